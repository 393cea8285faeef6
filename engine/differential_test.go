package engine

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

var (
	diffSeed  = flag.Uint64("seed", 0, "differential test: run only this seed (0 = the fixed set)")
	diffSteps = flag.Int("steps", 3000, "differential test: steps per seed")
)

// diffWorld drives the engine and the reference model with the same random operations.
type diffWorld struct {
	t     *testing.T
	rng   *rand.Rand
	e     *Engine
	m     *refModel
	ctxs  []ContextKey
	univ  map[ContextKey][]uint64 // per context: the block keys of a "document" chain
	insts []string
	res   Result
	step  int
	// lazy: clears are swept 3 records per writer step, only with requests, so that
	// queries run against records that still hold cleared bits; block counts then
	// include records not swept yet (compared as at least the model's).
	lazy bool
}

func newDiffWorld(t *testing.T, seed uint64, maxBlocks int, lazy bool, sets int) *diffWorld {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{MaxBlocksPerContext: maxBlocks, Logger: quiet}
	modelMax := maxBlocks
	if maxBlocks < 0 {
		modelMax = 0
	}
	w := &diffWorld{
		t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)),
		e: New(cfg), m: newRefModel(modelMax),
		ctxs: []ContextKey{
			{TenantID: "t1", ModelName: "m", BlockSize: 16},
			{TenantID: "t1", ModelName: "m", BlockSize: 4},
			{TenantID: "t2", ModelName: "m", BlockSize: 16},
		},
		univ:  map[ContextKey][]uint64{},
		insts: []string{"a", "b", "c", "d", "e"},
		lazy:  lazy,
	}
	if lazy {
		w.e.hooks = &testHooks{noIdleMigration: true, sweepChunk: 3}
	}
	if sets > 0 {
		w.e.hooks = &testHooks{bindSets: sets}
	}
	t.Cleanup(w.e.Close)
	for i, k := range w.ctxs {
		u := make([]uint64, 48)
		for j := range u {
			// Small distinct keys; some share their low 32 bits across contexts, and
			// hashMul spreads them over the table.
			u[j] = uint64(i)<<40 | uint64(j+1)
		}
		w.univ[k] = u
	}
	if seed%2 == 0 {
		// Even seeds start one context with more than 64 slots: two-word records.
		for r := 0; r < 70; r++ {
			s := Slot{"wide", r}
			if _, err := w.e.RegisterSlot(w.ctxs[0], vllmProfile(t), s); err != nil {
				t.Fatal(err)
			}
			w.m.register(w.ctxs[0], s)
		}
	}
	return w
}

func (w *diffWorld) pick(n int) int { return w.rng.IntN(n) }

func (w *diffWorld) randSlot() Slot {
	// Many ranks for one instance push slot numbers past 64 (record widening).
	if w.pick(8) == 0 {
		return Slot{"wide", w.pick(90)}
	}
	return Slot{w.insts[w.pick(len(w.insts))], w.pick(3)}
}

// randHashes returns a contiguous run of the context's chain most of the time (what
// engines store), sometimes a scattered set or foreign keys.
func (w *diffWorld) randHashes(k ContextKey) []uint64 {
	u := w.univ[k]
	switch w.pick(4) {
	case 0:
		n := 1 + w.pick(6)
		out := make([]uint64, n)
		for i := range out {
			out[i] = u[w.pick(len(u))]
		}
		return out
	case 1:
		return []uint64{uint64(w.pick(1 << 20))} // never queried keys: table churn
	default:
		a := w.pick(len(u))
		b := a + 1 + w.pick(min(len(u)-a, 12))
		return slices.Clone(u[a:b])
	}
}

func (w *diffWorld) randOp(k ContextKey) Op {
	src := []string{"tcp://mc:1", "tcp://mc:2"}[w.pick(2)]
	backend := []string{"pool-a", "pool-b"}[w.pick(2)]
	u := w.univ[k]
	switch r := w.pick(20); {
	case r < 8:
		return Op{Kind: OpStore, Slot: w.randSlot(), Tier: EngineTier(w.pick(3)), Hashes: w.randHashes(k)}
	case r < 12:
		return Op{Kind: OpRemove, Slot: w.randSlot(), Tier: EngineTier(w.pick(3)), Hashes: w.randHashes(k)}
	case r < 13:
		return Op{Kind: OpClear, Slot: w.randSlot(), ClearTiers: TierMask(1 + w.pick(7))}
	default:
		// Object keys mostly name their hash (so stores repeat and components pile up);
		// sometimes a key is reused for another hash (a conflict, or a mismatched remove).
		// Keys come in three forms: free-form strings, 64 hex digits (kept as 32 binary
		// bytes) and the same digits in upper case (another key, kept as a string).
		i := w.pick(len(u))
		obj := fmt.Sprintf("obj-%d-%d", i, w.pick(2))
		switch w.pick(3) {
		case 0:
			obj = fmt.Sprintf("%016x%016x%016x%016x", u[i], i, w.pick(2), ^u[i])
		case 1:
			if w.pick(2) == 0 {
				obj = strings.ToUpper(fmt.Sprintf("%016x%016x%016x%016x", u[i], i, w.pick(2), ^u[i]))
			}
		}
		// Components: mostly the usual K/V pair, sometimes one of many (more names than
		// the bindings' component bitmask holds, so some go to the overflow lists).
		comp := []string{"", "_0_k", "_0_v"}[w.pick(3)]
		if w.pick(3) == 0 {
			comp = fmt.Sprintf("_%d_x", w.pick(48))
		}
		h := u[i]
		if w.pick(10) == 0 {
			h = u[w.pick(len(u))]
		}
		kind := OpSharedStore
		if r >= 17 {
			kind = OpSharedRemove
		}
		return Op{Kind: kind, Source: src, Backend: backend, ObjectKey: obj, SharedTier: SharedTier(w.pick(2)),
			Component: comp, Hash: h}
	}
}

func (w *diffWorld) doStep() {
	w.step++
	k := w.ctxs[w.pick(len(w.ctxs))]
	switch r := w.pick(100); {
	case r < 12:
		s := w.randSlot()
		p := vllmProfile(w.t)
		got, err := w.e.RegisterSlot(k, p, s)
		want := w.m.register(k, s)
		if err != nil || got != want {
			w.t.Fatalf("step %d: register %v = %v %v, model %v", w.step, s, got, err, want)
		}
	case r < 18:
		s := w.randSlot()
		w.e.UnregisterSlot(k, s)
		w.m.unregister(k, s)
	case r < 20:
		src := []string{"tcp://mc:1", "tcp://mc:2"}[w.pick(2)]
		if w.pick(2) == 0 {
			backend := []string{"pool-a", "pool-b"}[w.pick(2)]
			w.e.ClearShared(src, backend, k.TenantID)
			w.m.clearShared(src, backend, k.TenantID)
		} else {
			w.e.RetractSource(src)
			w.m.retract(src)
		}
	default:
		ops := make([]Op, 1+w.pick(4))
		for i := range ops {
			ops[i] = w.randOp(k)
		}
		mops := slices.Clone(ops)
		err := w.e.Apply(k, ops)
		merrs, merr := w.m.apply(k, mops)
		if !sameErr(err, merr) {
			w.t.Fatalf("step %d: Apply err %v, model %v", w.step, err, merr)
		}
		for i := range merrs {
			if !sameErr(ops[i].Err, merrs[i]) {
				w.t.Fatalf("step %d: op %d %+v: err %v, model %v", w.step, i, ops[i], ops[i].Err, merrs[i])
			}
		}
	}
}

func (w *diffWorld) randQuery(k ContextKey) ([]uint64, int, string) {
	u := w.univ[k]
	n := w.pick(len(u) + 1)
	keys := slices.Clone(u[:n])
	if n > 0 && w.pick(4) == 0 {
		keys[w.pick(n)] = w.univ[k][w.pick(len(u))] // a hole or a reordering
	}
	positions := n * int(k.BlockSize)
	if n > 0 && w.pick(3) == 0 {
		positions -= w.pick(int(k.BlockSize)) // partial last block (SGLang)
	}
	filter := ""
	if w.pick(4) == 0 {
		filter = append(w.insts, "wide", "nobody")[w.pick(len(w.insts)+2)]
	}
	return keys, positions, filter
}

func (w *diffWorld) check(queries int) {
	for i := 0; i < queries; i++ {
		k := w.ctxs[w.pick(len(w.ctxs))]
		keys, positions, filter := w.randQuery(k)
		// Both walks: the test's tables are small enough to walk without probes, so half
		// the queries force the overlapped probes.
		mode := walkAuto
		if i%2 == 0 {
			mode = walkProbed
		}
		if err := w.e.queryKeysWith(k, keys, nil, positions, filter, &w.res, mode); err != nil {
			w.t.Fatalf("step %d: query: %v", w.step, err)
		}
		want := w.m.query(k, keys, positions, filter)
		if !sameHits(w.res.Instances, want) {
			w.t.Fatalf("step %d: query %v (positions %d, filter %q)\nengine %s\nmodel  %s",
				w.step, keys, positions, filter, formatHits(w.res.Instances), formatHits(want))
		}
	}
	w.checkViews()
	if w.step%32 == 0 {
		w.checkBindings()
	}
}

// checkBindings compares every context's shared bindings, decoded from the binding store
// (key, origin, tier, hash, components), with the model's.
func (w *diffWorld) checkBindings() {
	for _, k := range w.ctxs {
		got := map[bindingKey]string{}
		if w.e.lookup(k) != nil {
			onWriter(w.t, w.e, k, func(c *cacheContext) {
				if c.bs == nil {
					return
				}
				seen := map[uint64]bool{}
				for i := uint32(0); i < c.bs.ents.HighWater(); i++ {
					if !entLive(c.bs.ent(i)) || seen[c.bs.hash(i)] {
						continue
					}
					h := c.bs.hash(i)
					seen[h] = true
					c.bs.eachOf(h, func(src, bk, key string, tier SharedTier, comps []string) {
						got[bindingKey{src, bk, key, tier}] = fmt.Sprint(h, slices.Sorted(slices.Values(comps)))
					})
				}
			})
		}
		want := map[bindingKey]string{}
		if mc := w.m.ctxs[k]; mc != nil {
			for bk, b := range mc.bindings {
				want[bk] = fmt.Sprint(b.hash, slices.Sorted(maps.Keys(b.comps)))
			}
		}
		if !maps.Equal(got, want) {
			w.t.Fatalf("step %d: context %v bindings\nengine %v\nmodel  %v", w.step, k, got, want)
		}
	}
}

func (w *diffWorld) checkViews() {
	got, want := w.e.GlobalView(), w.m.globalView()
	if len(got) != len(want) {
		w.t.Fatalf("step %d: %d contexts, model %d", w.step, len(got), len(want))
	}
	for i := range got {
		g, m := got[i], want[i]
		countOK := g.PrefixCount == m.PrefixCount || w.lazy && g.PrefixCount > m.PrefixCount
		if g.Key != m.Key || !countOK || len(g.Instances) != len(m.Instances) {
			w.t.Fatalf("step %d: view %+v, model %+v", w.step, g, m)
		}
		for j := range g.Instances {
			if g.Instances[j].InstanceID != m.Instances[j].InstanceID || !slices.Equal(g.Instances[j].Ranks, m.Instances[j].Ranks) {
				w.t.Fatalf("step %d: instances %+v, model %+v", w.step, g.Instances, m.Instances)
			}
		}
		st, _ := w.e.Stats(g.Key)
		if uint64(st.EvictedBlocks) != uint64(w.m.ctxs[g.Key].evicted) {
			w.t.Fatalf("step %d: evicted %d, model %d", w.step, st.EvictedBlocks, w.m.ctxs[g.Key].evicted)
		}
	}
}

// TestDifferentialAgainstModel applies thousands of random registrations, stores,
// removes, clears, unregistrations, shared binding ops and retractions to the engine and
// the naive model, comparing random queries and views after every step, and every
// context's shared bindings (decoded, with their components) every 32 steps; the sets3
// mode lets a context's bindings intern only 3 component sets, so most keep their own
// component lists. Reproduce a
// failure with: go test ./engine -run Differential -seed N [-steps M].
func TestDifferentialAgainstModel(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4}
	if *diffSeed != 0 {
		seeds = []uint64{*diffSeed}
	}
	for _, seed := range seeds {
		for _, mode := range []struct {
			capacity int
			lazy     bool
			sets     int // interned component sets per context (0: maxSets)
		}{{-1, false, 0}, {60, false, 0}, {-1, true, 0}, {-1, false, 3}} {
			capacity := mode.capacity
			name := fmt.Sprintf("seed%d/max%d", seed, capacity)
			if mode.lazy {
				name += "/lazy-sweep"
			}
			if mode.sets > 0 {
				name += fmt.Sprintf("/sets%d", mode.sets) // most bindings past the set table
			}
			t.Run(name, func(t *testing.T) {
				steps := *diffSteps
				if testing.Short() {
					steps /= 5
				}
				w := newDiffWorld(t, seed, capacity, mode.lazy, mode.sets)
				for i := 0; i < steps; i++ {
					w.doStep()
					w.check(4)
				}
			})
		}
	}
}
