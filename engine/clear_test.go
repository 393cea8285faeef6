package engine

import (
	"fmt"
	"testing"
	"time"
)

// Slot clears are exact at once and applied to the records a bounded chunk per writer step
// (clear.go). These tests stop the idle sweep (noIdleMigration) and use a small chunk, so
// that every check below runs while the clear is still pending in most records.

// sweepState reads, on the writer, the pending clears and the records swept so far.
func sweepState(t testing.TB, e *Engine) (pending, swept int) {
	t.Helper()
	onWriter(t, e, ctxA, func(c *cacheContext) { pending, swept = len(c.clears), c.swept })
	return
}

// slotCountsOf reads the writer's per-tier counts of a slot.
func slotCountsOf(t testing.TB, e *Engine, s Slot) (counts [3]int) {
	t.Helper()
	onWriter(t, e, ctxA, func(c *cacheContext) { counts = c.slotCounts[c.slots[s]] })
	return
}

func clearOp(s Slot, m TierMask) Op { return Op{Kind: OpClear, Slot: s, ClearTiers: m} }

func seqKeys(base uint64, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = base + uint64(i)*0x9E3779B1
	}
	return hs
}

// TestClearExactBeforeSweep: right after a clear is acknowledged, and while nearly every
// record still holds the cleared bits, no query reports them (a); blocks stored again
// after the clear, in the same batch or later, are reported (b); the sweep then visits
// at most sweepChunk records per writer step and completes in about high-water/chunk
// steps (c), leaving the counts and the records right.
func TestClearExactBeforeSweep(t *testing.T) {
	for _, nslots := range []int{2, 30, 65} { // packed records, walk1, walkN
		for _, mask := range []TierMask{MaskAllEngine, MaskDevice} {
			t.Run(fmt.Sprintf("slots=%d/mask=%d", nslots, mask), func(t *testing.T) {
				const chunk, n = 16, 300
				a, b := Slot{"a", 0}, Slot{"b", 0}
				e, _ := hookedEngineWith(t, Config{}, &testHooks{noIdleMigration: true, sweepChunk: chunk}, a, b)
				padSlots(t, e, 2, nslots)
				hs := seqKeys(1000, n)
				mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(a, TierCPULocal, hs...), store(b, TierDisk, hs[100:]...))
				// The sweep visits records in index order (hs[i] is record i): the
				// query walks the last 100 blocks, which it reaches last.
				q := append(append([]uint64{}, hs[280:]...), hs[200:280]...)
				full := int64(100 * 16)

				// One batch: the clear, then a new store of 20 blocks on device.
				mustApply(t, e, ctxA, clearOp(a, mask), store(a, TierDevice, hs[280:]...))
				if pending, _ := sweepState(t, e); pending != 1 {
					t.Fatalf("clear no longer pending (%d): the test checks nothing", pending)
				}
				wantA := Tiers{Device: 20 * 16, CPULocal: 20 * 16, CPUShare: 20 * 16, Disk: 20 * 16}
				if mask == MaskDevice {
					wantA = Tiers{Device: 20 * 16, CPULocal: full, CPUShare: full, Disk: full}
				}
				check := func(when string) {
					t.Helper()
					hits := qk(t, e, ctxA, q, "")
					if got := rankTiers(t, hits, "a", 0); got != wantA {
						t.Fatalf("%s: a = %+v, want %+v", when, got, wantA)
					}
					if got := rankTiers(t, hits, "b", 0); got != (Tiers{0, 0, 0, full}) {
						t.Fatalf("%s: b = %+v", when, got)
					}
				}
				check("after the clear")
				// A removal of a cleared bit is a no-op; a store after the clear shows.
				mustApply(t, e, ctxA, remove(a, TierDevice, hs[230]), store(a, TierDevice, hs[200:205]...))
				wantA.Device = 25 * 16
				if mask != MaskDevice {
					wantA = Tiers{Device: 25 * 16, CPULocal: 25 * 16, CPUShare: 25 * 16, Disk: 25 * 16}
				}
				check("after a later store")

				// (c): every further step sweeps at most chunk records.
				_, swept0 := sweepState(t, e)
				steps := 0
				for {
					_, before := sweepState(t, e) // a request: one sweep step after it
					pending, after := sweepState(t, e)
					if d := after - before; d > chunk {
						t.Fatalf("one step swept %d records, chunk %d", d, chunk)
					}
					steps++
					check(fmt.Sprintf("sweep step %d", steps))
					if pending == 0 {
						break
					}
					if steps > 2*n/chunk+4 {
						t.Fatalf("sweep not done after %d steps", steps)
					}
				}
				if _, swept := sweepState(t, e); swept-swept0 > n+chunk {
					t.Fatalf("swept %d records for a %d-record arena", swept-swept0, n)
				}
				check("after the sweep")
				want := [3]int{25, n, 0}
				if mask == MaskAllEngine {
					want = [3]int{25, 0, 0}
				}
				if got := slotCountsOf(t, e, a); got != want {
					t.Fatalf("counts of a after the sweep: %v, want %v", got, want)
				}
				if mask == MaskAllEngine {
					// Blocks left with no owner went: 200 of b, 25 of a among them.
					if got := prefixCount(e, ctxA); got != 200 {
						t.Fatalf("blocks after the sweep: %d, want 200", got)
					}
				}
			})
		}
	}
}

// TestReusedSlotNumberNeverSeesClearedBits: a is unregistered while its clear is still
// pending in the records; b registers and takes a's freed slot number. The records not yet
// swept still hold a's bits at that number: b must not be credited with them, while its
// own stores show.
func TestReusedSlotNumberNeverSeesClearedBits(t *testing.T) {
	a, b, c := Slot{"a", 0}, Slot{"b", 0}, Slot{"c", 0}
	e, _ := hookedEngineWith(t, Config{}, &testHooks{noIdleMigration: true, sweepChunk: 8}, a, c)
	hs := seqKeys(77, 100)
	mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(c, TierDisk, hs...))
	e.UnregisterSlot(ctxA, a)
	mustRegister(t, e, ctxA, vllmProfile(t), b)
	cc := e.lookup(ctxA)
	if cc.state.Load().slots.insts[0].ranks[0].slot != 0 {
		t.Fatal("b did not take a's slot number")
	}
	if pending, _ := sweepState(t, e); pending != 1 {
		t.Fatal("clear not pending: the test checks nothing")
	}
	mustApply(t, e, ctxA, store(b, TierCPULocal, hs[90:]...))
	// b's own records, then records the sweep reaches last (hs[i] is record i), whose a
	// device bits would extend b's cpu_local run were they credited to b.
	q := append(append([]uint64{}, hs[90:]...), hs[50:90]...)
	for step := 0; step < 20; step++ {
		hits := qk(t, e, ctxA, q, "")
		if got := rankTiers(t, hits, "b", 0); got != (Tiers{0, 160, 160, 160}) {
			t.Fatalf("step %d: b = %+v", step, got)
		}
		if got := rankTiers(t, hits, "c", 0); got != (Tiers{0, 0, 0, 800}) {
			t.Fatalf("step %d: c = %+v", step, got)
		}
		sweepState(t, e) // one more writer step
	}
	if pending, _ := sweepState(t, e); pending != 0 {
		t.Fatal("sweep not done")
	}
	if got := slotCountsOf(t, e, b); got != [3]int{0, 10, 0} {
		t.Fatalf("counts of b: %v", got)
	}
}

// TestWalkRereadsRecordCleanedUnderIt: a query whose view masks a pending clear stops
// between its loads of a record; meanwhile the writer cleans the record (a new store of
// the block by the cleared slot). The walk sees the version change and reads again:
// it reports the new store, never the cleared bits.
func TestWalkRereadsRecordCleanedUnderIt(t *testing.T) {
	for _, nslots := range []int{1, 30, 65} {
		t.Run(fmt.Sprintf("slots=%d", nslots), func(t *testing.T) {
			s := Slot{"a", 0}
			e, hooks := hookedEngineWith(t, Config{}, &testHooks{noIdleMigration: true, sweepChunk: 1}, s)
			padSlots(t, e, 1, nslots)
			hs := seqKeys(5, 50)
			k := hs[40]
			mustApply(t, e, ctxA, store(s, TierDisk, hs...))
			mustApply(t, e, ctxA, clearOp(s, MaskAllEngine))
			w := widthFor(nslots - 1)
			st := &steps{
				at: []int{recBits, recMeta},
				fn: []func(){func() { mustApply(t, e, ctxA, store(s, TierDevice, k)) }, func() {}},
			}
			if w > 0 {
				st.at[0] = recBits + 2*w // before loading disk
			}
			var hits []InstanceHit
			st.during(t, hooks, func() { hits = qk(t, e, ctxA, []uint64{k}, "a") })
			if got := rankTiers(t, hits, "a", 0); got != (Tiers{16, 16, 16, 16}) {
				t.Fatalf("got %+v, want the device store only", got)
			}
			if got := rankTiers(t, qk(t, e, ctxA, hs[10:40], "a"), "a", 0); got != (Tiers{}) {
				t.Fatalf("cleared blocks: %+v", got)
			}
		})
	}
}

// TestDropContextWithOnlyClearedRecords: a context whose slots are all unregistered holds
// no visible block, even while its sweep is pending: DropEmptyContext removes it and the
// engine's block total drops with it.
func TestDropContextWithOnlyClearedRecords(t *testing.T) {
	a := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{}, &testHooks{noIdleMigration: true, sweepChunk: 4}, a)
	mustApply(t, e, ctxA, store(a, TierDevice, seqKeys(3, 100)...))
	e.UnregisterSlot(ctxA, a)
	if pending, _ := sweepState(t, e); pending != 1 {
		t.Fatal("clear not pending")
	}
	if !e.DropEmptyContext(ctxA) {
		t.Fatal("context with only cleared records not dropped")
	}
	if got := e.TotalBlocks(); got != 0 {
		t.Fatalf("engine total after drop: %d", got)
	}
}

// stalledCount reads, on the writer, how many requests wait for a clear stamp.
// awaitAnswer receives the answer of a request the engine has already answered (its
// goroutine only has to run); the time bound only turns a hang into a failure.
func awaitAnswer(t testing.TB, answered <-chan error) error {
	t.Helper()
	select {
	case err := <-answered:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the engine's answer never reached the caller")
		return nil
	}
}

// answered polls, between writer steps, the answer channel of a request that waits on the
// writer: true once the answer came (an error fails the test), or once answeredByWriter
// reports that the writer has answered it, after receiving that answer with awaitAnswer
// (the goroutine that sends it may not have run yet: GOMAXPROCS=1, a loaded machine).
func answered(t testing.TB, answer <-chan error, answeredByWriter func() bool) bool {
	t.Helper()
	select {
	case err := <-answer:
		if err != nil {
			t.Fatal(err)
		}
		return true
	default:
		if !answeredByWriter() {
			return false
		}
		if err := awaitAnswer(t, answer); err != nil {
			t.Fatal(err)
		}
		return true
	}
}

// stalledCount reads, on the writer, the requests stalled behind a pending clear.
func stalledCount(t testing.TB, e *Engine) (n int) {
	t.Helper()
	onWriter(t, e, ctxA, func(c *cacheContext) { n = len(c.stalled) })
	return
}

// TestClearsPastStampsStallInBoundedSteps: with every clear stamp taken by a pending clear
// (maxPendingClears), one more clear does not complete the pending ones in one writer step
// (a pass over the whole arena): its request stalls, with the ops before the clear applied
// and nothing after it, while the writer serves other requests and sweeps at most a chunk
// per step; the clear is acknowledged once the oldest pending clear completed and it took
// its stamp, and queries never see its bits from then on. An unregistration stalls the
// same way. Stepped writer: the sweep advances only with requests.
func TestClearsPastStampsStallInBoundedSteps(t *testing.T) {
	const chunk, n = 16, 2000
	a, b := Slot{"a", 0}, Slot{"b", 0}
	hooks := &testHooks{noIdleMigration: true, sweepChunk: chunk}
	e, _ := hookedEngineWith(t, Config{}, hooks, a, b)
	c := e.lookup(ctxA)
	hs := seqKeys(9, n)
	mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(b, TierDisk, hs...))
	// Records swept per writer step, measured on the writer (noIdleMigration: there
	// are no other steps).
	maxSwept := maxStepGrowth(hooks, func() int { return c.swept })
	for i := 0; i < maxPendingClears; i++ {
		mustApply(t, e, ctxA, clearOp(a, MaskDevice)) // a's counts stay until swept: each takes a stamp
	}
	if pending, _ := sweepState(t, e); pending != maxPendingClears {
		t.Fatalf("pending clears %d, want %d", pending, maxPendingClears)
	}
	// The stalled batch: a store before the clear, a store after it. The test waits for
	// each request to stall without stepping the writer (stalled hook).
	stalls := make(chan struct{}, 2)
	hooks.stalled = func() { stalls <- struct{}{} }
	applied := make(chan error, 1)
	go func() {
		applied <- e.Apply(ctxA, []Op{store(a, TierDevice, hs[:10]...), clearOp(a, MaskDevice), store(a, TierCPULocal, hs[:5]...)})
	}()
	<-stalls
	unreg := make(chan struct{})
	go func() {
		e.UnregisterSlot(ctxA, b)
		close(unreg)
	}()
	<-stalls
	if got := stalledCount(t, e); got != 2 {
		t.Fatalf("stalled requests %d, want 2", got)
	}
	steps := 1
	// While stalled: the store before the clear shows, the one after it does not, b is
	// still registered, other requests are served.
	hits := qk(t, e, ctxA, hs[:10], "")
	if got := rankTiers(t, hits, "a", 0); got != (Tiers{160, 160, 160, 160}) {
		t.Fatalf("while stalled: a = %+v, want the store before the clear", got)
	}
	if got := rankTiers(t, hits, "b", 0); got != (Tiers{0, 0, 0, 160}) {
		t.Fatalf("while stalled: b = %+v", got)
	}
	mustApply(t, e, ctxA, store(b, TierDevice, hs[1000]))
	// Each stalledCount is one writer step. Once nothing is stalled, the Apply has been
	// answered: wait for its answer instead of stepping on.
	for done := false; !done; steps++ {
		done = answered(t, applied, func() bool { return stalledCount(t, e) == 0 })
		if steps > 2*n {
			t.Fatal("stalled clear never applied")
		}
	}
	if steps < 10 {
		t.Fatalf("clear acknowledged after %d steps: the oldest pending clear cannot be complete", steps)
	}
	if got := rankTiers(t, qk(t, e, ctxA, hs[:10], "a"), "a", 0); got != (Tiers{0, 80, 80, 80}) {
		t.Fatalf("after the stalled clear: a = %+v, want cpu_local on the first 5 blocks only", got)
	}
	for stalledCount(t, e) > 0 {
		if steps++; steps > 4*n {
			t.Fatal("unregistration never resumed")
		}
	}
	<-unreg
	if hits := qk(t, e, ctxA, hs[:10], ""); len(hits) != 1 || hits[0].InstanceID != "a" {
		t.Fatalf("after the unregistration: %+v", hits)
	}
	if maxSwept() > chunk {
		t.Fatalf("a writer step swept %d records, chunk %d", maxSwept(), chunk)
	}
	settle(t, e, ctxA)
	if got := slotCountsOf(t, e, a); got != [3]int{0, 5, 0} {
		t.Fatalf("counts of a: %v", got)
	}
}
