package engine

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// snapshotSet flattens a context's snapshot into comparable lines (slot identities, not
// numbers), and counts the chunks.
func snapshotSet(t *testing.T, e *Engine, key ContextKey, step int) (lines []string, chunks int) {
	t.Helper()
	err := e.SnapshotContext(key, step, func(ch *SnapshotChunk) error {
		chunks++
		for _, en := range ch.Entries {
			s := ch.Slots[en.Slot]
			lines = append(lines, fmt.Sprintf("e %x %s/%d %b", en.Key, s.InstanceID, s.DPRank, en.Tiers))
		}
		for _, b := range ch.Bindings {
			comps := append([]string(nil), b.Components...)
			sort.Strings(comps)
			lines = append(lines, fmt.Sprintf("b %s %s %s %d %x %v", b.Source, b.Backend, b.ObjectKey, b.Tier, b.Hash, comps))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return lines, chunks
}

// TestSnapshotRoundTrip: a context copied in small steps and loaded into a fresh engine
// holds the same blocks per slot and tier and the same shared bindings, and answers the
// same queries.
func TestSnapshotRoundTrip(t *testing.T) {
	a, b := Slot{InstanceID: "a", DPRank: 0}, Slot{InstanceID: "b", DPRank: 1}
	src, key, p := setup(t, Config{}, a, b), ctxA, vllmProfile(t)
	hs := seqKeys(1, 50)
	ops := []Op{
		{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: hs[:40]},
		{Kind: OpStore, Slot: a, Tier: TierDisk, Hashes: hs[10:20]},
		{Kind: OpStore, Slot: b, Tier: TierCPULocal, Hashes: hs[30:50]},
		{Kind: OpRemove, Slot: a, Tier: TierDevice, Hashes: hs[5:8]},
		{Kind: OpSharedStore, Source: "tcp://store:1", Backend: "x", ObjectKey: "o1", Component: "_0_k", SharedTier: SharedCPU, Hash: hs[0]},
		{Kind: OpSharedStore, Source: "tcp://store:1", Backend: "x", ObjectKey: "o1", Component: "_0_v", SharedTier: SharedCPU, Hash: hs[0]},
		{Kind: OpSharedStore, Source: "tcp://store:1", Backend: "x", ObjectKey: "o2", SharedTier: SharedDisk, Hash: 77},
		// A 64-hex key is stored as 32 binary bytes: the snapshot writes it back as text.
		{Kind: OpSharedStore, Source: "tcp://store:2", Backend: "y", ObjectKey: strings.Repeat("0123456789abcdef", 4),
			Component: "_1_v", SharedTier: SharedCPU, Hash: hs[1]},
	}
	if err := src.Apply(key, ops); err != nil {
		t.Fatal(err)
	}
	for i := range ops {
		if ops[i].Err != nil {
			t.Fatalf("op %d: %v", i, ops[i].Err)
		}
	}
	want, chunks := snapshotSet(t, src, key, 7)
	if !strings.Contains(fmt.Sprint(want), "b tcp://store:2 y "+strings.Repeat("0123456789abcdef", 4)+" 0 ") {
		t.Fatalf("hex-keyed binding not in the snapshot as its text: %v", want)
	}
	if chunks < 7 {
		t.Fatalf("%d chunks for 51 records in steps of 7", chunks)
	}
	if len(want) != 37+20+3 { // a: 37 blocks (10 also on disk), b: 20, three bindings
		t.Fatalf("snapshot has %d lines: %v", len(want), want)
	}

	dst := New(Config{})
	defer dst.Close()
	loaded := 0
	err := src.SnapshotContext(key, 7, func(ch *SnapshotChunk) error {
		n, skipped, err := dst.LoadSnapshotChunk(key, p, ch, func(Slot) bool { return true }, func(string) bool { return true })
		loaded += n
		if skipped != 0 {
			t.Errorf("skipped %d", skipped)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := snapshotSet(t, dst, key, 0)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loaded snapshot differs:\n got %v\nwant %v", got, want)
	}

	// A profile conflict refuses the chunk; slots and sources not allowed are skipped.
	other, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "1", "low64_be")
	if _, _, err := dst.LoadSnapshotChunk(key, other, &SnapshotChunk{}, nil, nil); err != ErrProfileConflict {
		t.Fatalf("profile conflict: %v", err)
	}
	part := New(Config{})
	defer part.Close()
	err = src.SnapshotContext(key, 0, func(ch *SnapshotChunk) error {
		_, _, err := part.LoadSnapshotChunk(key, p, ch, func(s Slot) bool { return s == b }, func(string) bool { return false })
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = snapshotSet(t, part, key, 0)
	if len(got) != 20 {
		t.Fatalf("only slot b loaded: %d lines %v", len(got), got)
	}
}

// TestSnapshotExactUnderWrites: writes applied between the snapshot's steps (the
// callback runs while the writer is free, so each write lands between two steps) are
// journaled; loading the chunks into a fresh engine rebuilds the context exactly as it is
// after the last step: removed blocks gone, blocks stored behind or ahead of the cursor
// present, cleared tiers cleared, bindings added and retracted.
func TestSnapshotExactUnderWrites(t *testing.T) {
	a, b := Slot{InstanceID: "a"}, Slot{InstanceID: "b", DPRank: 2}
	src, key, p := setup(t, Config{}, a, b), ctxA, vllmProfile(t)
	h := func(i int) uint64 { return uint64(i) * 0x9E3779B97F4A7C15 }
	first := make([]uint64, 40)
	for i := range first {
		first[i] = h(i + 1)
	}
	must := func(ops ...Op) {
		t.Helper()
		if err := src.Apply(key, ops); err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			if ops[i].Err != nil {
				t.Fatalf("op %d: %v", i, ops[i].Err)
			}
		}
	}
	must(Op{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: first},
		Op{Kind: OpStore, Slot: b, Tier: TierDisk, Hashes: first[:20]},
		Op{Kind: OpSharedStore, Source: "tcp://s:1", Backend: "x", ObjectKey: "o1", SharedTier: SharedCPU, Hash: h(1)})
	// One write batch per step: each mixes stores and removes behind and ahead of the cursor.
	writes := [][]Op{
		{{Kind: OpRemove, Slot: a, Tier: TierDevice, Hashes: []uint64{h(1), h(2), h(30)}},
			{Kind: OpStore, Slot: b, Tier: TierCPULocal, Hashes: []uint64{h(1), h(35), h(100), h(101)}}},
		{{Kind: OpStore, Slot: a, Tier: TierDevice, Hashes: []uint64{h(1), h(102)}},
			{Kind: OpSharedStore, Source: "tcp://s:1", Backend: "x", ObjectKey: "o2", Component: "_0_k", SharedTier: SharedDisk, Hash: h(38)}},
		{{Kind: OpClear, Slot: b, ClearTiers: MaskDisk},
			{Kind: OpSharedRemove, Source: "tcp://s:1", Backend: "x", ObjectKey: "o1", SharedTier: SharedCPU, Hash: h(1)}},
		{{Kind: OpRemove, Slot: b, Tier: TierCPULocal, Hashes: []uint64{h(100)}},
			{Kind: OpStore, Slot: a, Tier: TierDisk, Hashes: []uint64{h(3), h(39), h(103)}}},
	}
	dst := New(Config{})
	defer dst.Close()
	steps := 0
	err := src.SnapshotContext(key, 8, func(ch *SnapshotChunk) error {
		if _, _, err := dst.LoadSnapshotChunk(key, p, ch, nil, nil); err != nil {
			return err
		}
		if steps < len(writes) {
			must(writes[steps]...)
		}
		steps++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if steps < len(writes)+1 {
		t.Fatalf("only %d steps", steps)
	}
	want, _ := snapshotSet(t, src, key, 0)
	got, _ := snapshotSet(t, dst, key, 0)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rebuilt context differs:\n got %v\nwant %v", got, want)
	}
	// The writes made after the last step are not in it: the journal stopped.
	must(Op{Kind: OpStore, Slot: a, Hashes: []uint64{h(500)}})
	got, _ = snapshotSet(t, dst, key, 0)
	if strings.Contains(fmt.Sprint(got), fmt.Sprintf("%x", h(500))) {
		t.Fatal("a write after the snapshot reached the copy")
	}
}

// TestSnapshotWriterServesBetweenSteps: the snapshot holds the writer for one step at a
// time: during the callback of the first step, a write to the same context is applied
// (it would deadlock if the snapshot held the writer) and handed over in the next chunk's
// journal; the records copied are those of each step's moment.
func TestSnapshotWriterServesBetweenSteps(t *testing.T) {
	a := Slot{InstanceID: "a"}
	e, key := setup(t, Config{}, a), ctxA
	if err := e.Apply(key, []Op{{Kind: OpStore, Slot: a, Hashes: []uint64{1, 2, 3, 4}}}); err != nil {
		t.Fatal(err)
	}
	var log []string
	err := e.SnapshotContext(key, 2, func(ch *SnapshotChunk) error {
		for _, j := range ch.Journal {
			log = append(log, fmt.Sprintf("j%d%v", j.Kind, j.Hashes))
		}
		for _, en := range ch.Entries {
			log = append(log, fmt.Sprint(en.Key))
		}
		log = append(log, "|")
		if len(log) == 3 {
			// Records 0 and 1 are copied; remove key 1 (freeing record 0) and add key 5
			// (which takes record 0 again, behind the cursor).
			ops := []Op{{Kind: OpRemove, Slot: a, Hashes: []uint64{1}}, {Kind: OpStore, Slot: a, Hashes: []uint64{5}}}
			if err := e.Apply(key, ops); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(log); got != "[1 2 | j1[1] j0[5] 3 4 |]" {
		t.Fatalf("stream %s", got)
	}
}

// TestSnapshotHidesPendingClears: a is unregistered while its clear is still pending in
// the records and b takes a's freed slot number. The snapshot, like a query, must not
// copy a's bits (neither as a's nor as b's): loaded elsewhere they would be hits that do
// not exist. Only c's blocks and b's own store are in it.
func TestSnapshotHidesPendingClears(t *testing.T) {
	a, b, c := Slot{"a", 0}, Slot{"b", 0}, Slot{"c", 0}
	e, _ := hookedEngineWith(t, Config{}, &testHooks{noIdleMigration: true, sweepChunk: 4}, a, c)
	hs := seqKeys(78, 60)
	mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(c, TierDisk, hs[:10]...))
	e.UnregisterSlot(ctxA, a)
	mustRegister(t, e, ctxA, vllmProfile(t), b)
	mustApply(t, e, ctxA, store(b, TierCPULocal, hs[50:]...))
	if pending, _ := sweepState(t, e); pending != 1 {
		t.Fatal("clear not pending: the test checks nothing")
	}
	lines, _ := snapshotSet(t, e, ctxA, 1000)
	var nb, nc int
	for _, l := range lines {
		switch {
		case strings.Contains(l, " b/0 "):
			nb++
			if !strings.HasSuffix(l, " 10") { // cpu_local only (tier bit 1)
				t.Errorf("b credited with another tier: %s", l)
			}
		case strings.Contains(l, " c/0 "):
			nc++
		default:
			t.Errorf("line of no live slot: %s", l)
		}
	}
	if nb != 10 || nc != 10 {
		t.Fatalf("b %d and c %d lines, want 10 and 10: %v", nb, nc, lines)
	}
}
