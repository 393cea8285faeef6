package ingest

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
)

// recorder is a Handler that keeps what it was given.
type recorder struct {
	mu       sync.Mutex
	seqs     []uint64
	payloads [][]byte
	stale    []string
	restarts [][2]uint64
	reject   func(seq uint64) error
	// gate, when set for a seq, makes HandleBatch signal entered and block until released.
	gateSeq   uint64
	gated     bool
	entered   chan struct{}
	release   chan struct{}
	firstCall time.Time
}

func (r *recorder) HandleBatch(seq uint64, payload []byte) error {
	r.mu.Lock()
	gated := r.gated && seq == r.gateSeq
	reject := r.reject
	r.mu.Unlock()
	if gated {
		close(r.entered)
		<-r.release
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.firstCall.IsZero() {
		r.firstCall = time.Now()
	}
	if reject != nil {
		if err := reject(seq); err != nil {
			return err
		}
	}
	r.seqs = append(r.seqs, seq)
	r.payloads = append(r.payloads, bytes.Clone(payload))
	return nil
}

func (r *recorder) OnStale(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stale = append(r.stale, reason)
}

func (r *recorder) OnPublisherRestart(lastSeq, firstSeq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restarts = append(r.restarts, [2]uint64{lastSeq, firstSeq})
}

func (r *recorder) applied() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.seqs...)
}

func (r *recorder) staleReasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.stale...)
}

// fastConfig keeps the polling and reconnect timers short so failure paths finish
// quickly. A replay attempt gets 3 s, far more than a loaded machine takes to answer
// one, so that tests counting replay requests never see a retry the machine's speed
// caused; the tests about replay timeouts and deadlines set their own.
func fastConfig(endpoint, replay string) SubscriberConfig {
	return SubscriberConfig{
		Name:                  "test",
		Endpoint:              endpoint,
		ReplayEndpoint:        replay,
		PollTimeout:           10 * time.Millisecond,
		ReplayTimeout:         3 * time.Second,
		ReplayRecoveryTimeout: 10 * time.Second,
		ReconnectDelay:        20 * time.Millisecond,
		Logger:                testLogger(),
	}
}

// testLogger shows the subscriber's log lines with CONDUCTOR_TEST_LOG=1.
func testLogger() *slog.Logger {
	if os.Getenv("CONDUCTOR_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func newPub(t *testing.T, cfg zmqtest.Config) *zmqtest.Publisher {
	t.Helper()
	return zmqtest.NewForTest(t, cfg)
}

// startSub starts a subscriber and waits until the publisher sees its subscription.
func startSub(t testing.TB, cfg SubscriberConfig, h Handler, p *zmqtest.Publisher) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := p.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// wantStale fails the test unless the handler was told once that the source went stale,
// for a reason that mentions why.
func (r *recorder) wantStale(t *testing.T, why string) {
	t.Helper()
	if reasons := r.staleReasons(); len(reasons) != 1 || !strings.Contains(reasons[0], why) {
		t.Fatalf("stale reasons = %q, want one about %q", reasons, why)
	}
}

// awaitStale waits until s goes stale, publishes more (which a stale subscriber no longer
// reads) and waits until s can no longer change (flushSub); it checks that the handler was
// told why, and returns the subscriber's stats and the sequences the handler applied.
func awaitStale(t *testing.T, p *zmqtest.Publisher, s *Subscriber, h *recorder, why string, more ...string) (SubscriberStats, []uint64) {
	t.Helper()
	waitUntil(t, "stale", func() bool { return s.Stats().Stale })
	publish(t, p, more...)
	flushSub(t, p, s)
	st := s.Stats()
	h.wantStale(t, why)
	return st, h.applied()
}

// waitUntil waits until cond holds (zmqtest.Await).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	zmqtest.Await(t, what, cond)
}

// flushSub waits until s can no longer be changed by what p published so far, so that a
// check that something did not happen is decided by that, not by how long the test
// waited. A stale subscriber closes its SUB socket and reads nothing more: it waits for
// the unsubscription that closing sends. Otherwise it sends a marker (one frame, which
// the subscriber reads and drops as malformed: no sequence number used) and waits until
// s has read it: s reads its SUB socket in order and is done with a message before it
// reads the next, so every batch p published before has been handled (or buffered,
// during a recovery) by then.
func flushSub(t *testing.T, p *zmqtest.Publisher, s *Subscriber) {
	t.Helper()
	if s.Stats().Stale {
		if err := p.WaitUnsubscribes(1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		return
	}
	before := s.Stats().ConsumeErrors
	if err := p.SendRaw([]byte("flush")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the marker read", func() bool { return s.Stats().ConsumeErrors > before })
}

func publish(t *testing.T, p *zmqtest.Publisher, payloads ...string) {
	t.Helper()
	for _, s := range payloads {
		if _, err := p.Publish([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
}

func seqRange(lo, hi uint64) []uint64 {
	var out []uint64
	for s := lo; s < hi; s++ {
		out = append(out, s)
	}
	return out
}

func TestHappyPath(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	p.Skip(5)                                              // a subscriber joining late takes its first message as the baseline
	big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // beyond the initial receive buffer
	var want [][]byte
	for i := range 100 {
		payload := []byte(fmt.Sprintf("batch-%d", i))
		if i == 50 {
			payload = big
		}
		want = append(want, payload)
		if _, err := p.Publish(payload); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "100 batches", func() bool { return s.Stats().Applied == 100 })
	if got := h.applied(); !slices.Equal(got, seqRange(5, 105)) {
		t.Fatalf("seqs = %v", got)
	}
	h.mu.Lock()
	for i := range want {
		if !bytes.Equal(h.payloads[i], want[i]) {
			t.Fatalf("payload %d differs (len %d, want %d)", i, len(h.payloads[i]), len(want[i]))
		}
	}
	h.mu.Unlock()
	st := s.Stats()
	if st.Received != 100 || st.Gaps != 0 || st.Dropped != 0 || st.Duplicates != 0 || st.Stale ||
		st.ConsumeErrors != 0 || st.LastEventUnixNano == 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestTopicIgnored(t *testing.T) {
	p := newPub(t, zmqtest.Config{Topic: "kv@not-this-service"})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	topics := []string{"", "kv@not-this-service", "SGLang", "\x00\xff", strings.Repeat("t", 5000)}
	for i, topic := range topics {
		if err := p.SendRaw([]byte(topic), zmqtest.SeqFrame(uint64(i)), []byte(topic+"payload")); err != nil {
			t.Fatal(err)
		}
	}
	p.Skip(uint64(len(topics)))
	publish(t, p, "via-publisher-topic")
	waitUntil(t, "all topics", func() bool { return s.Stats().Applied == uint64(len(topics)+1) })
	if got := h.applied(); !slices.Equal(got, seqRange(0, uint64(len(topics)+1))) {
		t.Fatalf("seqs = %v", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, topic := range topics {
		if string(h.payloads[i]) != topic+"payload" {
			t.Fatalf("payload %d = %q", i, h.payloads[i])
		}
	}
}

func TestMalformedMessagesAreDropped(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	bad := [][][]byte{
		{[]byte(""), zmqtest.SeqFrame(0)},                                  // truncated: 2 frames
		{[]byte(""), zmqtest.SeqFrame(0), []byte("p"), []byte("extra")},    // 4 frames
		{[]byte(""), zmqtest.SeqFrame(0), []byte("p"), {}, {}, {}, {}, {}}, // many frames
		{[]byte(""), make([]byte, 7), []byte("p")},                         // short sequence
		{[]byte(""), make([]byte, 9), []byte("p")},                         // long sequence
		{[]byte(""), zmqtest.SeqFrame(1 << 63), []byte("p")},               // above INT64_MAX
		{[]byte("")}, // 1 frame
	}
	for _, m := range bad {
		if err := p.SendRaw(m...); err != nil {
			t.Fatal(err)
		}
	}
	publish(t, p, "a", "b")
	waitUntil(t, "valid batches", func() bool { return s.Stats().Applied == 2 })
	st := s.Stats()
	if st.ConsumeErrors != uint64(len(bad)) || st.Received != uint64(len(bad))+2 || st.Stale {
		t.Fatalf("stats = %+v", st)
	}
	if got := h.applied(); !slices.Equal(got, []uint64{0, 1}) {
		t.Fatalf("seqs = %v", got)
	}
}

func TestDuplicatesAndOlderDropped(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	for _, seq := range []uint64{0, 1, 2, 3, 2, 1, 3, 4} {
		if err := p.SendRaw(nil, zmqtest.SeqFrame(seq), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "received", func() bool { return s.Stats().Received == 8 })
	st := s.Stats()
	if got := h.applied(); !slices.Equal(got, seqRange(0, 5)) || st.Duplicates != 3 || st.Gaps != 0 || st.Restarts != 0 {
		t.Fatalf("seqs = %v, stats = %+v", got, st)
	}
}

func TestGapRecoveredByReplay(t *testing.T) {
	for _, withTopic := range []bool{false, true} {
		t.Run(fmt.Sprintf("topic=%v", withTopic), func(t *testing.T) {
			p := newPub(t, zmqtest.Config{Topic: "kv", ReplayEndpoint: "tcp://127.0.0.1:*", ReplayWithTopic: withTopic})
			h := &recorder{}
			s := startSub(t, fastConfig(p.Endpoint(), p.ReplayEndpoint()), h, p)
			publish(t, p, "b0", "b1", "b2")
			for i := 3; i <= 6; i++ {
				p.Lose([]byte(fmt.Sprintf("b%d", i)))
			}
			publish(t, p, "b7", "b8")
			waitUntil(t, "recovery", func() bool { return s.Stats().Applied == 9 })
			flushSub(t, p, s) // anything applied twice would show up by now
			if got := h.applied(); !slices.Equal(got, seqRange(0, 9)) {
				t.Fatalf("seqs = %v", got)
			}
			h.mu.Lock()
			for i, pl := range h.payloads {
				if string(pl) != fmt.Sprintf("b%d", i) {
					t.Errorf("payload %d = %q", i, pl)
				}
			}
			h.mu.Unlock()
			st := s.Stats()
			if st.Dropped != 4 || st.Gaps != 1 || st.ReplaysOK != 1 || st.ReplaysFailed != 0 || st.Stale {
				t.Fatalf("stats = %+v", st)
			}
			if req := p.ReplayRequests(); len(req) != 1 || req[0] != 3 {
				t.Fatalf("replay requests = %v", req)
			}
		})
	}
}

func TestSecondGapDuringRecovery(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	// The replay waits until the subscriber has read every live batch, so that the second
	// gap shows up while the first is being recovered.
	piled := make(chan struct{})
	var pileOnce sync.Once
	pileUp := func() { pileOnce.Do(func() { close(piled) }) }
	t.Cleanup(pileUp) // before p closes (cleanups run last first)
	p.SetResponder(func(from uint64, send func(...[]byte) error) {
		<-piled
		p.ReplayFromRing(from, send)
	})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), p.ReplayEndpoint()), h, p)
	publish(t, p, "0")
	p.Lose([]byte("1"))
	publish(t, p, "2")
	p.Lose([]byte("3"))
	publish(t, p, "4", "5")
	waitUntil(t, "the live batches read", func() bool { return s.Stats().Received == 4 })
	pileUp()
	waitUntil(t, "both gaps", func() bool { return s.Stats().Applied == 6 })
	st := s.Stats()
	if got := h.applied(); !slices.Equal(got, seqRange(0, 6)) || st.Gaps != 2 || st.Dropped != 2 || st.ReplaysOK != 2 {
		t.Fatalf("seqs = %v, stats = %+v", got, st)
	}
	if req := p.ReplayRequests(); len(req) != 2 || req[0] != 1 || req[1] != 3 {
		t.Fatalf("replay requests = %v", req)
	}
}

func TestGapWithoutReplayGoesStale(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	publish(t, p, "0", "1")
	p.Skip(2)
	publish(t, p, "4")
	st, got := awaitStale(t, p, s, h, "gap", "5", "6")
	if !slices.Equal(got, []uint64{0, 1}) || st.Dropped != 2 || st.Gaps != 1 {
		t.Fatalf("seqs = %v, stats = %+v", got, st)
	}
}

// unrecoverableGaps are gaps of 2 and 3 (after 0 and 1; 4 and 5 live after them) that
// the replay endpoint cannot close. applied is what the handler gets before the source
// goes stale; hole the batches lost for good.
var unrecoverableGaps = []struct {
	name      string
	responder func(p *zmqtest.Publisher) zmqtest.Responder
	skip      bool // burn the missing seqs instead of keeping them for replay
	applied   []uint64
	hole      [2]uint64
	reason    string
}{
	{
		name: "end marker only",
		responder: func(*zmqtest.Publisher) zmqtest.Responder {
			return func(_ uint64, send func(...[]byte) error) {
				_ = send([]byte{}, zmqtest.SeqFrame(zmqtest.EndMarkerSeq), nil)
			}
		},
		applied: []uint64{0, 1},
		hole:    [2]uint64{2, 3},
		reason:  "without progress",
	},
	{
		name: "end marker before boundary",
		responder: func(p *zmqtest.Publisher) zmqtest.Responder {
			return func(from uint64, send func(...[]byte) error) {
				_ = send([]byte{}, zmqtest.SeqFrame(from), []byte("replayed"))
				_ = send([]byte{}, zmqtest.SeqFrame(zmqtest.EndMarkerSeq), nil)
			}
		},
		applied: []uint64{0, 1, 2},
		hole:    [2]uint64{3, 3},
		reason:  "did not contain every missing sequence",
	},
	{
		name:    "ring lacks the missing batches",
		skip:    true,
		applied: []uint64{0, 1},
		hole:    [2]uint64{2, 3},
		reason:  "skipped sequence",
	},
}

// publishUnrecoverableGap publishes 0 and 1, loses 2 and 3 (kept for replay, or burnt),
// and publishes 4 and 5.
func publishUnrecoverableGap(t *testing.T, p *zmqtest.Publisher, skip bool) {
	t.Helper()
	publish(t, p, "0", "1")
	if skip {
		p.Skip(2)
	} else {
		p.Lose([]byte("2"))
		p.Lose([]byte("3"))
	}
	publish(t, p, "4", "5")
}

func TestUnrecoverableReplayGoesStale(t *testing.T) {
	for _, tc := range unrecoverableGaps {
		t.Run(tc.name, func(t *testing.T) {
			p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
			if tc.responder != nil {
				p.SetResponder(tc.responder(p))
			}
			h := &recorder{}
			s := startSub(t, fastConfig(p.Endpoint(), p.ReplayEndpoint()), h, p)
			publishUnrecoverableGap(t, p, tc.skip)
			st, got := awaitStale(t, p, s, h, tc.reason)
			if !slices.Equal(got, tc.applied) || st.ReplaysFailed != 1 || st.ReplaysOK != 0 {
				t.Fatalf("seqs = %v, stats = %+v", got, st)
			}
		})
	}
}

// holeTaker is a recorder that is also an ingest HoleHandler: it takes every hole
// (take) or none, and records those offered.
type holeTaker struct {
	recorder
	take    bool
	offered [][2]uint64
}

func (h *holeTaker) OnHole(first, last uint64, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.offered = append(h.offered, [2]uint64{first, last})
	return h.take
}

func (h *holeTaker) holes() [][2]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.offered)
}

// TestHoleHandler: a handler that is a HoleHandler is offered each gap the replay
// endpoint cannot close (or any gap, without one) before the source goes stale. When it
// takes it, the batches after the gap follow and the source stays fresh; when it does
// not, the source goes stale for the same reason as without it, nothing after the gap
// applied.
func TestHoleHandler(t *testing.T) {
	type gapCase struct {
		name      string
		responder func(p *zmqtest.Publisher) zmqtest.Responder
		skip      bool
		replay    bool
		applied   []uint64
		hole      [2]uint64
		reason    string
	}
	cases := []gapCase{{name: "no replay endpoint", skip: true, applied: []uint64{0, 1}, hole: [2]uint64{2, 3}, reason: "no replay endpoint"}}
	for _, g := range unrecoverableGaps {
		cases = append(cases, gapCase{g.name, g.responder, g.skip, true, g.applied, g.hole, g.reason})
	}
	for _, tc := range cases {
		for _, take := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/take=%v", tc.name, take), func(t *testing.T) {
				cfg := zmqtest.Config{}
				if tc.replay {
					cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
				}
				p := newPub(t, cfg)
				if tc.responder != nil {
					p.SetResponder(tc.responder(p))
				}
				h := &holeTaker{take: take}
				s := startSub(t, fastConfig(p.Endpoint(), p.ReplayEndpoint()), h, p)
				publishUnrecoverableGap(t, p, tc.skip)
				if !take {
					st, got := awaitStale(t, p, s, &h.recorder, tc.reason)
					if !slices.Equal(got, tc.applied) || st.HolesTaken != 0 || !slices.Equal(h.holes(), [][2]uint64{tc.hole}) {
						t.Fatalf("seqs = %v, holes offered %v, stats = %+v", got, h.holes(), st)
					}
					return
				}
				want := append(slices.Clone(tc.applied), 4, 5)
				// Stale ends the waits too: the checks below then say why.
				waitUntil(t, "batches after the hole", func() bool { return len(h.applied()) == len(want) || s.Stats().Stale })
				publish(t, p, "6")
				waitUntil(t, "the next live batch", func() bool { return len(h.applied()) == len(want)+1 || s.Stats().Stale })
				st := s.Stats()
				if got := h.applied(); !slices.Equal(got, append(want, 6)) || st.Stale || st.HolesTaken != 1 ||
					!slices.Equal(h.holes(), [][2]uint64{tc.hole}) || len(h.staleReasons()) != 0 {
					t.Fatalf("seqs = %v, holes %v, stale %q, stats = %+v", got, h.holes(), h.staleReasons(), st)
				}
			})
		}
	}
}

// TestFailedReplayAttemptsRetried: an attempt that gets no reply within ReplayTimeout,
// or a malformed one, is retried for the same gap, the live boundary held back. The
// deadline is an hour away: the test waits for the retries to happen, whatever the
// machine's speed, and TestReplayGoesStaleAtDeadline covers the deadline.
func TestFailedReplayAttemptsRetried(t *testing.T) {
	for name, responder := range map[string]zmqtest.Responder{"silent": zmqtest.Silent, "malformed": zmqtest.Malformed} {
		t.Run(name, func(t *testing.T) {
			p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
			p.SetResponder(responder)
			h := &recorder{}
			cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
			cfg.ReplayTimeout = 50 * time.Millisecond
			cfg.ReplayRecoveryTimeout = time.Hour
			s := startSub(t, cfg, h, p)
			publish(t, p, "0")
			p.Lose([]byte("1"))
			publish(t, p, "2")
			waitUntil(t, "three attempts", func() bool { return s.Stats().ReplayRetries >= 2 && len(p.ReplayRequests()) >= 3 })
			st := s.Stats()
			for _, from := range p.ReplayRequests() {
				if from != 1 {
					t.Fatalf("replay requests %v: each asks for the gap from 1", p.ReplayRequests())
				}
			}
			if got := h.applied(); !slices.Equal(got, []uint64{0}) || st.Stale || st.ReplaysFailed != 0 {
				t.Fatalf("seqs = %v, stats = %+v", got, st)
			}
		})
	}
}

// TestReplayGoesStaleAtDeadline: a replay endpoint that never answers, or answers
// malformed, is retried until the recovery deadline, and then the source goes stale for
// the deadline: not before it (the wait is measured from before the gap was published),
// and with no attempt opened after it (attempts open at least ReplayTimeout apart when
// unanswered, ReconnectDelay apart when answered malformed, so at most deadline over
// that many fit, however late a loaded machine runs the timers). No verdict depends on
// how fast the machine is.
func TestReplayGoesStaleAtDeadline(t *testing.T) {
	for _, c := range []struct {
		name      string
		responder zmqtest.Responder
		spacing   func(cfg SubscriberConfig) time.Duration
	}{
		{"silent", zmqtest.Silent, func(cfg SubscriberConfig) time.Duration { return cfg.ReplayTimeout }},
		{"malformed", zmqtest.Malformed, func(cfg SubscriberConfig) time.Duration { return cfg.ReconnectDelay }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
			p.SetResponder(c.responder)
			h := &recorder{}
			cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
			cfg.ReplayTimeout = 100 * time.Millisecond
			cfg.ReplayRecoveryTimeout = 500 * time.Millisecond
			maxAttempts := int(cfg.ReplayRecoveryTimeout / c.spacing(cfg))
			s := startSub(t, cfg, h, p)
			publish(t, p, "0")
			p.Lose([]byte("1"))
			start := time.Now()
			publish(t, p, "2", "3")
			waitUntil(t, "stale", func() bool { return s.Stats().Stale })
			if elapsed := time.Since(start); elapsed < cfg.ReplayRecoveryTimeout {
				t.Fatalf("stale after %v, before the %v recovery deadline", elapsed, cfg.ReplayRecoveryTimeout)
			}
			st := s.Stats()
			h.wantStale(t, "deadline")
			// The buffered live boundary is never applied out of order.
			if got := h.applied(); !slices.Equal(got, []uint64{0}) || st.ReplaysFailed != 1 {
				t.Fatalf("seqs = %v, stats = %+v", got, st)
			}
			if req := p.ReplayRequests(); len(req) < 1 || len(req) > maxAttempts {
				t.Fatalf("replay requests = %v, want 1 to %d", req, maxAttempts)
			}
		})
	}
}

func TestRecoveryBufferLimits(t *testing.T) {
	t.Run("messages", func(t *testing.T) {
		p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
		p.SetResponder(zmqtest.Silent)
		h := &recorder{}
		cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
		cfg.MaxRecoveryMessages = 3
		cfg.ReplayRecoveryTimeout = 10 * time.Second
		s := startSub(t, cfg, h, p)
		publish(t, p, "0")
		p.Lose([]byte("1"))
		publish(t, p, "2", "3", "4")
		flushSub(t, p, s)
		if s.Stats().Stale {
			t.Fatal("stale with the buffer at its limit, not over it")
		}
		publish(t, p, "5")
		waitUntil(t, "stale", func() bool { return s.Stats().Stale })
		h.wantStale(t, "limit")
	})
	t.Run("bytes include the topic", func(t *testing.T) {
		topic := strings.Repeat("t", 60)
		p := newPub(t, zmqtest.Config{Topic: topic, ReplayEndpoint: "tcp://127.0.0.1:*"})
		p.SetResponder(zmqtest.Silent)
		h := &recorder{}
		cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
		cfg.MaxRecoveryBytes = 100 // one 60+30 byte message fits, two do not; payloads alone would
		cfg.ReplayRecoveryTimeout = 10 * time.Second
		s := startSub(t, cfg, h, p)
		payload := strings.Repeat("p", 30)
		publish(t, p, payload)
		p.Lose([]byte(payload))
		publish(t, p, payload)
		flushSub(t, p, s)
		if s.Stats().Stale {
			t.Fatal("stale with one message buffered")
		}
		publish(t, p, payload)
		waitUntil(t, "stale", func() bool { return s.Stats().Stale })
		h.wantStale(t, "limit")
	})
}

func TestHandlerErrorGoesStaleWithoutAdvancing(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(fmt.Sprintf("replay=%v", replay), func(t *testing.T) {
			cfg := zmqtest.Config{}
			if replay {
				cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
			}
			p := newPub(t, cfg)
			h := &recorder{reject: func(seq uint64) error {
				if seq == 2 {
					return errors.New("batch data_parallel_rank conflicts with trusted registration")
				}
				return nil
			}}
			s := startSub(t, fastConfig(p.Endpoint(), p.ReplayEndpoint()), h, p)
			publish(t, p, "0", "1")
			if replay {
				p.Lose([]byte("2")) // rejected while replayed
			}
			publish(t, p, "x", "y")
			st, got := awaitStale(t, p, s, h, "data_parallel_rank", "z")
			if !slices.Equal(got, []uint64{0, 1}) || st.Rejected != 1 || st.Applied != 2 {
				t.Fatalf("seqs = %v, stats = %+v", got, st)
			}
		})
	}
}

// TestHandlerStaleStopsSubscriber: a handler that answers a batch with ErrSourceStale has
// made the source stale itself: the subscriber goes stale without telling it again
// (no OnStale) or counting a rejection, applies nothing more, and closes its sockets
// (the publisher sees it unsubscribe).
func TestHandlerStaleStopsSubscriber(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{reject: func(seq uint64) error {
		if seq == 2 {
			return fmt.Errorf("gate: %w", ErrSourceStale)
		}
		return nil
	}}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	publish(t, p, "0", "1", "2", "3")
	waitUntil(t, "stale", func() bool { return s.Stats().Stale })
	if err := p.WaitUnsubscribes(1, 30*time.Second); err != nil {
		t.Fatalf("the stale subscriber kept its subscription: %v", err)
	}
	publish(t, p, "4")
	st := s.Stats()
	if got := h.applied(); !slices.Equal(got, []uint64{0, 1}) || st.Rejected != 0 || len(h.staleReasons()) != 0 {
		t.Fatalf("seqs = %v, OnStale %q, stats = %+v", got, h.staleReasons(), st)
	}
}

func TestStopWaitsForInFlightBatch(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &recorder{gated: true, gateSeq: 3, entered: make(chan struct{}), release: make(chan struct{})}
	s := startSub(t, fastConfig(p.Endpoint(), ""), h, p)
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-stopPub:
				return
			default:
			}
			if _, err := p.Publish([]byte("traffic")); err != nil {
				return
			}
			time.Sleep(100 * time.Microsecond) // paces the traffic (no verdict depends on it)
		}
	}()
	defer func() { close(stopPub); <-pubDone }()
	<-h.entered
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	// Stop has been asked (the subscriber's flag is set) while HandleBatch runs.
	waitUntil(t, "Stop called", s.stop.Load)
	select {
	case <-stopped:
		t.Fatal("Stop returned while HandleBatch was running")
	case <-time.After(150 * time.Millisecond):
		// Time for a Stop that does not wait to return: a correct one never does, so no
		// load can fail this.
	}
	close(h.release)
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("Stop did not return after the batch finished")
	}
	// Stop was asked before the batch in flight returned: nothing after it is delivered.
	got := h.applied()
	if len(got) == 0 || got[len(got)-1] != h.gateSeq {
		t.Fatalf("batches delivered %v: the last is not the one in flight when Stop was called (%d)", got, h.gateSeq)
	}
	n := len(got)
	// The traffic goes on: a subscriber still reading would deliver some of the next
	// batches.
	for sent := p.Sent(); p.Sent() < sent+20; {
		select {
		case <-pubDone:
			t.Fatal("the traffic stopped")
		default:
			runtime.Gosched()
		}
	}
	if len(h.applied()) != n {
		t.Fatal("batches delivered after Stop returned")
	}
	done := make(chan struct{})
	go func() { s.Stop(); s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("second Stop blocked")
	}
}

func TestStartAndStopLifecycle(t *testing.T) {
	h := &recorder{}
	if _, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}, nil); err == nil {
		t.Fatal("nil handler accepted")
	}
	if _, err := NewSubscriber(SubscriberConfig{}, h); err == nil {
		t.Fatal("empty endpoint accepted")
	}
	if _, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", PollTimeout: -1}, h); err == nil {
		t.Fatal("negative timeout accepted")
	}
	for _, ep := range []string{"tcp://127.0.0.1", "bogus://x", "tcp://127.0.0.1:notaport", "127.0.0.1:5557"} {
		s, err := NewSubscriber(SubscriberConfig{Endpoint: ep}, h)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Start()
		if err == nil || !strings.HasPrefix(err.Error(), "failed to start ZMQ client: ") {
			t.Fatalf("Start(%q) = %v", ep, err)
		}
		s.Stop()
	}
	bad, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1"}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Start(); err == nil || !strings.Contains(err.Error(), "replay") {
		t.Fatalf("Start with a malformed replay endpoint = %v", err)
	}
	// Nobody listens yet: connecting is not an error. Stop wakes the poll at once rather
	// than waiting out PollTimeout (an hour: a Stop that waited it out would fail below
	// whatever the load).
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", PollTimeout: time.Hour}, h)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("second Start accepted")
	}
	// Paces only: Stop should find the goroutine blocked in poll (if it is not there yet,
	// Stop is quick anyway).
	time.Sleep(20 * time.Millisecond)
	stopped := make(chan struct{})
	go func() { s.Stop(); s.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Minute):
		t.Fatal("Stop waits out the poll")
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start after Stop accepted")
	}
	never, _ := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}, h)
	never.Stop()
}

// rebind binds a new publisher on the endpoints of one just closed.
func rebind(t *testing.T, cfg zmqtest.Config) *zmqtest.Publisher {
	t.Helper()
	var err error
	for range 50 {
		var p *zmqtest.Publisher
		if p, err = zmqtest.NewPublisher(cfg); err == nil {
			t.Cleanup(func() { _ = p.Close() })
			return p
		}
		time.Sleep(20 * time.Millisecond) // paces the retries of the bind
	}
	t.Fatal(err)
	return nil
}

// restartAfter10 publishes 10 batches "old" on p1, numbered from first, and once s has
// applied them closes p1 and returns the publisher that restarts in its place (same
// endpoint, numbering from first again) once s has subscribed to it.
func restartAfter10(t *testing.T, p1 *zmqtest.Publisher, s *Subscriber, first uint64) *zmqtest.Publisher {
	t.Helper()
	p1.Skip(first)
	for range 10 {
		publish(t, p1, "old")
	}
	waitUntil(t, "first stream", func() bool { return s.Stats().Applied == 10 })
	ep := p1.Endpoint()
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}
	p2 := rebind(t, zmqtest.Config{Endpoint: ep})
	p2.Skip(first)
	if err := p2.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return p2
}

func TestPublisherRestart(t *testing.T) {
	t.Run("no replay", func(t *testing.T) {
		p1 := newPub(t, zmqtest.Config{})
		h := &recorder{}
		s := startSub(t, fastConfig(p1.Endpoint(), ""), h, p1)
		p2 := restartAfter10(t, p1, s, 0)
		for range 5 {
			publish(t, p2, "new")
		}
		waitUntil(t, "second stream", func() bool { return s.Stats().Applied == 15 })
		st := s.Stats()
		want := append(seqRange(0, 10), seqRange(0, 5)...)
		if got := h.applied(); !slices.Equal(got, want) || st.Restarts != 1 || st.Stale || st.Reconnects < 1 {
			t.Fatalf("seqs = %v, stats = %+v", got, st)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.restarts) != 1 || h.restarts[0] != [2]uint64{9, 0} {
			t.Fatalf("restart notifications = %v", h.restarts)
		}
	})
	t.Run("no replay, stream numbered from 1", func(t *testing.T) {
		p1 := newPub(t, zmqtest.Config{})
		h := &recorder{}
		s := startSub(t, fastConfig(p1.Endpoint(), ""), h, p1)
		p2 := restartAfter10(t, p1, s, 1) // the Mooncake master numbers from 1
		publish(t, p2, "new1", "new2", "new3")
		waitUntil(t, "second stream", func() bool { return s.Stats().Applied == 13 })
		st := s.Stats()
		want := append(seqRange(1, 11), seqRange(1, 4)...)
		if got := h.applied(); !slices.Equal(got, want) || st.Restarts != 1 || st.Stale || st.Gaps != 0 {
			t.Fatalf("seqs = %v, stats = %+v", got, st)
		}
	})
	t.Run("replay recovers batches sent before reconnect", func(t *testing.T) {
		p1 := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
		h := &recorder{}
		s := startSub(t, fastConfig(p1.Endpoint(), p1.ReplayEndpoint()), h, p1)
		for range 10 {
			publish(t, p1, "old")
		}
		waitUntil(t, "first stream", func() bool { return s.Stats().Applied == 10 })
		cfg := zmqtest.Config{Endpoint: p1.Endpoint(), ReplayEndpoint: p1.ReplayEndpoint()}
		if err := p1.Close(); err != nil {
			t.Fatal(err)
		}
		p2 := rebind(t, cfg)
		publish(t, p2, "new0", "new1") // before the SUB is back: lost on the PUB side
		if err := p2.WaitSubscribers(1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		publish(t, p2, "new2", "new3")
		waitUntil(t, "second stream", func() bool { return s.Stats().Applied == 14 })
		st := s.Stats()
		want := append(seqRange(0, 10), seqRange(0, 4)...)
		if got := h.applied(); !slices.Equal(got, want) || st.Restarts != 1 || st.Stale {
			t.Fatalf("seqs = %v, stats = %+v", got, st)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for i := range 4 {
			if got := string(h.payloads[10+i]); got != fmt.Sprintf("new%d", i) {
				t.Fatalf("payload %d after restart = %q", i, got)
			}
		}
	})
}

// steppedSub opens a subscriber of p's stream whose receive path the test drives on its
// own goroutine (it owns the sockets then): no run goroutine is started. set, when not
// nil, adjusts its configuration first.
func steppedSub(t *testing.T, p *zmqtest.Publisher, h Handler, set func(*SubscriberConfig)) *Subscriber {
	t.Helper()
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(p.Endpoint(), "")
	cfg.Transport = tr
	if set != nil {
		set(&cfg)
	}
	s, err := NewSubscriber(cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	z, err := s.open()
	if err != nil {
		t.Fatal(err)
	}
	s.z = z
	t.Cleanup(func() {
		z.Free()
		_ = tr.Close()
	})
	if err := p.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLivePathAllocatesNothing(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &countHandler{}
	s := steppedSub(t, p, h, nil)
	payload := bytes.Repeat([]byte{7}, 5000)
	const runs = 200
	for range runs + 10 {
		if _, err := p.Publish(payload); err != nil {
			t.Fatal(err)
		}
	}
	next := func() {
		for {
			n, err := s.pumpSub()
			if err != nil {
				panic(err)
			}
			if n > 0 {
				return
			}
		}
	}
	for range 5 {
		next()
	}
	if allocs := testing.AllocsPerRun(runs, next); allocs != 0 {
		t.Fatalf("live path allocates %v per message", allocs)
	}
	if h.n != runs+6 || s.Stats().Applied != runs+6 {
		t.Fatalf("handled %d, stats %+v", h.n, s.Stats())
	}
}

type countHandler struct{ n int }

func (c *countHandler) HandleBatch(uint64, []byte) error { c.n++; return nil }
func (c *countHandler) OnStale(string)                   {}

func catchUpConfig(p *zmqtest.Publisher) SubscriberConfig {
	cfg := fastConfig(p.Endpoint(), p.ReplayEndpoint())
	cfg.CatchUpOnStart = true
	// A catch-up is not retried: one reply later than ReplayTimeout ends it as failed.
	// fastConfig's 200 ms was missed on a loaded CI machine (race detector, busy cores);
	// the tests that are about failures set their own short timeout.
	cfg.ReplayTimeout = 3 * time.Second
	cfg.ReplayRecoveryTimeout = 4 * time.Second
	// These tests count replay requests; the join check has its own tests.
	cfg.JoinCheckDelay = -1
	return cfg
}

// checkPayloads asserts that the handler got payload "b<seq>" for every batch.
func checkPayloads(t *testing.T, h *recorder) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, pl := range h.payloads {
		if want := fmt.Sprintf("b%d", h.seqs[i]); string(pl) != want {
			t.Fatalf("payload of seq %d = %q, want %q", h.seqs[i], pl, want)
		}
	}
}

// publishSeqs publishes payloads "b<seq>" for the next n sequence numbers.
func publishSeqs(t *testing.T, p *zmqtest.Publisher, n int) {
	t.Helper()
	for range n {
		publish(t, p, fmt.Sprintf("b%d", p.NextSeq()))
	}
}

// TestJoinCheckRecoversBatchPublishedBeforeSubscriptionTookEffect: batch 3 is published
// right after the catch-up read the ring (the responder loses it once the first reply is
// out), so the SUB never receives it, and the stream then goes quiet. Only the join check
// can apply it; without it Applied stays at 3 for good.
func TestJoinCheckRecoversBatchPublishedBeforeSubscriptionTookEffect(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	publishSeqs(t, p, 3) // only the ring keeps them
	var served atomic.Int32
	p.SetResponder(func(from uint64, send func(...[]byte) error) {
		p.ReplayFromRing(from, send)
		if served.Add(1) == 1 {
			p.Lose([]byte(fmt.Sprintf("b%d", p.NextSeq())))
		}
	})
	cfg := catchUpConfig(p)
	cfg.JoinCheckDelay = 50 * time.Millisecond
	h := &recorder{}
	s := startSub(t, cfg, h, p)
	waitUntil(t, "join check", func() bool { return s.Stats().JoinChecks == 1 })
	if got := h.applied(); !slices.Equal(got, seqRange(0, 4)) {
		t.Fatalf("seqs = %v", got)
	}
	checkPayloads(t, h)
	st := s.Stats()
	if st.Stale || st.CatchUps != 1 || st.Gaps != 1 || st.Dropped != 1 || st.JoinChecksFailed != 0 || st.ReplaysOK != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if req := p.ReplayRequests(); len(req) != 2 || req[0] != 0 || req[1] != 3 {
		t.Fatalf("replay requests = %v", req)
	}
	publishSeqs(t, p, 1)
	waitUntil(t, "live batch", func() bool { return s.Stats().Applied == 5 })
}

// TestJoinCheckDuringBurstIsNotStale: the first live batch arrives while the catch-up is
// still out, and once the catch-up is applied the stream bursts far past what the
// publisher's ring holds, while the subscriber is busy. The join check, due by then, does
// not run: the live stream shows any gap after the catch-up itself. (It used to ask the
// replay endpoint from the applied sequence, which the ring no longer held while the rest
// of the burst waited unread in the connection: the source went stale for nothing, its
// entries retracted.) Nothing is replayed twice.
func TestJoinCheckDuringBurstIsNotStale(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 8})
	answer := make(chan struct{})
	p.SetResponder(func(from uint64, send func(...[]byte) error) {
		<-answer
		p.ReplayFromRing(from, send)
	})
	cfg := catchUpConfig(p)
	cfg.JoinCheckDelay = time.Nanosecond // due as soon as the SUB has connected
	h := &recorder{gated: true, gateSeq: 0, entered: make(chan struct{}), release: make(chan struct{})}
	s := startSub(t, cfg, h, p)
	publishSeqs(t, p, 1)
	waitUntil(t, "batch 0 received (buffered behind the catch-up)", func() bool { return s.Stats().Received == 1 })
	close(answer)
	<-h.entered // batch 0 applied: the catch-up is complete
	const burst = 1000
	publishSeqs(t, p, burst)
	close(h.release)
	waitUntil(t, "the burst applied", func() bool { return s.Stats().Applied == burst+1 || s.Stats().Stale })
	if got := h.applied(); !slices.Equal(got, seqRange(0, burst+1)) {
		t.Fatalf("applied %d batches, stale %v", len(got), h.staleReasons())
	}
	checkPayloads(t, h)
	st := s.Stats()
	if st.Stale || st.CatchUps != 1 || st.JoinChecks != 0 || st.JoinChecksFailed != 0 || st.Duplicates != 0 ||
		st.Gaps != 0 || st.ReplaysOK != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if req := p.ReplayRequests(); len(req) != 1 || req[0] != 0 {
		t.Fatalf("replay requests = %v, want the catch-up's alone", req)
	}
}

func TestCatchUpOnStartReplaysEverything(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	publishSeqs(t, p, 5) // nobody subscribed: only the ring keeps them
	h := &recorder{}
	s := startSub(t, catchUpConfig(p), h, p)
	waitUntil(t, "catch-up", func() bool { return s.Stats().CatchUps == 1 })
	publishSeqs(t, p, 1)
	waitUntil(t, "live batch", func() bool { return s.Stats().Applied == 6 })
	flushSub(t, p, s) // anything applied twice would show up by now
	if got := h.applied(); !slices.Equal(got, seqRange(0, 6)) {
		t.Fatalf("seqs = %v", got)
	}
	checkPayloads(t, h)
	st := s.Stats()
	if st.Stale || st.CatchUpsFailed != 0 || st.Gaps != 0 || st.ReplaysOK != 0 || st.Duplicates != 0 {
		t.Fatalf("stats = %+v", st)
	}
	if req := p.ReplayRequests(); len(req) != 1 || req[0] != 0 {
		t.Fatalf("replay requests = %v", req)
	}
}

func TestCatchUpAcceptsRingStartingLate(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 3})
	publishSeqs(t, p, 8) // the ring keeps 5, 6, 7
	h := &recorder{}
	s := startSub(t, catchUpConfig(p), h, p)
	waitUntil(t, "catch-up", func() bool { return s.Stats().CatchUps == 1 })
	publishSeqs(t, p, 2)
	waitUntil(t, "live batches", func() bool { return s.Stats().Applied == 5 })
	if got := h.applied(); !slices.Equal(got, seqRange(5, 10)) {
		t.Fatalf("seqs = %v", got)
	}
	checkPayloads(t, h)
	st := s.Stats()
	if st.Stale || st.CatchUpsFailed != 0 || st.Gaps != 0 || st.Dropped != 0 || len(h.staleReasons()) != 0 {
		t.Fatalf("stats = %+v, stale reasons %q", st, h.staleReasons())
	}
	// The window is established: a later gap the ring cannot fill is strict again.
	p.Skip(2)
	publishSeqs(t, p, 1)
	waitUntil(t, "stale", func() bool { return s.Stats().Stale })
	st = s.Stats()
	h.wantStale(t, "skipped sequence")
	if st.ReplaysFailed != 1 || st.CatchUpsFailed != 0 || st.Gaps != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestCatchUpFailureIsNotStale(t *testing.T) {
	t.Run("silent replay, live batches waiting", func(t *testing.T) {
		p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
		p.SetResponder(zmqtest.Silent)
		publishSeqs(t, p, 3)
		h := &recorder{}
		cfg := catchUpConfig(p)
		cfg.ReplayTimeout = 150 * time.Millisecond
		start := time.Now()
		s := startSub(t, cfg, h, p)
		publishSeqs(t, p, 2) // buffered while the catch-up waits
		waitUntil(t, "buffered batches", func() bool { return s.Stats().Applied == 2 })
		h.mu.Lock()
		first := h.firstCall
		h.mu.Unlock()
		if d := first.Sub(start); d < 140*time.Millisecond {
			t.Fatalf("first batch applied %v after Start, before the catch-up timed out", d)
		}
		publishSeqs(t, p, 1)
		waitUntil(t, "live batch", func() bool { return s.Stats().Applied == 3 })
		st := s.Stats()
		if got := h.applied(); !slices.Equal(got, seqRange(3, 6)) {
			t.Fatalf("seqs = %v", got)
		}
		if st.Stale || st.CatchUpsFailed != 1 || st.CatchUps != 0 || st.ReplaysFailed != 0 || len(h.staleReasons()) != 0 {
			t.Fatalf("stats = %+v", st)
		}
		if req := p.ReplayRequests(); len(req) != 1 || req[0] != 0 {
			t.Fatalf("replay requests = %v (a catch-up is not retried)", req)
		}
	})
	t.Run("no replay server", func(t *testing.T) {
		p := newPub(t, zmqtest.Config{})
		h := &recorder{}
		cfg := fastConfig(p.Endpoint(), "tcp://"+freeAddr(t))
		cfg.CatchUpOnStart = true
		cfg.ReplayTimeout = 100 * time.Millisecond
		s := startSub(t, cfg, h, p)
		waitUntil(t, "catch-up failure", func() bool { return s.Stats().CatchUpsFailed == 1 })
		p.Skip(4)
		publishSeqs(t, p, 2) // the first live batch is the baseline, as without catch-up
		waitUntil(t, "live batches", func() bool { return s.Stats().Applied == 2 })
		if got, st := h.applied(), s.Stats(); !slices.Equal(got, seqRange(4, 6)) || st.Stale || st.Gaps != 0 {
			t.Fatalf("seqs = %v, stats = %+v", got, st)
		}
	})
	t.Run("buffer limit", func(t *testing.T) {
		p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
		p.SetResponder(zmqtest.Silent)
		h := &recorder{}
		cfg := catchUpConfig(p)
		cfg.ReplayTimeout = 10 * time.Second // only the limit can end the catch-up
		cfg.ReplayRecoveryTimeout = 10 * time.Second
		cfg.MaxRecoveryMessages = 2
		s := startSub(t, cfg, h, p)
		publishSeqs(t, p, 4)
		waitUntil(t, "live batches", func() bool { return s.Stats().Applied == 4 })
		if got, st := h.applied(), s.Stats(); !slices.Equal(got, seqRange(0, 4)) || st.Stale || st.CatchUpsFailed != 1 {
			t.Fatalf("seqs = %v, stats = %+v", got, st)
		}
	})
}

// freeAddr returns a 127.0.0.1 port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestCatchUpWithNothingToReplay(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	h := &recorder{}
	s := startSub(t, catchUpConfig(p), h, p)
	waitUntil(t, "catch-up", func() bool { return s.Stats().CatchUps == 1 })
	if got := h.applied(); len(got) != 0 {
		t.Fatalf("replayed %v from an empty publisher", got)
	}
	publishSeqs(t, p, 3)
	waitUntil(t, "live batches", func() bool { return s.Stats().Applied == 3 })
	st := s.Stats()
	if got := h.applied(); !slices.Equal(got, seqRange(0, 3)) || st.Stale || st.CatchUpsFailed != 0 || st.Gaps != 0 {
		t.Fatalf("seqs = %v, stats = %+v", got, st)
	}
	checkPayloads(t, h)
}

func TestCatchUpWhileLiveStreams(t *testing.T) {
	// pile: the catch-up's replay waits until the subscriber has read that many live
	// batches (they pile up behind the catch-up).
	for _, pile := range []uint64{0, 40} {
		t.Run(fmt.Sprintf("replay after %d live batches", pile), func(t *testing.T) {
			p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
			var sub atomic.Pointer[Subscriber]
			var pubEnded atomic.Bool
			p.SetResponder(func(from uint64, send func(...[]byte) error) {
				for s := sub.Load(); s != nil && s.Stats().Received < pile && !pubEnded.Load(); {
					runtime.Gosched() // the live stream goes on (its goroutine paces it)
				}
				p.ReplayFromRing(from, send)
			})
			publishSeqs(t, p, 20)
			const total = 220
			stopPub := make(chan struct{})
			pubDone := make(chan error, 1)
			go func() {
				defer pubEnded.Store(true)
				for p.NextSeq() < total {
					select {
					case <-stopPub:
						pubDone <- nil
						return
					default:
					}
					if _, err := p.Publish([]byte(fmt.Sprintf("b%d", p.NextSeq()))); err != nil {
						pubDone <- err
						return
					}
					time.Sleep(500 * time.Microsecond) // paces the live stream
				}
				pubDone <- nil
			}()
			h := &recorder{}
			s, err := NewSubscriber(catchUpConfig(p), h)
			if err != nil {
				t.Fatal(err)
			}
			sub.Store(s)
			if err := s.Start(); err != nil {
				close(stopPub)
				<-pubDone
				t.Fatal(err)
			}
			t.Cleanup(s.Stop)
			err = <-pubDone
			close(stopPub)
			if err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "every batch", func() bool { return s.Stats().Applied >= total || s.Stats().Stale })
			flushSub(t, p, s)
			st := s.Stats()
			if got := h.applied(); !slices.Equal(got, seqRange(0, total)) || st.Stale {
				t.Fatalf("seqs = %v, stats = %+v", got, st)
			}
			checkPayloads(t, h)
			if st.CatchUps != 1 || st.CatchUpsFailed != 0 || st.ReplaysFailed != 0 {
				t.Fatalf("stats = %+v", st)
			}
		})
	}
}

func TestCatchUpInterruptedAfterProgressIsStrict(t *testing.T) {
	p := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	p.SetResponder(func(from uint64, send func(...[]byte) error) {
		if from == 0 { // the catch-up: two batches, then silence
			for seq := range uint64(2) {
				_ = send([]byte{}, zmqtest.SeqFrame(seq), []byte(fmt.Sprintf("b%d", seq)))
			}
			return
		}
		p.ReplayFromRing(from, send)
	})
	publishSeqs(t, p, 5)
	h := &recorder{}
	cfg := catchUpConfig(p)
	cfg.ReplayTimeout = 100 * time.Millisecond
	s := startSub(t, cfg, h, p)
	publishSeqs(t, p, 1)
	waitUntil(t, "recovery", func() bool { return s.Stats().Applied == 6 })
	flushSub(t, p, s)
	st := s.Stats()
	if got := h.applied(); !slices.Equal(got, seqRange(0, 6)) || st.Stale {
		t.Fatalf("seqs = %v, stats = %+v", got, st)
	}
	checkPayloads(t, h)
	if st.CatchUpsFailed != 1 || st.CatchUps != 0 || st.ReplaysOK != 1 || st.ReplayRetries != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if req := p.ReplayRequests(); len(req) != 2 || req[0] != 0 || req[1] != 2 {
		t.Fatalf("replay requests = %v", req)
	}
}

func TestCatchUpAfterPublisherRestart(t *testing.T) {
	for _, steps := range []int{0, 3} {
		t.Run(fmt.Sprintf("buffer steps %d", steps), func(t *testing.T) {
			p1 := newPub(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
			h := &recorder{}
			s := startSub(t, catchUpConfig(p1), h, p1)
			waitUntil(t, "catch-up", func() bool { return s.Stats().CatchUps == 1 })
			publishSeqs(t, p1, 10)
			waitUntil(t, "first stream", func() bool { return s.Stats().Applied == 10 })
			cfg := zmqtest.Config{Endpoint: p1.Endpoint(), ReplayEndpoint: p1.ReplayEndpoint(), BufferSteps: steps}
			if err := p1.Close(); err != nil {
				t.Fatal(err)
			}
			p2 := rebind(t, cfg)
			publishSeqs(t, p2, 6) // before the SUB is back: only the new ring has them
			if err := p2.WaitSubscribers(1, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			publishSeqs(t, p2, 1) // reveals the restart; the ring then holds 4, 5, 6
			waitUntil(t, "catch-up after restart", func() bool { return s.Stats().CatchUps == 2 || s.Stats().Stale })
			publishSeqs(t, p2, 1)
			first := uint64(0)
			if steps == 3 {
				first = 4 // the new ring no longer reaches 0: history before 4 is unknown
			}
			want := append(seqRange(0, 10), seqRange(first, 8)...)
			waitUntil(t, "second stream", func() bool { return len(h.applied()) >= len(want) || s.Stats().Stale })
			flushSub(t, p2, s)
			st := s.Stats()
			if got := h.applied(); !slices.Equal(got, want) || st.Stale || st.Restarts != 1 || st.CatchUps != 2 {
				t.Fatalf("seqs = %v, stats = %+v, stale reasons %q", got, st, h.staleReasons())
			}
			checkPayloads(t, h)
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.restarts) != 1 || h.restarts[0][0] != 9 {
				t.Fatalf("restart notifications = %v", h.restarts)
			}
		})
	}
}

// burstRecorder defers batches until Flush, like translate.EventHandler.
type burstRecorder struct {
	deferred, flushed []uint64
}

func (b *burstRecorder) HandleBatch(seq uint64, _ []byte) error {
	b.flushed = append(b.flushed, seq)
	return nil
}

func (b *burstRecorder) HandleBatchDeferred(seq uint64, _ []byte) error {
	b.deferred = append(b.deferred, seq)
	return nil
}

func (b *burstRecorder) Flush() {
	b.flushed = append(b.flushed, b.deferred...)
	b.deferred = b.deferred[:0]
}

func (b *burstRecorder) OnStale(string) {}

// TestBurstHandlerFlushedBeforeCounted: with a BurstHandler, the subscriber defers every
// batch of a burst and counts it as applied only once Flush has returned. Driven on this
// goroutine (it owns the sockets here), step by step.
func TestBurstHandlerFlushedBeforeCounted(t *testing.T) {
	p := newPub(t, zmqtest.Config{})
	h := &burstRecorder{}
	s := steppedSub(t, p, h, nil)
	publish(t, p, "a", "b", "c")
	for got := 0; got < 3; {
		n, err := s.pumpSub()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			got++
		}
	}
	if len(h.deferred) != 3 || len(h.flushed) != 0 || s.Stats().Applied != 0 {
		t.Fatalf("before flush: deferred %v flushed %v applied %d", h.deferred, h.flushed, s.Stats().Applied)
	}
	s.flush()
	if !slices.Equal(h.flushed, seqRange(0, 3)) || s.Stats().Applied != 3 {
		t.Fatalf("after flush: flushed %v applied %d", h.flushed, s.Stats().Applied)
	}
}

// TestIdleSubscriberWaitsLong: with no timer due (no replay, catch-up or join check in
// progress), a subscriber's wait is bounded by DefaultPollTimeout, seconds long, so an
// idle subscription (a thousand of them on dead endpoints) does not wake ten times a
// second; Stop still wakes it at once (TestStartAndStopLifecycle).
func TestIdleSubscriberWaitsLong(t *testing.T) {
	s, err := NewSubscriber(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}, &recorder{})
	if err != nil {
		t.Fatal(err)
	}
	if d := s.waitFor(time.Now()); d < time.Second {
		t.Fatalf("idle wait %v, want at least a second", d)
	}
}
