package seqtrack

import (
	"fmt"
	"log/slog"
	"math"
	"time"
)

// Recovery: closing a gap (or catching up) through the publisher's replay endpoint, one
// attempt at a time, within the recovery deadline.

// startRecovery begins closing the gap between next and the first buffered batch (or,
// after a reconnect with nothing buffered, whatever the publisher has from next on).
func (t *Tracker) startRecovery(now time.Time) {
	t.rec = recovery{
		active:   true,
		from:     t.next,
		deadline: now.Add(t.cfg.RecoveryTimeout),
		retryAt:  now,
	}
	if until, bounded := t.pend.min(); bounded {
		t.log(slog.LevelInfo, "replay recovery started", "from", t.next, "until", until)
	} else {
		t.log(slog.LevelInfo, "replay recovery started", "from", t.next, "until", "end of publisher buffer")
	}
	t.driveRecovery(now)
}

// startCatchUp asks for everything the publisher still buffers (from next, 0 before any
// baseline), without waiting for a live batch. Live batches are buffered meanwhile, as
// during a gap recovery.
func (t *Tracker) startCatchUp(now time.Time) {
	t.rec = recovery{
		active:   true,
		catchUp:  true,
		from:     t.next,
		deadline: now.Add(t.cfg.RecoveryTimeout),
		retryAt:  now,
	}
	t.log(slog.LevelInfo, "catch-up started", "from", t.next)
	t.driveRecovery(now)
}

// catchUpFailed ends a catch-up that found no baseline, without marking the source
// stale: the buffered live batches, if any, become the stream, and otherwise the next
// live batch is the baseline, as without catch-up.
func (t *Tracker) catchUpFailed(now time.Time, reason string) {
	t.closeAttempt()
	t.rec.active, t.rec.catchUp = false, false
	t.st.catchUpsFailed.Add(1)
	t.log(slog.LevelWarn, "catch-up failed; continuing from the live stream", "err", reason, "attempts", t.rec.attempts)
	if until, ok := t.pend.min(); ok {
		t.base = true
		t.next, t.hiNext = until, max(t.hiNext, until)
		t.flush(now)
	}
}

// Tick enforces the recovery deadline and opens or times out attempts.
func (t *Tracker) Tick(now time.Time) []Action {
	t.begin()
	if !t.stale {
		t.driveRecovery(now)
		t.driveJoinCheck(now)
	}
	return t.acts
}

// driveJoinCheck starts the pending join check once it is due and no recovery runs. It
// needs a completed catch-up (which shows that the replay endpoint answers); with a
// baseline it is an unbounded recovery from next, without one (the ring was empty and no
// live batch came) another catch-up.
func (t *Tracker) driveJoinCheck(now time.Time) {
	if !t.join || t.rec.active || now.Before(t.joinAt) {
		return
	}
	t.join = false
	if t.st.catchUps.Load() == 0 { // no completed catch-up: the replay endpoint never answered
		return
	}
	if !t.base {
		t.startCatchUp(now)
		return
	}
	t.rec = recovery{
		active:    true,
		joinCheck: true,
		from:      t.next,
		deadline:  now.Add(t.cfg.RecoveryTimeout),
		retryAt:   now,
	}
	t.log(slog.LevelInfo, "join check started: batches published while the subscription joined", "from", t.next)
	t.driveRecovery(now)
}

func (t *Tracker) driveRecovery(now time.Time) {
	if !t.rec.active {
		return
	}
	if !now.Before(t.rec.deadline) {
		if t.rec.catchUp && !t.base {
			t.catchUpFailed(now, fmt.Sprintf("deadline %v exceeded", t.cfg.RecoveryTimeout))
			return
		}
		until, bounded := t.pend.min()
		if t.rec.joinCheck && (!bounded || t.next >= until) {
			// No live batch shows that anything is missing: best effort, as the catch-up.
			t.closeAttempt()
			t.rec.active, t.rec.joinCheck = false, false
			t.st.joinChecksFailed.Add(1)
			t.log(slog.LevelWarn, "join check failed; continuing from the live stream", "next", t.next,
				"attempts", t.rec.attempts)
			t.flush(now)
			return
		}
		reason := fmt.Sprintf("replay recovery deadline exceeded after %d attempts (next %d, live boundary %d)",
			t.rec.attempts, t.next, until)
		if !bounded || t.next >= until {
			// Nothing bounds what is lost (a recovery after a reconnect): no hole to offer.
			t.markStale(reason)
			return
		}
		if t.skip(until, reason) {
			t.finishRecovery(now)
		}
		return
	}
	if !t.rec.open {
		if now.Before(t.rec.retryAt) {
			return
		}
		t.rec.attempts++
		t.rec.open = true
		t.rec.recvDeadline = now.Add(t.cfg.ReplayTimeout)
		t.emit(Action{Kind: OpenReplay, Seq: t.next})
		return
	}
	if !now.Before(t.rec.recvDeadline) {
		t.attemptFailed(now, fmt.Sprintf("no replay reply within %v", t.cfg.ReplayTimeout))
	}
}

// ReplayFailed reports that the open attempt failed: it could not be opened or its
// request sent, a reply was malformed, or its socket failed.
func (t *Tracker) ReplayFailed(now time.Time, reason string) []Action {
	t.begin()
	if !t.stale && t.rec.active && t.rec.open {
		t.attemptFailed(now, reason)
	}
	return t.acts
}

// attemptFailed drops the current attempt; another opens after RetryDelay, until the
// recovery deadline. A catch-up is not retried: before its baseline it ends, after it
// (replayed batches applied) the rest of the window must be closed, so it carries on as
// a strict gap recovery.
func (t *Tracker) attemptFailed(now time.Time, reason string) {
	if t.rec.active && t.rec.catchUp {
		if !t.base {
			t.catchUpFailed(now, reason)
			return
		}
		t.rec.catchUp = false
		t.st.catchUpsFailed.Add(1)
		t.log(slog.LevelWarn, "catch-up interrupted after replayed batches; recovering the rest as a gap",
			"next", t.next, "err", reason)
	}
	t.closeAttempt()
	t.st.replayRetries.Add(1)
	t.rec.retryAt = now.Add(t.cfg.RetryDelay)
	t.log(slog.LevelWarn, "replay attempt failed", "attempt", t.rec.attempts, "next", t.next, "err", reason)
}

// DropAttempt closes the open attempt without counting it, so that it reopens at once
// (the owner's sockets failed and are reopened).
func (t *Tracker) DropAttempt(now time.Time) []Action {
	t.begin()
	if t.rec.open {
		t.closeAttempt()
		t.rec.retryAt = now
	}
	return t.acts
}

func (t *Tracker) closeAttempt() {
	if t.rec.open {
		t.rec.open = false
		t.emit(Action{Kind: CloseReplay})
	}
}

// ReplayBatch handles one replayed batch of the open attempt.
func (t *Tracker) ReplayBatch(now time.Time, seq uint64, payload []byte) []Action {
	t.begin()
	if !t.rec.active || !t.rec.open || t.stale {
		return t.acts
	}
	t.rec.recvDeadline = now.Add(t.cfg.ReplayTimeout)
	if seq > math.MaxInt64 {
		t.attemptFailed(now, fmt.Sprintf("malformed replay reply: sequence %d exceeds INT64_MAX", seq))
		return t.acts
	}
	t.replayBatch(now, seq, payload)
	return t.acts
}

// replayBatch applies replayed batches below the live boundary, in order, once each.
func (t *Tracker) replayBatch(now time.Time, seq uint64, payload []byte) {
	if t.rec.catchUp && !t.base {
		// The first batch of a catch-up sets the baseline, wherever the publisher's ring
		// starts; when the live stream is already buffered from an older batch, that is
		// where the stream starts.
		t.base = true
		until, bounded := t.pend.min()
		if bounded && seq >= until {
			t.next = until
			t.finishRecovery(now)
			return
		}
		t.next = seq
		if seq > t.rec.from {
			t.log(slog.LevelInfo, "catch-up starts after the requested sequence: older batches are no longer buffered",
				"requested", t.rec.from, "first", seq)
		}
	}
	if seq < t.next {
		t.st.duplicates.Add(1)
		return
	}
	until, bounded := t.pend.min()
	if bounded && seq >= until && t.next == until {
		t.finishRecovery(now)
		return
	}
	if seq != t.next {
		end := seq
		if bounded && until < end {
			end = until
		}
		if !t.skip(end, fmt.Sprintf("replay skipped sequence: expected %d, got %d", t.next, seq)) {
			return
		}
		if bounded && t.next == until {
			t.finishRecovery(now)
			return
		}
	}
	t.apply(seq, payload)
	t.rec.progress = true
	t.rec.replayed++
	if bounded && t.next == until {
		// Replies at or past the live boundary are not needed: closing the DEALER
		// discards them, and the boundary is applied once, from the buffer.
		t.finishRecovery(now)
	}
}

// ReplayEnd handles the end marker: the publisher has nothing more after what it sent.
func (t *Tracker) ReplayEnd(now time.Time) []Action {
	t.begin()
	if !t.rec.active || !t.rec.open || t.stale {
		return t.acts
	}
	t.rec.recvDeadline = now.Add(t.cfg.ReplayTimeout)
	until, bounded := t.pend.min()
	if t.rec.catchUp {
		// Nothing replayed: the buffered live batches (or the next one) start the stream.
		// Live batches missing after the replayed ones (sent after the publisher read
		// its ring, before the SUB had joined) are recovered strictly by the flush.
		if !t.base && bounded {
			t.base = true
			t.next = until
		}
		t.finishRecovery(now)
		return t.acts
	}
	switch {
	case !bounded || t.next >= until:
		t.finishRecovery(now)
	case !t.rec.progress:
		if t.skip(until, fmt.Sprintf("replay completed without progress: publisher has no batch %d (live boundary %d)",
			t.next, until)) {
			t.finishRecovery(now)
		}
	default:
		if t.skip(until, fmt.Sprintf("replay buffer did not contain every missing sequence (next %d, live boundary %d)",
			t.next, until)) {
			t.finishRecovery(now)
		}
	}
	return t.acts
}

// finishRecovery closes the attempt and applies the buffered live batches.
func (t *Tracker) finishRecovery(now time.Time) {
	t.closeAttempt()
	t.rec.active = false
	// An unbounded replay (after a reconnect, or a catch-up) may apply past every live
	// batch seen; later live batches are not gaps for that.
	t.hiNext = max(t.hiNext, t.next)
	if t.rec.joinCheck {
		t.rec.joinCheck = false
		// Counted last: a reader that sees the check done sees its gap counts too.
		defer t.st.joinChecks.Add(1)
		if missing := t.rec.replayed; missing > 0 {
			// Never received live: count them as a gap, recovered.
			t.st.gaps.Add(1)
			t.st.dropped.Add(missing)
			t.log(slog.LevelWarn, "join check recovered batches published while the subscription joined",
				"from", t.rec.from, "next", t.next, "missing", missing)
		} else {
			t.log(slog.LevelInfo, "join check complete: nothing was missed", "next", t.next)
		}
		t.flush(now)
		return
	}
	if !t.rec.catchUp {
		if t.rec.holed {
			// Not counted as closed: its lost batches went to the handler as a hole.
			t.log(slog.LevelInfo, "replay recovery ended past a hole", "from", t.rec.from, "next", t.next, "attempts", t.rec.attempts)
		} else {
			t.st.replaysOK.Add(1)
			t.log(slog.LevelInfo, "replay recovery complete", "from", t.rec.from, "next", t.next, "attempts", t.rec.attempts)
		}
		t.flush(now)
		return
	}
	t.rec.catchUp = false
	t.st.catchUps.Add(1)
	t.log(slog.LevelInfo, "catch-up complete", "from", t.rec.from, "next", t.next, "baseline", t.base)
	if t.base {
		if until, ok := t.pend.min(); ok && until > t.next {
			// Published after the ring was read but before the SUB had joined: a gap in
			// the established window, recovered strictly by flush.
			missing := until - t.next
			t.st.gaps.Add(1)
			t.st.dropped.Add(missing)
			t.log(slog.LevelWarn, "ZMQ sequence gap after catch-up", "expected", t.next, "got", until, "missing", missing)
		}
	}
	t.flush(now)
}

// flush applies buffered batches while they are contiguous; a hole among them (a second
// gap that opened during recovery) starts another recovery at now.
func (t *Tracker) flush(now time.Time) {
	for t.pend.len() > 0 {
		m := t.pend.first()
		switch {
		case m.seq < t.next:
			t.st.duplicates.Add(1)
		case m.seq > t.next:
			t.startRecovery(now)
			return
		default:
			t.apply(m.seq, t.pend.payload(m))
		}
		t.pend.pop()
	}
}
