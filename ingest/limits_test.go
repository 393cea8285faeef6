package ingest

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/fdtest"
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
	if got := h.applied(); !slices.Equal(got, seqRange(0, 3)) {
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
	if got := h.applied(); !slices.Equal(got, []uint64{0}) {
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

// TestReceiveBufferAllocatedAtFirstMessage: a subscription holds no receive buffer until
// its first message (a service whose engine is down costs none), then one that fits it.
func TestReceiveBufferAllocatedAtFirstMessage(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	if b := s.Stats().RecvBufferBytes; b != 0 {
		t.Fatalf("receive buffer of %d bytes before any message", b)
	}
	payload := strings.Repeat("x", 3000)
	publish(t, p, payload)
	waitUntil(t, "first message", func() bool { return s.Stats().Applied == 1 })
	if b := s.Stats().RecvBufferBytes; b < int64(len(payload)) || b > recvBufInitial {
		t.Fatalf("receive buffer of %d bytes for a %d-byte payload", b, len(payload))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if string(h.payloads[0]) != payload {
		t.Fatal("payload corrupted")
	}
}

// procFDs and procThreads read this process's open descriptors and OS threads.
func procFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func procThreads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(rest))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line")
	return 0
}

// Subscribers in one Transport cost their sockets' descriptors and no OS thread each, and
// give every descriptor back when they stop.
func TestSubscribersShareTransportAndReleaseDescriptors(t *testing.T) {
	tr := newTransport(t)
	// One live publisher among endpoints nobody listens on (ports 1..n of 127.0.0.1).
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	h := &recorder{}
	cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
	cfg.Transport = tr
	live := startSub(t, cfg, h, p)
	const n = 100
	fds0, threads0 := procFDs(t), procThreads(t)
	subs := make([]*Subscriber, n)
	for i := range subs {
		c := fastConfig("tcp://127.0.0.1:"+strconv.Itoa(1+i), "")
		c.Transport = tr
		s, err := NewSubscriber(c, &recorder{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		subs[i] = s
	}
	// The live subscriber still works beside them.
	publish(t, p, "a", "b")
	waitUntil(t, "live batches", func() bool { return live.Stats().Applied == 2 })
	fds, threads := procFDs(t)-fds0, procThreads(t)-threads0
	t.Logf("%d subscribers: +%d descriptors, +%d threads", n, fds, threads)
	if fds > 5*n {
		t.Errorf("%d descriptors for %d subscribers", fds, n)
	}
	if threads > n/10 {
		t.Errorf("%d OS threads for %d subscribers", threads, n)
	}
	if got := tr.Open(); got != n+1 {
		t.Errorf("transport holds %d subscribers, want %d", got, n+1)
	}
	for _, s := range subs {
		s.Stop()
	}
	waitUntil(t, "descriptors released", func() bool { return procFDs(t) <= fds0 })
	if got := tr.Open(); got != 1 {
		t.Errorf("transport holds %d subscribers after Stop, want 1", got)
	}
	if err := tr.Close(); err == nil {
		t.Error("Close succeeded with a subscriber open")
	}
	live.Stop()
}

// A subscriber started while the process is out of descriptors does not fail: it is
// Waiting, retries with a bounded backoff, and subscribes once descriptors free up.
// The cases leave room for 0 to 5 new descriptors, so that opening fails at one of its
// steps (poll set, SUB socket, monitor, monitor reader; libzmq may still be closing the
// previous case's sockets, so which step is not fixed) or succeeds; either way the
// subscriber ends up subscribed.
func TestStartOutOfDescriptorsRetries(t *testing.T) {
	tr := newTransport(t)
	for room := 0; room <= 5; room++ {
		t.Run(strconv.Itoa(room), func(t *testing.T) {
			p := newPub(t, zmqtest.Config{})
			h := &recorder{}
			cfg := fastConfig(p.Endpoint(), "")
			cfg.Transport = tr
			cfg.OpenRetryMax = 40 * time.Millisecond
			s, err := NewSubscriber(cfg, h)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			var startErr error
			var st SubscriberStats
			fdtest.WithRoom(t, room, func() {
				startErr = s.Start()
				st = s.Stats()
			})
			if startErr != nil {
				t.Fatalf("Start with room for %d descriptors: %v", room, startErr)
			}
			t.Logf("room %d: waiting %v, open failures %d", room, st.Waiting, st.OpenFailures)
			if st.Waiting != (st.OpenFailures > 0) || (room == 0 && !st.Waiting) {
				t.Fatalf("room %d: stats %+v, want waiting", room, st)
			}
			waitUntil(t, "sockets open", func() bool { return !s.Stats().Waiting })
			if err := p.WaitSubscribers(1, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			publish(t, p, "a", "b")
			waitUntil(t, "batches", func() bool { return s.Stats().Applied == 2 })
		})
	}
}

// Stop ends a subscriber still waiting for descriptors at once.
func TestStopWhileWaitingForDescriptors(t *testing.T) {
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig("tcp://127.0.0.1:1", "")
	cfg.Transport = tr
	cfg.ReconnectDelay = time.Hour // the retry never comes: only Stop can end the wait
	s, err := NewSubscriber(cfg, &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	var startErr error
	fdtest.WithRoom(t, 0, func() { startErr = s.Start() })
	if startErr != nil || !s.Stats().Waiting {
		t.Fatalf("Start = %v, stats %+v", startErr, s.Stats())
	}
	s.Stop()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// Stop wakes a subscriber parked in the network poller whatever it is doing at that
// moment (about to wait, waiting, between two waits): with an hour-long PollTimeout, a
// lost wake-up would hold Stop for an hour instead of the watchdog's bound.
func TestStopWakesPollerWait(t *testing.T) {
	tr := newTransport(t)
	for i := range 20 {
		cfg := fastConfig("tcp://127.0.0.1:1", "")
		cfg.Transport = tr
		cfg.PollTimeout = time.Hour
		s, err := NewSubscriber(cfg, &recorder{})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			runtime.Gosched() // let it reach the wait on some rounds
		}
		done := make(chan struct{})
		go func() { s.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: Stop did not wake the subscriber", i)
		}
	}
}

// newTransport is a transport of its own for one test, closed at its end.
func newTransport(t *testing.T) *zmqtransport.Transport {
	t.Helper()
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
	return tr
}

// TestRcvHWMFromByteBudget: the SUB socket's high-water mark is the byte budget in
// messages of the largest size allowed, at least 1 and at most upstream's 200,000; an
// unlimited message size counts as the default.
func TestRcvHWMFromByteBudget(t *testing.T) {
	for _, tc := range []struct {
		budget, maxMsg int64
		want           int
	}{
		{DefaultBufferBytes, DefaultMaxMessageSize, 64},
		{64 << 20, 16 << 20, 4},
		{64 << 20, -1, 64 << 20 / DefaultMaxMessageSize},
		{1, DefaultMaxMessageSize, 1},
		{1 << 40, 1024, maxRcvHWM},
		{5 << 10, 1 << 10, 5},
	} {
		if got := RcvHWM(tc.budget, tc.maxMsg); got != tc.want {
			t.Errorf("RcvHWM(%d, %d) = %d, want %d", tc.budget, tc.maxMsg, got, tc.want)
		}
	}
	if _, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", BufferBytes: -1}, &recorder{}); err == nil {
		t.Fatal("negative BufferBytes accepted")
	}
}

// TestBufferBytesBoundsTheSubQueue: a subscriber's SUB socket is opened with the
// high-water mark of its byte budget, and a burst far beyond it, sent while nothing is
// read, waits in the connection and the publisher and then arrives whole and in order.
func TestBufferBytesBoundsTheSubQueue(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &countHandler{}
	s := steppedSub(t, p, h, func(cfg *SubscriberConfig) { cfg.MaxMessageSize, cfg.BufferBytes = 64<<10, 4*64<<10 })
	z := s.z
	if hwm, err := z.RcvHWM(); hwm != 4 || s.RcvHWM() != 4 || err != nil {
		t.Fatalf("SUB RCVHWM %d (%v), subscriber's %d; want 4", hwm, err, s.RcvHWM())
	}
	const burst = 2000
	payload := bytes.Repeat([]byte{3}, 1000)
	for range burst {
		if _, err := p.Publish(payload); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); h.n < burst && time.Now().Before(deadline); {
		n, err := s.pumpSub()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if _, err := z.Wait(50*time.Millisecond, &s.stop); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st := s.Stats(); h.n != burst || st.Gaps != 0 || st.Dropped != 0 || st.Applied != burst {
		t.Fatalf("handled %d of %d, stats %+v", h.n, burst, st)
	}
}
