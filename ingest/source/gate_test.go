package source

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/conductor-go/conductor/ingest"
)

// fakeInner records what a gate forwards, as the event handler would apply it: a batch
// handed over with HandleBatch is applied at once, one handed over deferred waits for
// Flush. It does not flush by itself on OnStale or OnPublisherRestart (the real handler
// does): the gate must have flushed the burst before, which the log then shows.
type fakeInner struct {
	calls   []string // what reached the index, in order
	held    []string // deferred, not flushed yet
	flushes int      // Flush calls that applied something
	fail    uint64   // this seq is rejected
	// onFlush, when set, runs at each Flush (before the held batches are applied).
	onFlush func()
}

var errBadBatch = errors.New("bad batch")

func (f *fakeInner) HandleBatch(seq uint64, payload []byte) error {
	f.Flush()
	if seq == f.fail {
		f.calls = append(f.calls, fmt.Sprintf("reject %d", seq))
		return errBadBatch
	}
	f.calls = append(f.calls, fmt.Sprintf("apply %d %s", seq, payload))
	return nil
}

func (f *fakeInner) HandleBatchDeferred(seq uint64, payload []byte) error {
	if seq == f.fail {
		f.calls = append(f.calls, fmt.Sprintf("reject %d", seq))
		return errBadBatch
	}
	f.held = append(f.held, fmt.Sprintf("apply %d %s", seq, payload))
	return nil
}

func (f *fakeInner) Flush() {
	if f.onFlush != nil {
		f.onFlush()
	}
	if len(f.held) == 0 {
		return
	}
	f.flushes++
	f.calls = append(f.calls, f.held...)
	f.held = f.held[:0]
}

func (f *fakeInner) OnStale(string) { f.calls = append(f.calls, f.unflushed()+"stale") }

func (f *fakeInner) OnPublisherRestart(uint64, uint64) {
	f.calls = append(f.calls, f.unflushed()+"restart")
}

func (f *fakeInner) unflushed() string {
	if len(f.held) > 0 {
		return fmt.Sprintf("(%d deferred batches not flushed!) ", len(f.held))
	}
	return ""
}

func payloadOf(seq uint64) []byte { return []byte(fmt.Sprintf("b%d", seq)) }

// TestGateOpen: the gate's decisions at open and on the first live batches after it,
// with the subscriber handing batches over one at a time (HandleBatch) and in bursts
// (HandleBatchDeferred, then Flush): the index sees the same batches in the same order.
func TestGateOpen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		buffered  []uint64
		threshold uint64
		have      bool
		restart   bool // publisher restart while closed, before the buffered batches
		live      []uint64
		fail      uint64
		want      []string
		stale     bool
		last      uint64 // lastApplied at the end (0: none)
		// behind: the buffer begins after threshold+1, or a hole ends past threshold
		// (reachesBack false before open).
		behind bool
		// lost: holes the subscriber offers while closed (first, last), after the
		// buffered batches below them; each is taken.
		lost [][2]uint64
	}{
		{name: "no snapshot: apply all", buffered: []uint64{5, 6}, live: []uint64{7},
			want: []string{"apply 5 b5", "apply 6 b6", "apply 7 b7"}, last: 7},
		{name: "drop what the snapshot holds", buffered: []uint64{5, 6, 7, 8}, threshold: 6, have: true, live: []uint64{9},
			want: []string{"apply 7 b7", "apply 8 b8", "apply 9 b9"}, last: 9},
		{name: "snapshot ahead of the buffer", buffered: []uint64{5, 6}, threshold: 9, have: true, live: []uint64{9, 10},
			want: []string{"apply 10 b10"}, last: 10},
		{name: "nothing buffered, next live continues", threshold: 4, have: true, live: []uint64{3, 4, 5, 6},
			want: []string{"apply 5 b5", "apply 6 b6"}, last: 6},
		{name: "gap in the buffer", buffered: []uint64{8, 9}, threshold: 6, have: true, live: []uint64{10},
			want: []string{"stale"}, stale: true, behind: true},
		{name: "gap after open", threshold: 6, have: true, live: []uint64{8, 9},
			want: []string{"stale"}, last: 6},
		// Nothing buffered and nothing live yet: the snapshot's cut is what the index
		// holds (a snapshot of this replica must carry it).
		{name: "snapshot only", threshold: 4, have: true, want: nil, last: 4},
		{name: "restart while closed: retract, apply the new stream", restart: true, buffered: []uint64{1, 2}, threshold: 50, have: true,
			want: []string{"restart", "apply 1 b1", "apply 2 b2"}, last: 2},
		{name: "rejected buffered batch", buffered: []uint64{7, 8, 9}, threshold: 6, have: true, fail: 8,
			want: []string{"reject 8", "apply 7 b7", "stale"}, stale: true, last: 7},
		// Batches the subscriber lost for good while the gate was closed (its replay came
		// too late): the snapshot holds them when its cut reaches them.
		{name: "hole held by the snapshot", buffered: []uint64{5, 6, 9, 10}, lost: [][2]uint64{{7, 8}}, threshold: 9, have: true,
			live: []uint64{11}, want: []string{"apply 10 b10", "apply 11 b11"}, last: 11},
		{name: "holes at the cut", buffered: []uint64{2, 5, 8}, lost: [][2]uint64{{3, 4}, {6, 7}}, threshold: 7, have: true,
			want: []string{"apply 8 b8"}, last: 8},
		{name: "hole past the cut", buffered: []uint64{5, 6, 9, 10}, lost: [][2]uint64{{7, 8}}, threshold: 7, have: true,
			want: []string{"stale"}, stale: true, behind: true},
		{name: "hole without a snapshot", buffered: []uint64{5, 6, 9}, lost: [][2]uint64{{7, 8}},
			want: []string{"stale"}, stale: true},
		{name: "hole of the old stream after a restart", restart: true, buffered: []uint64{1, 2}, threshold: 50, have: true,
			want: []string{"restart", "apply 1 b1", "apply 2 b2"}, last: 2},
	} {
		for _, burst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/burst=%v", tc.name, burst), func(t *testing.T) {
				in := &fakeInner{fail: tc.fail}
				g := newGate(in, true)
				hand := g.HandleBatch
				if burst {
					hand = g.HandleBatchDeferred
				}
				if tc.restart {
					_ = hand(40, []byte("old"))
					if !g.OnHole(41, 45, "test") { // of the old stream: dropped with it
						t.Fatal("closed gate refused a hole")
					}
					g.OnPublisherRestart(40, 1)
				}
				lost := tc.lost
				for _, s := range tc.buffered {
					for len(lost) > 0 && lost[0][0] < s {
						if !g.OnHole(lost[0][0], lost[0][1], "test") {
							t.Fatalf("closed gate refused hole %v", lost[0])
						}
						lost = lost[1:]
					}
					if err := hand(s, payloadOf(s)); err != nil {
						t.Fatal(err)
					}
					g.Flush() // the subscriber's end of step: nothing to flush while closed
				}
				if len(in.calls) != 0 || len(in.held) != 0 {
					t.Fatalf("closed gate forwarded %v (held %v)", in.calls, in.held)
				}
				if _, ok := g.lastApplied(); ok {
					t.Fatal("closed gate reports a batch applied")
				}
				if tc.have && g.reachesBack(tc.threshold) == tc.behind {
					t.Fatalf("reachesBack(%d) = %v with %v buffered", tc.threshold, !tc.behind, tc.buffered)
				}
				stale, _ := g.open(tc.threshold, tc.have)
				if !g.reachesBack(tc.threshold) {
					t.Fatal("an open gate reports a snapshot it cannot continue")
				}
				if stale != tc.stale {
					t.Fatalf("stale = %v", stale)
				}
				for _, s := range tc.live {
					_ = hand(s, payloadOf(s))
				}
				g.Flush()
				if !reflect.DeepEqual(in.calls, tc.want) {
					t.Fatalf("calls %v, want %v", in.calls, tc.want)
				}
				last, ok := g.lastApplied()
				if ok != (tc.last != 0) || ok && last != tc.last {
					t.Fatalf("lastApplied = %d %v, want %d", last, ok, tc.last)
				}
			})
		}
	}
}

// TestGateOpenAppliesBufferAsOneBurst: the batches a closed gate kept reach the index in
// one flush at open.
func TestGateOpenAppliesBufferAsOneBurst(t *testing.T) {
	in := &fakeInner{}
	g := newGate(in, true)
	for s := uint64(1); s <= 5; s++ {
		_ = g.HandleBatchDeferred(s, payloadOf(s))
	}
	if stale, reason := g.open(0, false); stale {
		t.Fatal(reason)
	}
	if in.flushes != 1 || len(in.calls) != 5 {
		t.Fatalf("%d flushes, calls %v; want the 5 batches in 1 flush", in.flushes, in.calls)
	}
}

// TestGateBurstAppliedAtFlush: through an open gate, a burst is handed on deferred and
// counts as applied (lastApplied, which snapshots read) only once it is flushed; a
// rejected batch of the burst does not count, the ones before it do.
func TestGateBurstAppliedAtFlush(t *testing.T) {
	in := &fakeInner{fail: 4}
	g := newGate(in, false)
	lastIs := func(step string, want uint64, wantOK bool) {
		t.Helper()
		if last, ok := g.lastApplied(); last != want || ok != wantOK {
			t.Fatalf("%s: lastApplied %d %v, want %d %v", step, last, ok, want, wantOK)
		}
	}
	for s := uint64(1); s <= 3; s++ {
		if err := g.HandleBatchDeferred(s, payloadOf(s)); err != nil {
			t.Fatal(err)
		}
	}
	if len(in.calls) != 0 || len(in.held) != 3 {
		t.Fatalf("before flush: calls %v held %v", in.calls, in.held)
	}
	lastIs("before flush", ^uint64(0), false)
	g.Flush()
	if in.flushes != 1 || len(in.calls) != 3 {
		t.Fatalf("after flush: %d flushes, calls %v", in.flushes, in.calls)
	}
	lastIs("after flush", 3, true)
	g.Flush() // nothing in flight: the inner handler is not asked
	if in.flushes != 1 {
		t.Fatalf("empty flush reached the handler")
	}

	// Batch 4 is rejected; 5 (the subscriber goes stale before it in real life) is not
	// handed over. What was deferred before the rejection is applied at the flush.
	if err := g.HandleBatchDeferred(4, payloadOf(4)); err == nil {
		t.Fatal("rejection not passed on")
	}
	g.Flush()
	lastIs("after a rejected burst", 3, true)
}

// TestGateRetractionsFlushFirst: a stale source or a publisher restart reaches the
// handler only after the burst in flight is applied (and counted), so that the
// retraction removes it too.
func TestGateRetractionsFlushFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(g *gate)
		want string
	}{
		{"stale", func(g *gate) { g.OnStale("test") }, "stale"},
		{"restart", func(g *gate) { g.OnPublisherRestart(2, 0) }, "restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &fakeInner{}
			g := newGate(in, false)
			_ = g.HandleBatchDeferred(1, payloadOf(1))
			_ = g.HandleBatchDeferred(2, payloadOf(2))
			tc.act(g)
			want := []string{"apply 1 b1", "apply 2 b2", tc.want}
			if !reflect.DeepEqual(in.calls, want) {
				t.Fatalf("calls %v, want %v", in.calls, want)
			}
			if last, ok := g.lastApplied(); !ok || last != 2 {
				t.Fatalf("lastApplied %d %v, want 2", last, ok)
			}
		})
	}
}

// TestGateImmediateAfterBurst: a batch handed over at once (HandleBatch) while a burst is
// in flight is applied after the burst.
func TestGateImmediateAfterBurst(t *testing.T) {
	in := &fakeInner{}
	g := newGate(in, false)
	_ = g.HandleBatchDeferred(1, payloadOf(1))
	_ = g.HandleBatch(2, payloadOf(2))
	want := []string{"apply 1 b1", "apply 2 b2"}
	if !reflect.DeepEqual(in.calls, want) {
		t.Fatalf("calls %v, want %v", in.calls, want)
	}
	if last, _ := g.lastApplied(); last != 2 {
		t.Fatalf("lastApplied %d, want 2", last)
	}
}

// TestGateOpenWhileSubscriberRuns: open runs on the bootstrap goroutine while the
// subscriber's goroutine goes on. Stepped: open is held inside its flush of the buffer;
// meanwhile the subscriber ends a step (Flush: nothing of its own is in flight, so the
// handler must not be touched: the race detector sees it if it is) and hands over the
// next batch, which is applied after the buffer, whichever of the two gets the gate
// first once open is released.
func TestGateOpenWhileSubscriberRuns(t *testing.T) {
	in := &fakeInner{}
	g := newGate(in, true)
	for s := uint64(1); s <= 3; s++ {
		_ = g.HandleBatchDeferred(s, payloadOf(s))
	}
	inFlush, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	in.onFlush = func() {
		once.Do(func() {
			close(inFlush)
			<-release
		})
	}
	opened := make(chan bool)
	go func() {
		stale, _ := g.open(0, false)
		opened <- stale
	}()
	<-inFlush
	g.Flush() // the subscriber's end of step, while open is applying the buffer
	handed := make(chan error)
	go func() {
		err := g.HandleBatchDeferred(4, payloadOf(4))
		g.Flush()
		handed <- err
	}()
	close(release)
	if stale := <-opened; stale {
		t.Fatal("open: stale")
	}
	if err := <-handed; err != nil {
		t.Fatal(err)
	}
	want := []string{"apply 1 b1", "apply 2 b2", "apply 3 b3", "apply 4 b4"}
	if !reflect.DeepEqual(in.calls, want) {
		t.Fatalf("calls %v, want %v", in.calls, want)
	}
	if last, _ := g.lastApplied(); last != 4 {
		t.Fatalf("lastApplied %d, want 4", last)
	}
}

type nopInner struct{}

func (nopInner) HandleBatch(uint64, []byte) error         { return nil }
func (nopInner) HandleBatchDeferred(uint64, []byte) error { return nil }
func (nopInner) Flush()                                   {}
func (nopInner) OnStale(string)                           {}
func (nopInner) OnPublisherRestart(uint64, uint64)        {}

// BenchmarkGateHandleBatch: what the gate adds to every batch of an open subscription
// (the sequence bookkeeping snapshots read), one batch at a time and in bursts of 16.
func BenchmarkGateHandleBatch(b *testing.B) {
	payload := make([]byte, 256)
	b.Run("immediate", func(b *testing.B) {
		g := newGate(nopInner{}, false)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_ = g.HandleBatch(uint64(i), payload)
		}
	})
	b.Run("burst16", func(b *testing.B) {
		g := newGate(nopInner{}, false)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			_ = g.HandleBatchDeferred(uint64(i), payload)
			if i%16 == 15 {
				g.Flush()
			}
		}
	})
}

// TestGateOpenAllocatesNothing guards the open gate's paths: no allocation per batch.
func TestGateOpenAllocatesNothing(t *testing.T) {
	g := newGate(nopInner{}, false)
	payload := make([]byte, 256)
	seq := uint64(0)
	if n := testing.AllocsPerRun(1000, func() { seq++; _ = g.HandleBatch(seq, payload) }); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		seq++
		_ = g.HandleBatchDeferred(seq, payload)
		g.Flush()
	}); n != 0 {
		t.Fatalf("%v allocations per deferred batch", n)
	}
}

// TestGateSetBehind: Behind names the sources whose held batches a snapshot cut at seqs
// cannot continue (a gap after the cut), and none that it can, that it does not cover, or
// that are already open.
func TestGateSetBehind(t *testing.T) {
	s := NewGateSet(true)
	hold := func(ep string, seqs ...uint64) {
		g := s.add(ep, &fakeInner{})
		for _, q := range seqs {
			if err := g.HandleBatch(q, payloadOf(q)); err != nil {
				t.Fatal(err)
			}
		}
	}
	hold("tcp://a", 10, 11, 12) // continues a cut at 9 or later
	hold("tcp://b", 20, 21)     // needs a cut at 19 or later
	hold("tcp://c", 5)          // not in the snapshot
	hold("tcp://d")             // holds nothing: any cut will do
	hold("tcp://e", 30, 31)     // behind a cut at 1; a cut at 40 is past what it holds
	seqs := map[string]uint64{"tcp://a": 9, "tcp://b": 17, "tcp://d": 3, "tcp://e": 1}
	if got, want := s.Behind(seqs), []string{"tcp://b", "tcp://e"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Behind = %v, want %v", got, want)
	}
	seqs["tcp://b"], seqs["tcp://e"] = 19, 40 // a later cut: b continues, e is past its buffer
	if got := s.Behind(seqs); len(got) != 0 {
		t.Fatalf("Behind a later cut = %v", got)
	}
	seqs["tcp://b"], seqs["tcp://e"] = 17, 1
	stale := s.OpenAll(seqs)
	if _, ok := stale["tcp://b"]; !ok || len(stale) != 2 {
		t.Fatalf("OpenAll stale = %v, want b and e", stale)
	}
	if got := s.Behind(seqs); len(got) != 0 {
		t.Fatalf("Behind after OpenAll = %v", got)
	}
}

// TestGateHoleAfterOpen: a hole the subscriber offers once the gate is open (its replay
// failed after the snapshot loaded) is taken only at or below the cut the gate opened
// with; past it, or without a snapshot, it is refused (the subscriber then marks the
// source stale). Batches after a taken hole go on as before.
func TestGateHoleAfterOpen(t *testing.T) {
	in := &fakeInner{}
	g := newGate(in, true)
	if stale, reason := g.open(9, true); stale {
		t.Fatal(reason)
	}
	if !g.OnHole(7, 9, "test") {
		t.Fatal("hole at or below the cut refused")
	}
	if g.OnHole(10, 10, "test") {
		t.Fatal("hole past the cut taken")
	}
	for _, s := range []uint64{9, 10, 11} {
		_ = g.HandleBatch(s, payloadOf(s))
	}
	if want := []string{"apply 10 b10", "apply 11 b11"}; !reflect.DeepEqual(in.calls, want) {
		t.Fatalf("calls %v, want %v", in.calls, want)
	}
	for _, closed := range []bool{false, true} {
		g := newGate(&fakeInner{}, closed)
		if closed {
			g.open(0, false) // opened without a snapshot
		}
		if g.OnHole(1, 1, "test") {
			t.Fatalf("hole taken by an open gate that loaded no snapshot (closed first: %v)", closed)
		}
	}
}

// TestGateManyHoles: a closed gate takes any number of holes in constant memory (it
// keeps the latest only, since they come in order): a cut past the last one opens it
// fresh, a cut between two of them makes the source stale.
func TestGateManyHoles(t *testing.T) {
	for _, tc := range []struct {
		cut   uint64
		stale bool
	}{{cut: 2000, stale: false}, {cut: 1000, stale: true}} {
		g := newGate(&fakeInner{}, true)
		for i := range uint64(1000) {
			if !g.OnHole(2*i, 2*i, "test") {
				t.Fatalf("hole %d refused", i)
			}
			if err := g.HandleBatch(2*i+1, payloadOf(2*i+1)); err != nil {
				t.Fatal(err)
			}
		}
		if back := g.reachesBack(tc.cut); back == tc.stale {
			t.Fatalf("cut %d: reachesBack %v", tc.cut, back)
		}
		if stale, reason := g.open(tc.cut, true); stale != tc.stale {
			t.Fatalf("cut %d: stale %v (%s), want %v", tc.cut, stale, reason, tc.stale)
		}
	}
}

// TestGateStaleStopsSubscriber: once the gate has made its source stale itself (at open,
// or on a gap after it), it answers every batch with an ingest.ErrSourceStale error, so
// that the subscriber goes stale too and stops reading, and forwards nothing more: the
// handler hears OnStale once, from the gate.
func TestGateStaleStopsSubscriber(t *testing.T) {
	for _, tc := range []struct {
		name     string
		buffered []uint64
		live     []uint64
	}{
		{name: "stale at open", buffered: []uint64{8, 9}, live: []uint64{10, 11}},
		{name: "gap after open", live: []uint64{8, 9}},
	} {
		for _, burst := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/burst=%v", tc.name, burst), func(t *testing.T) {
				in := &fakeInner{}
				g := newGate(in, true)
				hand := g.HandleBatch
				if burst {
					hand = g.HandleBatchDeferred
				}
				for _, s := range tc.buffered {
					if err := hand(s, payloadOf(s)); err != nil {
						t.Fatal(err)
					}
				}
				g.open(6, true)
				for _, s := range tc.live {
					if err := hand(s, payloadOf(s)); !errors.Is(err, ingest.ErrSourceStale) {
						t.Fatalf("batch %d: err %v, want ingest.ErrSourceStale", s, err)
					}
				}
				g.Flush()
				if want := []string{"stale"}; !reflect.DeepEqual(in.calls, want) {
					t.Fatalf("calls %v, want %v", in.calls, want)
				}
			})
		}
	}
}
