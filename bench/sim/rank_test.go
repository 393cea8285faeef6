package sim

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// keysOf returns n distinct fake block keys starting at base (ranks never hash; keys
// are opaque to them).
func keysOf(base uint64, n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = base + uint64(i)
	}
	return k
}

func tokensFor(n, bs int) []int32 {
	t := make([]int32, n*bs)
	for i := range t {
		t[i] = int32(i)
	}
	return t
}

func newTestRank(t *testing.T, kind publisher.Kind, cc CacheConfig) (*Rank, *captureSink) {
	t.Helper()
	sink := &captureSink{}
	r, err := newRank(0, 1, kind, 4, cc, sink, StyleMinimal, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return r, sink
}

// TestRankLRUEvictsTailFirst: a vLLM rank evicts the least recently used blocks, and
// within one prompt its last blocks before its first, so prefixes survive longest.
func TestRankLRUEvictsTailFirst(t *testing.T) {
	r, sink := newTestRank(t, publisher.VLLM, CacheConfig{Device: 4})
	a, b := keysOf(100, 3), keysOf(200, 3)
	m, err := r.Store(tokensFor(3, 4), a, 1)
	if err != nil || m != (Match{}) {
		t.Fatalf("first store: match %+v err %v", m, err)
	}
	if m = r.Match(a); m != (Match{3, 3, 3}) {
		t.Fatalf("after store: %+v, want all 3 blocks", m)
	}
	if _, err := r.Store(tokensFor(3, 4), b, 2); err != nil {
		t.Fatal(err)
	}
	// a's tail (a2, a1) went first; a0 survives.
	if m = r.Match(a); m != (Match{1, 1, 1}) {
		t.Fatalf("a after b: %+v, want 1 block", m)
	}
	if len(sink.batches) != 2 {
		t.Fatalf("%d batches, want 2", len(sink.batches))
	}
	first := decodeTestBatch(t, sink.batches[0])
	if len(first.Events) != 1 || first.Events[0].Type != "BlockStored" || !slices.Equal(first.Events[0].Hashes, a) ||
		first.Events[0].Parent != nil || len(first.Events[0].Tokens) != 12 || first.Rank != 1 {
		t.Fatalf("first batch %+v", first)
	}
	second := decodeTestBatch(t, sink.batches[1])
	var types []string
	var removed []uint64
	for _, ev := range second.Events {
		types = append(types, ev.Type)
		if ev.Type == "BlockRemoved" {
			removed = append(removed, ev.Hashes...)
			if ev.Medium != "GPU" || len(ev.Hashes) != 1 {
				t.Fatalf("removed event %+v", ev)
			}
		}
	}
	if !slices.Equal(types, []string{"BlockRemoved", "BlockRemoved", "BlockStored"}) || !slices.Equal(removed, []uint64{102, 101}) {
		t.Fatalf("second batch types %v removed %v", types, removed)
	}
	// A hit on a0 followed by new blocks: one run whose parent is a0.
	ext := append([]uint64{a[0]}, keysOf(300, 2)...)
	m, err = r.Store(tokensFor(3, 4), ext, 3)
	if err != nil || m.Device != 1 {
		t.Fatalf("extension: %+v %v", m, err)
	}
	last := decodeTestBatch(t, sink.batches[2])
	st := last.Events[len(last.Events)-1]
	if st.Type != "BlockStored" || st.Parent == nil || *st.Parent != a[0] || !slices.Equal(st.Hashes, ext[1:]) || len(st.Tokens) != 8 {
		t.Fatalf("extension stored %+v", st)
	}
}

// TestRankSGLangTiers: an SGLang rank demotes device victims to CPU and then to disk,
// promotes a lower-tier hit back to the device, and counts matches like the conductor.
func TestRankSGLangTiers(t *testing.T) {
	r, sink := newTestRank(t, publisher.SGLang, CacheConfig{Device: 2, CPU: 2, Disk: 2})
	a := keysOf(10, 2)
	b := keysOf(20, 2)
	c := keysOf(30, 2)
	for _, k := range [][]uint64{a, b, c} {
		if _, err := r.Store(tokensFor(2, 4), k, 1); err != nil {
			t.Fatal(err)
		}
	}
	// device: c; cpu: b; disk: a.
	if got := [3]int{r.Blocks(TierDevice), r.Blocks(TierCPU), r.Blocks(TierDisk)}; got != [3]int{2, 2, 2} {
		t.Fatalf("tier sizes %v", got)
	}
	if m := r.Match(a); m != (Match{0, 0, 2}) {
		t.Fatalf("a: %+v, want disk only", m)
	}
	if m := r.Match(b); m != (Match{0, 2, 2}) {
		t.Fatalf("b: %+v, want cpu", m)
	}
	if m := r.Match(c); m != (Match{2, 2, 2}) {
		t.Fatalf("c: %+v, want device", m)
	}
	// Mixed prefix: device block then cpu block.
	if m := r.Match([]uint64{c[0], b[0], a[0], 99}); m != (Match{1, 2, 3}) {
		t.Fatalf("mixed: %+v, want {1 2 3}", m)
	}
	// Promote a from disk: c goes to cpu, b to disk.
	m, err := r.Store(tokensFor(2, 4), a, 2)
	if err != nil || m != (Match{0, 0, 2}) {
		t.Fatalf("promote: %+v %v", m, err)
	}
	if r.Match(a).Device != 2 || r.Match(c) != (Match{0, 2, 2}) || r.Match(b) != (Match{0, 0, 2}) {
		t.Fatalf("after promotion a %+v b %+v c %+v", r.Match(a), r.Match(b), r.Match(c))
	}
	// The events reconstruct exactly the rank's tiers.
	md := model{}
	for _, p := range sink.batches {
		tb := decodeTestBatch(t, p)
		for _, ev := range tb.Events {
			if ev.Type == "BlockStored" && len(ev.Hashes) != 1 {
				t.Fatalf("SGLang BlockStored with %d hashes", len(ev.Hashes))
			}
		}
		md.apply(t, tb)
	}
	checkModel(t, r, md)
}

func checkModel(t *testing.T, r *Rank, md model) {
	t.Helper()
	for tier := TierDevice; tier < numTiers; tier++ {
		want := map[uint64]bool{}
		if r.tiers[tier] != nil {
			r.tiers[tier].each(func(k uint64) { want[k] = true })
		}
		got := md[tier.String()]
		if len(got) != len(want) {
			t.Fatalf("tier %s: events say %d blocks, rank holds %d", tier.String(), len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				t.Fatalf("tier %s: block %x held but never announced", tier.String(), k)
			}
		}
	}
}

// TestRankEventsReconstructState: under a random workload of overlapping prompts, the
// published events always describe exactly what each tier holds, and batches never
// exceed the event cap.
func TestRankEventsReconstructState(t *testing.T) {
	for _, kind := range []publisher.Kind{publisher.VLLM, publisher.SGLang} {
		t.Run(kind.String(), func(t *testing.T) {
			sink := &captureSink{}
			r, err := newRank(0, 0, kind, 4, CacheConfig{Device: 24, CPU: 16, Disk: 8}, sink, StyleCurrent, "lora-x", 7)
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			md := model{}
			for step := 0; step < 400; step++ {
				// Prompts share prefixes: pick a root and a depth along a fixed chain.
				root := uint64(rng.IntN(6)) << 32
				n := 1 + rng.IntN(30)
				keys := make([]uint64, n)
				for i := range keys {
					keys[i] = root + uint64(i)
					if i > n/2 && rng.IntN(4) == 0 {
						keys[i] += uint64(step) << 16 // divergent suffix
					}
				}
				before := r.Match(keys)
				sink.batches = sink.batches[:0]
				got, err := r.Store(tokensFor(n, 4), keys, float64(step))
				if err != nil {
					t.Fatal(err)
				}
				if got != before {
					t.Fatalf("step %d: Store reported %+v, Match said %+v", step, got, before)
				}
				for _, p := range sink.batches {
					tb := decodeTestBatch(t, p)
					if len(tb.Events) > 7 {
						t.Fatalf("batch of %d events exceeds cap 7", len(tb.Events))
					}
					md.apply(t, tb)
				}
				checkModel(t, r, md)
				if m := r.Match(keys); m.Device != min(n, 24) {
					t.Fatalf("step %d: prompt not on device after store: %+v", step, m)
				}
			}
			st := r.Stats()
			if st.Requests != 400 || st.Batches == 0 || st.Stored == 0 || st.Removed == 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestRankClear: AllBlocksCleared empties every tier.
func TestRankClear(t *testing.T) {
	r, sink := newTestRank(t, publisher.SGLang, CacheConfig{Device: 2, CPU: 2})
	if _, err := r.Store(tokensFor(3, 4), keysOf(1, 3), 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Clear(2); err != nil {
		t.Fatal(err)
	}
	if r.Blocks(TierDevice)+r.Blocks(TierCPU) != 0 {
		t.Fatal("tiers not empty after Clear")
	}
	tb := decodeTestBatch(t, sink.batches[len(sink.batches)-1])
	if len(tb.Events) != 1 || tb.Events[0].Type != "AllBlocksCleared" {
		t.Fatalf("clear batch %+v", tb)
	}
}

// TestRankConfigErrors: impossible tier layouts are rejected.
func TestRankConfigErrors(t *testing.T) {
	if _, err := newRank(0, 0, publisher.VLLM, 4, CacheConfig{}, nil, StyleMinimal, "", 0); err == nil {
		t.Error("zero device capacity accepted")
	}
	if _, err := newRank(0, 0, publisher.SGLang, 4, CacheConfig{Device: 1, Disk: 1}, nil, StyleMinimal, "", 0); err == nil {
		t.Error("disk without cpu accepted")
	}
}

// TestRankWithoutSink: a rank without a sink (baseline simulations) keeps the same cache
// state and counts, but encodes nothing.
func TestRankWithoutSink(t *testing.T) {
	with, _ := newTestRank(t, publisher.VLLM, CacheConfig{Device: 5})
	without, err := newRank(0, 0, publisher.VLLM, 4, CacheConfig{Device: 5}, nil, StyleMinimal, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 100; i++ {
		keys := keysOf(uint64(rng.IntN(4))<<20, 1+rng.IntN(6))
		m1, _ := with.Store(tokensFor(len(keys), 4), keys, 0)
		m2, _ := without.Store(tokensFor(len(keys), 4), keys, 0)
		if m1 != m2 {
			t.Fatalf("step %d: %+v vs %+v", i, m1, m2)
		}
	}
	if without.Stats().Batches != 0 || without.Stats().Stored != with.Stats().Stored {
		t.Fatalf("stats with %+v without %+v", with.Stats(), without.Stats())
	}
}
