package engine

import (
	"strings"
	"sync/atomic"
	"testing"
)

// TestEngineBudgetEvictsOldestAcrossContexts: with Config.MaxBlocks, each new block past
// the engine-wide budget evicts the oldest-written block of the whole engine, whichever
// context holds it; the evictions are counted per context and logged.
func TestEngineBudgetEvictsOldestAcrossContexts(t *testing.T) {
	log, buf, mu := captureLogger()
	var clock atomic.Uint64
	h := &testHooks{now: func() uint64 { return clock.Add(1) }} // every request a later microsecond
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e, _ := hookedEngineWith(t, Config{MaxBlocks: 10, Logger: log}, h, a)
	ctxB := ContextKey{TenantID: "default", ModelName: "other", BlockSize: 16}
	mustRegister(t, e, ctxB, vllmProfile(t), b)
	for k := uint64(1); k <= 6; k++ {
		mustApply(t, e, ctxA, store(a, TierDevice, k))
	}
	for k := uint64(101); k <= 104; k++ {
		mustApply(t, e, ctxB, store(b, TierDevice, k))
	}
	if e.TotalBlocks() != 10 {
		t.Fatalf("total %d", e.TotalBlocks())
	}
	present := func(k ContextKey, h uint64) bool {
		var res Result
		if err := e.QueryKeys(k, []uint64{h}, 16, "", &res); err != nil {
			t.Fatal(err)
		}
		return res.Instances[0].Device == 16
	}
	// B grows: A holds the oldest blocks (1, then 2), which A's writer evicts.
	mustApply(t, e, ctxB, store(b, TierDevice, 105))
	mustApply(t, e, ctxB, store(b, TierDevice, 106))
	mustApply(t, e, ctxA) // a step of A's writer: its debt is paid by the time it returns
	if present(ctxA, 1) || present(ctxA, 2) || !present(ctxA, 3) || !present(ctxB, 101) || !present(ctxB, 106) {
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
	if present(ctxB, 101) || present(ctxB, 102) || !present(ctxB, 103) || !present(ctxA, 3) || !present(ctxA, 8) {
		t.Fatal("A's new blocks did not evict B's two oldest")
	}
	// A's own block is the oldest: it goes at once.
	mustApply(t, e, ctxB, store(b, TierDisk, 103, 104, 105, 106))
	mustApply(t, e, ctxA, store(a, TierDevice, 9))
	if present(ctxA, 3) || !present(ctxA, 9) || e.TotalBlocks() != 10 {
		t.Fatalf("A's oldest block survived its own growth (total %d)", e.TotalBlocks())
	}
	sa, _ := e.Stats(ctxA)
	sb, _ := e.Stats(ctxB)
	if sa.EvictedBlocks != 3 || sb.EvictedBlocks != 2 || sa.Blocks+sb.Blocks != 10 {
		t.Fatalf("stats A %+v B %+v", sa, sb)
	}
	mu.Lock()
	logged := buf.String()
	mu.Unlock()
	if !strings.Contains(logged, "engine over max_blocks") || !strings.Contains(logged, "max_blocks=10") {
		t.Fatalf("budget evictions not logged: %q", logged)
	}
}
