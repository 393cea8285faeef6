package engine

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

// widenState reads, on the writer, whether a widening runs and the records copied so far.
func widenState(t testing.TB, e *Engine) (widening bool, copied, widenings int) {
	t.Helper()
	onWriter(t, e, ctxA, func(c *cacheContext) { widening, copied, widenings = c.wide != nil, c.widenCopied, c.widenings })
	return
}

// hitsWithout drops instance id from hits (a registration the other engine has not made).
func hitsWithout(hits []InstanceHit, id string) []InstanceHit {
	return slices.DeleteFunc(slices.Clone(hits), func(h InstanceHit) bool { return h.InstanceID == id })
}

// TestWideningInBoundedSteps: registering the slot that widens a large context's records
// (past 21, past 64 slots) does not rewrite them in one writer step. The registration
// waits while the writer copies a bounded chunk of records per step (plus the records a
// request changed after they were copied), serving other requests meanwhile; stores,
// removes, clears and evictions of the other slots go on, and every query, during the
// copy and after the switch, answers exactly as a reference engine given the same
// requests without the widening (registered wide from the start). At the switch the
// copy equals the original, record for record. Stepped writer (no idle steps).
func TestWideningInBoundedSteps(t *testing.T) {
	for _, tc := range []struct{ from, n int }{{packedSlots, 2000}, {64, 1200}} {
		t.Run(fmt.Sprintf("slots=%d", tc.from), func(t *testing.T) {
			const chunk = 32
			cfg := Config{MaxBlocksPerContext: tc.n + 500}
			hooks := &testHooks{noIdleMigration: true, widenChunk: chunk, sweepChunk: 32, widenSmall: 64}
			e, _ := hookedEngineWith(t, cfg, hooks)
			ref := newTestEngine(t, cfg)
			p := vllmProfile(t)
			slots := make([]Slot, tc.from)
			for i := range slots {
				slots[i] = Slot{fmt.Sprintf("i%02d", i/4), i % 4}
				mustRegister(t, e, ctxA, p, slots[i])
				mustRegister(t, ref, ctxA, p, slots[i])
			}
			wide := Slot{"wide", 0}
			rng := rand.New(rand.NewSource(int64(tc.from)))
			keys := make([]uint64, tc.n+1000)
			for i := range keys {
				keys[i] = benchKey(i)
			}
			both := func(ops ...Op) {
				t.Helper()
				mustApply(t, e, ctxA, ops...)
				mustApply(t, ref, ctxA, ops...)
			}
			for done := 0; done < tc.n; done += 100 {
				s := slots[rng.Intn(len(slots))]
				ops := []Op{store(s, EngineTier(rng.Intn(3)), keys[done:done+100]...)}
				if done < tc.n/2 { // long walks in the first half; the second half has one owner per block
					ops = append(ops, store(slots[0], TierDisk, keys[done:done+100]...))
				}
				both(ops...)
			}
			c := e.lookup(ctxA)
			maxCopied := maxStepGrowth(hooks, func() int { return c.widenCopied })
			mismatches, switched := -1, false
			hooks.widened = func(m int) { mismatches, switched = m, true } // read after the next request
			waits := make(chan struct{}, 1)
			hooks.widening = func() { waits <- struct{}{} }
			registered := make(chan error, 1)
			go func() {
				_, err := e.RegisterSlot(ctxA, p, wide)
				registered <- err
			}()
			select {
			case <-waits:
			case err := <-registered:
				t.Fatalf("registration did not wait for a widening (err %v)", err)
			}
			mustRegister(t, ref, ctxA, p, wide)
			// A query over a prefix of the blocks; compared without "wide" while its
			// registration waits.
			check := func(when string, acked bool) {
				t.Helper()
				for _, start := range []int{0, rng.Intn(tc.n)} {
					q := keys[start : start+200]
					got, want := qk(t, e, ctxA, q, ""), qk(t, ref, ctxA, q, "")
					if !acked && !switched {
						if slices.ContainsFunc(got, func(h InstanceHit) bool { return h.InstanceID == "wide" }) {
							t.Fatalf("%s: the waiting registration shows", when)
						}
						want = hitsWithout(want, "wide")
					}
					if !sameHits(got, want) {
						t.Fatalf("%s: query at %d:\n got %+v\nwant %+v", when, start, got, want)
					}
				}
			}
			// Mutations during the copy: 8 hashes per op, so a step copies at most
			// chunk records plus those it changed (see perOpBound).
			steps, acked, next := 0, false, tc.n
			// Each record a step changes (8 per op, as many evicted, a sweep chunk of 32
			// cleaned) is copied again, with its write-order neighbours: at most 4 each.
			const perOpBound = 4 * (8 + 8 + 32)
			for !acked {
				// switched is read after the last request (both): the writer has answered
				// the registration at the switch.
				acked = answered(t, registered, func() bool { return switched })
				steps++
				if steps > 4*tc.n/chunk+100 {
					t.Fatal("widening never switched")
				}
				var ops []Op
				s := slots[rng.Intn(len(slots))]
				switch k := rng.Intn(10); {
				case k < 4: // new blocks (evictions past the capacity)
					ops = append(ops, store(s, EngineTier(rng.Intn(3)), keys[next:next+8]...))
					next = (next+8)%(len(keys)-8) + 0
				case k < 7: // re-stores of copied and not yet copied blocks
					i := rng.Intn(tc.n - 8)
					ops = append(ops, store(s, EngineTier(rng.Intn(3)), keys[i:i+8]...))
				case k < 9:
					i := rng.Intn(tc.n - 8)
					ops = append(ops, remove(s, EngineTier(rng.Intn(3)), keys[i:i+8]...))
				default: // clears: the sweep deletes records left without owner
					ops = append(ops, clearOp(s, TierMask(1+rng.Intn(7))))
				}
				if acked && rng.Intn(2) == 0 {
					ops = append(ops, store(wide, TierDevice, keys[rng.Intn(tc.n-8):][:8]...))
				}
				both(ops...)
				if steps%16 == 0 || acked {
					check(fmt.Sprintf("step %d", steps), acked)
				}
			}
			if mismatches != 0 {
				t.Fatalf("copy differs from the original in %d records at the switch", mismatches)
			}
			if steps < tc.n/chunk/2 {
				t.Fatalf("registration acknowledged after %d steps: not incremental", steps)
			}
			if maxCopied() > chunk+perOpBound {
				t.Fatalf("a writer step copied %d records (chunk %d)", maxCopied(), chunk)
			}
			for i := 0; i < 10; i++ {
				both(store(wide, TierCPULocal, keys[i*8:i*8+8]...), remove(slots[1], TierDisk, keys[i*8]))
				check(fmt.Sprintf("after the switch %d", i), true)
			}
			settle(t, e, ctxA)
			check("settled", true)
		})
	}
}

// TestQueryAcrossWideningSwitch: a query stops inside its walk (before loading a record)
// with the view of before a widening; meanwhile the widening switches, the old arena is
// given back (it reads as zeros) and blocks change in the new one. The query must answer
// exactly as the context is after those changes (it walks again with the new view), not
// cut short at the released record nor with the old arena's stale bits.
func TestQueryAcrossWideningSwitch(t *testing.T) {
	a := Slot{"a", 0}
	hooks := &testHooks{noIdleMigration: true, widenChunk: 16, widenSmall: 8}
	e, _ := hookedEngineWith(t, Config{}, hooks, a)
	p := vllmProfile(t)
	for i := 1; i < packedSlots; i++ {
		mustRegister(t, e, ctxA, p, Slot{"pad", i})
	}
	hs := seqKeys(3, 200)
	mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(a, TierDisk, hs...))
	switched := false
	hooks.widened = func(int) { switched = true }
	c := e.lookup(ctxA)
	st := &steps{at: []int{recMeta}, fn: []func(){func() {
		registered := make(chan error, 1)
		go func() {
			_, err := e.RegisterSlot(ctxA, p, Slot{"wide", 0})
			registered <- err
		}()
		for done := false; !done; {
			select {
			case err := <-registered:
				if err != nil {
					t.Error(err)
				}
				done = true
			default:
				mustApply(t, e, ctxA) // one writer step
			}
		}
		// The old arena's slabs go back a chunk per step; then a change in the new one.
		for i := 0; i < 8; i++ {
			mustApply(t, e, ctxA)
		}
		mustApply(t, e, ctxA, remove(a, TierDevice, hs[120:]...))
	}}}
	var hookAt int
	hooks.walkLoad = func(i, w int) {
		if i == 100 || hookAt > 0 {
			hookAt++
			st.hook(i, w)
		}
	}
	hits := qk(t, e, ctxA, hs, "a")
	hooks.walkLoad = nil
	if !st.allDone() || !switched {
		t.Fatal("the widening did not switch during the walk")
	}
	if c.state.Load().tab.w != 1 {
		t.Fatal("records not widened")
	}
	if got := rankTiers(t, hits, "a", 0); got != (Tiers{Device: 120 * 16, CPULocal: 120 * 16, CPUShare: 120 * 16, Disk: 200 * 16}) {
		t.Fatalf("query across the switch: %+v, want device, cpu_local, cpu_share 120 blocks, disk 200", got)
	}
}
