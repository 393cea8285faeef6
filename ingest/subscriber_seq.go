package ingest

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// seqState is the subscriber goroutine's view of the stream: what has been applied, what
// is buffered while a gap is being recovered, and the recovery in progress.
type seqState struct {
	replay  bool   // a replay endpoint is configured
	catchUp bool   // CatchUpOnStart, with replay
	base    bool   // the baseline is set: next is meaningful
	next    uint64 // next sequence number to apply
	hiNext  uint64 // highest sequence seen + 1; gaps are counted against it
	// liveTop is the highest sequence received live + 1 (0: none since the stream
	// began). Unlike next and hiNext it never moves for replayed batches, so a live
	// batch 0 that arrives after a catch-up replayed it is not taken for a restart.
	liveTop uint64
	stale   bool

	connectedOnce bool // the SUB has connected at least once
	reconnected   bool // it reconnected since the last batch was applied

	rec  recovery
	pend pendingBuf

	consumeLogAt      time.Time
	consumeSuppressed int
}

// recovery is one gap being closed through the replay endpoint, possibly over several
// attempts (each with a fresh DEALER, so replies to an abandoned attempt cannot mix in).
type recovery struct {
	active       bool
	from         uint64    // next when the recovery began (for logs)
	deadline     time.Time // ReplayRecoveryTimeout after the start
	retryAt      time.Time // when the next attempt may open
	recvDeadline time.Time // ReplayTimeout after the last reply of the open attempt
	attempts     int
	progress     bool // a replayed batch was applied
	// catchUp: a best-effort catch-up (CatchUpOnStart), not a gap. Until its first
	// replayed batch sets the baseline (base), it tolerates a replay that starts late
	// and ends without marking the source stale when it fails.
	catchUp bool
}

func (s *Subscriber) initSeq() {
	s.replay = s.cfg.ReplayEndpoint != ""
	s.catchUp = s.replay && s.cfg.CatchUpOnStart
}

// onLiveMessage validates the n-frame message in s.buf and hands it to live.
func (s *Subscriber) onLiveMessage(n int) {
	now := time.Now()
	s.st.received.Add(1)
	s.st.lastEvent.Store(now.UnixNano())
	if s.stale {
		return
	}
	if n != 3 {
		s.consumeError(now, "message has %d frames, want 3", n)
		return
	}
	if s.sizes[1] != 8 {
		s.consumeError(now, "sequence frame has %d bytes, want 8", s.sizes[1])
		return
	}
	off := s.sizes[0]
	seq := binary.BigEndian.Uint64(s.buf[off : off+8])
	if seq > math.MaxInt64 {
		s.consumeError(now, "sequence %d exceeds INT64_MAX", seq)
		return
	}
	end := off + 8 + s.sizes[2]
	// Capped, so a handler that appends to the payload cannot write into the buffer.
	s.live(now, seq, s.sizes[0], s.buf[off+8:end:end])
}

// consumeError counts a malformed live message and logs at most one line per second.
// The message is dropped and the SUB socket kept: the message was read whole, the stream
// behind it is intact, and a batch it hid still shows up as a sequence gap.
func (s *Subscriber) consumeError(now time.Time, format string, args ...any) {
	s.st.consumeErrors.Add(1)
	if now.Sub(s.consumeLogAt) < time.Second {
		s.consumeSuppressed++
		return
	}
	s.log.Warn("dropped malformed ZMQ message", "err", fmt.Sprintf(format, args...),
		"suppressed_since_last_log", s.consumeSuppressed)
	s.consumeLogAt = now
	s.consumeSuppressed = 0
}

// live handles one well-formed live batch.
func (s *Subscriber) live(now time.Time, seq uint64, topicLen int, payload []byte) {
	if s.base && seq < s.next {
		if !s.isRestart(seq) {
			s.st.duplicates.Add(1)
			return
		}
		s.restart(now, seq)
	}
	if !s.base && !s.rec.active {
		// The first message is the baseline (unless a catch-up, still looking for one,
		// buffers it); nothing before it is requested.
		s.base = true
		s.next, s.hiNext = seq, seq
	}
	if s.liveTop <= seq {
		s.liveTop = seq + 1
	}
	// While a catch-up has no baseline, gaps count only between live batches.
	if (s.base || s.pend.len() > 0) && seq > s.hiNext {
		missing := seq - s.hiNext
		s.st.gaps.Add(1)
		s.st.dropped.Add(missing)
		s.log.Warn("ZMQ sequence gap", "expected", s.hiNext, "got", seq, "missing", missing,
			"replay", s.replay)
	}
	if seq >= s.hiNext {
		s.hiNext = seq + 1
	}
	if s.rec.active {
		if !s.rec.catchUp || s.base || s.fits(topicLen+len(payload)) {
			s.bufferLive(seq, topicLen, payload)
			return
		}
		// A catch-up that would overflow the buffer before it found a baseline is
		// given up: the buffered live batches become the stream, as without catch-up.
		s.catchUpFailed(fmt.Sprintf("recovery buffer limit reached (%d messages, %d bytes buffered)",
			s.pend.len(), s.pend.bytes))
		if s.stale {
			return
		}
		if !s.base {
			s.base = true
			s.next, s.hiNext = seq, seq+1
		}
		if s.rec.active {
			s.bufferLive(seq, topicLen, payload)
			return
		}
		if seq < s.next {
			s.st.duplicates.Add(1)
			return
		}
	}
	if seq == s.next {
		s.apply(seq, payload)
		return
	}
	if !s.replay {
		s.markStale(fmt.Sprintf("sequence gap: expected %d, got %d (no replay endpoint)", s.next, seq))
		return
	}
	if s.bufferLive(seq, topicLen, payload) {
		s.startRecovery(now)
	}
}

// isRestart tells a restarted publisher (its sequence starts again at 0) from a duplicate.
// Sequence 0 after later ones can only come from a new publisher process; any older
// sequence right after the SUB reconnected is also taken as one, because the first
// batches of a new publisher are often sent before the SUB has reconnected.
func (s *Subscriber) isRestart(seq uint64) bool {
	if seq == 0 && s.next >= 2 && s.liveTop >= 2 {
		return true
	}
	if !s.reconnected && s.z != nil {
		// The connect event may still be queued behind the message that revealed it.
		s.drainMonitor()
	}
	return s.reconnected
}

// restart re-baselines on a publisher restart. With replay (vLLM, SGLang: sequences start
// at 0 per process) the new stream is expected from 0, so batches it sent before the SUB
// reconnected count as a gap and are replayed; with CatchUpOnStart they are caught up
// instead, so that a new publisher whose ring no longer reaches 0 does not make the
// source stale (the handler has just dropped the old publisher's state, so the lost
// start can only under-report). Without replay the first batch seen is the new
// baseline, as at startup: the Mooncake master numbers from 1, so a missing start cannot
// be told from a stream that begins there.
func (s *Subscriber) restart(now time.Time, seq uint64) {
	last := s.next - 1
	s.st.restarts.Add(1)
	s.log.Warn("ZMQ publisher restarted (sequence reset)", "last_seq", last, "seq", seq)
	if s.rec.active {
		s.rec.active, s.rec.catchUp = false, false
		s.z.closeDealer()
		s.log.Info("replay recovery abandoned after publisher restart")
	}
	s.pend.reset()
	s.next, s.hiNext = seq, seq
	if s.replay {
		s.next, s.hiNext = 0, 0
	}
	s.liveTop = 0
	s.reconnected = false
	if s.rh != nil {
		s.rh.OnPublisherRestart(last, seq)
	}
	if s.catchUp {
		s.base = false
		s.startCatchUp(now)
	}
}

// apply hands one batch to the handler; a rejection marks the source stale without
// advancing.
func (s *Subscriber) apply(seq uint64, payload []byte) bool {
	if err := s.h.HandleBatch(seq, payload); err != nil {
		s.st.rejected.Add(1)
		s.markStale(fmt.Sprintf("batch %d rejected: %v", seq, err))
		return false
	}
	s.st.applied.Add(1)
	s.next = seq + 1
	s.reconnected = false
	return true
}

// fits tells whether one more buffered message of cost bytes stays within the limits.
func (s *Subscriber) fits(cost int) bool {
	return s.pend.len()+1 <= s.cfg.MaxRecoveryMessages && s.pend.bytes+cost <= s.cfg.MaxRecoveryBytes
}

// bufferLive keeps a live batch that arrived during recovery. It returns false when the
// recovery limits were exceeded and the source went stale.
func (s *Subscriber) bufferLive(seq uint64, topicLen int, payload []byte) bool {
	if _, found := s.pend.search(seq); found {
		s.st.duplicates.Add(1)
		return true
	}
	cost := topicLen + len(payload)
	if !s.fits(cost) {
		s.markStale(fmt.Sprintf("recovery buffer limit exceeded (%d messages, %d bytes buffered; limits %d, %d)",
			s.pend.len(), s.pend.bytes, s.cfg.MaxRecoveryMessages, s.cfg.MaxRecoveryBytes))
		return false
	}
	s.pend.insert(seq, cost, payload)
	return true
}

// startRecovery begins closing the gap between s.next and the first buffered batch (or,
// after a reconnect with nothing buffered, whatever the publisher has from s.next on).
func (s *Subscriber) startRecovery(now time.Time) {
	s.rec = recovery{
		active:   true,
		from:     s.next,
		deadline: now.Add(s.cfg.ReplayRecoveryTimeout),
		retryAt:  now,
	}
	until, bounded := s.pend.min()
	if bounded {
		s.log.Info("replay recovery started", "from", s.next, "until", until)
	} else {
		s.log.Info("replay recovery started", "from", s.next, "until", "end of publisher buffer")
	}
	s.driveRecovery(now)
}

// startCatchUp asks for everything the publisher still buffers (from s.next, 0 before
// any baseline), without waiting for a live batch. Live batches are buffered meanwhile,
// as during a gap recovery.
func (s *Subscriber) startCatchUp(now time.Time) {
	s.rec = recovery{
		active:   true,
		catchUp:  true,
		from:     s.next,
		deadline: now.Add(s.cfg.ReplayRecoveryTimeout),
		retryAt:  now,
	}
	s.log.Info("catch-up started", "from", s.next)
	s.driveRecovery(now)
}

// catchUpFailed ends a catch-up that found no baseline, without marking the source
// stale: the buffered live batches, if any, become the stream, and otherwise the next
// live batch is the baseline, as without catch-up.
func (s *Subscriber) catchUpFailed(reason string) {
	s.z.closeDealer()
	s.rec.active, s.rec.catchUp = false, false
	s.st.catchUpsFailed.Add(1)
	s.log.Warn("catch-up failed; continuing from the live stream", "err", reason, "attempts", s.rec.attempts)
	if until, ok := s.pend.min(); ok {
		s.base = true
		s.next, s.hiNext = until, max(s.hiNext, until)
		s.flush()
	}
}

// driveRecovery enforces the recovery deadline and opens or times out attempts.
func (s *Subscriber) driveRecovery(now time.Time) {
	if !s.rec.active {
		return
	}
	if !now.Before(s.rec.deadline) {
		if s.rec.catchUp && !s.base {
			s.catchUpFailed(fmt.Sprintf("deadline %v exceeded", s.cfg.ReplayRecoveryTimeout))
			return
		}
		until, _ := s.pend.min()
		s.markStale(fmt.Sprintf("replay recovery deadline exceeded after %d attempts (next %d, live boundary %d)",
			s.rec.attempts, s.next, until))
		return
	}
	if !s.z.hasDealer() {
		if now.Before(s.rec.retryAt) {
			return
		}
		s.rec.attempts++
		if err := s.z.openDealer(s.cfg.ReplayEndpoint); err != nil {
			s.attemptFailed(now, err.Error())
			return
		}
		if err := s.z.sendReplay(s.next); err != nil {
			s.attemptFailed(now, err.Error())
			return
		}
		s.rec.recvDeadline = now.Add(s.cfg.ReplayTimeout)
		return
	}
	if !now.Before(s.rec.recvDeadline) {
		s.attemptFailed(now, fmt.Sprintf("no replay reply within %v", s.cfg.ReplayTimeout))
	}
}

// attemptFailed drops the current attempt; another opens after ReconnectDelay, until
// the recovery deadline. A catch-up is not retried: before its baseline it ends, after
// it (replayed batches applied) the rest of the window must be closed, so it carries on
// as a strict gap recovery.
func (s *Subscriber) attemptFailed(now time.Time, reason string) {
	if s.rec.active && s.rec.catchUp {
		if !s.base {
			s.catchUpFailed(reason)
			return
		}
		s.rec.catchUp = false
		s.st.catchUpsFailed.Add(1)
		s.log.Warn("catch-up interrupted after replayed batches; recovering the rest as a gap",
			"next", s.next, "err", reason)
	}
	s.z.closeDealer()
	s.st.replayRetries.Add(1)
	s.rec.retryAt = now.Add(s.cfg.ReconnectDelay)
	s.log.Warn("replay attempt failed", "attempt", s.rec.attempts, "next", s.next, "err", reason)
}

// dropAttempt closes the open attempt without counting it, so that it reopens at once.
func (s *Subscriber) dropAttempt() {
	if s.z.hasDealer() {
		s.z.closeDealer()
		s.rec.retryAt = time.Now()
	}
}

// waitFor is how long the next poll may block: PollTimeout, or less when a replay timer
// is due sooner.
func (s *Subscriber) waitFor(now time.Time) time.Duration {
	d := s.cfg.PollTimeout
	if !s.discAt.IsZero() {
		d = min(d, s.discAt.Add(protocolErrorGrace).Sub(now))
	}
	if s.rec.active {
		d = min(d, s.rec.deadline.Sub(now))
		if s.z.hasDealer() {
			d = min(d, s.rec.recvDeadline.Sub(now))
		} else {
			d = min(d, s.rec.retryAt.Sub(now))
		}
	}
	return max(d, 0)
}

// onReplayMessage validates one reply of the open attempt: ["", seq, payload] or
// ["", topic, seq, payload]. Malformed replies fail the attempt, which is retried.
func (s *Subscriber) onReplayMessage(n int) {
	if !s.rec.active || s.stale {
		return
	}
	now := time.Now()
	s.rec.recvDeadline = now.Add(s.cfg.ReplayTimeout)
	if n != 3 && n != 4 {
		s.attemptFailed(now, fmt.Sprintf("malformed replay reply: %d frames, want 3 or 4", n))
		return
	}
	if s.sizes[0] != 0 {
		s.attemptFailed(now, "malformed replay reply: first frame is not the empty delimiter")
		return
	}
	off := 0
	for i := range n - 2 {
		off += s.sizes[i]
	}
	if s.sizes[n-2] != 8 {
		s.attemptFailed(now, fmt.Sprintf("malformed replay reply: sequence frame has %d bytes, want 8", s.sizes[n-2]))
		return
	}
	seq := binary.BigEndian.Uint64(s.buf[off : off+8])
	end := off + 8 + s.sizes[n-1]
	payload := s.buf[off+8 : end : end]
	switch {
	case seq == math.MaxUint64 && len(payload) == 0:
		s.onReplayEnd()
	case seq > math.MaxInt64:
		s.attemptFailed(now, fmt.Sprintf("malformed replay reply: sequence %d exceeds INT64_MAX", seq))
	default:
		s.onReplayBatch(seq, payload)
	}
}

// onReplayBatch applies replayed batches below the live boundary, in order, once each.
func (s *Subscriber) onReplayBatch(seq uint64, payload []byte) {
	if s.rec.catchUp && !s.base {
		// The first batch of a catch-up sets the baseline, wherever the publisher's ring
		// starts; when the live stream is already buffered from an older batch, that is
		// where the stream starts.
		s.base = true
		until, bounded := s.pend.min()
		if bounded && seq >= until {
			s.next = until
			s.finishRecovery()
			return
		}
		s.next = seq
		if seq > s.rec.from {
			s.log.Info("catch-up starts after the requested sequence: older batches are no longer buffered",
				"requested", s.rec.from, "first", seq)
		}
	}
	if seq < s.next {
		s.st.duplicates.Add(1)
		return
	}
	until, bounded := s.pend.min()
	if bounded && seq >= until && s.next == until {
		s.finishRecovery()
		return
	}
	if seq != s.next {
		s.markStale(fmt.Sprintf("replay skipped sequence: expected %d, got %d", s.next, seq))
		return
	}
	if !s.apply(seq, payload) {
		return
	}
	s.rec.progress = true
	if bounded && s.next == until {
		// Replies at or past the live boundary are not needed: closing the DEALER
		// discards them, and the boundary is applied once, from the buffer.
		s.finishRecovery()
	}
}

// onReplayEnd handles the end marker: the publisher has nothing more after what it sent.
func (s *Subscriber) onReplayEnd() {
	until, bounded := s.pend.min()
	if s.rec.catchUp {
		// Nothing replayed: the buffered live batches (or the next one) start the stream.
		// Live batches missing after the replayed ones (sent after the publisher read
		// its ring, before the SUB had joined) are recovered strictly by the flush.
		if !s.base && bounded {
			s.base = true
			s.next = until
		}
		s.finishRecovery()
		return
	}
	if !bounded || s.next >= until {
		s.finishRecovery()
		return
	}
	if !s.rec.progress {
		s.markStale(fmt.Sprintf("replay completed without progress: publisher has no batch %d (live boundary %d)",
			s.next, until))
		return
	}
	s.markStale(fmt.Sprintf("replay buffer did not contain every missing sequence (next %d, live boundary %d)",
		s.next, until))
}

// finishRecovery closes the attempt and applies the buffered live batches.
func (s *Subscriber) finishRecovery() {
	s.z.closeDealer()
	s.rec.active = false
	// An unbounded replay (after a reconnect, or a catch-up) may apply past every live
	// batch seen; later live batches are not gaps for that.
	s.hiNext = max(s.hiNext, s.next)
	if !s.rec.catchUp {
		s.st.replaysOK.Add(1)
		s.log.Info("replay recovery complete", "from", s.rec.from, "next", s.next, "attempts", s.rec.attempts)
		s.flush()
		return
	}
	s.rec.catchUp = false
	s.st.catchUps.Add(1)
	s.log.Info("catch-up complete", "from", s.rec.from, "next", s.next, "baseline", s.base)
	if s.base {
		if until, ok := s.pend.min(); ok && until > s.next {
			// Published after the ring was read but before the SUB had joined: a gap in
			// the established window, recovered strictly by flush.
			missing := until - s.next
			s.st.gaps.Add(1)
			s.st.dropped.Add(missing)
			s.log.Warn("ZMQ sequence gap after catch-up", "expected", s.next, "got", until, "missing", missing)
		}
	}
	s.flush()
}

// flush applies buffered batches while they are contiguous; a hole among them (a second
// gap that opened during recovery) starts another recovery.
func (s *Subscriber) flush() {
	for s.pend.len() > 0 {
		m := s.pend.first()
		switch {
		case m.seq < s.next:
			s.st.duplicates.Add(1)
		case m.seq > s.next:
			s.startRecovery(time.Now())
			return
		default:
			if !s.apply(m.seq, s.pend.payload(m)) {
				return
			}
		}
		s.pend.pop()
	}
}

// onReconnect notes a new SUB connection. With replay, whatever was lost while
// disconnected is requested at once rather than when the next live batch shows the gap.
func (s *Subscriber) onReconnect() {
	s.st.reconnects.Add(1)
	s.reconnected = true
	s.log.Info("ZMQ publisher reconnected")
	if s.replay && s.base && !s.stale && !s.rec.active {
		s.startRecovery(time.Now())
	}
}

// markStale is one-shot: it drops the recovery state and tells the handler.
func (s *Subscriber) markStale(reason string) {
	if s.stale {
		return
	}
	s.stale = true
	if s.rec.active {
		s.rec.active = false
		if s.rec.catchUp {
			s.st.catchUpsFailed.Add(1)
		} else {
			s.st.replaysFailed.Add(1)
		}
		s.rec.catchUp = false
	}
	if s.z != nil {
		s.z.closeDealer()
	}
	s.pend.reset()
	s.log.Warn("ZMQ source marked stale", "reason", reason, "next_seq", s.next)
	s.h.OnStale(reason)
	// Published after OnStale, so a caller that sees Stale knows the handler has been told.
	s.st.stale.Store(true)
}

// pendingBuf holds live batches, ordered by sequence, while a gap is recovered. Payloads
// are copied into one arena that is reused, so buffering allocates nothing once warm.
type pendingBuf struct {
	msgs  []pendingMsg
	head  int
	arena []byte
	bytes int // topic + payload bytes, the quantity the byte limit applies to
}

type pendingMsg struct {
	seq    uint64
	off, n int
	cost   int
}

// Above these capacities a drained buffer is released instead of kept for reuse.
const (
	pendingKeepArena = 8 << 20
	pendingKeepMsgs  = 1 << 16
)

func (p *pendingBuf) len() int { return len(p.msgs) - p.head }

func (p *pendingBuf) min() (uint64, bool) {
	if p.len() == 0 {
		return 0, false
	}
	return p.msgs[p.head].seq, true
}

func (p *pendingBuf) first() pendingMsg { return p.msgs[p.head] }

func (p *pendingBuf) payload(m pendingMsg) []byte { return p.arena[m.off : m.off+m.n : m.off+m.n] }

// search returns the index in msgs where seq is or would be inserted.
func (p *pendingBuf) search(seq uint64) (int, bool) {
	lo, hi := p.head, len(p.msgs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if p.msgs[mid].seq < seq {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(p.msgs) && p.msgs[lo].seq == seq
}

// insert copies payload in; the caller has checked for duplicates and limits.
func (p *pendingBuf) insert(seq uint64, cost int, payload []byte) {
	m := pendingMsg{seq: seq, off: len(p.arena), n: len(payload), cost: cost}
	p.arena = append(p.arena, payload...)
	p.bytes += cost
	if p.len() == 0 || seq > p.msgs[len(p.msgs)-1].seq {
		p.msgs = append(p.msgs, m)
		return
	}
	i, _ := p.search(seq)
	p.msgs = append(p.msgs, pendingMsg{})
	copy(p.msgs[i+1:], p.msgs[i:])
	p.msgs[i] = m
}

func (p *pendingBuf) pop() {
	p.bytes -= p.msgs[p.head].cost
	p.head++
	if p.head == len(p.msgs) {
		p.reset()
	}
}

func (p *pendingBuf) reset() {
	p.msgs, p.arena = p.msgs[:0], p.arena[:0]
	p.head, p.bytes = 0, 0
	if cap(p.arena) > pendingKeepArena {
		p.arena = nil
	}
	if cap(p.msgs) > pendingKeepMsgs {
		p.msgs = nil
	}
}
