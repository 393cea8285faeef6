package engine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
)

var ctxA = ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}

func qk(t testing.TB, e *Engine, k ContextKey, keys []uint64, filter string) []InstanceHit {
	t.Helper()
	var res Result
	if err := e.QueryKeys(k, keys, len(keys)*int(k.BlockSize), filter, &res); err != nil {
		t.Fatalf("query: %v", err)
	}
	return res.Instances
}

func store(s Slot, tier EngineTier, hs ...uint64) Op {
	return Op{Kind: OpStore, Slot: s, Tier: tier, Hashes: hs}
}

func remove(s Slot, tier EngineTier, hs ...uint64) Op {
	return Op{Kind: OpRemove, Slot: s, Tier: tier, Hashes: hs}
}

func sharedOp(kind OpKind, obj string, tier SharedTier, h uint64) Op {
	return Op{Kind: kind, Source: "tcp://mc:1", Backend: "pool", ObjectKey: obj, SharedTier: tier, Hash: h}
}

func rankTiers(t testing.TB, hits []InstanceHit, id string, rank int) Tiers {
	t.Helper()
	for _, in := range hits {
		if in.InstanceID != id {
			continue
		}
		for _, r := range in.Ranks {
			if r.Rank == rank {
				return r.Tiers
			}
		}
	}
	t.Fatalf("no %s rank %d in %s", id, rank, formatHits(hits))
	return Tiers{}
}

func setup(t testing.TB, cfg Config, slots ...Slot) *Engine {
	t.Helper()
	e := newTestEngine(t, cfg)
	for _, s := range slots {
		mustRegister(t, e, ctxA, vllmProfile(t), s)
	}
	return e
}

func prefixCount(e *Engine, k ContextKey) int {
	st, _ := e.Stats(k)
	return st.Blocks
}

// wantTiers fails the test unless id's rank 0 has the tiers want for keys (16 positions
// each) in ctxA; why says what the state is.
func wantTiers(t testing.TB, e *Engine, id string, keys []uint64, want Tiers, why string) {
	t.Helper()
	if got := rankTiers(t, qk(t, e, ctxA, keys, ""), id, 0); got != want {
		t.Fatalf("%s: %s = %+v, want %+v", why, id, got, want)
	}
}

// wantBlocks fails the test unless ctxA holds want blocks; why says what they are.
func wantBlocks(t testing.TB, e *Engine, want int, why string) {
	t.Helper()
	if n := prefixCount(e, ctxA); n != want {
		t.Fatalf("blocks = %d, want %d (%s)", n, want, why)
	}
}

func TestStoreRequiresRegisteredSlot(t *testing.T) {
	e := setup(t, Config{}, Slot{"a", 0})
	ops := []Op{store(Slot{"a", 1}, TierDevice, 1), store(Slot{"b", 0}, TierDevice, 1), store(Slot{"a", 0}, TierDevice, 2)}
	if err := e.Apply(ctxA, ops); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if !errors.Is(ops[i].Err, ErrSlotNotRegistered) {
			t.Errorf("op %d err = %v, want ErrSlotNotRegistered", i, ops[i].Err)
		}
	}
	if ops[2].Err != nil {
		t.Fatalf("registered slot: %v", ops[2].Err)
	}
	wantBlocks(t, e, 1, "failed stores create nothing")
	if ops[0].Err.Error() != "engine owner instance/rank is not registered" {
		t.Fatalf("message %q", ops[0].Err)
	}
}

func TestApplyUnknownContext(t *testing.T) {
	e := setup(t, Config{})
	ops := []Op{sharedOp(OpSharedStore, "k", SharedCPU, 1)}
	if err := e.Apply(ctxA, ops); !errors.Is(err, ErrUnknownContext) {
		t.Fatalf("err = %v, want ErrUnknownContext", err)
	}
	if len(e.GlobalView()) != 0 {
		t.Fatal("Apply on an unknown context created one")
	}
}

func TestUnknownStateOpsAreNoOps(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	mustApply(t, e, ctxA, store(a, TierDevice, 1, 2))
	ops := []Op{
		remove(Slot{"ghost", 0}, TierDevice, 1),
		{Kind: OpClear, Slot: Slot{"ghost", 0}, ClearTiers: MaskAllEngine},
		remove(a, TierDevice, 99),  // unknown hash
		remove(a, TierCPULocal, 1), // bit never set
		sharedOp(OpSharedRemove, "nope", SharedCPU, 1),
	}
	mustApply(t, e, ctxA, ops...)
	e.UnregisterSlot(ctxA, Slot{"ghost", 0})
	e.UnregisterSlot(ContextKey{ModelName: "other"}, a)
	wantTiers(t, e, "a", []uint64{1, 2}, Tiers{32, 32, 32, 32}, "after the ops")
	wantBlocks(t, e, 2, "the no-ops removed nothing")
}

func TestStoreAndRemoveAreIdempotent(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	mustApply(t, e, ctxA, store(a, TierDevice, 1, 2), store(a, TierDevice, 1, 2))
	mustApply(t, e, ctxA, remove(a, TierDevice, 2), remove(a, TierDevice, 2))
	wantTiers(t, e, "a", []uint64{1, 2}, Tiers{16, 16, 16, 16}, "after the ops")
	wantBlocks(t, e, 1, "block 2 removed")
}

// TestBlockLivesUntilLastOwner: a block is dropped only when every slot bit in every tier
// and every shared binding is gone.
func TestBlockLivesUntilLastOwner(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e := setup(t, Config{}, a, b)
	mustApply(t, e, ctxA, store(a, TierDevice, 7), store(b, TierCPULocal, 7), store(a, TierDisk, 7),
		sharedOp(OpSharedStore, "k1", SharedCPU, 7), sharedOp(OpSharedStore, "k2", SharedDisk, 7))
	steps := []Op{
		remove(a, TierDevice, 7), remove(b, TierCPULocal, 7), remove(a, TierDisk, 7),
		sharedOp(OpSharedRemove, "k1", SharedCPU, 7), sharedOp(OpSharedRemove, "k2", SharedDisk, 7),
	}
	for i, op := range steps {
		if n := prefixCount(e, ctxA); n != 1 {
			t.Fatalf("before step %d: blocks = %d, want 1", i, n)
		}
		mustApply(t, e, ctxA, op)
	}
	wantBlocks(t, e, 0, "every owner left")
}

func TestLocalTiersRespectRank(t *testing.T) {
	r0, r1 := Slot{"a", 0}, Slot{"a", 1}
	e := setup(t, Config{}, r0, r1)
	mustApply(t, e, ctxA, store(r0, TierDevice, 1, 2), store(r1, TierCPULocal, 1), store(r1, TierDisk, 2))
	hits := qk(t, e, ctxA, []uint64{1, 2}, "")
	if got := rankTiers(t, hits, "a", 0); got != (Tiers{32, 32, 32, 32}) {
		t.Fatalf("rank 0 = %+v", got)
	}
	if got := rankTiers(t, hits, "a", 1); got != (Tiers{0, 16, 16, 32}) {
		t.Fatalf("rank 1 = %+v", got)
	}
	// The instance is the max over ranks, never a concatenation.
	if got := hits[0].Tiers; got != (Tiers{32, 32, 32, 32}) {
		t.Fatalf("instance = %+v", got)
	}
}

// TestRanksNeverConcatenate: rank 0 holds block 0 and rank 1 block 1; neither has 32.
func TestRanksNeverConcatenate(t *testing.T) {
	r0, r1 := Slot{"a", 0}, Slot{"a", 1}
	e := setup(t, Config{}, r0, r1)
	mustApply(t, e, ctxA, store(r0, TierDevice, 1), store(r1, TierDevice, 2))
	hits := qk(t, e, ctxA, []uint64{1, 2}, "")
	if got := hits[0].Tiers; got != (Tiers{16, 16, 16, 16}) {
		t.Fatalf("instance = %+v, want 16 everywhere", got)
	}
}

func TestSharedTiersVisibleToEveryRankInContextOnly(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 3}
	e := setup(t, Config{}, a, b)
	other := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 32}
	mustRegister(t, e, other, vllmProfile(t), a)
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k1", SharedCPU, 1), sharedOp(OpSharedStore, "k2", SharedDisk, 2))
	hits := qk(t, e, ctxA, []uint64{1, 2}, "")
	for _, s := range []Slot{a, b} {
		if got := rankTiers(t, hits, s.InstanceID, s.DPRank); got != (Tiers{0, 0, 16, 32}) {
			t.Fatalf("%v = %+v", s, got)
		}
	}
	if got := rankTiers(t, qk(t, e, other, []uint64{1, 2}, ""), "a", 0); got != (Tiers{}) {
		t.Fatalf("other context sees shared blocks: %+v", got)
	}
}

func TestZeroHitRanksAndFilter(t *testing.T) {
	a0, a1, b := Slot{"a", 0}, Slot{"a", 1}, Slot{"b", 0}
	e := setup(t, Config{}, a0, a1, b)
	mustApply(t, e, ctxA, store(a1, TierDevice, 1))
	hits := qk(t, e, ctxA, []uint64{1}, "")
	if len(hits) != 2 || hits[0].InstanceID != "a" || hits[1].InstanceID != "b" {
		t.Fatalf("hits = %s", formatHits(hits))
	}
	if !slices.Equal(hits[0].Ranks, []RankHit{{Rank: 0}, {Rank: 1, Tiers: Tiers{16, 16, 16, 16}}}) {
		t.Fatalf("ranks of a = %+v", hits[0].Ranks)
	}
	if hits[1].Tiers != (Tiers{}) || len(hits[1].Ranks) != 1 {
		t.Fatalf("zero-hit instance b = %+v", hits[1])
	}
	f := qk(t, e, ctxA, []uint64{1}, "b")
	if len(f) != 1 || f[0].InstanceID != "b" {
		t.Fatalf("filter b = %s", formatHits(f))
	}
	if f := qk(t, e, ctxA, []uint64{1}, "nobody"); len(f) != 0 {
		t.Fatalf("unknown filter = %s", formatHits(f))
	}
}

func TestUnknownContextQueryCreatesNothing(t *testing.T) {
	e := setup(t, Config{})
	p := vllmProfile(t)
	var res Result
	if err := e.Query(&Query{Key: ctxA, Tokens: seqTokens(64)}, &res); err != nil || len(res.Instances) != 0 {
		t.Fatalf("query: %v %s", err, formatHits(res.Instances))
	}
	if len(e.GlobalView()) != 0 {
		t.Fatal("query created a context")
	}
	if err := e.CheckProfile(ctxA, p); err != nil {
		t.Fatalf("CheckProfile on unknown context: %v", err)
	}
	if _, ok := e.ContextProfile(ctxA); ok {
		t.Fatal("ContextProfile found an unknown context")
	}
}

func TestClearDeviceKeepsOtherTiersAndSlots(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e := setup(t, Config{}, a, b)
	mustApply(t, e, ctxA, store(a, TierDevice, 1, 2), store(a, TierCPULocal, 1), store(b, TierDevice, 1, 2),
		sharedOp(OpSharedStore, "k", SharedCPU, 2))
	mustApply(t, e, ctxA, Op{Kind: OpClear, Slot: a, ClearTiers: MaskDevice})
	hits := qk(t, e, ctxA, []uint64{1, 2}, "")
	if got := rankTiers(t, hits, "a", 0); got != (Tiers{0, 16, 32, 32}) {
		t.Fatalf("a after device clear = %+v", got)
	}
	if got := rankTiers(t, hits, "b", 0); got != (Tiers{32, 32, 32, 32}) {
		t.Fatalf("b = %+v", got)
	}
	mustApply(t, e, ctxA, Op{Kind: OpClear, Slot: a, ClearTiers: MaskAllEngine}, Op{Kind: OpClear, Slot: b, ClearTiers: MaskAllEngine})
	wantTiers(t, e, "a", []uint64{1, 2}, Tiers{}, "after full clear (block 1 has no owner left)")
	wantBlocks(t, e, 1, "the shared one")
}

func TestUnregisterRemovesOnlyThatRankAndKeepsShared(t *testing.T) {
	r0, r1 := Slot{"a", 0}, Slot{"a", 1}
	e := setup(t, Config{}, r0, r1)
	mustApply(t, e, ctxA, store(r0, TierDevice, 1), store(r0, TierCPULocal, 2), store(r0, TierDisk, 3),
		store(r1, TierDevice, 1), sharedOp(OpSharedStore, "k", SharedDisk, 3))
	e.UnregisterSlot(ctxA, r0)
	hits := qk(t, e, ctxA, []uint64{1, 2, 3}, "")
	if len(hits) != 1 || len(hits[0].Ranks) != 1 || hits[0].Ranks[0].Rank != 1 {
		t.Fatalf("hits = %s", formatHits(hits))
	}
	wantBlocks(t, e, 2, "rank 1's block 1, shared block 3")
	e.UnregisterSlot(ctxA, r1)
	if hits := qk(t, e, ctxA, []uint64{1}, ""); len(hits) != 0 {
		t.Fatalf("no slots left, hits = %s", formatHits(hits))
	}
	gv := e.GlobalView()
	if len(gv) != 1 || len(gv[0].Instances) != 0 || gv[0].PrefixCount != 1 {
		t.Fatalf("global view = %+v", gv)
	}
}

// TestSlotReuseStartsClean: a new slot that reuses a freed slot number inherits nothing.
func TestSlotReuseStartsClean(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e := setup(t, Config{}, a, b)
	mustApply(t, e, ctxA, store(a, TierDevice, 1), store(a, TierDisk, 2), store(b, TierDevice, 1, 2))
	e.UnregisterSlot(ctxA, a)
	c := Slot{"c", 0}
	mustRegister(t, e, ctxA, vllmProfile(t), c)
	wantTiers(t, e, "c", []uint64{1, 2}, Tiers{}, "new slot inherited")
}

func TestRegistration(t *testing.T) {
	e := setup(t, Config{})
	p := vllmProfile(t)
	s := Slot{"a", 0}
	if isNew, err := e.RegisterSlot(ctxA, p, s); err != nil || !isNew {
		t.Fatalf("first: %v %v", isNew, err)
	}
	if isNew, err := e.RegisterSlot(ctxA, p, s); err != nil || isNew {
		t.Fatalf("repeat: %v %v", isNew, err)
	}
	pickle := resolve(t, "vllm_v1", "sha256", "0", "low64_be")
	if _, err := e.RegisterSlot(ctxA, pickle, Slot{"b", 0}); !errors.Is(err, ErrProfileConflict) {
		t.Fatalf("conflict err = %v", err)
	}
	if err := e.CheckProfile(ctxA, pickle); !errors.Is(err, ErrProfileConflict) {
		t.Fatalf("CheckProfile = %v", err)
	}
	if err := e.CheckProfile(ctxA, p); err != nil {
		t.Fatalf("CheckProfile same = %v", err)
	}
	got, ok := e.ContextProfile(ctxA)
	if !ok || !got.Equal(p) {
		t.Fatalf("ContextProfile = %+v %v", got, ok)
	}
	gv := e.GlobalView()
	if len(gv) != 1 || len(gv[0].Instances) != 1 || gv[0].Instances[0].InstanceID != "a" {
		t.Fatalf("conflicting registration left state: %+v", gv)
	}
	// SGLang profiles ignore the seed: seed variants share a context.
	k2 := ContextKey{TenantID: "default", ModelName: "s", BlockSize: 4}
	s1 := resolve(t, "sglang", "sha256_raw", "", "first64_be")
	s2 := resolve(t, "sglang", "sha256_raw", "123", "first64_be")
	mustRegister(t, e, k2, s1, Slot{"x", 0})
	mustRegister(t, e, k2, s2, Slot{"y", 0})
}

// TestConcurrentRegistrationKeepsOneProfile: racing first registrations with different
// profiles end with exactly one profile and only its registrants.
func TestConcurrentRegistrationKeepsOneProfile(t *testing.T) {
	e := setup(t, Config{})
	profiles := []string{"sha256", "sha256_cbor"}
	var wg sync.WaitGroup
	results := make([]error, 16)
	for i := range results {
		wg.Go(func() {
			p := resolve(t, "vllm_v1", profiles[i%2], "0", "low64_be")
			_, results[i] = e.RegisterSlot(ctxA, p, Slot{"inst", i})
		})
	}
	wg.Wait()
	p, _ := e.ContextProfile(ctxA)
	okCount := 0
	for i, err := range results {
		want := p.AlgorithmName() == profiles[i%2]
		if (err == nil) != want {
			t.Fatalf("registration %d: err %v, profile %s", i, err, p.AlgorithmName())
		}
		if err == nil {
			okCount++
		}
	}
	if st, _ := e.Stats(ctxA); st.Slots != okCount || okCount != 8 {
		t.Fatalf("slots = %d, ok = %d", st.Slots, okCount)
	}
}

func TestMultipleObjectKeysBindOneHash(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "m@tp_rank:0@h", SharedCPU, 5), sharedOp(OpSharedStore, "m@tp_rank:1@h", SharedCPU, 5))
	mustApply(t, e, ctxA, sharedOp(OpSharedRemove, "m@tp_rank:0@h", SharedCPU, 5))
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{5}, ""), "a", 0); got.CPUShare != 16 {
		t.Fatalf("after first of two removed: %+v", got)
	}
	mustApply(t, e, ctxA, sharedOp(OpSharedRemove, "m@tp_rank:1@h", SharedCPU, 5))
	wantTiers(t, e, "a", []uint64{5}, Tiers{}, "after both removed")
}

func TestSGLangComponentsShareOneBinding(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	op := func(kind OpKind, comp string) Op {
		o := sharedOp(kind, "ns_abc", SharedCPU, 9)
		o.Component = comp
		return o
	}
	mustApply(t, e, ctxA, op(OpSharedStore, "_0_k"), op(OpSharedStore, "_0_v"), op(OpSharedStore, "_0_k"))
	mustApply(t, e, ctxA, op(OpSharedRemove, "_0_k"), op(OpSharedRemove, "_0_k"))
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{9}, ""), "a", 0); got.CPUShare != 16 {
		t.Fatalf("one component left: %+v", got)
	}
	mustApply(t, e, ctxA, op(OpSharedRemove, "_0_v"))
	wantBlocks(t, e, 0, "last component removed")
}

func TestBindingConflictAndMismatch(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k", SharedCPU, 1))
	ops := []Op{sharedOp(OpSharedStore, "k", SharedCPU, 2), sharedOp(OpSharedRemove, "k", SharedCPU, 3),
		sharedOp(OpSharedStore, "k", SharedDisk, 2)} // another tier is another binding
	if err := e.Apply(ctxA, ops); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(ops[0].Err, ErrBindingConflict) || !errors.Is(ops[1].Err, ErrBindingMismatch) || ops[2].Err != nil {
		t.Fatalf("errs = %v, %v, %v", ops[0].Err, ops[1].Err, ops[2].Err)
	}
	wantTiers(t, e, "a", []uint64{1, 2}, Tiers{0, 0, 16, 32}, "after the ops")
}

// TestColliding shared owners: two sources binding the same hash are removable independently.
func TestCollidingSharedOwnersIndependent(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	o1 := sharedOp(OpSharedStore, "k", SharedCPU, 4)
	o2 := o1
	o2.Source = "tcp://mc:2"
	mustApply(t, e, ctxA, o1, o2)
	r1 := o1
	r1.Kind = OpSharedRemove
	mustApply(t, e, ctxA, r1)
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{4}, ""), "a", 0); got.CPUShare != 16 {
		t.Fatalf("other source's owner lost: %+v", got)
	}
}

func TestClearSharedScope(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	tenant2 := ContextKey{TenantID: "t2", ModelName: "m", BlockSize: 16}
	mustRegister(t, e, tenant2, vllmProfile(t), a)
	mk := func(src, backend, obj string, tier SharedTier, h uint64) Op {
		return Op{Kind: OpSharedStore, Source: src, Backend: backend, ObjectKey: obj, SharedTier: tier, Hash: h}
	}
	mustApply(t, e, ctxA, mk("s1", "pool", "a", SharedCPU, 1), mk("s1", "pool", "b", SharedDisk, 2),
		mk("s1", "other", "c", SharedCPU, 3), mk("s2", "pool", "d", SharedCPU, 4))
	mustApply(t, e, tenant2, mk("s1", "pool", "a", SharedCPU, 1))
	e.ClearShared("s1", "pool", "default")
	hits := qk(t, e, ctxA, []uint64{1}, "")
	if rankTiers(t, hits, "a", 0).Disk != 0 {
		t.Fatal("cleared binding still visible")
	}
	for _, h := range []uint64{3, 4} {
		if rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).CPUShare != 16 {
			t.Fatalf("hash %d of another backend/source was cleared", h)
		}
	}
	if rankTiers(t, qk(t, e, tenant2, []uint64{1}, ""), "a", 0).CPUShare != 16 {
		t.Fatal("another tenant's binding was cleared")
	}
	e.RetractSource("s1")
	if rankTiers(t, qk(t, e, ctxA, []uint64{3}, ""), "a", 0).CPUShare != 0 ||
		rankTiers(t, qk(t, e, tenant2, []uint64{1}, ""), "a", 0).CPUShare != 0 {
		t.Fatal("RetractSource left bindings of s1")
	}
	if rankTiers(t, qk(t, e, ctxA, []uint64{4}, ""), "a", 0).CPUShare != 16 {
		t.Fatal("RetractSource removed another source")
	}
}

// TestWideningPastSixtyFourSlots registers 200 slots with blocks between registrations: the
// records widen from packed (21 slots) to one, two, three and four words per tier, and every
// bit survives each conversion.
func TestWideningPastSixtyFourSlots(t *testing.T) {
	e := setup(t, Config{})
	p := vllmProfile(t)
	var slots []Slot
	for i := 0; i < 200; i++ {
		s := Slot{"inst", i}
		slots = append(slots, s)
		mustRegister(t, e, ctxA, p, s)
		// Keep adding blocks while widening so records are copied with their bits.
		mustApply(t, e, ctxA, store(s, EngineTier(i%3), uint64(1000+i), 1))
	}
	hits := qk(t, e, ctxA, []uint64{1}, "")
	if len(hits) != 1 || len(hits[0].Ranks) != 200 {
		t.Fatalf("ranks = %d", len(hits[0].Ranks))
	}
	for i, r := range hits[0].Ranks {
		want := Tiers{16, 16, 16, 16}
		switch i % 3 {
		case 1:
			want.Device = 0
		case 2:
			want = Tiers{0, 0, 0, 16}
		}
		if r.Rank != i || r.Tiers != want {
			t.Fatalf("rank %d = %+v, want %+v", i, r, want)
		}
	}
	for i := 0; i < 200; i += 2 {
		e.UnregisterSlot(ctxA, slots[i])
	}
	if hits := qk(t, e, ctxA, []uint64{1}, ""); len(hits[0].Ranks) != 100 || hits[0].Ranks[0].Rank != 1 {
		t.Fatalf("after unregistering even ranks: %d ranks", len(hits[0].Ranks))
	}
	wantBlocks(t, e, 101, "block 1 and the 100 odd ranks' own blocks")
}

func TestGlobalViewAndStats(t *testing.T) {
	e := setup(t, Config{})
	p := vllmProfile(t)
	keys := []ContextKey{
		{TenantID: "b", ModelName: "m", BlockSize: 16},
		{TenantID: "a", ModelName: "z", BlockSize: 16},
		{TenantID: "a", ModelName: "m", LoraName: "l", BlockSize: 16},
		{TenantID: "a", ModelName: "m", BlockSize: 32},
		{TenantID: "a", ModelName: "m", BlockSize: 16},
	}
	for _, k := range keys {
		mustRegister(t, e, k, p, Slot{"y", 2})
		mustRegister(t, e, k, p, Slot{"x", 1})
		mustRegister(t, e, k, p, Slot{"y", 0})
	}
	mustApply(t, e, keys[0], store(Slot{"x", 1}, TierDevice, 1, 2, 3))
	gv := e.GlobalView()
	order := []int{4, 3, 2, 1, 0}
	for i, want := range order {
		if gv[i].Key != keys[want] {
			t.Fatalf("view %d = %+v, want %+v", i, gv[i].Key, keys[want])
		}
		if len(gv[i].Instances) != 2 || gv[i].Instances[0].InstanceID != "x" ||
			!slices.Equal(gv[i].Instances[1].Ranks, []int{0, 2}) {
			t.Fatalf("instances = %+v", gv[i].Instances)
		}
	}
	if gv[4].PrefixCount != 3 {
		t.Fatalf("prefix count = %d", gv[4].PrefixCount)
	}
	st, ok := e.Stats(keys[0])
	if !ok || st.Blocks != 3 || st.Slots != 3 {
		t.Fatalf("stats = %+v", st)
	}
	if _, ok := e.Stats(ContextKey{}); ok {
		t.Fatal("stats of an unknown context")
	}
}

func TestInvalidOps(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	ops := []Op{{Kind: 99}, store(a, 7, 1), {Kind: OpSharedStore, SharedTier: 5}}
	if err := e.Apply(ctxA, ops); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		if !errors.Is(op.Err, ErrInvalidOp) {
			t.Errorf("op %d err = %v", i, op.Err)
		}
	}
}

func TestCloseIsIdempotentAndStopsMutations(t *testing.T) {
	e := New(Config{})
	a := Slot{"a", 0}
	mustRegister(t, e, ctxA, vllmProfile(t), a)
	mustApply(t, e, ctxA, store(a, TierDevice, 1))
	e.Close()
	e.Close()
	if err := e.Apply(ctxA, []Op{store(a, TierDevice, 2)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close = %v", err)
	}
	if _, err := e.RegisterSlot(ContextKey{ModelName: "new", BlockSize: 1}, vllmProfile(t), a); !errors.Is(err, ErrClosed) {
		t.Fatalf("RegisterSlot after Close = %v", err)
	}
	if _, err := e.RegisterSlot(ctxA, vllmProfile(t), Slot{"b", 0}); !errors.Is(err, ErrClosed) {
		t.Fatalf("RegisterSlot on existing context after Close = %v", err)
	}
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{1}, ""), "a", 0); got.Device != 16 {
		t.Fatalf("queries after Close: %+v", got)
	}
}

func TestConfigDefaults(t *testing.T) {
	if e := New(Config{}); e.maxBlocks != DefaultMaxBlocksPerContext || e.log == nil {
		t.Fatalf("defaults: max %d", e.maxBlocks)
	}
	if e := New(Config{MaxBlocksPerContext: -1}); e.maxBlocks != 0 {
		t.Fatalf("unlimited: max %d", e.maxBlocks)
	}
}

// captureLogger returns a logger and a func that returns what it logged so far.
func captureLogger() (*slog.Logger, func() string) {
	var buf bytes.Buffer
	var mu sync.Mutex
	return slog.New(slog.NewTextHandler(&lockedWriter{&buf, &mu}, nil)), func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func TestCapacityEvictsOldestWritten(t *testing.T) {
	log, logs := captureLogger()
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: 10, Logger: log}, a)
	for h := uint64(1); h <= 10; h++ {
		mustApply(t, e, ctxA, store(a, TierDevice, h))
	}
	mustApply(t, e, ctxA, store(a, TierCPULocal, 1)) // a store of any tier refreshes block 1
	mustApply(t, e, ctxA, store(a, TierDevice, 11))  // 11 > 10: the oldest (2) goes
	mustApply(t, e, ctxA, store(a, TierDevice, 12))  // and then 3
	st, _ := e.Stats(ctxA)
	if st.Blocks != 10 || st.Evictions != 2 || st.EvictedBlocks != 2 {
		t.Fatalf("stats = %+v", st)
	}
	for h := uint64(1); h <= 12; h++ {
		got := rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).Disk
		want := int64(16)
		if h == 2 || h == 3 {
			want = 0
		}
		if got != want {
			t.Errorf("block %d: %d, want %d", h, got, want)
		}
	}
	logged := logs()
	// One warning for the first eviction; the second falls in the same log interval.
	if !strings.Contains(logged, "level=WARN") || !strings.Contains(logged, "evicted=1") || strings.Count(logged, "over capacity") != 1 {
		t.Fatalf("eviction not logged once as a warning: %q", logged)
	}
	// The slot's bookkeeping followed the eviction: clearing it empties the context.
	mustApply(t, e, ctxA, Op{Kind: OpClear, Slot: a, ClearTiers: MaskAllEngine})
	wantBlocks(t, e, 0, "after clear")
}

func TestCapacityUnlimited(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: -1}, a)
	hs := make([]uint64, 5000)
	for i := range hs {
		hs[i] = uint64(i + 1)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, hs...))
	if st, _ := e.Stats(ctxA); st.Blocks != 5000 || st.Evictions != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestEvictionDropsSharedBindings: eviction drops the block with every owner, its shared
// bindings included (their object keys would otherwise outlive it without bound): the
// object key may then bind another hash.
func TestEvictionDropsSharedBindings(t *testing.T) {
	log, _ := captureLogger()
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: 3, Logger: log}, a)
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k", SharedCPU, 100)) // block + binding: 2
	mustApply(t, e, ctxA, store(a, TierDevice, 1, 2))                   // 4 > 3: 100 goes, with "k"
	wantTiers(t, e, "a", []uint64{100}, Tiers{}, "evicted shared block visible")
	if st, _ := e.Stats(ctxA); st.Blocks != 2 || st.EvictedBlocks != 1 || e.TotalBlocks() != 2 {
		t.Fatalf("stats %+v, total %d", st, e.TotalBlocks())
	}
	// The binding went with its block: "k" binds another hash without a conflict.
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k", SharedCPU, 101)) // 4 > 3: block 1 goes
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{101}, ""), "a", 0); got.CPUShare != 16 {
		t.Fatalf("re-bound object key: %+v", got)
	}
	mustApply(t, e, ctxA, sharedOp(OpSharedRemove, "k", SharedCPU, 101))
	wantTiers(t, e, "a", []uint64{101}, Tiers{}, "remove after re-bind")
}

// TestBindingsCountAgainstCapacity: bindings count like blocks, so a block bound by many
// object keys cannot grow memory past the capacity.
func TestBindingsCountAgainstCapacity(t *testing.T) {
	log, _ := captureLogger()
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: 3, Logger: log}, a)
	mustApply(t, e, ctxA, store(a, TierDevice, 1))
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k1", SharedCPU, 100), sharedOp(OpSharedStore, "k2", SharedDisk, 100))
	// 1 + (100, k1, k2) = 4 > 3: the oldest block, 1, went.
	if rankTiers(t, qk(t, e, ctxA, []uint64{1}, ""), "a", 0).Device != 0 || rankTiers(t, qk(t, e, ctxA, []uint64{100}, ""), "a", 0).CPUShare != 16 {
		t.Fatal("block 1 should have made room for the bindings of 100")
	}
	mustApply(t, e, ctxA, sharedOp(OpSharedStore, "k3", SharedCPU, 100)) // 100 + 3 bindings = 4 > 3
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{100}, ""), "a", 0); got != (Tiers{}) || e.TotalBlocks() != 0 {
		t.Fatalf("a block over capacity by its bindings stayed: %+v, total %d", got, e.TotalBlocks())
	}
	ops := []Op{sharedOp(OpSharedStore, "k1", SharedCPU, 200)}
	if err := e.Apply(ctxA, ops); err != nil || ops[0].Err != nil {
		t.Fatalf("evicted binding still known: %v %v", err, ops[0].Err)
	}
}

// TestEvictionAtScale: many blocks and refreshes; eviction follows the write order.
func TestEvictionAtScale(t *testing.T) {
	log, _ := captureLogger()
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: 20000, Logger: log}, a)
	batch := make([]uint64, 64)
	next := uint64(1)
	for i := 0; i < 400; i++ { // 25600 distinct blocks, with refreshes of old ones
		for j := range batch {
			batch[j] = next
			next++
		}
		mustApply(t, e, ctxA, store(a, TierDevice, batch...), store(a, TierDisk, 1, 2, 3))
	}
	st, _ := e.Stats(ctxA)
	if st.Evictions == 0 || st.Blocks != 20000 {
		t.Fatalf("stats = %+v", st)
	}
	// Blocks 1..3 are rewritten in every batch, so they are never the oldest.
	for h := uint64(1); h <= 3; h++ {
		if rankTiers(t, qk(t, e, ctxA, []uint64{h}, ""), "a", 0).Disk != 16 {
			t.Fatalf("recently written block %d was evicted", h)
		}
	}
	if rankTiers(t, qk(t, e, ctxA, []uint64{100}, ""), "a", 0).Disk != 0 {
		t.Fatal("oldest block 100 survived")
	}
	if rankTiers(t, qk(t, e, ctxA, []uint64{next - 1}, ""), "a", 0).Device != 16 {
		t.Fatal("newest block missing")
	}
}

// settle runs on the writer goroutine what it would otherwise do over the next steps:
// it completes pending clears, the shrink they lead to and any table migration, and gives
// retired memory back.
func settle(t testing.TB, e *Engine, k ContextKey) {
	t.Helper()
	onWriter(t, e, k, func(c *cacheContext) {
		for c.wide != nil { // a widening switches once no migration runs
			c.migrateStep()
			c.widenStep()
		}
		if len(c.clears) > 0 {
			c.finishClears()
			c.maybeShrink()
		}
		c.resumeStalled()
		for c.tab.prev.Load() != nil {
			c.migrateStep()
		}
		for len(c.toRelease) > 0 {
			c.releaseStep()
		}
	})
}

// tableOf runs on the writer goroutine to read writer-owned sizes safely: the current
// table's capacity, the blocks, the current table's used entries (live and tombstones) and
// the arena high-water mark.
func tableOf(t testing.TB, e *Engine, k ContextKey) (entries, live, used, highWater int) {
	t.Helper()
	onWriter(t, e, k, func(c *cacheContext) {
		entries, live, used, highWater = len(c.tab.entries), c.tab.ar.Len(), c.tab.live+c.tab.tombs, int(c.tab.ar.HighWater())
	})
	return
}

func TestTableShrinksAndCompactsAfterClear(t *testing.T) {
	a, b := Slot{"a", 0}, Slot{"b", 0}
	e := setup(t, Config{}, a, b)
	hs := make([]uint64, 100_000)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x100000001
	}
	mustApply(t, e, ctxA, store(a, TierDevice, hs...), store(b, TierDisk, hs[:10]...))
	big, _, _, _ := tableOf(t, e, ctxA)
	mustApply(t, e, ctxA, Op{Kind: OpClear, Slot: a, ClearTiers: MaskDevice})
	if got := rankTiers(t, qk(t, e, ctxA, hs[:12], ""), "a", 0); got != (Tiers{}) {
		t.Fatalf("cleared blocks served: %+v", got)
	}
	settle(t, e, ctxA) // the sweep of the clear, and the compaction after it
	entries, live, _, hw := tableOf(t, e, ctxA)
	if live != 10 || entries >= big/100 || hw > 1024 {
		t.Fatalf("after clear: %d entries (was %d), %d live, arena high water %d", entries, big, live, hw)
	}
	if got := rankTiers(t, qk(t, e, ctxA, hs[:12], ""), "b", 0); got != (Tiers{0, 0, 0, 160}) {
		t.Fatalf("survivors: %+v", got)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, hs[:20]...))
	if got := rankTiers(t, qk(t, e, ctxA, hs[:20], ""), "a", 0); got.Device != 320 {
		t.Fatalf("stores after compaction: %+v", got)
	}
}

// TestTombstoneChurnKeepsTableBounded: endless store/remove of new keys reuses tombstones
// and purges them by rebuilding instead of growing.
func TestTombstoneChurnKeepsTableBounded(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	hs := make([]uint64, 64)
	for round := 0; round < 2000; round++ {
		for i := range hs {
			hs[i] = uint64(round*64+i+1) * 0x9E3779B1
		}
		mustApply(t, e, ctxA, store(a, TierDevice, hs...), remove(a, TierDevice, hs[:60]...))
	}
	entries, live, used, _ := tableOf(t, e, ctxA)
	if live != 8000 || entries > 16384 || used*16 > entries*13 {
		t.Fatalf("entries %d live %d used %d", entries, live, used)
	}
}

func TestTableShrinksAfterRetraction(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	ops := make([]Op, 20_000)
	for i := range ops {
		ops[i] = sharedOp(OpSharedStore, fmt.Sprintf("obj-%d", i), SharedDisk, uint64(i+1)*0x100000001)
	}
	mustApply(t, e, ctxA, ops...)
	mustApply(t, e, ctxA, store(a, TierDevice, 7))
	big, _, _, _ := tableOf(t, e, ctxA)
	e.RetractSource("tcp://mc:1")
	entries, live, _, _ := tableOf(t, e, ctxA)
	if live != 1 || entries >= big/100 {
		t.Fatalf("after retraction: %d entries (was %d), %d live", entries, big, live)
	}
	if got := rankTiers(t, qk(t, e, ctxA, []uint64{7}, ""), "a", 0); got.Device != 16 {
		t.Fatalf("engine block lost: %+v", got)
	}
}
