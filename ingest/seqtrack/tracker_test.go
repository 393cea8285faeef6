package seqtrack

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// The tracker is a pure function of its inputs: each case below is a script of inputs at
// given times and the actions each must produce, rendered as text:
//
//	apply N:P      Apply of batch N with payload P
//	open N         OpenReplay from N
//	close          CloseReplay
//	stale          Stale
//	restart L>F    Restarted (last L, first F)
//	hole F..L      Hole (batches F to L lost)
//
// Log actions are left out. Times are offsets from t0 in milliseconds; no clock is read and
// nothing sleeps.

var t0 = time.Unix(1_700_000_000, 0)

// step is one input. op: start, live, replay, end, fail (ReplayFailed), tick, conn
// (Connected), reject (Rejected), drop (DropAttempt), staleat (StaleAt seq).
type step struct {
	at   int // ms after t0
	op   string
	seq  uint64
	want string
}

func cfgReplay() Config {
	return Config{Replay: true, ReplayTimeout: 100 * time.Millisecond, RecoveryTimeout: time.Second,
		RetryDelay: 50 * time.Millisecond, MaxMessages: 100, MaxBytes: 1 << 20}
}

func cfgNoReplay() Config {
	c := cfgReplay()
	c.Replay = false
	return c
}

func cfgCatchUp() Config {
	c := cfgReplay()
	c.CatchUpOnStart = true
	return c
}

// cfgHoles is cfgReplay with gaps that cannot be closed offered as holes.
func cfgHoles() Config {
	c := cfgReplay()
	c.Holes = true
	return c
}

// cfgJoin is cfgCatchUp with the join check 200 ms after the first connect.
func cfgJoin() Config {
	c := cfgCatchUp()
	c.JoinCheck, c.JoinCheckDelay = true, 200*time.Millisecond
	return c
}

func render(acts []Action) string {
	var parts []string
	for _, a := range acts {
		switch a.Kind {
		case Apply:
			parts = append(parts, fmt.Sprintf("apply %d:%s", a.Seq, a.Payload))
		case OpenReplay:
			parts = append(parts, fmt.Sprintf("open %d", a.Seq))
		case CloseReplay:
			parts = append(parts, "close")
		case Stale:
			parts = append(parts, "stale")
		case Restarted:
			parts = append(parts, fmt.Sprintf("restart %d>%d", a.Last, a.Seq))
		case Hole:
			parts = append(parts, fmt.Sprintf("hole %d..%d", a.Seq, a.Last))
		case Log:
		default:
			parts = append(parts, a.Kind.String())
		}
	}
	return strings.Join(parts, " ")
}

// feed applies one step; payloads are "p<seq>" for live batches and "r<seq>" for replayed
// ones, so an Apply shows where its batch came from.
func feed(tr *Tracker, s step) []Action {
	now := t0.Add(time.Duration(s.at) * time.Millisecond)
	switch s.op {
	case "start":
		return tr.Start(now)
	case "live":
		p := fmt.Sprintf("p%d", s.seq)
		return tr.Live(now, s.seq, len(p), []byte(p))
	case "replay":
		return tr.ReplayBatch(now, s.seq, []byte(fmt.Sprintf("r%d", s.seq)))
	case "end":
		return tr.ReplayEnd(now)
	case "fail":
		return tr.ReplayFailed(now, "test failure")
	case "tick":
		return tr.Tick(now)
	case "conn":
		return tr.Connected(now)
	case "reject":
		return tr.Rejected(s.seq, errors.New("rejected by test"))
	case "drop":
		return tr.DropAttempt(now)
	case "staleat":
		return tr.StaleAt(s.seq, "stale by test")
	}
	panic("unknown op " + s.op)
}

func live(at int, seq uint64, want string) step {
	return step{at: at, op: "live", seq: seq, want: want}
}
func replay(at int, seq uint64, want string) step {
	return step{at: at, op: "replay", seq: seq, want: want}
}
func op(at int, name, want string) step { return step{at: at, op: name, want: want} }

type trackerCase struct {
	name  string
	cfg   Config
	steps []step
	// want holds counters that must match at the end (others are not checked).
	want  Counters
	stale bool
	next  uint64
}

var trackerCases = []trackerCase{
	{name: "in order from 0", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(1, 1, "apply 1:p1"), live(2, 2, "apply 2:p2"),
	}, next: 3},
	{name: "first batch is the baseline", cfg: cfgNoReplay(), steps: []step{
		live(0, 41, "apply 41:p41"), live(1, 42, "apply 42:p42"),
	}, next: 43},
	{name: "duplicates and older batches dropped", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 1, "apply 1:p1"), live(0, 2, "apply 2:p2"),
		live(0, 2, ""), live(0, 1, ""), live(0, 3, "apply 3:p3"),
	}, want: Counters{Duplicates: 2}, next: 4},
	{name: "gap without replay is stale", cfg: cfgNoReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "stale"), live(0, 3, ""),
	}, want: Counters{Gaps: 1, Dropped: 1}, stale: true, next: 1},
	{name: "gap recovered by replay exactly once", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"),
		live(1, 3, "open 1"),
		live(2, 4, ""),
		replay(3, 1, "apply 1:r1"),
		replay(3, 2, "apply 2:r2 close apply 3:p3 apply 4:p4"),
		live(4, 5, "apply 5:p5"),
	}, want: Counters{Gaps: 1, Dropped: 2, ReplaysOK: 1}, next: 6},
	{name: "replies past the live boundary are not applied twice", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(1, 2, "open 1"),
		replay(2, 1, "apply 1:r1 close apply 2:p2"),
		replay(2, 2, ""), // the attempt is closed: a late reply is ignored
	}, want: Counters{ReplaysOK: 1}, next: 3},
	{name: "second gap during recovery starts another", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"), live(0, 4, ""),
		replay(1, 1, "apply 1:r1 close apply 2:p2 open 3"),
		replay(2, 3, "apply 3:r3 close apply 4:p4"),
	}, want: Counters{Gaps: 2, Dropped: 2, ReplaysOK: 2}, next: 5},
	{name: "replay without the missing batch is stale", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), op(1, "end", "close stale"),
	}, want: Counters{ReplaysFailed: 1}, stale: true, next: 1},
	{name: "replay with part of the gap is stale", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), replay(1, 1, "apply 1:r1"), op(1, "end", "close stale"),
	}, want: Counters{ReplaysFailed: 1}, stale: true, next: 2},
	{name: "replay skipping a sequence is stale", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 5, "open 1"), replay(1, 2, "close stale"),
	}, stale: true, next: 1},
	{name: "replayed duplicates dropped", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 1, "apply 1:p1"), live(0, 4, "open 2"),
		replay(1, 0, ""), replay(1, 1, ""), replay(1, 2, "apply 2:r2"), replay(1, 3, "apply 3:r3 close apply 4:p4"),
	}, want: Counters{Duplicates: 2, ReplaysOK: 1}, next: 5},
	{name: "silent replay retried then stale at the deadline", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"),
		op(99, "tick", ""),
		op(100, "tick", "close"), // no reply within ReplayTimeout
		op(149, "tick", ""),
		op(150, "tick", "open 1"), // after RetryDelay
		op(250, "tick", "close"),
		op(300, "tick", "open 1"),
		op(1000, "tick", "close stale"), // RecoveryTimeout from the start
	}, want: Counters{ReplayRetries: 2, ReplaysFailed: 1}, stale: true, next: 1},
	{name: "replies push the attempt's timeout", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"),
		replay(90, 1, "apply 1:r1"),
		op(150, "tick", ""), // 100 ms after the open, 60 after the reply
		op(190, "tick", "close"),
	}, want: Counters{ReplayRetries: 1}, next: 2},
	{name: "malformed reply fails the attempt, retried", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"),
		op(10, "fail", "close"), op(59, "tick", ""), op(60, "tick", "open 1"),
		replay(61, 1, "apply 1:r1 close apply 2:p2"),
	}, want: Counters{ReplayRetries: 1, ReplaysOK: 1}, next: 3},
	{name: "replayed sequence above INT64_MAX fails the attempt", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"),
		replay(1, math.MaxInt64+1, "close"),
	}, want: Counters{ReplayRetries: 1}, next: 1},
	{name: "dropped attempt reopens at once, uncounted", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"),
		op(5, "drop", "close"), op(5, "tick", "open 1"),
	}, want: Counters{ReplayRetries: 0}, next: 1},
	{name: "recovery buffer limit is stale", cfg: func() Config { c := cfgReplay(); c.MaxMessages = 2; return c }(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"), live(0, 3, ""), live(0, 4, "close stale"),
	}, want: Counters{ReplaysFailed: 1}, stale: true, next: 1},
	{name: "recovery byte limit is stale", cfg: func() Config { c := cfgReplay(); c.MaxBytes = 3; return c }(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"), live(0, 3, "close stale"),
	}, stale: true, next: 1},
	{name: "buffered duplicate dropped", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"), live(0, 2, ""),
		replay(1, 1, "apply 1:r1 close apply 2:p2"),
	}, want: Counters{Duplicates: 1}, next: 3},
	{name: "rejected batch is stale without advancing", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 1, "apply 1:p1"), step{op: "reject", seq: 1, want: "stale"},
		live(0, 2, ""),
	}, stale: true, next: 1},
	{name: "handler stale at a batch ends the stream there", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 1, "apply 1:p1"), step{op: "staleat", seq: 1, want: "stale"},
		live(0, 2, ""), op(1, "tick", ""),
	}, stale: true, next: 1},
	{name: "restart to 0 with replay re-baselines at 0", cfg: cfgReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 1, "apply 1:p1"), live(0, 2, "apply 2:p2"),
		live(1, 0, "restart 2>0 apply 0:p0"), live(1, 1, "apply 1:p1"),
	}, want: Counters{Restarts: 1}, next: 2},
	{name: "restart seen late is replayed from 0", cfg: cfgReplay(), steps: []step{
		op(0, "conn", ""),
		live(0, 5, "apply 5:p5"), live(0, 6, "apply 6:p6"),
		op(1, "conn", "open 7"), // reconnect: ask for what was lost
		live(2, 2, "close restart 6>2 open 0"),
		replay(3, 0, "apply 0:r0"), replay(3, 1, "apply 1:r1 close apply 2:p2"),
	}, want: Counters{Restarts: 1, Reconnects: 1}, next: 3},
	{name: "restart without replay takes the first batch", cfg: cfgNoReplay(), steps: []step{
		live(0, 1, "apply 1:p1"), live(0, 2, "apply 2:p2"), live(0, 3, "apply 3:p3"),
		live(1, 0, "restart 3>0 apply 0:p0"),
	}, want: Counters{Restarts: 1}, next: 1},
	{name: "old sequence after a reconnect is a restart", cfg: cfgNoReplay(), steps: []step{
		op(0, "conn", ""), live(0, 7, "apply 7:p7"), live(0, 8, "apply 8:p8"),
		op(1, "conn", ""), live(1, 1, "restart 8>1 apply 1:p1"),
	}, want: Counters{Restarts: 1, Reconnects: 1}, next: 2},
	{name: "old sequence without a reconnect is a duplicate", cfg: cfgNoReplay(), steps: []step{
		live(0, 7, "apply 7:p7"), live(0, 8, "apply 8:p8"), live(1, 1, ""),
	}, want: Counters{Duplicates: 1}, next: 9},
	{name: "catch-up replays everything", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"),
		replay(1, 0, "apply 0:r0"), replay(1, 1, "apply 1:r1"), op(1, "end", "close"),
		live(2, 2, "apply 2:p2"),
	}, want: Counters{CatchUps: 1}, next: 3},
	{name: "catch-up accepts a ring starting late", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), replay(1, 5, "apply 5:r5"), op(1, "end", "close"), live(2, 6, "apply 6:p6"),
	}, want: Counters{CatchUps: 1}, next: 7},
	{name: "catch-up with nothing to replay", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), op(1, "end", "close"), live(2, 9, "apply 9:p9"),
	}, want: Counters{CatchUps: 1}, next: 10},
	{name: "catch-up failure is not stale", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), op(1, "fail", "close"), live(2, 7, "apply 7:p7"),
	}, want: Counters{CatchUpsFailed: 1}, next: 8},
	{name: "catch-up timeout is not stale", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), op(100, "tick", "close"), live(101, 3, "apply 3:p3"),
	}, want: Counters{CatchUpsFailed: 1}, next: 4},
	{name: "catch-up while live batches stream", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), live(1, 3, ""), live(1, 4, ""),
		replay(2, 0, "apply 0:r0"), replay(2, 1, "apply 1:r1"), replay(2, 2, "apply 2:r2 close apply 3:p3 apply 4:p4"),
	}, want: Counters{CatchUps: 1}, next: 5},
	{name: "catch-up ring past the buffered live batches", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), live(1, 3, ""), replay(2, 5, "close apply 3:p3"),
	}, want: Counters{CatchUps: 1}, next: 4},
	{name: "catch-up end with live batches buffered", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), live(1, 3, ""), live(1, 4, ""), op(2, "end", "close apply 3:p3 apply 4:p4"),
	}, want: Counters{CatchUps: 1}, next: 5},
	{name: "catch-up gap after the ring is recovered strictly", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), live(1, 4, ""),
		replay(2, 0, "apply 0:r0"), replay(2, 1, "apply 1:r1"), op(2, "end", "close open 2"),
		replay(3, 2, "apply 2:r2"), replay(3, 3, "apply 3:r3 close apply 4:p4"),
	}, want: Counters{CatchUps: 1, ReplaysOK: 1, Gaps: 1, Dropped: 2}, next: 5},
	{name: "catch-up interrupted after progress is strict", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), live(1, 3, ""),
		replay(2, 0, "apply 0:r0"), op(3, "fail", "close"),
		op(53, "tick", "open 1"),
		replay(54, 1, "apply 1:r1"), replay(54, 2, "apply 2:r2 close apply 3:p3"),
	}, want: Counters{CatchUpsFailed: 1, ReplayRetries: 1, ReplaysOK: 1}, next: 4},
	{name: "catch-up overflow before a baseline gives up", cfg: func() Config { c := cfgCatchUp(); c.MaxMessages = 2; return c }(), steps: []step{
		op(0, "start", "open 0"), live(1, 5, ""), live(1, 6, ""),
		live(1, 7, "close apply 5:p5 apply 6:p6 apply 7:p7"),
	}, want: Counters{CatchUpsFailed: 1}, next: 8},
	{name: "catch-up again after a publisher restart", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), op(1, "end", "close"),
		live(2, 0, "apply 0:p0"), live(2, 1, "apply 1:p1"), live(2, 2, "apply 2:p2"),
		live(3, 0, "restart 2>0 open 0"),
		replay(4, 0, "close apply 0:p0"), // the buffered live 0 is the boundary: applied once, from the buffer
	}, want: Counters{CatchUps: 2, Restarts: 1}, next: 1},
	// The join check: batch 2 was published after the catch-up read the ring and before
	// the subscription reached the publisher, and the stream went quiet.
	{name: "join check recovers what the catch-up could not see", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), replay(1, 1, "apply 1:r1"), op(1, "end", "close"),
		op(5, "conn", ""), op(204, "tick", ""), op(205, "tick", "open 2"),
		replay(206, 2, "apply 2:r2"), op(206, "end", "close"), op(300, "tick", ""),
		live(400, 3, "apply 3:p3"),
	}, want: Counters{CatchUps: 1, JoinChecks: 1, Gaps: 1, Dropped: 1}, next: 4},
	{name: "join check waits for the catch-up", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), op(1, "conn", ""), replay(50, 0, "apply 0:r0"), replay(140, 1, "apply 1:r1"),
		op(201, "tick", ""), op(202, "end", "close"),
		op(203, "tick", "open 2"), op(204, "end", "close"),
	}, want: Counters{CatchUps: 1, JoinChecks: 1}, next: 2},
	{name: "join check after an empty ring is another catch-up", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), op(1, "end", "close"), op(2, "conn", ""),
		op(202, "tick", "open 0"), replay(203, 4, "apply 4:r4"), op(203, "end", "close"),
	}, want: Counters{CatchUps: 2}, next: 5},
	// The first live batch ends a running join check when it follows on from what is
	// applied: the stream is received from there, and its replies are not waited for.
	{name: "join check ended by the live stream", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		op(202, "tick", "open 1"), live(203, 1, "close apply 1:p1"), live(203, 2, "apply 2:p2"),
		replay(204, 1, ""), op(204, "end", ""), op(500, "tick", ""), live(600, 3, "apply 3:p3"),
	}, want: Counters{CatchUps: 1, JoinChecks: 1}, next: 4},
	// ... also when the replay got ahead of it: the batches replayed from the first live
	// one on are received live (duplicates), those before it were missing.
	{name: "join check ended by a live batch it replayed already", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		op(202, "tick", "open 1"), replay(203, 1, "apply 1:r1"), replay(203, 2, "apply 2:r2"), replay(203, 3, "apply 3:r3"),
		live(204, 2, "close"), live(204, 3, ""), live(205, 4, "apply 4:p4"),
	}, want: Counters{CatchUps: 1, JoinChecks: 1, Gaps: 1, Dropped: 1, Duplicates: 2}, next: 5},
	// A live batch before the check is due (a stream that flows: a burst, or paced
	// batches) makes it moot: nothing is asked, nothing is replayed twice. In a burst the
	// applied sequence lags far behind what waits unread in the connection, and a replay
	// from it would find the publisher's ring moved on (a false stale source).
	{name: "join check dropped when the live stream arrives first", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		live(100, 1, "apply 1:p1"), live(150, 2, "apply 2:p2"), op(202, "tick", ""), op(5000, "tick", ""),
		live(5001, 3, "apply 3:p3"),
	}, want: Counters{CatchUps: 1}, next: 4},
	{name: "join check dropped at a live gap, closed as a gap", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		live(100, 3, "open 1"), replay(101, 1, "apply 1:r1"), replay(101, 2, "apply 2:r2 close apply 3:p3"),
		op(300, "tick", ""),
	}, want: Counters{CatchUps: 1, Gaps: 1, Dropped: 2, ReplaysOK: 1}, next: 4},
	{name: "join check not scheduled after a live batch", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), live(1, 0, ""), replay(2, 0, "close apply 0:p0"), op(3, "conn", ""),
		op(500, "tick", ""), live(501, 1, "apply 1:p1"),
	}, want: Counters{CatchUps: 1}, next: 2},
	{name: "join check needs an answered catch-up", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), op(1, "fail", "close"), op(2, "conn", ""),
		live(3, 7, "apply 7:p7"), op(300, "tick", ""),
	}, want: Counters{CatchUpsFailed: 1}, next: 8},
	{name: "join check unanswered is not stale", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		op(202, "tick", "open 1"), op(302, "tick", "close"), op(352, "tick", "open 1"),
		op(1202, "tick", "close"), live(1203, 1, "apply 1:p1"),
	}, want: Counters{CatchUps: 1, JoinChecksFailed: 1, ReplayRetries: 1}, next: 2},
	{name: "join check with a live gap is strict", cfg: cfgJoin(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		op(202, "tick", "open 1"), live(203, 3, ""), op(204, "end", "close stale"),
	}, want: Counters{CatchUps: 1, JoinChecksFailed: 1}, stale: true, next: 1},
	{name: "join check off", cfg: cfgCatchUp(), steps: []step{
		op(0, "start", "open 0"), replay(1, 0, "apply 0:r0"), op(1, "end", "close"), op(2, "conn", ""),
		op(5000, "tick", ""),
	}, want: Counters{CatchUps: 1}, next: 1},
	{name: "reconnect with nothing lost replays to the end", cfg: cfgReplay(), steps: []step{
		op(0, "conn", ""), live(0, 0, "apply 0:p0"), op(1, "conn", "open 1"), op(2, "end", "close"),
		live(3, 1, "apply 1:p1"),
	}, want: Counters{Reconnects: 1, ReplaysOK: 1}, next: 2},
	{name: "reconnect without replay only counts", cfg: cfgNoReplay(), steps: []step{
		op(0, "conn", ""), live(0, 0, "apply 0:p0"), op(1, "conn", ""), live(1, 1, "apply 1:p1"),
	}, want: Counters{Reconnects: 1}, next: 2},
	// With Holes, what no replay can supply is offered to the owner, and the stream goes
	// on after it (the same scripts as the stale cases above).
	{name: "holes: gap without replay", cfg: func() Config { c := cfgNoReplay(); c.Holes = true; return c }(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "hole 1..1 apply 2:p2"), live(0, 3, "apply 3:p3"),
	}, want: Counters{Gaps: 1, Dropped: 1}, next: 4},
	{name: "holes: replay without the missing batch", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), op(1, "end", "hole 1..2 close apply 3:p3"),
		live(2, 4, "apply 4:p4"),
	}, want: Counters{Gaps: 1, Dropped: 2}, next: 5},
	{name: "holes: replay with part of the gap", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), replay(1, 1, "apply 1:r1"), op(1, "end", "hole 2..2 close apply 3:p3"),
	}, next: 4},
	{name: "holes: replay skipping a sequence goes on after it", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 5, "open 1"), replay(1, 3, "hole 1..2 apply 3:r3"),
		replay(1, 4, "apply 4:r4 close apply 5:p5"), live(2, 6, "apply 6:p6"),
	}, next: 7},
	{name: "holes: replay ring past the live boundary", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), live(0, 4, ""),
		replay(1, 6, "hole 1..2 close apply 3:p3 apply 4:p4"), live(2, 5, "apply 5:p5"),
	}, next: 6},
	{name: "holes: recovery deadline", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 2, "open 1"), op(100, "tick", "close"), op(150, "tick", "open 1"),
		op(1000, "tick", "hole 1..1 close apply 2:p2"),
	}, want: Counters{ReplayRetries: 1}, next: 3},
	{name: "holes: a refused hole is stale where it began", cfg: cfgHoles(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 3, "open 1"), op(1, "end", "hole 1..2 close apply 3:p3"),
		step{op: "staleat", seq: 1, want: "stale"}, live(2, 4, ""),
	}, stale: true, next: 1},
	{name: "holes: no bound after a reconnect is stale", cfg: cfgHoles(), steps: []step{
		op(0, "conn", ""), live(0, 0, "apply 0:p0"), op(1, "conn", "open 1"),
		op(1001, "tick", "close stale"),
	}, want: Counters{ReplaysFailed: 1}, stale: true, next: 1},
	{name: "stale tracker ignores everything", cfg: cfgNoReplay(), steps: []step{
		live(0, 0, "apply 0:p0"), live(0, 5, "stale"), live(0, 1, ""), op(1, "conn", ""), op(2, "tick", ""),
	}, stale: true, next: 1},
}

func TestTrackerTables(t *testing.T) {
	for _, tc := range trackerCases {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(tc.cfg)
			for i, s := range tc.steps {
				if got := render(feed(tr, s)); got != s.want {
					t.Fatalf("step %d (%s %d at %dms): actions %q, want %q", i, s.op, s.seq, s.at, got, s.want)
				}
			}
			if tr.Stale() != tc.stale || tr.Next() != tc.next {
				t.Fatalf("stale %v next %d, want %v %d", tr.Stale(), tr.Next(), tc.stale, tc.next)
			}
			got := tr.Counters()
			check := func(name string, g, w uint64) {
				if w != 0 && g != w {
					t.Errorf("%s = %d, want %d (all: %+v)", name, g, w, got)
				}
			}
			w := tc.want
			check("Dropped", got.Dropped, w.Dropped)
			check("Duplicates", got.Duplicates, w.Duplicates)
			check("Gaps", got.Gaps, w.Gaps)
			check("ReplaysOK", got.ReplaysOK, w.ReplaysOK)
			check("ReplaysFailed", got.ReplaysFailed, w.ReplaysFailed)
			check("ReplayRetries", got.ReplayRetries, w.ReplayRetries)
			check("Restarts", got.Restarts, w.Restarts)
			check("Reconnects", got.Reconnects, w.Reconnects)
			check("CatchUps", got.CatchUps, w.CatchUps)
			check("CatchUpsFailed", got.CatchUpsFailed, w.CatchUpsFailed)
			check("JoinChecks", got.JoinChecks, w.JoinChecks)
			check("JoinChecksFailed", got.JoinChecksFailed, w.JoinChecksFailed)
			if tc.cfg.JoinCheck && w.JoinChecks == 0 && got.JoinChecks != 0 {
				t.Errorf("JoinChecks = %d, want 0", got.JoinChecks)
			}
			if strings.HasPrefix(tc.name, "holes:") && got.ReplaysOK != 0 {
				t.Errorf("ReplaysOK = %d, want 0: a recovery past a hole did not close its gap", got.ReplaysOK)
			}
			if tc.name == "dropped attempt reopens at once, uncounted" && got.ReplayRetries != 0 {
				t.Errorf("ReplayRetries = %d, want 0", got.ReplayRetries)
			}
		})
	}
}

// TestTrackerDeadline: the owner's next wake-up is the earliest of the recovery
// deadline, the open attempt's reply timeout, or the retry time.
func TestTrackerDeadline(t *testing.T) {
	tr := New(cfgReplay())
	if _, ok := tr.Deadline(); ok {
		t.Fatal("deadline without a recovery")
	}
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tr.Live(ms(0), 0, 1, []byte("a"))
	tr.Live(ms(0), 2, 1, []byte("c"))
	if d, ok := tr.Deadline(); !ok || !d.Equal(ms(100)) || !tr.AttemptOpen() {
		t.Fatalf("open attempt: deadline %v %v, want reply timeout at 100ms", d.Sub(t0), ok)
	}
	tr.Tick(ms(100))
	if d, ok := tr.Deadline(); !ok || !d.Equal(ms(150)) || tr.AttemptOpen() {
		t.Fatalf("after a timeout: deadline %v %v, want retry at 150ms", d.Sub(t0), ok)
	}
	tr.Tick(ms(980))
	if d, _ := tr.Deadline(); !d.Equal(ms(1000)) {
		t.Fatalf("near the end: deadline %v, want the recovery deadline at 1000ms", d.Sub(t0))
	}
	if tr.Buffered() != 1 {
		t.Fatalf("buffered %d, want 1", tr.Buffered())
	}
}

// TestNeedsConnectCheck: only a batch that would otherwise be dropped as a duplicate asks
// the owner to read its pending connection events first.
func TestNeedsConnectCheck(t *testing.T) {
	tr := New(cfgNoReplay())
	if tr.NeedsConnectCheck(0) {
		t.Fatal("before a baseline")
	}
	for s := range uint64(4) {
		tr.Live(t0, s, 1, []byte("x"))
	}
	for _, tc := range []struct {
		seq  uint64
		want bool
	}{{4, false}, {9, false}, {3, true}, {1, true}, {0, false /* restart by sequence 0 */}} {
		if got := tr.NeedsConnectCheck(tc.seq); got != tc.want {
			t.Errorf("NeedsConnectCheck(%d) = %v, want %v", tc.seq, got, tc.want)
		}
	}
	tr.Connected(t0)
	tr.Connected(t0)
	if tr.NeedsConnectCheck(2) {
		t.Fatal("after a reconnect the check is done")
	}
}

// TestTrackerPayloadsStayValid: payloads handed out from the recovery buffer stay intact
// through the call that hands them out, even when the same call buffers again.
func TestTrackerPayloadsStayValid(t *testing.T) {
	c := cfgCatchUp()
	c.MaxMessages = 2
	tr := New(c)
	tr.Start(t0)
	tr.Live(t0, 5, 2, []byte("p5"))
	tr.Live(t0, 7, 2, []byte("p7"))
	// Overflow before a baseline: the catch-up ends, 5 is applied from the buffer, the
	// hole at 6 starts a recovery, and 8 is buffered in the same call.
	acts := tr.Live(t0, 8, 2, []byte("p8"))
	if got := render(acts); got != "close apply 5:p5 open 6" {
		t.Fatalf("actions %q", got)
	}
	for _, a := range acts {
		if a.Kind == Apply && string(a.Payload) != "p5" {
			t.Fatalf("payload of 5 overwritten: %q", a.Payload)
		}
	}
}

// TestLivePathAllocatesNothing: an in-order live batch costs no allocation.
func TestLivePathAllocatesNothing(t *testing.T) {
	tr := New(cfgReplay())
	p := []byte("payload")
	seq := uint64(0)
	if n := testing.AllocsPerRun(1000, func() {
		if acts := tr.Live(t0, seq, len(p), p); len(acts) != 1 {
			panic("not applied")
		}
		seq++
	}); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
}
