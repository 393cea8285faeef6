package ingest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// A message over MaxMessageSize is refused by libzmq before it is allocated and the
// connection is dropped (libzmq would not reconnect after such a protocol error). The
// subscriber counts it, reopens its SUB socket, and recovers the lost batch through
// replay; the stream goes on.
func TestOversizeMessageCountedAndRecovered(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	// The replayed copy of the big batch is a small stand-in, so the gap can be closed.
	p.SetResponder(func(from uint64, send func(...[]byte) error) {
		p.ReplayFromRing(from, func(frames ...[]byte) error {
			if len(frames) == 3 && len(frames[2]) > 1024 {
				frames = [][]byte{frames[0], frames[1], []byte("small stand-in")}
			}
			return send(frames...)
		})
	})
	h := &recorder{}
	cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
	cfg.MaxMessageSize = 1024
	s := startSub(t, cfg, h, p)
	publish(t, p, "b0")
	waitUntil(t, "b0", func() bool { return s.Stats().Applied == 1 })
	if _, err := p.Publish(bytes.Repeat([]byte{1}, 64<<10)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "protocol error", func() bool { return s.Stats().ProtocolErrors == 1 })
	// The reopened socket subscribes again (WaitSubscribers counts every subscription).
	if err := p.WaitSubscribers(2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	publish(t, p, "b2")
	waitUntil(t, "recovery", func() bool { return s.Stats().Applied == 3 })
	if got := h.applied(); !equalSeqs(got, seqRange(0, 3)) {
		t.Fatalf("seqs = %v", got)
	}
	h.mu.Lock()
	if string(h.payloads[1]) != "small stand-in" {
		t.Errorf("payload 1 = %q", h.payloads[1])
	}
	h.mu.Unlock()
	st := s.Stats()
	if st.Stale || st.ProtocolErrors != 1 || st.RecvBufferBytes > recvBufInitial {
		t.Fatalf("stats = %+v", st)
	}
}

// Without replay the refused batch is a gap that cannot be closed: the source goes stale
// (never a silent hole), and nothing else breaks.
func TestOversizeMessageWithoutReplayGoesStale(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	cfg := fastConfig(p.Endpoint(), "")
	cfg.MaxMessageSize = 1024
	s := startSub(t, cfg, h, p)
	publish(t, p, "b0")
	waitUntil(t, "b0", func() bool { return s.Stats().Applied == 1 })
	if _, err := p.Publish(bytes.Repeat([]byte{1}, 4096)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "protocol error", func() bool { return s.Stats().ProtocolErrors == 1 })
	// The reopened socket subscribes again (WaitSubscribers counts every subscription).
	if err := p.WaitSubscribers(2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	publish(t, p, "b2")
	waitUntil(t, "stale", func() bool { return s.Stats().Stale })
	if got := h.applied(); !equalSeqs(got, []uint64{0}) {
		t.Fatalf("seqs = %v", got)
	}
	if r := h.staleReasons(); len(r) != 1 {
		t.Fatalf("stale reasons = %v", r)
	}
}

// A message under the limit but far above the usual size is received whole; the buffer
// it needed is given back once the subscriber is idle, and when a stream of small
// messages follows it.
func TestReceiveBufferShrinksAfterOutlier(t *testing.T) {
	for _, idle := range []bool{true, false} {
		t.Run(fmt.Sprintf("idle=%v", idle), func(t *testing.T) {
			p := newPub(t, zmqtest.Config{})
			h := &recorder{}
			s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
			big := bytes.Repeat([]byte{2}, 8<<20)
			if _, err := p.Publish(big); err != nil {
				t.Fatal(err)
			}
			if !idle {
				// Queue the small ones behind it, so the subscriber never goes idle
				// between them.
				for i := range recvShrinkAfter + 1 {
					publish(t, p, fmt.Sprintf("small %d", i))
				}
			}
			waitUntil(t, "big message", func() bool { return s.Stats().Applied >= 1 })
			h.mu.Lock()
			gotBig := bytes.Equal(h.payloads[0], big)
			h.mu.Unlock()
			if !gotBig {
				t.Fatal("big payload corrupted")
			}
			if idle {
				waitUntil(t, "shrink when idle", func() bool { return s.Stats().RecvBufferBytes == recvBufInitial })
			} else {
				waitUntil(t, "all", func() bool { return s.Stats().Applied == recvShrinkAfter+2 })
				if b := s.Stats().RecvBufferBytes; b > recvBufKeep {
					t.Fatalf("receive buffer still %d bytes", b)
				}
			}
		})
	}
}
