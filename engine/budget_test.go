package engine

import (
	"strings"
	"sync/atomic"
	"testing"
)

// twoContexts is an engine (cfg, a clock that gives every request a later microsecond)
// with slot a in ctxA holding blocks 1..6 on device, written first, then slot b in ctxB
// holding 101..104.
func twoContexts(t *testing.T, cfg Config) (e *Engine, a, b Slot, ctxB ContextKey) {
	t.Helper()
	var clock atomic.Uint64
	h := &testHooks{now: func() uint64 { return clock.Add(1) }}
	a, b = Slot{"a", 0}, Slot{"b", 0}
	e, _ = hookedEngineWith(t, cfg, h, a)
	ctxB = ContextKey{TenantID: "default", ModelName: "other", BlockSize: 16}
	mustRegister(t, e, ctxB, vllmProfile(t), b)
	for k := uint64(1); k <= 6; k++ {
		mustApply(t, e, ctxA, store(a, TierDevice, k))
	}
	for k := uint64(101); k <= 104; k++ {
		mustApply(t, e, ctxB, store(b, TierDevice, k))
	}
	return e, a, b, ctxB
}

// TestEngineBudgetEvictsOldestAcrossContexts: with Config.MaxBlocks, each new block past
// the engine-wide budget evicts the oldest-written block of the whole engine, whichever
// context holds it; the evictions are counted per context and logged.
func TestEngineBudgetEvictsOldestAcrossContexts(t *testing.T) {
	log, logs := captureLogger()
	e, a, b, ctxB := twoContexts(t, Config{MaxBlocks: 10, Logger: log})
	if e.TotalBlocks() != 10 {
		t.Fatalf("total %d", e.TotalBlocks())
	}
	// B grows: A holds the oldest blocks (1, then 2), which A's writer evicts.
	mustApply(t, e, ctxB, store(b, TierDevice, 105))
	mustApply(t, e, ctxB, store(b, TierDevice, 106))
	mustApply(t, e, ctxA) // a step of A's writer: its debt is paid by the time it returns
	if holdsOnDevice(t, e, ctxA, 1) || holdsOnDevice(t, e, ctxA, 2) || !holdsOnDevice(t, e, ctxA, 3) || !holdsOnDevice(t, e, ctxB, 101) || !holdsOnDevice(t, e, ctxB, 106) {
		t.Fatal("B's new blocks did not evict A's two oldest")
	}
	if e.TotalBlocks() != 10 {
		t.Fatalf("total %d after evicting for B", e.TotalBlocks())
	}
	// Refresh A's remaining blocks: B's now hold the oldest writes, and A's growth
	// evicts from B (101, then 102).
	mustApply(t, e, ctxA, store(a, TierDisk, 3, 4, 5, 6))
	mustApply(t, e, ctxA, store(a, TierDevice, 7))
	mustApply(t, e, ctxA, store(a, TierDevice, 8))
	mustApply(t, e, ctxB)
	if holdsOnDevice(t, e, ctxB, 101) || holdsOnDevice(t, e, ctxB, 102) || !holdsOnDevice(t, e, ctxB, 103) || !holdsOnDevice(t, e, ctxA, 3) || !holdsOnDevice(t, e, ctxA, 8) {
		t.Fatal("A's new blocks did not evict B's two oldest")
	}
	// A's own block is the oldest: it goes at once.
	mustApply(t, e, ctxB, store(b, TierDisk, 103, 104, 105, 106))
	mustApply(t, e, ctxA, store(a, TierDevice, 9))
	if holdsOnDevice(t, e, ctxA, 3) || !holdsOnDevice(t, e, ctxA, 9) || e.TotalBlocks() != 10 {
		t.Fatalf("A's oldest block survived its own growth (total %d)", e.TotalBlocks())
	}
	sa, _ := e.Stats(ctxA)
	sb, _ := e.Stats(ctxB)
	if sa.EvictedBlocks != 3 || sb.EvictedBlocks != 2 || sa.Blocks+sb.Blocks != 10 {
		t.Fatalf("stats A %+v B %+v", sa, sb)
	}
	logged := logs()
	if !strings.Contains(logged, "engine over max_blocks") || !strings.Contains(logged, "max_blocks=10") {
		t.Fatalf("budget evictions not logged: %q", logged)
	}
}

// TestMemoryLimitEvictsOldestAcrossContexts: with Config.MemoryLimitBytes, blocks and
// shared bindings are charged (48 bytes a packed block, 64 bytes plus the strings it
// holds alone a binding); past the limit each new one evicts the engine's oldest-written block,
// whichever context holds it, and the charge comes back down with evictions, removals
// and drops.
func TestMemoryLimitEvictsOldestAcrossContexts(t *testing.T) {
	log, logs := captureLogger()
	const limit = 10 * 48
	e, a, b, ctxB := twoContexts(t, Config{MemoryLimitBytes: limit, Logger: log})
	if got := e.IndexBytes(); got != limit {
		t.Fatalf("charged %d bytes for 10 packed blocks, want %d", got, limit)
	}
	mustApply(t, e, ctxB, store(b, TierDevice, 105))
	mustApply(t, e, ctxA) // A's writer pays its debt
	if holdsOnDevice(t, e, ctxA, 1) || !holdsOnDevice(t, e, ctxA, 2) || !holdsOnDevice(t, e, ctxB, 105) || e.IndexBytes() != limit {
		t.Fatalf("B's new block did not evict A's oldest (charged %d)", e.IndexBytes())
	}
	// A binding (56 bytes: its entry and index slots, both indexes as its object key is
	// not 64 hex digits, and 16 + 5 for that key, kept as a string; its one, empty,
	// component is interned) costs more than a block: still over after one eviction, its
	// store evicts a second.
	bind := Op{Kind: OpSharedStore, Source: "tcp://mc:1", Backend: "pool", ObjectKey: "obj-1", SharedTier: SharedCPU, Hash: 2}
	mustApply(t, e, ctxA, bind)
	mustApply(t, e, ctxB)
	if want := int64(limit + bindingBaseBytes + objSlotBytes + 16 + 5 - 2*48); e.IndexBytes() != want {
		t.Fatalf("charged %d after the binding, want %d", e.IndexBytes(), want)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, 7))
	mustApply(t, e, ctxA, store(a, TierDevice, 8))
	mustApply(t, e, ctxB)
	if e.IndexBytes() > limit+48 {
		t.Fatalf("charge %d over the limit %d by more than a block", e.IndexBytes(), limit)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, 9))
	mustApply(t, e, ctxB)
	if e.IndexBytes() > limit {
		t.Fatalf("charge %d still over the limit %d after new blocks", e.IndexBytes(), limit)
	}
	sa, _ := e.Stats(ctxA)
	sb, _ := e.Stats(ctxB)
	if sa.EvictedBlocks+sb.EvictedBlocks < 4 {
		t.Fatalf("evictions not counted: A %+v B %+v", sa, sb)
	}
	logged := logs()
	if !strings.Contains(logged, "memory_limit_bytes=480") || !strings.Contains(logged, "engine_index_bytes=") {
		t.Fatalf("memory-limit evictions not logged: %q", logged)
	}
	// Everything gone: nothing charged.
	e.RetractSource("tcp://mc:1")
	e.UnregisterSlot(ctxA, a)
	e.UnregisterSlot(ctxB, b)
	if !e.DropEmptyContext(ctxA) || !e.DropEmptyContext(ctxB) {
		t.Fatal("contexts not dropped")
	}
	if e.IndexBytes() != 0 || e.TotalBlocks() != 0 {
		t.Fatalf("after dropping everything: %d bytes, %d blocks", e.IndexBytes(), e.TotalBlocks())
	}
}

// TestEngineCountsPublishedPerStep: without an engine budget the writer publishes the
// engine-wide counts (TotalBlocks, IndexBytes) once per step (charge, flushCharges), with
// one the counts move with every block; both are exact whenever a call returns. Two
// engines, one without a budget and one with budgets too large to evict, take the same
// calls: stores, removes, bindings, a clear, a widening, a shared clear, a retraction,
// unregistrations, the context's drop.
func TestEngineCountsPublishedPerStep(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 0}
	// Sweeps and migrations advance only with requests: both engines take the same steps.
	plain, _ := hookedEngineWith(t, Config{MaxBlocksPerContext: -1}, &testHooks{noIdleMigration: true}, a, b)
	budget, _ := hookedEngineWith(t, Config{MaxBlocksPerContext: -1, MaxBlocks: 1 << 40, MemoryLimitBytes: 1 << 50},
		&testHooks{noIdleMigration: true}, a, b)
	engines := []*Engine{plain, budget}
	check := func(step string, wantBlocks int64) {
		t.Helper()
		if plain.TotalBlocks() != budget.TotalBlocks() || plain.IndexBytes() != budget.IndexBytes() {
			t.Fatalf("%s: %d units, %d bytes without a budget; %d, %d with one", step,
				plain.TotalBlocks(), plain.IndexBytes(), budget.TotalBlocks(), budget.IndexBytes())
		}
		if wantBlocks >= 0 && plain.TotalBlocks() != wantBlocks {
			t.Fatalf("%s: %d units, want %d", step, plain.TotalBlocks(), wantBlocks)
		}
	}
	keys := func(from, to uint64) []uint64 {
		var ks []uint64
		for k := from; k < to; k++ {
			ks = append(ks, k)
		}
		return ks
	}
	apply := func(step string, want int64, ops ...Op) {
		t.Helper()
		for _, e := range engines {
			mustApply(t, e, ctxA, ops...)
		}
		check(step, want)
	}
	apply("stores", 300, store(a, TierDevice, keys(0, 200)...), store(b, TierDisk, keys(100, 300)...))
	apply("removes", 190, remove(a, TierDevice, keys(0, 60)...), remove(b, TierDisk, keys(250, 400)...))
	apply("bindings", 194, sharedOp(OpSharedStore, "o1", SharedCPU, 10), sharedOp(OpSharedStore, "o2", SharedDisk, 1000),
		sharedOp(OpSharedStore, "o3", SharedCPU, 150), sharedOp(OpSharedRemove, "o3", SharedCPU, 150))
	apply("clear", -1, Op{Kind: OpClear, Slot: a, ClearTiers: MaskAllEngine})
	for i := 1; i <= packedSlots; i++ { // past 21 slots: records widen
		for _, e := range engines {
			mustRegister(t, e, ctxA, vllmProfile(t), Slot{"w", i})
		}
	}
	check("widening", -1)
	apply("stores after widening", -1, store(Slot{"w", packedSlots}, TierDevice, keys(0, 500)...))
	for _, e := range engines {
		e.ClearShared("tcp://mc:1", "pool", ctxA.TenantID)
	}
	check("shared clear", -1)
	apply("binding again", -1, sharedOp(OpSharedStore, "o4", SharedCPU, 2000))
	for _, e := range engines {
		e.RetractSource("tcp://mc:1")
	}
	check("retraction", -1)
	for _, e := range engines {
		e.UnregisterSlot(ctxA, a)
		e.UnregisterSlot(ctxA, b)
		for i := 1; i <= packedSlots; i++ {
			e.UnregisterSlot(ctxA, Slot{"w", i})
		}
	}
	check("unregistrations", -1)
	for _, e := range engines {
		settle(t, e, ctxA) // the unregistrations' clears complete
	}
	check("settled", 0)
	for _, e := range engines {
		if !e.DropEmptyContext(ctxA) {
			t.Fatal("context not dropped")
		}
	}
	check("drop", 0)
	if plain.IndexBytes() != 0 {
		t.Fatalf("%d bytes left charged", plain.IndexBytes())
	}
}
