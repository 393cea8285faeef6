package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/conductor-go/conductor/ingest/seqtrack"
)

// This file ties the sequence tracker (package seqtrack: every rule about order, gaps,
// replay and staleness) to the sockets and the handler: it validates the frames of a
// message, hands the tracker what arrived, and carries out the actions it answers with.

func (s *Subscriber) newTracker() *seqtrack.Tracker {
	return seqtrack.New(seqtrack.Config{
		Replay:          s.cfg.ReplayEndpoint != "",
		CatchUpOnStart:  s.cfg.CatchUpOnStart,
		ReplayTimeout:   s.cfg.ReplayTimeout,
		RecoveryTimeout: s.cfg.ReplayRecoveryTimeout,
		RetryDelay:      s.cfg.ReconnectDelay,
		MaxMessages:     s.cfg.MaxRecoveryMessages,
		MaxBytes:        s.cfg.MaxRecoveryBytes,
		JoinCheck:       s.cfg.JoinCheckDelay >= 0,
		JoinCheckDelay:  s.cfg.JoinCheckDelay,
		Holes:           s.hh != nil,
	})
}

// do carries out the tracker's actions in order. A rejected batch or a refused hole ends
// the list (the tracker is told, and marks the source stale); a replay attempt that
// cannot be opened is reported once the rest is done.
func (s *Subscriber) do(acts []seqtrack.Action) {
	replayErr := ""
	for i := range acts {
		a := &acts[i]
		switch a.Kind {
		case seqtrack.Apply:
			if err := s.handle(a.Seq, a.Payload); err != nil {
				if errors.Is(err, ErrSourceStale) {
					s.handlerStale = true // it knows: no OnStale
					s.do(s.tr.StaleAt(a.Seq, err.Error()))
					return
				}
				s.st.rejected.Add(1)
				s.do(s.tr.Rejected(a.Seq, err))
				return
			}
			if s.bh != nil {
				s.deferred++ // counted in Applied once flushed
			} else {
				s.st.applied.Add(1)
			}
		case seqtrack.OpenReplay:
			if err := s.openAttempt(a.Seq); err != nil {
				replayErr = err.Error()
			}
		case seqtrack.CloseReplay:
			s.z.CloseDealer()
		case seqtrack.Stale:
			if !s.handlerStale {
				s.h.OnStale(a.Reason)
			}
			// Published after OnStale, so a caller that sees Stale knows the handler has
			// been told.
			s.st.stale.Store(true)
		case seqtrack.Restarted:
			if s.rh != nil {
				s.rh.OnPublisherRestart(a.Last, a.Seq)
			}
		case seqtrack.Hole:
			if s.hh == nil || !s.hh.OnHole(a.Seq, a.Last, a.Reason) {
				s.do(s.tr.StaleAt(a.Seq, a.Reason))
				return
			}
			s.st.holesTaken.Add(1)
			s.log.Info("hole taken: the handler holds the lost batches from elsewhere", "first", a.Seq, "last", a.Last)
		case seqtrack.Log:
			s.log.Log(context.Background(), a.Level, a.Msg, a.Attrs...)
		}
	}
	if replayErr != "" {
		s.do(s.tr.ReplayFailed(time.Now(), replayErr))
	}
}

// handle hands one batch to the handler: deferred to the end of the burst when it can.
func (s *Subscriber) handle(seq uint64, payload []byte) error {
	if s.bh != nil {
		return s.bh.HandleBatchDeferred(seq, payload)
	}
	return s.h.HandleBatch(seq, payload)
}

// openAttempt opens a fresh DEALER and asks for every batch from from on.
func (s *Subscriber) openAttempt(from uint64) error {
	s.z.CloseDealer()
	if err := s.z.OpenDealer(s.cfg.ReplayEndpoint); err != nil {
		return err
	}
	if err := s.z.SendReplay(from); err != nil {
		s.z.CloseDealer()
		return err
	}
	return nil
}

// onLiveMessage validates the n-frame message in s.buf and hands it to the tracker.
func (s *Subscriber) onLiveMessage(n int) {
	now := time.Now()
	s.st.received.Add(1)
	s.st.lastEvent.Store(now.UnixNano())
	if s.tr.Stale() {
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
	if s.tr.NeedsConnectCheck(seq) {
		// Older than expected: a duplicate, unless the SUB reconnected to a restarted
		// publisher, whose connect event may still be queued behind this message.
		s.drainMonitor()
	}
	// Capped, so a handler that appends to the payload cannot write into the buffer.
	s.do(s.tr.Live(now, seq, s.sizes[0]+s.sizes[2], s.buf[off+8:end:end]))
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

// onReplayMessage validates one reply of the open attempt: ["", seq, payload] or
// ["", topic, seq, payload]. Malformed replies fail the attempt, which is retried.
func (s *Subscriber) onReplayMessage(n int) {
	if !s.tr.AttemptOpen() || s.tr.Stale() {
		return
	}
	now := time.Now()
	if n != 3 && n != 4 {
		s.do(s.tr.ReplayFailed(now, fmt.Sprintf("malformed replay reply: %d frames, want 3 or 4", n)))
		return
	}
	if s.sizes[0] != 0 {
		s.do(s.tr.ReplayFailed(now, "malformed replay reply: first frame is not the empty delimiter"))
		return
	}
	off := 0
	for i := range n - 2 {
		off += s.sizes[i]
	}
	if s.sizes[n-2] != 8 {
		s.do(s.tr.ReplayFailed(now, fmt.Sprintf("malformed replay reply: sequence frame has %d bytes, want 8", s.sizes[n-2])))
		return
	}
	seq := binary.BigEndian.Uint64(s.buf[off : off+8])
	end := off + 8 + s.sizes[n-1]
	payload := s.buf[off+8 : end : end]
	if seq == math.MaxUint64 && len(payload) == 0 {
		s.do(s.tr.ReplayEnd(now))
		return
	}
	s.do(s.tr.ReplayBatch(now, seq, payload))
}

// waitFor is how long the next poll may block: PollTimeout, or less when a timer (the
// tracker's, or the protocol-error grace) is due sooner.
func (s *Subscriber) waitFor(now time.Time) time.Duration {
	d := s.cfg.PollTimeout
	if !s.discAt.IsZero() {
		d = min(d, s.discAt.Add(protocolErrorGrace).Sub(now))
	}
	if at, ok := s.tr.Deadline(); ok {
		d = min(d, at.Sub(now))
	}
	return max(d, 0)
}
