package engine

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// derivedKey reports whether a binding of key to hash is a derived one (its key is 64
// lowercase hex digits whose first 16 are hash), computed independently of the store.
func derivedKey(key string, hash uint64) bool {
	if len(key) != 64 || strings.ToLower(key) != key {
		return false
	}
	if _, err := hex.DecodeString(key); err != nil {
		return false
	}
	first, err := strconv.ParseUint(key[:16], 16, 64)
	return err == nil && first == hash
}

// fakeRecords stands in for a context's engine records in tests that drive a binding
// store directly: one record per block hash, its index handed to link.
type fakeRecords struct {
	keys []uint64
	idx  map[uint64]uint32
}

func (f *fakeRecords) recordKey(i uint32) uint64 { return f.keys[i] }

func (f *fakeRecords) recordOf(h uint64) (uint32, bool) {
	i, ok := f.idx[h]
	return i, ok
}

// of returns the record of block hash h, created on first use.
func (f *fakeRecords) of(h uint64) uint32 {
	if i, ok := f.idx[h]; ok {
		return i
	}
	if f.idx == nil {
		f.idx = map[uint64]uint32{}
	}
	f.idx[h] = uint32(len(f.keys))
	f.keys = append(f.keys, h)
	return f.idx[h]
}

// TestBindStoreAgainstMap drives the compact binding store directly with random adds,
// component changes, removals and block drops, many thousands of bindings (so its index
// tables split and deletions shift probe runs), and checks every binding (found by its
// key, decoded back with its components), every block's chain and flags, the interned
// component sets' reference counts, and the charges against plain maps after each
// phase. Keys: 64 lowercase hex digits bound to the hash their first 16 digits give
// (derived: no block hash stored, found through the block's chain) or to another
// (explicit), the same digits in upper case and free-form keys (explicit).
func TestBindStoreAgainstMap(t *testing.T) {
	for _, limit := range []int{maxSets, 6} {
		t.Run(fmt.Sprintf("sets=%d", limit), func(t *testing.T) { testBindStoreAgainstMap(t, limit) })
	}
}

func testBindStoreAgainstMap(t *testing.T, setLimit int) {
	type key struct {
		src, bk, obj string
		tier         SharedTier
	}
	type val struct {
		hash  uint64
		comps map[string]bool
	}
	r := rand.New(rand.NewPCG(1, 2))
	var recs fakeRecords
	s := newBindStore(&recs)
	s.sets.limit = setLimit
	defer s.release()
	model := map[key]*val{}
	idx := map[key]uint32{}
	var charged int64
	objOf := func(i int) string {
		switch i % 3 {
		case 0:
			return fmt.Sprintf("%016x%016x%016x%016x", i%3000, i, i*13, i*31)
		case 1:
			return strings.ToUpper(fmt.Sprintf("%016x%016x%016x%016x", i%3000, i, i*13, i*31))
		}
		return fmt.Sprintf("key-%d", i)
	}
	randKey := func(span int) (key, int) {
		i := r.IntN(span)
		return key{fmt.Sprintf("src-%d", r.IntN(5)), fmt.Sprintf("bk-%d", r.IntN(3)), objOf(i), SharedTier(r.IntN(2))}, i
	}
	derivedSeen := 0
	check := func(phase string) {
		t.Helper()
		if s.n != len(model) {
			t.Fatalf("%s: %d bindings, model %d", phase, s.n, len(model))
		}
		flags := map[uint64]uint64{}
		var want int64
		explicit := 0
		setRefs := map[uint16]uint32{}
		for k, v := range model {
			i, ok := s.find(k.src, k.bk, k.tier, k.obj)
			if !ok || i != idx[k] || s.hash(i) != v.hash {
				t.Fatalf("%s: find %v = %d %v, want %d", phase, k, i, ok, idx[k])
			}
			e := s.ent(i)
			if d := derivedKey(k.obj, v.hash); d == entExplicit(e) {
				t.Fatalf("%s: %v bound to %x: derived %v, explicit flag %v", phase, k, v.hash, d, entExplicit(e))
			} else if d {
				derivedSeen++
			}
			flags[v.hash] |= tierFlag(k.tier)
			want += bindingBaseBytes
			if entExplicit(e) {
				explicit++
				want += objSlotBytes + stringBytes + int64(len(k.obj))
			}
			if set := entSet(e); set == setOverflow {
				for _, c := range s.over[i] {
					want += stringBytes + int64(len(c))
				}
			} else if set != 0 {
				setRefs[set]++
			}
		}
		// Every binding decoded from its block's chain: key, origin, tier, components.
		seen := 0
		for h := range flags {
			if got := s.flags(h); got != flags[h] {
				t.Fatalf("%s: flags of %d = %b, want %b", phase, h, got, flags[h])
			}
			s.eachOf(h, func(src, bk, obj string, tier SharedTier, comps []string) {
				seen++
				v := model[key{src, bk, obj, tier}]
				if v == nil || v.hash != h || len(comps) != len(v.comps) {
					t.Fatalf("%s: block %d decodes %s/%s/%q/%d %q, model %+v", phase, h, src, bk, obj, tier, comps, v)
				}
				for _, c := range comps {
					if !v.comps[c] {
						t.Fatalf("%s: %q has component %q, model %v", phase, obj, c, v.comps)
					}
				}
			})
		}
		if seen != len(model) {
			t.Fatalf("%s: chains hold %d bindings, model %d", phase, seen, len(model))
		}
		if s.obj.n != explicit || s.blk.n != len(flags) {
			t.Fatalf("%s: table counts %d/%d, want %d/%d", phase, s.obj.n, s.blk.n, explicit, len(flags))
		}
		if charged != want {
			t.Fatalf("%s: charged %d, want %d", phase, charged, want)
		}
		// Interned sets: one reference per binding holding one, and each name one per
		// live set holding it.
		nameRefs := map[uint16]uint32{}
		for id := 1; id < len(s.sets.sets.names); id++ {
			if s.sets.sets.refs[id] != setRefs[uint16(id)] {
				t.Fatalf("%s: set %d (%b) has %d references, %d bindings hold it", phase, id, s.sets.sets.names[id], s.sets.sets.refs[id], setRefs[uint16(id)])
			}
			for m := s.sets.sets.names[id]; m != 0; m &= m - 1 {
				nameRefs[uint16(bits.TrailingZeros64(m))]++
			}
		}
		if len(s.sets.sets.idx) != len(setRefs) || len(s.sets.sets.names)-1 > setLimit {
			t.Fatalf("%s: %d sets interned (%d ids), %d held, limit %d", phase, len(s.sets.sets.idx), len(s.sets.sets.names)-1, len(setRefs), setLimit)
		}
		for c, n := range s.sets.names.refs {
			if n != nameRefs[uint16(c)] {
				t.Fatalf("%s: component %q has %d references, in %d sets", phase, s.sets.names.names[c], n, nameRefs[uint16(c)])
			}
		}
	}
	add := func(k key, h uint64, comp string) {
		if v := model[k]; v != nil {
			if added, c := s.addComp(idx[k], comp); added != !v.comps[comp] {
				t.Fatalf("addComp %q to %v: added %v, model had %v", comp, k, added, v.comps[comp])
			} else {
				charged += c
			}
			v.comps[comp] = true
			return
		}
		i, c, err := s.add(k.src, k.bk, k.tier, k.obj, h)
		if err != nil {
			t.Fatal(err)
		}
		s.link(i, recs.of(h))
		charged += c
		_, c = s.addComp(i, comp)
		charged += c
		model[k] = &val{hash: h, comps: map[string]bool{comp: true}}
		idx[k] = i
	}
	for round := 0; round < 3; round++ {
		for j := 0; j < 6000; j++ {
			k, i := randKey(4000)
			comp := []string{"_0_k", "_0_v"}[r.IntN(2)]
			if r.IntN(4) == 0 {
				comp = fmt.Sprintf("_%d_x", r.IntN(50))
			}
			h := uint64(r.IntN(3000))
			if r.IntN(4) != 0 {
				h = uint64(i % 3000) // a lowercase hex key's own hash: derived
			}
			if v := model[k]; v != nil {
				h = v.hash
			}
			add(k, h, comp)
		}
		check(fmt.Sprintf("round %d grown", round))
		// Component removals, dropping bindings with their last component.
		for k, v := range model {
			if r.IntN(2) == 0 {
				continue
			}
			for comp := range v.comps {
				removed, c, left := s.removeComp(idx[k], comp)
				if !removed {
					t.Fatalf("removeComp %q of %v: not there", comp, k)
				}
				charged -= c
				delete(v.comps, comp)
				if left != (len(v.comps) > 0) {
					t.Fatalf("removeComp %q of %v: left %v, model %d", comp, k, left, len(v.comps))
				}
				if r.IntN(3) == 0 {
					break // a binding that keeps some of its components
				}
			}
			if removed, _, _ := s.removeComp(idx[k], "_none_"); removed {
				t.Fatal("removed a component never added")
			}
			if len(v.comps) > 0 {
				continue
			}
			if _, c := s.remove(idx[k]); c < bindingBaseBytes {
				t.Fatalf("remove charge %d", c)
			} else {
				charged -= c
			}
			delete(model, k)
			delete(idx, k)
		}
		check(fmt.Sprintf("round %d removed", round))
		// Whole blocks.
		byHash := map[uint64][]key{}
		for k, v := range model {
			byHash[v.hash] = append(byHash[v.hash], k)
		}
		for h := uint64(0); h < 3000; h += 1 + uint64(r.IntN(3)) {
			n, c := s.dropBlock(h)
			charged -= c
			m := len(byHash[h])
			for _, k := range byHash[h] {
				delete(model, k)
				delete(idx, k)
			}
			if n != m {
				t.Fatalf("dropBlock %d dropped %d, model %d", h, n, m)
			}
		}
		check(fmt.Sprintf("round %d blocks dropped", round))
	}
	for k := range model {
		_, c := s.remove(idx[k])
		charged -= c
		delete(model, k)
	}
	check("emptied")
	if derivedSeen == 0 {
		t.Fatal("no derived binding checked")
	}
	if charged != 0 || len(s.origins.idx) != 0 || len(s.sets.sets.idx) != 0 || len(s.sets.names.idx) != 0 || len(s.over) != 0 {
		t.Fatalf("emptied store: charge %d, names %d, sets %d, components %d, overflow %d", charged, len(s.origins.idx), len(s.sets.sets.idx), len(s.sets.names.idx), len(s.over))
	}
	if s.obj.depth < 2 || s.blk.depth < 2 {
		t.Fatalf("tables never split: depths %d %d", s.obj.depth, s.blk.depth)
	}
	for _, tab := range []*bindTable{&s.obj, &s.blk} {
		for ti, c := range tab.count {
			if c != 0 {
				t.Fatalf("emptied table %d counts %d", ti, c)
			}
		}
	}
}

// TestBindingComponentsPastBitmask: a binding with more components than an interned set
// holds (setNames) keeps them all in its overflow list; it stays (with its block's shared
// hit) until its last component is removed, and every byte charged comes back.
func TestBindingComponentsPastBitmask(t *testing.T) {
	s := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{MemoryLimitBytes: 1 << 30}, &testHooks{}, s)
	op := func(kind OpKind, obj, comp string, h uint64) Op {
		return Op{Kind: kind, Source: "tcp://mc:1", Backend: "pool", ObjectKey: obj, Component: comp, SharedTier: SharedCPU, Hash: h}
	}
	hex := strings.Repeat("0123456789abcdef", 4)
	const n = setNames + 5
	// Each binding's first setNames components are interned sets; with the next, all go to
	// its overflow list.
	for _, obj := range []string{hex, "other"} {
		for i := 0; i < n; i++ {
			mustApply(t, e, ctxA, op(OpSharedStore, obj, fmt.Sprintf("_%d_k", i), map[string]uint64{hex: 7, "other": 8}[obj]))
		}
	}
	hit := func(h uint64) bool { return rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).CPUShare == 16 }
	if !hit(7) || !hit(8) || e.TotalBlocks() != 4 {
		t.Fatalf("bindings with %d components: hits %v %v, units %d", n, hit(7), hit(8), e.TotalBlocks())
	}
	// Block 7's binding loses its bitmask components first, block 8's its overflow ones.
	for i := 0; i < n; i++ {
		if !hit(7) || !hit(8) {
			t.Fatalf("a block lost its binding with %d components left: hits %v %v", n-i, hit(7), hit(8))
		}
		for _, rm := range []Op{op(OpSharedRemove, hex, fmt.Sprintf("_%d_k", i), 7), op(OpSharedRemove, "other", fmt.Sprintf("_%d_k", n-1-i), 8)} {
			mustApply(t, e, ctxA, rm, rm) // the second is a no-op
		}
	}
	if hit(7) || hit(8) || e.IndexBytes() != 0 || e.TotalBlocks() != 0 {
		t.Fatalf("all removed: hits %v %v, %d bytes, %d units", hit(7), hit(8), e.IndexBytes(), e.TotalBlocks())
	}
}

// TestHexObjectKeyForms: a 64-hex-digit key (kept as binary) and the same digits in upper
// case or one digit short (kept as strings) are three bindings; each is found again by
// its own spelling only.
func TestHexObjectKeyForms(t *testing.T) {
	s := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{}, &testHooks{}, s)
	low := strings.Repeat("00ff", 16)
	keys := []string{low, strings.ToUpper(low), low[:63], low[:63] + "g"}
	for i, k := range keys {
		mustApply(t, e, ctxA, Op{Kind: OpSharedStore, Source: "m", Backend: "b", ObjectKey: k, SharedTier: SharedDisk, Hash: uint64(10 + i)})
	}
	for i, k := range keys {
		// Another hash under the same key conflicts; the binding's own hash does not.
		ops := []Op{{Kind: OpSharedStore, Source: "m", Backend: "b", ObjectKey: k, SharedTier: SharedDisk, Hash: 99}}
		if err := e.Apply(ctxA, ops); err != nil || !errors.Is(ops[0].Err, ErrBindingConflict) {
			t.Fatalf("key %q: store under another hash: %v %v", k, err, ops[0].Err)
		}
		ops = []Op{{Kind: OpSharedRemove, Source: "m", Backend: "b", ObjectKey: k, SharedTier: SharedDisk, Hash: uint64(10 + i)}}
		if err := e.Apply(ctxA, ops); err != nil || ops[0].Err != nil {
			t.Fatalf("key %q: remove: %v %v", k, err, ops[0].Err)
		}
		if rankTiers(t, qk(t, e, ctxA, []uint64{uint64(10 + i)}, ""), "a", 0).Disk != 0 {
			t.Fatalf("key %q: removed binding still hits", k)
		}
		for j := i + 1; j < len(keys); j++ {
			if rankTiers(t, qk(t, e, ctxA, []uint64{uint64(10 + j)}, ""), "a", 0).Disk != 16 {
				t.Fatalf("removing %q dropped the binding of %q", k, keys[j])
			}
		}
	}
}

// TestTooManySharedNames: (source, backend) pairs are interned in 16 bits per context;
// past 65,536 live pairs a store is refused with ErrTooManyNames (nothing changed), and
// a pair freed by its last binding's removal makes room again.
func TestTooManySharedNames(t *testing.T) {
	s := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{MaxBlocksPerContext: -1}, &testHooks{}, s)
	bind := func(kind OpKind, i int) Op {
		return Op{Kind: kind, Source: fmt.Sprintf("s%d", i), Backend: "b", ObjectKey: "k", SharedTier: SharedCPU, Hash: uint64(i)}
	}
	const names = 1 << 16
	ops := make([]Op, 0, 4096)
	for i := 0; i < names; i++ {
		ops = append(ops, bind(OpSharedStore, i))
		if len(ops) == cap(ops) || i == names-1 {
			mustApply(t, e, ctxA, ops...)
			ops = ops[:0]
		}
	}
	over := []Op{bind(OpSharedStore, names)}
	if err := e.Apply(ctxA, over); err != nil || !errors.Is(over[0].Err, ErrTooManyNames) {
		t.Fatalf("store past the name table: %v %v", err, over[0].Err)
	}
	if rankTiers(t, qk(t, e, ctxA, []uint64{names}, ""), "a", 0).CPUShare != 0 {
		t.Fatal("refused store left a hit")
	}
	mustApply(t, e, ctxA, bind(OpSharedRemove, 5))
	over = []Op{bind(OpSharedStore, names)}
	if err := e.Apply(ctxA, over); err != nil || over[0].Err != nil {
		t.Fatalf("store after a name was freed: %v %v", err, over[0].Err)
	}
	if rankTiers(t, qk(t, e, ctxA, []uint64{names}, ""), "a", 0).CPUShare != 16 {
		t.Fatal("store after a name was freed: no hit")
	}
}

// TestClearSharedInBoundedSteps: ClearShared removes a context's bindings a bounded
// number per writer step and returns when the last is gone. Between its steps, other
// requests apply: a store of a cleared object binds anew (and survives the clear), a
// remove of a cleared object is a no-op, a store of a cleared object under another hash
// is no conflict, and other origins' bindings are untouched.
func TestClearSharedInBoundedSteps(t *testing.T) {
	deferred, signal := notifier()
	h := &testHooks{noIdleMigration: true, dropDeferred: signal}
	a := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{}, h, a)
	op := func(kind OpKind, backend, obj string, hash uint64) Op {
		return Op{Kind: kind, Source: "s1", Backend: backend, ObjectKey: obj, Component: "_0_k", SharedTier: SharedCPU, Hash: hash}
	}
	const n = 8 * dropRemove
	var ops []Op
	for i := 1; i <= n; i++ {
		ops = append(ops, op(OpSharedStore, "pool", fmt.Sprintf("obj-%d", i), uint64(i)))
	}
	ops = append(ops, op(OpSharedStore, "other", "obj-1", 5000))
	mustApply(t, e, ctxA, ops...)
	hit := func(h uint64) bool { return rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).CPUShare == 16 }
	done := make(chan struct{})
	go func() {
		e.ClearShared("s1", "pool", ctxA.TenantID)
		close(done)
	}()
	<-deferred // its first step ran: at most dropRemove bindings went
	select {
	case <-done:
		t.Fatal("ClearShared returned after one step")
	default:
	}
	if !hit(n) || !hit(5000) {
		t.Fatal("bindings gone before the clear reached them, or another origin's")
	}
	mustApply(t, e, ctxA, op(OpSharedStore, "pool", fmt.Sprintf("obj-%d", n), uint64(n)),
		op(OpSharedRemove, "pool", fmt.Sprintf("obj-%d", n-1), uint64(n-1)),
		op(OpSharedStore, "pool", fmt.Sprintf("obj-%d", n-2), 7777))
	// Each writer step removes at most dropRemove bindings (and their blocks); the clear
	// ends after about n/dropRemove steps, and ClearShared returns then.
	for steps := 1; ; steps++ {
		before := e.TotalBlocks()
		if dropsPending(t, e) == 0 { // read on the writer before this step's drop work
			break
		}
		if steps > n/dropRemove+2 {
			t.Fatalf("clear of %d bindings not done after %d steps (%d units left)", n, steps, e.TotalBlocks())
		}
		if removed := before - e.TotalBlocks(); removed > 2*dropRemove {
			t.Fatalf("one step removed %d bindings and blocks, want at most %d", removed, 2*dropRemove)
		}
	}
	<-done
	if !hit(n) || !hit(7777) || !hit(5000) {
		t.Fatalf("bindings made after the clear, or another origin's, lost: %v %v %v", hit(n), hit(7777), hit(5000))
	}
	for _, h := range []uint64{1, 2, n / 2, n - 1, n - 2} {
		if hit(h) {
			t.Fatalf("block %d still hits after the clear", h)
		}
	}
	// Three bindings and their blocks.
	if got := e.TotalBlocks(); got != 6 {
		t.Fatalf("units %d after the clear, want 6", got)
	}
}

// TestClosePendingClearShared: closing the engine hands back a ClearShared still waiting
// for its steps.
func TestClosePendingClearShared(t *testing.T) {
	deferred, signal := notifier()
	h := &testHooks{noIdleMigration: true, dropDeferred: signal}
	a := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{}, h, a)
	var ops []Op
	for i := 1; i <= 4*dropRemove; i++ {
		ops = append(ops, Op{Kind: OpSharedStore, Source: "s1", Backend: "pool", ObjectKey: fmt.Sprintf("o%d", i), SharedTier: SharedDisk, Hash: uint64(i)})
	}
	mustApply(t, e, ctxA, ops...)
	done := make(chan struct{})
	go func() {
		e.RetractSource("s1")
		close(done)
	}()
	<-deferred
	e.Close()
	<-done
}

// dropsPending reads, on the writer, the ClearShared / RetractSource requests still
// waiting; the request is a writer step of its own (which may end them).
func dropsPending(t testing.TB, e *Engine) (n int) {
	t.Helper()
	onWriter(t, e, ctxA, func(c *cacheContext) { n = len(c.dropWaiters) })
	return n
}

// onWriter runs fn on context k's writer goroutine (a writer step of its own).
func onWriter(t testing.TB, e *Engine, k ContextKey, fn func(c *cacheContext)) {
	t.Helper()
	c := e.lookup(k)
	r := e.getReq()
	r.kind = reqSync
	r.fn = fn
	if err := c.do(r); err != nil {
		t.Fatal(err)
	}
	e.putReq(r)
}

// TestDerivedAndExplicitHexKeys: a 64-hex key bound to the hash its first 16 digits give
// is derived (no hash stored; found through its block's chain, not the key index); the
// same digits bound to another hash, or another hex key bound to that block, are
// explicit (found through the key index). Each is found by its key alone, whichever
// form holds it: a store under another hash conflicts and a remove under another hash
// is a mismatch, even when the key's digits name a block that has a chain. Each is
// charged for its form, and every byte comes back.
func TestDerivedAndExplicitHexKeys(t *testing.T) {
	s := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{MemoryLimitBytes: 1 << 30}, &testHooks{}, s)
	const h1, h2 = 0x1111222233334444, 55
	k1 := fmt.Sprintf("%016x%s", uint64(h1), strings.Repeat("ab", 24)) // derived: bound to h1
	k2 := fmt.Sprintf("%016x%s", uint64(h1), strings.Repeat("cd", 24)) // its digits name h1, bound to h2: explicit
	k3 := strings.Repeat("ef", 32)                                     // bound to h1: explicit
	op := func(kind OpKind, obj string, h uint64) Op {
		return Op{Kind: kind, Source: "tcp://mc:1", Backend: "pool", ObjectKey: obj, Component: "_0_k", SharedTier: SharedDisk, Hash: h}
	}
	hit := func(h uint64) bool { return rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).Disk == 16 }
	base := e.IndexBytes()
	mustApply(t, e, ctxA, op(OpSharedStore, k1, h1))
	withBlock := e.IndexBytes() - base
	mustApply(t, e, ctxA, op(OpSharedStore, k3, h1))
	if got, want := e.IndexBytes()-base-withBlock, int64(bindingBaseBytes+objSlotBytes+stringBytes+64); got != want {
		t.Fatalf("explicit binding on an indexed block charged %d, want %d", got, want)
	}
	before := e.IndexBytes()
	mustApply(t, e, ctxA, op(OpSharedStore, k2, h2))
	if got, want := e.IndexBytes()-before, withBlock+objSlotBytes+stringBytes+64; got != want {
		t.Fatalf("explicit binding of a new block charged %d, want %d (derived: %d)", got, want, withBlock)
	}
	onWriter(t, e, ctxA, func(c *cacheContext) {
		for _, b := range []struct {
			key      string
			hash     uint64
			explicit bool
		}{{k1, h1, false}, {k2, h2, true}, {k3, h1, true}} {
			i, ok := c.bs.find("tcp://mc:1", "pool", SharedDisk, b.key)
			if !ok || c.bs.hash(i) != b.hash || entExplicit(c.bs.ent(i)) != b.explicit {
				t.Errorf("%q: found %v, hash %x, explicit %v; want %x %v", b.key, ok, c.bs.hash(i), entExplicit(c.bs.ent(i)), b.hash, b.explicit)
			}
		}
		if c.bs.obj.n != 2 || c.bs.blk.n != 2 {
			t.Errorf("index counts: key %d, block %d; want 2, 2", c.bs.obj.n, c.bs.blk.n)
		}
	})
	for _, o := range []Op{op(OpSharedStore, k1, h2), op(OpSharedStore, k2, h1), op(OpSharedStore, k3, 7)} {
		ops := []Op{o}
		if err := e.Apply(ctxA, ops); err != nil || !errors.Is(ops[0].Err, ErrBindingConflict) {
			t.Fatalf("store of %q under %x: %v %v, want a conflict", o.ObjectKey, o.Hash, err, ops[0].Err)
		}
	}
	for _, o := range []Op{op(OpSharedRemove, k1, h2), op(OpSharedRemove, k2, h1), op(OpSharedRemove, k3, h2)} {
		ops := []Op{o}
		if err := e.Apply(ctxA, ops); err != nil || !errors.Is(ops[0].Err, ErrBindingMismatch) {
			t.Fatalf("remove of %q under %x: %v %v, want a mismatch", o.ObjectKey, o.Hash, err, ops[0].Err)
		}
	}
	mustApply(t, e, ctxA, op(OpSharedRemove, k1, h1))
	if !hit(h1) || !hit(h2) {
		t.Fatal("removing the derived binding dropped another binding's hit")
	}
	mustApply(t, e, ctxA, op(OpSharedRemove, k3, h1))
	if hit(h1) || !hit(h2) {
		t.Fatalf("after removing both bindings of %x: hits %v %v", uint64(h1), hit(h1), hit(h2))
	}
	mustApply(t, e, ctxA, op(OpSharedRemove, k2, h2))
	if hit(h2) || e.IndexBytes() != base {
		t.Fatalf("all removed: hit %v, %d bytes charged, want %d", hit(h2), e.IndexBytes(), base)
	}
}

// TestCompSetsInterning: component sets are shared by the bindings that hold them, with
// one reference each; a set goes (its id reused) when its last holder moves on, and a
// name when the last set holding it goes. Past the table's limit, or past setNames
// names, a set is refused and nothing changes.
func TestCompSetsInterning(t *testing.T) {
	cs := newCompSets(3)
	step := func(set uint16, add bool, comp string, wantChange, wantOK bool) uint16 {
		t.Helper()
		var n uint16
		var changed, ok bool
		if add {
			n, changed, ok = cs.with(set, comp)
		} else {
			n, changed, ok = cs.without(set, comp)
		}
		if changed != wantChange || ok != wantOK || (!ok || !changed) && n != set {
			t.Fatalf("set %d %v %q: %d %v %v", set, add, comp, n, changed, ok)
		}
		return n
	}
	names := func(set uint16) string {
		return strings.Join(slices.Sorted(slices.Values(cs.appendNames(nil, set))), ",")
	}
	nameRefs := func(c string) uint32 {
		if i, ok := cs.names.idx[c]; ok {
			return cs.names.refs[i]
		}
		return 0
	}
	a := step(0, true, "a", true, true)                              // binding A: {a}
	b := step(step(0, true, "a", true, true), true, "b", true, true) // binding B: {a} then {a,b}
	if b == a || cs.sets.refs[a] != 1 || cs.sets.refs[b] != 1 || names(b) != "a,b" || nameRefs("a") != 2 || nameRefs("b") != 1 {
		t.Fatalf("sets %d (%d refs) %d (%d refs) %q, name refs a %d b %d", a, cs.sets.refs[a], b, cs.sets.refs[b], names(b), nameRefs("a"), nameRefs("b"))
	}
	step(b, true, "b", false, true) // already there: nothing changes
	step(b, false, "z", false, true)
	c := step(0, true, "c", true, true) // binding C: {c}; the table is full (3 sets)
	if len(cs.sets.names)-1 != 3 {
		t.Fatalf("%d set ids", len(cs.sets.names)-1)
	}
	step(c, true, "d", true, false) // {c,d}: refused, C keeps {c}; "d" not kept
	if nameRefs("d") != 0 || cs.sets.refs[c] != 1 {
		t.Fatalf("refused set left name d (%d refs) or changed {c} (%d refs)", nameRefs("d"), cs.sets.refs[c])
	}
	// B drops b: {a} is shared (2 references); {a,b} goes and so does the name b.
	if nb := step(b, false, "b", true, true); nb != a || cs.sets.refs[a] != 2 || nameRefs("b") != 0 || cs.sets.refs[b] != 0 {
		t.Fatalf("{a,b} minus b: set %d (want %d), refs %d, name b %d", nb, a, cs.sets.refs[a], nameRefs("b"))
	}
	cd := step(c, true, "d", true, true) // now there is room: {c,d} takes the freed id
	if cd != b || names(cd) != "c,d" || nameRefs("c") != 1 || cs.sets.refs[c] != 0 {
		t.Fatalf("{c,d}: id %d (freed %d), names %q", cd, b, names(cd))
	}
	// Down to nothing: every set and name goes.
	cs.release(a)
	cs.release(a)
	if step(step(cd, false, "c", true, true), false, "d", true, true) != 0 {
		t.Fatal("emptied set is not the empty set")
	}
	if len(cs.sets.idx) != 0 || len(cs.names.idx) != 0 || len(cs.sets.free) != 3 {
		t.Fatalf("released all: %d sets, %d names, %d free ids", len(cs.sets.idx), len(cs.names.idx), len(cs.sets.free))
	}
	// More names than a set can hold.
	cs = newCompSets(maxSets)
	set := uint16(0)
	for i := 0; i < setNames; i++ {
		set = step(set, true, fmt.Sprintf("n%d", i), true, true)
	}
	step(set, true, "one-more", true, false)
}

// TestBindingSetOverflow: when the set a binding needs cannot be interned, adding (or
// removing: the set left need not be interned yet) a component puts the binding's
// components in its own list, charged per string; the binding keeps working (add, remove,
// duplicate adds) and every byte comes back when it goes.
func TestBindingSetOverflow(t *testing.T) {
	var recs fakeRecords
	s := newBindStore(&recs)
	defer s.release()
	s.sets.limit = 2
	hexOf := func(h uint64) string { return fmt.Sprintf("%016x%048x", h, h) }
	var charged int64
	bind := func(h uint64, comps ...string) uint32 {
		i, c, err := s.add("src", "bk", SharedCPU, hexOf(h), h)
		if err != nil {
			t.Fatal(err)
		}
		s.link(i, recs.of(h))
		charged += c
		for _, comp := range comps {
			if added, c := s.addComp(i, comp); !added {
				t.Fatalf("%q not added", comp)
			} else {
				charged += c
			}
		}
		return i
	}
	p := bind(1, "_a", "_b")       // {a,b}
	r := bind(2, "_a", "_b", "_c") // {a}, {a,b} shared, then {a,b,c}: the table is full
	if entSet(s.ent(p)) == setOverflow || entSet(s.ent(r)) == setOverflow || charged != 2*bindingBaseBytes {
		t.Fatalf("sets %d %d, charged %d", entSet(s.ent(p)), entSet(s.ent(r)), charged)
	}
	// R drops _b: {a,c} is not interned and cannot be: R's other two go to its list.
	removed, c, left := s.removeComp(r, "_b")
	if !removed || !left || c != -2*(stringBytes+2) || entSet(s.ent(r)) != setOverflow {
		t.Fatalf("remove _b: %v %d %v, set %d", removed, c, left, entSet(s.ent(r)))
	}
	charged -= c
	// A third binding needs a third set: its components go to its list as they come.
	q := bind(3, "_a", "_d")
	if entSet(s.ent(q)) != setOverflow || charged != 3*bindingBaseBytes+4*(stringBytes+2) {
		t.Fatalf("third binding: set %d, charged %d", entSet(s.ent(q)), charged)
	}
	if added, _ := s.addComp(q, "_d"); added {
		t.Fatal("duplicate component added to an overflow list")
	}
	for _, b := range []struct {
		i     uint32
		h     uint64
		comps string
	}{{p, 1, "_a,_b"}, {r, 2, "_a,_c"}, {q, 3, "_a,_d"}} {
		var got []string
		s.eachOf(b.h, func(_, _, key string, _ SharedTier, comps []string) {
			if key != hexOf(b.h) {
				t.Fatalf("key %q, want %q", key, hexOf(b.h))
			}
			got = append(got, comps...)
		})
		slices.Sort(got)
		if strings.Join(got, ",") != b.comps {
			t.Fatalf("binding of %d: components %q, want %s", b.h, got, b.comps)
		}
	}
	if removed, c, left := s.removeComp(r, "_a"); !removed || !left || c != stringBytes+2 {
		t.Fatalf("overflow remove: %v %d %v", removed, c, left)
	} else {
		charged -= c
	}
	for _, i := range []uint32{p, r, q} {
		_, c := s.remove(i)
		charged -= c
	}
	if charged != 0 || len(s.over) != 0 || len(s.sets.sets.idx) != 0 || len(s.sets.names.idx) != 0 {
		t.Fatalf("all removed: charged %d, %d lists, %d sets, %d names", charged, len(s.over), len(s.sets.sets.idx), len(s.sets.names.idx))
	}
}

// TestBindingChainsFollowCompaction: a block's chain of bindings ends at the block's
// engine record (its hash is that record's key), and a compaction copies the records into
// a new arena under new indices: after a clear leaves a context few blocks (maybeShrink)
// and when a small context widens its records (registerWide). Chains of one to three
// bindings (derived and explicit, two tiers), on blocks also held by an engine slot and
// on blocks held by bindings alone, must be found by their keys afterwards, name their
// block's new record, give its hits, take new bindings and go with their last component,
// leaving nothing charged. 1,000 bound blocks: the block index has several tables, and
// the chains moved to their new records are spread over them.
func TestBindingChainsFollowCompaction(t *testing.T) {
	for _, how := range []string{"shrink", "widen"} {
		t.Run(how, func(t *testing.T) {
			a := Slot{"a", 0}
			e := setup(t, Config{MemoryLimitBytes: 1 << 30}, a)
			p := vllmProfile(t)
			n := 5000
			if how == "widen" {
				n = 1500 // a small context: widened in one step, by a compaction
				for i := 1; i < packedSlots; i++ {
					mustRegister(t, e, ctxA, p, Slot{"pad", i})
				}
			}
			base := e.IndexBytes()
			hs := seqKeys(7, n)
			mustApply(t, e, ctxA, store(a, TierDevice, hs...))
			type binding struct {
				src, key string
				tier     SharedTier
				hash     uint64
			}
			var binds []binding
			var bound []uint64
			for j := 0; j < 1000; j++ { // a block index of several tables
				h := uint64(0xb000+j) << 40 // held by its bindings alone
				if j < 20 {
					h = hs[n-1-j*37] // also an engine block
				}
				bound = append(bound, h)
				binds = append(binds,
					binding{"tcp://mc:1", fmt.Sprintf("%016x%048x", h, j), SharedCPU, h},
					binding{"tcp://mc:2", fmt.Sprintf("%016x%048x", h, 1000+j), SharedDisk, h})
				if j%3 == 0 {
					binds = append(binds, binding{"tcp://mc:1", fmt.Sprintf("obj-%d", j), SharedCPU, h})
				}
			}
			shared := func(kind OpKind, b binding, comp string) Op {
				return Op{Kind: kind, Source: b.src, Backend: "pool", ObjectKey: b.key, Component: comp, SharedTier: b.tier, Hash: b.hash}
			}
			for _, b := range binds {
				mustApply(t, e, ctxA, shared(OpSharedStore, b, "_0_k"), shared(OpSharedStore, b, "_0_v"))
			}
			boundSet := map[uint64]bool{}
			for _, h := range bound {
				boundSet[h] = true
			}
			var gone, left []uint64 // engine blocks removed (widen) and kept
			for _, h := range hs {
				if how == "widen" && !boundSet[h] && h%2 == 0 {
					gone = append(gone, h)
				} else if how == "widen" && !boundSet[h] {
					left = append(left, h)
				}
			}
			var recsBefore []uint32
			onWriter(t, e, ctxA, func(c *cacheContext) {
				for _, h := range bound {
					idx, _ := c.tab.lookup(h)
					recsBefore = append(recsBefore, idx)
				}
			})
			if how == "shrink" {
				mustApply(t, e, ctxA, Op{Kind: OpClear, Slot: a, ClearTiers: MaskDevice})
			} else {
				mustApply(t, e, ctxA, remove(a, TierDevice, gone...))
				mustRegister(t, e, ctxA, p, Slot{"wide", 0})
			}
			settle(t, e, ctxA)
			moved := 0
			onWriter(t, e, ctxA, func(c *cacheContext) {
				if c.bs.blk.depth == 0 {
					t.Error("the block index is one table")
				}
				if how == "widen" && c.tab.w != 1 {
					t.Errorf("records not widened: width %d", c.tab.w)
				}
				for j, h := range bound {
					idx, ok := c.tab.lookup(h)
					if !ok {
						t.Errorf("block %x lost its record", h)
						continue
					}
					if idx != recsBefore[j] {
						moved++
					}
					if got, want := c.bs.flags(h), uint64(metaSharedCPU|metaSharedDisk); got != want {
						t.Errorf("block %x: flags %b, want %b", h, got, want)
					}
				}
				for _, b := range binds {
					i, ok := c.bs.find(b.src, "pool", b.tier, b.key)
					if !ok {
						t.Errorf("%q not found after the compaction", b.key)
						continue
					}
					idx, _ := c.tab.lookup(b.hash)
					if c.bs.hash(i) != b.hash || entLink(c.bs.ent(c.bs.tail(i))) != linkTail|uint64(idx) {
						t.Errorf("%q: hash %x (want %x), chain ends at %x (record %d)", b.key, c.bs.hash(i), b.hash, entLink(c.bs.ent(c.bs.tail(i))), idx)
					}
				}
			})
			if moved == 0 {
				t.Fatal("no bound block changed record: nothing compacted")
			}
			for _, h := range bound {
				if got := rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0); got.CPUShare != 16 || got.Disk != 16 {
					t.Fatalf("bound block %x after the compaction: %+v", h, got)
				}
			}
			// A new binding on a bound block, and one on a new block, after it.
			extra := []binding{{"tcp://mc:3", fmt.Sprintf("%016x%048x", bound[25], 7), SharedCPU, bound[25]},
				{"tcp://mc:3", fmt.Sprintf("%016x%048x", uint64(0xc0ffee), 7), SharedDisk, 0xc0ffee}}
			for _, b := range extra {
				mustApply(t, e, ctxA, shared(OpSharedStore, b, "_0_k"))
			}
			binds = append(binds, extra...)
			bound = append(bound, 0xc0ffee)
			if got := rankTiers(t, qk(t, e, ctxA, []uint64{0xc0ffee}, ""), "a", 0); got.Disk != 16 {
				t.Fatalf("new binding after the compaction: %+v", got)
			}
			// Every binding goes with its last component: a block held by bindings alone
			// goes, one also held by the engine slot keeps that hit alone.
			for _, b := range binds {
				mustApply(t, e, ctxA, shared(OpSharedRemove, b, "_0_k"), shared(OpSharedRemove, b, "_0_v"))
			}
			for j, h := range bound {
				want := Tiers{}
				if how == "widen" && j < 20 {
					want = Tiers{Device: 16, CPULocal: 16, CPUShare: 16, Disk: 16}
				}
				if hits := qk(t, e, ctxA, []uint64{h}, ""); len(hits) != 0 && rankTiers(t, hits, "a", 0) != want {
					t.Fatalf("block %x after its bindings went: %s, want %+v", h, formatHits(hits), want)
				}
			}
			if how == "widen" {
				mustApply(t, e, ctxA, remove(a, TierDevice, left...), remove(a, TierDevice, bound[:20]...))
			}
			if st, _ := e.Stats(ctxA); st.Blocks != 0 || e.IndexBytes() != base {
				t.Fatalf("emptied: %d blocks, %d bytes charged, want 0, %d", st.Blocks, e.IndexBytes(), base)
			}
		})
	}
}

// TestHexKeyDecode: hexKey against a decoder written plainly (encoding/hex, lowercase
// only), on random keys of lowercase digits with one byte replaced at every position by
// every byte value (so every byte class at every lane of its 8-byte group: digits,
// letters, the bytes around 0-9 and a-f, upper case, bytes of 0x80 and more), and on
// keys of other lengths.
func TestHexKeyDecode(t *testing.T) {
	want := func(k string) ([4]uint64, bool) {
		var w [4]uint64
		if len(k) != 64 || strings.ToLower(k) != k {
			return w, false
		}
		b, err := hex.DecodeString(k)
		if err != nil {
			return w, false
		}
		for i := range w {
			for _, c := range b[8*i : 8*i+8] {
				w[i] = w[i]<<8 | uint64(c)
			}
		}
		return w, true
	}
	r := rand.New(rand.NewPCG(3, 4))
	const digits = "0123456789abcdef"
	check := func(k string) {
		t.Helper()
		gw, gok := hexKey(k)
		ww, wok := want(k)
		if gok != wok || gw != ww {
			t.Fatalf("hexKey(%q) = %x %v, want %x %v", k, gw, gok, ww, wok)
		}
	}
	for round := 0; round < 4; round++ {
		key := make([]byte, 64)
		for i := range key {
			key[i] = digits[r.IntN(16)]
		}
		check(string(key))
		for pos := 0; pos < 64; pos++ {
			orig := key[pos]
			for c := 0; c < 256; c++ {
				key[pos] = byte(c)
				check(string(key))
			}
			key[pos] = orig
		}
	}
	for _, k := range []string{"", "0", strings.Repeat("f", 63), strings.Repeat("0", 65), strings.Repeat("0", 128)} {
		check(k)
	}
}
