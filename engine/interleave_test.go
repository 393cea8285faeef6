package engine

import (
	"fmt"
	"testing"
)

// Deterministic interleavings: a query is stopped at an exact load of the walk (testHooks)
// while the test, on the query's own goroutine, drives the context writer through Apply,
// RegisterSlot and UnregisterSlot, which return only once the writer has applied them.

// hookedEngine is setup with test hooks installed before any context exists (writers
// read them); the test sets and clears the hook functions it needs on its own goroutine.
func hookedEngine(t *testing.T, cfg Config, slots ...Slot) (*Engine, *testHooks) {
	t.Helper()
	return hookedEngineWith(t, cfg, &testHooks{}, slots...)
}

// hookedEngineWith is hookedEngine with h installed (for settings writers read).
func hookedEngineWith(t *testing.T, cfg Config, h *testHooks, slots ...Slot) (*Engine, *testHooks) {
	t.Helper()
	e := newTestEngine(t, cfg)
	e.hooks = h
	for _, s := range slots {
		mustRegister(t, e, ctxA, vllmProfile(t), s)
	}
	return e, h
}

// maxStepGrowth hooks the writer's steps to measure, on the writer, the most that count
// grows over one step; the function returned reads it once the steps ran.
func maxStepGrowth(hooks *testHooks, count func() int) (most func() int) {
	m, last := 0, 0
	hooks.step = func(begin bool) {
		if begin {
			last = count()
		} else {
			m = max(m, count()-last)
		}
	}
	return func() int { return m }
}

// steps runs fn[k], in order, when the walk is about to load word at[k] after fn[k-1]
// ran; once all ran, later loads (a retry of the same record) do nothing.
type steps struct {
	at   []int
	fn   []func()
	next int // the steps that ran
}

func (s *steps) hook(_, w int) {
	if k := s.next; k < len(s.at) && s.at[k] == w {
		s.next++
		s.fn[k]()
	}
}

func (s *steps) allDone() bool { return s.next == len(s.at) }

// during runs query with s hooked into the walk's loads, and fails the test unless every
// step ran during it.
func (s *steps) during(t *testing.T, hooks *testHooks, query func()) {
	t.Helper()
	hooks.walkLoad = s.hook
	query()
	hooks.walkLoad = nil
	if !s.allDone() {
		t.Fatal("interleaving did not happen")
	}
}

// eachWidth runs test for records of each width: packed (one bitset word), one word per
// tier (walk1) and two (walkN), in an engine with test hooks, slot s registered in ctxA
// and the context padded to nslots slots.
func eachWidth(t *testing.T, test func(t *testing.T, nslots int, e *Engine, hooks *testHooks, s Slot)) {
	for _, nslots := range []int{1, 30, 65} {
		t.Run(fmt.Sprintf("slots=%d", nslots), func(t *testing.T) {
			s := Slot{"a", 0}
			e, hooks := hookedEngine(t, Config{}, s)
			padSlots(t, e, 1, nslots)
			test(t, nslots, e, hooks, s)
		})
	}
}

// TestWalkRejectsRecordReusedBetweenLoads: block K is on disk only. While a query reads
// K's record, the record is freed and reused for K2 (cpu_local), then freed and reused for
// K again (disk): K → K2 → K between two loads of the walk. The key re-check alone accepts
// the mix (K2's cpu_local bit under K's key): a cpu_local hit that never existed.
func TestWalkRejectsRecordReusedBetweenLoads(t *testing.T) {
	eachWidth(t, func(t *testing.T, nslots int, e *Engine, hooks *testHooks, s Slot) {
		const k, k2 = uint64(0xAAAA0001), uint64(0xBBBB0002)
		mustApply(t, e, ctxA, store(s, TierDisk, k))
		w := widthFor(nslots - 1)
		at := []int{recBits + w, recBits + 2*w} // before loading cpu_local, before disk
		if w == 0 {
			at = []int{recBits, recMeta} // before loading the bitsets, before meta again
		}
		st := &steps{
			at: at,
			fn: []func(){
				func() { mustApply(t, e, ctxA, remove(s, TierDisk, k), store(s, TierCPULocal, k2)) },
				func() { mustApply(t, e, ctxA, remove(s, TierCPULocal, k2), store(s, TierDisk, k)) },
			},
		}
		var hits []InstanceHit
		st.during(t, hooks, func() { hits = qk(t, e, ctxA, []uint64{k}, "a") })
		if got := rankTiers(t, hits, "a", 0); got.Device != 0 || got.CPULocal != 0 {
			t.Fatalf("accepted bits of a reused record: %+v", got)
		}
		// The record was reused in place: the writer handed K2 the record K freed.
		if got := rankTiers(t, qk(t, e, ctxA, []uint64{k}, "a"), "a", 0); got != (Tiers{0, 0, 0, 16}) {
			t.Fatalf("after the interleaving: %+v", got)
		}
	})
}

// TestWalkRejectsBitsOfTwoChanges: block K is on device for a and in cpu_local for c.
// While a query reads K's record, one batch removes a's device bit and stores K on disk
// for b: two changes of one bitset word each, which the writer makes without marking the
// record busy (the record layout in table.go). A reader that loaded the device word
// before the batch and the disk word after it holds a's device bit and b's disk bit,
// which K never had at once; the meta stores that end each change make it read again.
func TestWalkRejectsBitsOfTwoChanges(t *testing.T) {
	for _, nslots := range []int{30, 65} { // one word per tier (walk1), two (walkN)
		t.Run(fmt.Sprintf("slots=%d", nslots), func(t *testing.T) {
			a, b, c := Slot{"a", 0}, Slot{"b", 0}, Slot{"c", 0}
			e, hooks := hookedEngine(t, Config{}, a, b, c)
			padSlots(t, e, 3, nslots)
			const k = uint64(0xAAAA0001)
			mustApply(t, e, ctxA, store(a, TierDevice, k), store(c, TierCPULocal, k))
			w := widthFor(nslots - 1)
			st := &steps{
				at: []int{recBits + 2*w}, // after the device word, before the disk word
				fn: []func(){func() {
					mustApply(t, e, ctxA, remove(a, TierDevice, k), store(b, TierDisk, k))
				}},
			}
			var hits []InstanceHit
			st.during(t, hooks, func() { hits = qk(t, e, ctxA, []uint64{k}, "") })
			ta, tb := rankTiers(t, hits, "a", 0), rankTiers(t, hits, "b", 0)
			if ta.Device != 0 && tb.Disk != 0 {
				t.Fatalf("accepted a's device bit with b's disk bit: a %+v, b %+v", ta, tb)
			}
			if ta != (Tiers{}) || tb != (Tiers{0, 0, 0, 16}) {
				t.Fatalf("not the state after the batch: a %+v, b %+v", ta, tb)
			}
		})
	}
}

// TestQueryNeverCreditsReusedSlotNumber: a query holds the slot table in which slot number
// 0 is instance a. Before it reads the record, a is unregistered, b registers (taking the
// freed number 0) and stores the block on device. The old mapping would credit b's device
// bit to a, which never had the block on device.
func TestQueryNeverCreditsReusedSlotNumber(t *testing.T) {
	for _, hashed := range []bool{false, true} {
		t.Run(fmt.Sprintf("hashed=%v", hashed), func(t *testing.T) {
			a, b, c := Slot{"a", 0}, Slot{"b", 0}, Slot{"c", 0}
			p := vllmProfile(t)
			e, hooks := hookedEngine(t, Config{}, a, c)
			tokens := seqTokens(16)
			keys := chainKeys(t, p, 16, "", "", tokens)
			mustApply(t, e, ctxA, store(a, TierDisk, keys...), store(c, TierDisk, keys...))
			st := &steps{
				at: []int{recMeta},
				fn: []func(){func() {
					e.UnregisterSlot(ctxA, a)
					mustRegister(t, e, ctxA, p, b)
					mustApply(t, e, ctxA, store(b, TierDevice, keys...))
				}},
			}
			var res Result
			var err error
			st.during(t, hooks, func() {
				if hashed {
					err = e.Query(&Query{Key: ctxA, Tokens: tokens}, &res)
				} else {
					err = e.QueryKeys(ctxA, keys, 16, "", &res)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range res.Instances {
				if in.InstanceID == "a" && (in.Device != 0 || in.CPULocal != 0) {
					t.Fatalf("a credited with b's bits: %s", formatHits(res.Instances))
				}
			}
			if got := rankTiers(t, qk(t, e, ctxA, keys, ""), "b", 0); got.Device != 16 {
				t.Fatalf("b after the interleaving: %+v", got)
			}
		})
	}
}

// TestRegisterSlotRacingDropRetries: a registration looks its context up, then (before its
// request reaches the writer) DropEmptyContext drops that empty context. The registration
// must land in a new context, not fail with ErrClosed.
func TestRegisterSlotRacingDropRetries(t *testing.T) {
	p := vllmProfile(t)
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e, hooks := hookedEngine(t, Config{}, a)
	e.UnregisterSlot(ctxA, a)
	fired, dropped := false, false
	hooks.beforeDo = func(_ *cacheContext, r *request) {
		if r.kind == reqRegister && !fired {
			fired = true
			dropped = e.DropEmptyContext(ctxA)
		}
	}
	isNew, err := e.RegisterSlot(ctxA, p, b)
	hooks.beforeDo = nil
	if !fired || !dropped {
		t.Fatalf("interleaving did not happen: fired %v dropped %v", fired, dropped)
	}
	if err != nil || !isNew {
		t.Fatalf("RegisterSlot after a racing drop: isNew %v, err %v", isNew, err)
	}
	views := e.GlobalView()
	if len(views) != 1 || len(views[0].Instances) != 1 || views[0].Instances[0].InstanceID != "b" {
		t.Fatalf("registration lost: %+v", views)
	}
}
