package engine

import (
	"fmt"
	"testing"
)

func skipAllocUnderRace(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates; allocation counts are checked without -race")
	}
}

// TestQueryAllocatesNothing: a query with a reused Result allocates nothing, hashing
// included, for each hash algorithm.
func TestQueryAllocatesNothing(t *testing.T) {
	skipAllocUnderRace(t)
	for _, tc := range []struct{ strategy, algo, proj string }{
		{"vllm_v1", "sha256_cbor", "low64_be"},
		{"vllm_v1", "sha256", "low64_be"},
		{"sglang", "sha256_raw", "first64_be"},
		{"sglang_bigram", "sha256_raw", "first64_be"},
	} {
		t.Run(tc.strategy+"/"+tc.algo, func(t *testing.T) {
			p := resolve(t, tc.strategy, tc.algo, "0", tc.proj)
			e := newTestEngine(t, Config{})
			k := ContextKey{TenantID: "default", ModelName: "m", LoraName: "lora", BlockSize: 16}
			slots := []Slot{{"a", 0}, {"a", 1}, {"b", 0}}
			for _, s := range slots {
				mustRegister(t, e, k, p, s)
			}
			tokens := seqTokens(16 * 64)
			keys := chainKeys(t, p, 16, "lora", "salt", tokens)
			mustApply(t, e, k, store(slots[0], TierDevice, keys[:20]...), store(slots[1], TierCPULocal, keys[:40]...),
				store(slots[2], TierDisk, keys...))
			q := &Query{Key: k, Tokens: tokens, CacheSalt: "salt"}
			var res Result
			mustQuery(t, e, q, &res)
			if res.Instances[1].Disk != int64(res.w.chain.Positions()) || res.Instances[1].Disk < int64(len(tokens)-1) {
				t.Fatalf("walk did not reach the end: %s", formatHits(res.Instances))
			}
			allocs := testing.AllocsPerRun(50, func() {
				mustQuery(t, e, q, &res)
			})
			if allocs != 0 {
				t.Fatalf("Query allocates %.1f per run", allocs)
			}
			filtered := &Query{Key: k, Tokens: tokens, CacheSalt: "salt", InstanceFilter: "a"}
			if allocs := testing.AllocsPerRun(50, func() { _ = e.Query(filtered, &res) }); allocs != 0 {
				t.Fatalf("filtered Query allocates %.1f per run", allocs)
			}
		})
	}
}

// TestWalkAllocatesNothing covers both walk variants (one- and multi-word records).
func TestWalkAllocatesNothing(t *testing.T) {
	skipAllocUnderRace(t)
	for _, nslots := range []int{8, 64, 256} {
		e := newTestEngine(t, Config{})
		p := vllmProfile(t)
		keys := make([]uint64, 512)
		for i := range keys {
			keys[i] = uint64(i+1) * 0x9E3779B1
		}
		for i := 0; i < nslots; i++ {
			s := Slot{"inst", i}
			mustRegister(t, e, ctxA, p, s)
			mustApply(t, e, ctxA, store(s, EngineTier(i%3), keys[:256+i]...))
		}
		var res Result
		if err := e.QueryKeys(ctxA, keys, len(keys)*16, "", &res); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(50, func() { _ = e.QueryKeys(ctxA, keys, len(keys)*16, "", &res) })
		if allocs != 0 {
			t.Fatalf("%d slots: walk allocates %.1f per run", nslots, allocs)
		}
	}
}

// TestApplyAllocatesNothing: steady-state store and remove batches allocate nothing.
func TestApplyAllocatesNothing(t *testing.T) {
	skipAllocUnderRace(t)
	a := Slot{"a", 0}
	e := setup(t, Config{}, a)
	hs := make([]uint64, 64)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9E3779B1
	}
	ops := []Op{store(a, TierDevice, hs...), remove(a, TierDevice, hs...)}
	mustApply(t, e, ctxA, ops...)
	allocs := testing.AllocsPerRun(100, func() {
		if err := e.Apply(ctxA, ops); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Apply allocates %.1f per run", allocs)
	}
}

// TestSharedApplyAllocatesNothing: once its names are interned, storing and removing a
// Mooncake binding (64-hex key, K and V components) allocates nothing: the binding is an
// arena entry reused from the free list, its key binary (a derived binding: the key's
// first 16 digits are its hash) or the caller's string (explicit: bound to another hash),
// its components an interned set ({K}, then {K, V}: interned again each run, as no other
// binding holds {K}).
func TestSharedApplyAllocatesNothing(t *testing.T) {
	skipAllocUnderRace(t)
	hex := "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	for _, h := range []uint64{0x0011223344556677, 2} {
		t.Run(fmt.Sprintf("derived=%v", h != 2), func(t *testing.T) {
			a := Slot{"a", 0}
			e := setup(t, Config{}, a)
			op := func(kind OpKind, obj, comp string, h uint64) Op {
				return Op{Kind: kind, Source: "tcp://mc:1", Backend: "mooncake", ObjectKey: obj, Component: comp, SharedTier: SharedCPU, Hash: h}
			}
			// Another binding keeps the names interned and the store alive.
			mustApply(t, e, ctxA, op(OpSharedStore, "keep", "_0_v", 1), op(OpSharedStore, "keep", "_0_k", 1))
			ops := []Op{op(OpSharedStore, hex, "_0_k", h), op(OpSharedStore, hex, "_0_v", h),
				op(OpSharedRemove, hex, "_0_k", h), op(OpSharedRemove, hex, "_0_v", h)}
			mustApply(t, e, ctxA, ops[:2]...)
			onWriter(t, e, ctxA, func(c *cacheContext) {
				i, ok := c.bs.find("tcp://mc:1", "mooncake", SharedCPU, hex)
				if !ok || entExplicit(c.bs.ent(i)) != (h == 2) {
					t.Errorf("binding found %v, explicit %v", ok, ok && entExplicit(c.bs.ent(i)))
				}
			})
			mustApply(t, e, ctxA, ops[2:]...)
			allocs := testing.AllocsPerRun(100, func() {
				if err := e.Apply(ctxA, ops); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("shared Apply allocates %.1f per run", allocs)
			}
			if e.TotalBlocks() != 2 {
				t.Fatalf("units %d, want the kept binding and its block", e.TotalBlocks())
			}
		})
	}
}
