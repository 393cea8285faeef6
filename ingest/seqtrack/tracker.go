// Package seqtrack is the sequence state machine of one KV-event stream: which batch to
// apply next, which are duplicates, when a gap needs the publisher's replay endpoint,
// when a publisher restarted, and when the stream can no longer be trusted (stale).
//
// It does no I/O and reads no clock. A Tracker is fed inputs (a live batch, a replay
// reply, the end of a replay, a failed replay attempt, a reconnect, a rejected batch, a
// timer tick), each with the current time, and answers with the actions its owner must
// carry out, in order: apply a batch, open a replay attempt from a sequence, close it,
// tell the handler the source is stale or its publisher restarted, write a log line.
// The owner (ingest's subscriber) does the sockets and the handler calls; the rules are
// proven here by tables of inputs and expected actions, with no socket and no sleep.
//
// Rules (reference notes §5.1, and the choices documented on ingest.SubscriberConfig):
// the first live batch is the baseline; a batch below the next expected one is a
// duplicate unless it marks a publisher restart; a gap is closed through replay (live
// batches are buffered meanwhile, within MaxRecoveryMessages / MaxRecoveryBytes) or,
// without replay, makes the source stale; a recovery that does not finish within
// RecoveryTimeout makes the source stale; a catch-up (CatchUpOnStart) is best effort.
// With Config.Holes, a gap that cannot be closed is first offered to the owner as a
// hole (a replica bootstrapping from a peer's snapshot may hold those batches already),
// and makes the source stale only if the owner refuses it.
package seqtrack

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// Config is what the tracker needs of a subscription's settings. Zero durations and
// limits are taken literally: the owner fills in its defaults.
type Config struct {
	// Replay: the publisher has a replay endpoint. Without it a gap makes the source stale.
	Replay bool
	// CatchUpOnStart asks for everything the publisher buffers at Start and after a
	// publisher restart (with Replay only).
	CatchUpOnStart bool
	// ReplayTimeout is how long one replay attempt waits for its next reply.
	ReplayTimeout time.Duration
	// RecoveryTimeout bounds the closing of one gap, retries included.
	RecoveryTimeout time.Duration
	// RetryDelay is the pause before a failed replay attempt is retried.
	RetryDelay time.Duration
	// MaxMessages and MaxBytes bound the live batches buffered during a recovery.
	MaxMessages, MaxBytes int
	// JoinCheck (with CatchUpOnStart): JoinCheckDelay after the SUB first connects, and
	// once the catch-up has completed, ask the replay endpoint once more for everything
	// from the next expected batch on. A catch-up reads the publisher's ring before the
	// subscription has reached the publisher; batches published in between are never
	// received live, and on a stream that then goes quiet no later batch reveals the
	// gap, so a block removed in that window would be served for good.
	JoinCheck      bool
	JoinCheckDelay time.Duration
	// Holes: the owner's handler may take a gap that cannot be closed (the replay
	// endpoint no longer has the batches, or there is none) as covered elsewhere: such
	// a gap is offered as a Hole action, and the stream goes on past it unless the
	// owner reports StaleAt. Without Holes the source is stale at once, as before.
	Holes bool
}

// Kind is what an Action asks of the owner.
type Kind uint8

// Action kinds.
const (
	// Apply: hand batch Seq (Payload) to the handler. When the handler rejects it, the
	// owner skips the rest of the actions and calls Rejected.
	Apply Kind = iota + 1
	// OpenReplay: open a fresh replay attempt (a new DEALER) asking for every batch from
	// Seq on. When that fails, the owner carries out the rest of the actions and then
	// calls ReplayFailed.
	OpenReplay
	// CloseReplay: close the replay attempt; its queued replies are discarded.
	CloseReplay
	// Stale: the source is stale (Reason); tell the handler. It is the last action the
	// tracker ever emits besides logs.
	Stale
	// Restarted: the publisher restarted (its last sequence Last, the new one Seq);
	// tell the handler before any batch of the new stream.
	Restarted
	// Log: write a log line (Level, Msg, Attrs).
	Log
	// Hole (Config.Holes): batches Seq..Last are lost (Reason says how) and the stream
	// goes on after them; offer them to the handler. When the handler does not take
	// them, the owner skips the rest of the actions and calls StaleAt(Seq, Reason).
	Hole
)

var kindNames = [...]string{"?", "apply", "open-replay", "close-replay", "stale", "restarted", "log", "hole"}

// String is the kind's short name (tests print actions with it).
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Action is one step for the owner. Payload is valid until the next call on the tracker.
type Action struct {
	Kind    Kind
	Seq     uint64
	Last    uint64 // Restarted: the old stream's last applied sequence; Hole: the last batch lost
	Payload []byte
	Reason  string // Stale, Hole
	Level   slog.Level
	Msg     string
	Attrs   []any
}

// Counters are the tracker's counts (see ingest.SubscriberStats for their meaning).
type Counters struct {
	Dropped, Duplicates, Gaps                      uint64
	ReplaysOK, ReplaysFailed, ReplayRetries        uint64
	Restarts, Reconnects, CatchUps, CatchUpsFailed uint64
	JoinChecks, JoinChecksFailed                   uint64
}

type counters struct {
	dropped, duplicates, gaps               atomic.Uint64
	replaysOK, replaysFailed, replayRetries atomic.Uint64
	restarts, reconnects                    atomic.Uint64
	catchUps, catchUpsFailed                atomic.Uint64
	joinChecks, joinChecksFailed            atomic.Uint64
}

// Tracker is the state of one stream. It is used by one goroutine; Counters and Stale may
// be read from any.
type Tracker struct {
	cfg Config

	base   bool   // the baseline is set: next is meaningful
	next   uint64 // next sequence number to apply
	hiNext uint64 // highest sequence seen + 1; gaps are counted against it
	// liveTop is the highest sequence received live + 1 (0: none since the stream
	// began). Unlike next and hiNext it never moves for replayed batches, so a live
	// batch 0 that arrives after a catch-up replayed it is not taken for a restart.
	liveTop uint64
	stale   bool

	connectedOnce bool // the SUB has connected at least once
	reconnected   bool // it reconnected since the last batch was applied
	// sawLive: a live batch has been received (see joinSeesLive).
	sawLive bool
	// join is the pending join check (Config.JoinCheck), due at joinAt.
	join   bool
	joinAt time.Time

	rec  recovery
	pend pendingBuf

	acts []Action
	st   counters
	// staleSeen is set once the owner may see Stale (published after the Stale action).
	staleSeen atomic.Bool
}

// recovery is one gap being closed through the replay endpoint, possibly over several
// attempts (each with a fresh DEALER, so replies to an abandoned attempt cannot mix in).
type recovery struct {
	active       bool
	open         bool      // an attempt is open (the owner holds a DEALER)
	from         uint64    // next when the recovery began (for logs)
	deadline     time.Time // RecoveryTimeout after the start
	retryAt      time.Time // when the next attempt may open
	recvDeadline time.Time // ReplayTimeout after the last reply of the open attempt
	attempts     int
	progress     bool // a replayed batch was applied
	// catchUp: a best-effort catch-up (CatchUpOnStart), not a gap. Until its first
	// replayed batch sets the baseline (base), it tolerates a replay that starts late
	// and ends without marking the source stale when it fails.
	catchUp bool
	// joinCheck: the join check (Config.JoinCheck), an unbounded recovery from next that
	// is counted apart and, as long as no live batch showed a gap, given up without
	// marking the source stale when the replay endpoint does not answer.
	joinCheck bool
	replayed  uint64 // batches applied from replay replies
	// holed: batches this recovery could not replay were offered as a Hole.
	holed bool
}

// New returns the tracker of a stream that has not started.
func New(cfg Config) *Tracker {
	cfg.CatchUpOnStart = cfg.CatchUpOnStart && cfg.Replay
	return &Tracker{cfg: cfg}
}

// Counters returns the counts; each is read atomically.
func (t *Tracker) Counters() Counters {
	return Counters{
		Dropped: t.st.dropped.Load(), Duplicates: t.st.duplicates.Load(), Gaps: t.st.gaps.Load(),
		ReplaysOK: t.st.replaysOK.Load(), ReplaysFailed: t.st.replaysFailed.Load(), ReplayRetries: t.st.replayRetries.Load(),
		Restarts: t.st.restarts.Load(), Reconnects: t.st.reconnects.Load(),
		CatchUps: t.st.catchUps.Load(), CatchUpsFailed: t.st.catchUpsFailed.Load(),
		JoinChecks: t.st.joinChecks.Load(), JoinChecksFailed: t.st.joinChecksFailed.Load(),
	}
}

// Stale tells whether the stream is stale (owner goroutine).
func (t *Tracker) Stale() bool { return t.stale }

// Next is the next sequence to apply (meaningful once a baseline is set).
func (t *Tracker) Next() uint64 { return t.next }

// Recovering tells whether a gap recovery or catch-up is in progress.
func (t *Tracker) Recovering() bool { return t.rec.active }

// AttemptOpen tells whether a replay attempt is open: the owner holds a DEALER.
func (t *Tracker) AttemptOpen() bool { return t.rec.open }

// Buffered is how many live batches wait for a recovery to finish.
func (t *Tracker) Buffered() int { return t.pend.len() }

// Deadline is when the tracker next needs a Tick (ok false: no timer runs).
func (t *Tracker) Deadline() (time.Time, bool) {
	if t.stale {
		return time.Time{}, false
	}
	if !t.rec.active {
		return t.joinAt, t.join
	}
	d := t.rec.deadline
	if t.rec.open {
		d = earliest(d, t.rec.recvDeadline)
	} else {
		d = earliest(d, t.rec.retryAt)
	}
	return d, true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// begin starts a call: the actions of the previous one are dropped, and the buffer's
// arena is truncated once empty (only here, so that payloads handed out in one call
// stay valid through it).
func (t *Tracker) begin() {
	clear(t.acts) // drop the payload references of the previous call
	t.acts = t.acts[:0]
	t.pend.compact()
}

// Release drops what the last call's actions refer to, and an empty recovery buffer. An
// owner that will not call again for a while (its stream is stale) calls it, so that
// no buffer is held for nothing.
func (t *Tracker) Release() {
	t.begin()
}

func (t *Tracker) emit(a Action) { t.acts = append(t.acts, a) }

func (t *Tracker) log(level slog.Level, msg string, attrs ...any) {
	t.emit(Action{Kind: Log, Level: level, Msg: msg, Attrs: attrs})
}

// Start begins the stream: with CatchUpOnStart, a catch-up.
func (t *Tracker) Start(now time.Time) []Action {
	t.begin()
	if t.cfg.CatchUpOnStart && !t.stale {
		t.startCatchUp(now)
	}
	return t.acts
}

// NeedsConnectCheck tells whether a live batch seq would be taken for a duplicate
// unless the SUB reconnected: the owner should read its queued connection events
// (Connected) before it hands the batch in, as the connect event may still be queued
// behind the message that revealed it.
func (t *Tracker) NeedsConnectCheck(seq uint64) bool {
	return !t.stale && t.base && seq < t.next && !t.restartByZero(seq) && !t.reconnected
}

// Live handles one well-formed live batch; cost is the bytes it would take in the
// recovery buffer (topic and payload).
func (t *Tracker) Live(now time.Time, seq uint64, cost int, payload []byte) []Action {
	t.begin()
	if !t.stale {
		t.live(now, seq, cost, payload)
	}
	return t.acts
}

func (t *Tracker) live(now time.Time, seq uint64, cost int, payload []byte) {
	restarted := t.base && seq < t.next && (t.restartByZero(seq) || t.reconnected)
	t.joinSeesLive(now, seq, restarted)
	if t.base && seq < t.next {
		if !restarted {
			t.st.duplicates.Add(1)
			return
		}
		t.restart(now, seq)
	}
	if !t.base && !t.rec.active {
		// The first message is the baseline (unless a catch-up, still looking for one,
		// buffers it); nothing before it is requested.
		t.base = true
		t.next, t.hiNext = seq, seq
	}
	if t.liveTop <= seq {
		t.liveTop = seq + 1
	}
	// While a catch-up has no baseline, gaps count only between live batches.
	if (t.base || t.pend.len() > 0) && seq > t.hiNext {
		missing := seq - t.hiNext
		t.st.gaps.Add(1)
		t.st.dropped.Add(missing)
		t.log(slog.LevelWarn, "ZMQ sequence gap", "expected", t.hiNext, "got", seq, "missing", missing,
			"replay", t.cfg.Replay)
	}
	if seq >= t.hiNext {
		t.hiNext = seq + 1
	}
	if t.rec.active {
		if !t.rec.catchUp || t.base || t.fits(cost) {
			t.bufferLive(seq, cost, payload)
			return
		}
		// A catch-up that would overflow the buffer before it found a baseline is
		// given up: the buffered live batches become the stream, as without catch-up.
		t.catchUpFailed(now, fmt.Sprintf("recovery buffer limit reached (%d messages, %d bytes buffered)",
			t.pend.len(), t.pend.bytes))
		if t.stale {
			return
		}
		if !t.base {
			t.base = true
			t.next, t.hiNext = seq, seq+1
		}
		if t.rec.active {
			t.bufferLive(seq, cost, payload)
			return
		}
		if seq < t.next {
			t.st.duplicates.Add(1)
			return
		}
	}
	if seq == t.next {
		t.apply(seq, payload)
		return
	}
	if !t.cfg.Replay {
		if t.skip(seq, fmt.Sprintf("sequence gap: expected %d, got %d (no replay endpoint)", t.next, seq)) {
			t.apply(seq, payload)
		}
		return
	}
	if t.bufferLive(seq, cost, payload) {
		t.startRecovery(now)
	}
}

// joinSeesLive makes the join check moot at the first live batch. The check is there for
// batches published after the catch-up read the publisher's ring and before the
// subscription took effect, on a stream that then goes quiet: no live batch would show
// them missing. Once a live batch seq has been received, the subscription receives the
// stream from seq on, and the sequence rules compare seq with what the catch-up applied
// (a gap before it is recovered as any gap), so nothing can be missed unseen. Asking the
// replay endpoint anyway, from the applied sequence, is worse than useless during a
// burst: the publisher's ring may no longer hold a sequence that still waits, unread,
// in the connection, and the source would go stale for nothing. So a pending check is
// dropped, and a running one ends here when the live stream follows on from what is
// applied (seq <= next, nothing buffered); a first live batch past next is a gap, which
// the running check goes on to close strictly.
func (t *Tracker) joinSeesLive(now time.Time, seq uint64, restarted bool) {
	if t.sawLive {
		return
	}
	t.sawLive = true
	if t.join {
		t.join = false
		t.log(slog.LevelInfo, "join check not needed: the live stream arrived", "seq", seq)
	}
	if t.rec.active && t.rec.joinCheck && !restarted && t.pend.len() == 0 && seq <= t.next {
		// Batches replayed from seq on are received live too: only those below seq
		// were missing.
		t.rec.replayed = min(t.rec.replayed, max(seq, t.rec.from)-t.rec.from)
		t.finishRecovery(now)
	}
}

// restartByZero: sequence 0 after later ones can only come from a new publisher process.
// Any older sequence right after the SUB reconnected is also taken as a restart, because
// the first batches of a new publisher are often sent before the SUB has reconnected.
func (t *Tracker) restartByZero(seq uint64) bool {
	return seq == 0 && t.next >= 2 && t.liveTop >= 2
}

// restart re-baselines on a publisher restart. With replay (vLLM, SGLang: sequences start
// at 0 per process) the new stream is expected from 0, so batches it sent before the SUB
// reconnected count as a gap and are replayed; with CatchUpOnStart they are caught up
// instead, so that a new publisher whose ring no longer reaches 0 does not make the
// source stale (the handler has just dropped the old publisher's state, so the lost
// start can only under-report). Without replay the first batch seen is the new
// baseline, as at startup: the Mooncake master numbers from 1, so a missing start cannot
// be told from a stream that begins there.
func (t *Tracker) restart(now time.Time, seq uint64) {
	last := t.next - 1
	t.st.restarts.Add(1)
	t.log(slog.LevelWarn, "ZMQ publisher restarted (sequence reset)", "last_seq", last, "seq", seq)
	if t.rec.active {
		t.rec.active, t.rec.catchUp = false, false
		t.closeAttempt()
		t.log(slog.LevelInfo, "replay recovery abandoned after publisher restart")
	}
	t.pend.reset()
	t.next, t.hiNext = seq, seq
	if t.cfg.Replay {
		t.next, t.hiNext = 0, 0
	}
	t.liveTop = 0
	t.reconnected = false
	t.emit(Action{Kind: Restarted, Last: last, Seq: seq})
	if t.cfg.CatchUpOnStart {
		t.base = false
		t.startCatchUp(now)
	}
}

// apply emits one batch for the handler and advances; a rejection comes back through
// Rejected.
func (t *Tracker) apply(seq uint64, payload []byte) {
	t.emit(Action{Kind: Apply, Seq: seq, Payload: payload})
	t.next = seq + 1
	t.reconnected = false
}

// Rejected is the owner's report that the handler rejected batch seq (the last Apply it
// carried out; it skipped the actions after it): the source is stale, and the stream
// did not advance past seq.
func (t *Tracker) Rejected(seq uint64, err error) []Action {
	t.begin()
	t.next = seq
	t.markStale(fmt.Sprintf("batch %d rejected: %v", seq, err))
	return t.acts
}

// StaleAt is the owner's report that the stream cannot go on from batch seq, and that it
// skipped the actions after the one that stopped it: the handler refused the Hole that
// starts at seq, or answered the Apply of seq with a staleness of its own. The source is
// stale (reason) and the stream did not advance past seq.
func (t *Tracker) StaleAt(seq uint64, reason string) []Action {
	t.begin()
	t.next = seq
	t.markStale(reason)
	return t.acts
}

// skip gives up the batches from next to end-1, which no replay can supply (reason):
// with Config.Holes they are offered to the owner as a Hole and the stream goes on at
// end; without, the source is stale. It reports whether the stream goes on.
func (t *Tracker) skip(end uint64, reason string) bool {
	if !t.cfg.Holes {
		t.markStale(reason)
		return false
	}
	t.log(slog.LevelWarn, "ZMQ batches lost; offered to the handler as a hole", "first", t.next, "last", end-1,
		"reason", reason)
	t.emit(Action{Kind: Hole, Seq: t.next, Last: end - 1, Reason: reason})
	t.next, t.hiNext = end, max(t.hiNext, end)
	if t.rec.active {
		t.rec.holed = true
	}
	return true
}

// fits tells whether one more buffered message of cost bytes stays within the limits.
func (t *Tracker) fits(cost int) bool {
	return t.pend.len()+1 <= t.cfg.MaxMessages && t.pend.bytes+cost <= t.cfg.MaxBytes
}

// bufferLive keeps a live batch that arrived during recovery. It returns false when the
// recovery limits were exceeded and the source went stale.
func (t *Tracker) bufferLive(seq uint64, cost int, payload []byte) bool {
	if _, found := t.pend.search(seq); found {
		t.st.duplicates.Add(1)
		return true
	}
	if !t.fits(cost) {
		t.markStale(fmt.Sprintf("recovery buffer limit exceeded (%d messages, %d bytes buffered; limits %d, %d)",
			t.pend.len(), t.pend.bytes, t.cfg.MaxMessages, t.cfg.MaxBytes))
		return false
	}
	t.pend.insert(seq, cost, payload)
	return true
}

// Connected reports a (re)connection of the SUB socket. With replay, whatever was lost
// while disconnected is requested at once rather than when the next live batch shows
// the gap.
func (t *Tracker) Connected(now time.Time) []Action {
	t.begin()
	if !t.connectedOnce {
		t.connectedOnce = true
		if t.cfg.CatchUpOnStart && t.cfg.JoinCheck && !t.stale && !t.sawLive {
			t.join, t.joinAt = true, now.Add(t.cfg.JoinCheckDelay)
			t.driveJoinCheck(now)
		}
		return t.acts
	}
	t.st.reconnects.Add(1)
	t.reconnected = true
	t.log(slog.LevelInfo, "ZMQ publisher reconnected")
	if t.cfg.Replay && t.base && !t.stale && !t.rec.active {
		t.startRecovery(now)
	}
	return t.acts
}

// markStale is one-shot: it drops the recovery state and emits Stale.
func (t *Tracker) markStale(reason string) {
	if t.stale {
		return
	}
	t.stale = true
	t.join = false
	if t.rec.active {
		t.rec.active = false
		switch {
		case t.rec.catchUp:
			t.st.catchUpsFailed.Add(1)
		case t.rec.joinCheck:
			t.st.joinChecksFailed.Add(1)
		default:
			t.st.replaysFailed.Add(1)
		}
		t.rec.catchUp, t.rec.joinCheck = false, false
	}
	t.closeAttempt()
	t.pend.reset()
	t.log(slog.LevelWarn, "ZMQ source marked stale", "reason", reason, "next_seq", t.next)
	t.emit(Action{Kind: Stale, Reason: reason})
}
