package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

func resolve(t testing.TB, strategy, algo, seed, proj string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(strategy, algo, seed, proj)
	if err != nil {
		t.Fatalf("resolve profile: %v", err)
	}
	return p
}

func vllmProfile(t testing.TB) hashing.Profile {
	return resolve(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
}

func seqTokens(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i + 1)
	}
	return out
}

// chainKeys hashes every block of tokens the way a query does, so stores and queries use
// the same keys an engine would publish.
func chainKeys(t testing.TB, p hashing.Profile, bs int, lora, salt string, tokens []int32) []uint64 {
	t.Helper()
	var c hashing.Chain
	c.Reset(&p, bs, lora, salt, tokens)
	out := make([]uint64, c.NumBlocks())
	for i := range out {
		k, err := c.Next()
		if err != nil {
			t.Fatalf("hash block %d: %v", i, err)
		}
		out[i] = k
	}
	return out
}

func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e := New(cfg)
	t.Cleanup(e.Close)
	return e
}

// queryWith is Query walking as mode.
func (e *Engine) queryWith(q *Query, res *Result, mode walkMode) error {
	return e.query(q.Key, q.InstanceFilter, walkInput{hash: true, tokens: q.Tokens, salt: q.CacheSalt}, res, mode)
}

// queryKeysWith is QueryKeys walking as mode, with record hints (one per key, or nil),
// which the walk corrects in place.
func (e *Engine) queryKeysWith(key ContextKey, keys []uint64, hints []uint32, positions int, filter string, res *Result, mode walkMode) error {
	return e.query(key, filter, walkInput{keys: keys, hints: hints, positions: positions}, res, mode)
}

// padSlots registers slots ("pad", from) .. ("pad", to-1) in ctxA, so that the context's
// slot numbers reach to (records of one or more bitset words).
func padSlots(t testing.TB, e *Engine, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		mustRegister(t, e, ctxA, vllmProfile(t), Slot{"pad", i})
	}
}

// notifier returns a channel of capacity one and a func that signals it without waiting
// (a signal still pending stands for the new one).
func notifier() (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	return ch, func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// holdsOnDevice reports whether the one instance of k holds block h on device.
func holdsOnDevice(t testing.TB, e *Engine, k ContextKey, h uint64) bool {
	t.Helper()
	var res Result
	if err := e.QueryKeys(k, []uint64{h}, 16, "", &res); err != nil {
		t.Fatal(err)
	}
	return res.Instances[0].Device == 16
}

// memoEngine is an engine with a key memo of entries, one context k of block size 16
// (vLLM sha256_cbor profile p) and one registered slot s.
func memoEngine(t testing.TB, entries int) (e *Engine, p hashing.Profile, k ContextKey, s Slot) {
	t.Helper()
	p = resolve(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
	e = newTestEngine(t, Config{MemoEntries: entries})
	k = ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	s = Slot{"a", 0}
	mustRegister(t, e, k, p, s)
	return e, p, k, s
}

// mustQuery runs q into res, failing the test on an error.
func mustQuery(t testing.TB, e *Engine, q *Query, res *Result) {
	t.Helper()
	if err := e.Query(q, res); err != nil {
		t.Fatal(err)
	}
}

// sglangEngine is an engine with one context k of block size bs, an SGLang profile p of
// strategy (sha256_raw, first64_be), and one registered slot s.
func sglangEngine(t testing.TB, strategy string, bs int64) (e *Engine, p hashing.Profile, k ContextKey, s Slot) {
	t.Helper()
	p = resolve(t, strategy, "sha256_raw", "", "first64_be")
	e = newTestEngine(t, Config{})
	k = ContextKey{TenantID: "default", ModelName: "m", BlockSize: bs}
	s = Slot{"sgl", 0}
	mustRegister(t, e, k, p, s)
	return e, p, k, s
}

func mustRegister(t testing.TB, e *Engine, k ContextKey, p hashing.Profile, s Slot) {
	t.Helper()
	if _, err := e.RegisterSlot(k, p, s); err != nil {
		t.Fatalf("register %v: %v", s, err)
	}
}

func mustApply(t testing.TB, e *Engine, k ContextKey, ops ...Op) {
	t.Helper()
	if err := e.Apply(k, ops); err != nil {
		t.Fatalf("apply: %v", err)
	}
	for i, op := range ops {
		if op.Err != nil {
			t.Fatalf("op %d: %v", i, op.Err)
		}
	}
}

// placeOps turns a per-block owner layout into ops for slot s. Each block lists tags:
// N device, L cpu_local, D engine disk (all owned by s), S Mooncake cpu, M Mooncake disk.
func placeOps(s Slot, keys []uint64, layout [][]string) []Op {
	var ops []Op
	for i, tags := range layout {
		for _, tag := range tags {
			h := []uint64{keys[i]}
			switch tag {
			case "N":
				ops = append(ops, Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: h})
			case "L":
				ops = append(ops, Op{Kind: OpStore, Slot: s, Tier: TierCPULocal, Hashes: h})
			case "D":
				ops = append(ops, Op{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: h})
			case "S":
				ops = append(ops, Op{Kind: OpSharedStore, Source: "tcp://mc:1", Backend: "pool-a",
					ObjectKey: fmt.Sprintf("m@%d@cpu", i), SharedTier: SharedCPU, Hash: keys[i]})
			case "M":
				ops = append(ops, Op{Kind: OpSharedStore, Source: "tcp://mc:1", Backend: "pool-a",
					ObjectKey: fmt.Sprintf("m@%d@disk", i), SharedTier: SharedDisk, Hash: keys[i]})
			}
		}
	}
	return ops
}

// letters expands "LNSD" into one tag per block ('-' is an absent block).
func letters(s string) [][]string {
	out := make([][]string, len(s))
	for i, ch := range s {
		if ch != '-' {
			out[i] = []string{string(ch)}
		}
	}
	return out
}

func blocksWith(n int, tagged map[string][]int) [][]string {
	out := make([][]string, n)
	for tag, blocks := range tagged {
		for _, b := range blocks {
			out[b] = append(out[b], tag)
		}
	}
	return out
}

// TestWorkedCasesNotes4 runs the FourTierInterleavedPrefixesAndGaps table and the extra
// worked cases of reference notes §4 through the public Query with real vLLM hashing.
func TestWorkedCasesNotes4(t *testing.T) {
	cases := []struct {
		name   string
		blocks int
		layout [][]string
		want   Tiers
	}{
		{"LNSD", 4, letters("LNSD"), Tiers{0, 32, 48, 64}},
		{"SLND", 4, letters("SLND"), Tiers{0, 0, 48, 64}},
		{"NSL-", 4, letters("NSL-"), Tiers{16, 16, 48, 48}},
		{"S-SN", 4, letters("S-SN"), Tiers{0, 0, 16, 16}},
		{"SSSS", 4, letters("SSSS"), Tiers{0, 0, 64, 64}},
		{"LLLL", 4, letters("LLLL"), Tiers{0, 64, 64, 64}},
		{"SLDS", 4, letters("SLDS"), Tiers{0, 0, 32, 64}},
		{"GPU01+S2+Mdisk3", 4, blocksWith(4, map[string][]int{"N": {0, 1}, "S": {2}, "M": {3}}), Tiers{32, 32, 48, 64}},
		{"GPU0+Mdisk12", 4, blocksWith(4, map[string][]int{"N": {0}, "M": {1, 2}}), Tiers{16, 16, 16, 48}},
		{"GPU0+S2+Mdisk13", 4, blocksWith(4, map[string][]int{"N": {0}, "S": {2}, "M": {1, 3}}), Tiers{16, 16, 16, 64}},
		{"N04+S14+disk34(engine)", 5, blocksWith(5, map[string][]int{"N": {0, 4}, "S": {1, 4}, "D": {3, 4}}), Tiers{16, 16, 32, 32}},
		{"N04+S14+disk34(shared)", 5, blocksWith(5, map[string][]int{"N": {0, 4}, "S": {1, 4}, "M": {3, 4}}), Tiers{16, 16, 32, 32}},
	}
	p := vllmProfile(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, Config{})
			k := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
			s := Slot{"engine-a", 0}
			mustRegister(t, e, k, p, s)
			tokens := seqTokens(16 * tc.blocks)
			keys := chainKeys(t, p, 16, "", "", tokens)
			mustApply(t, e, k, placeOps(s, keys, tc.layout)...)
			var res Result
			mustQuery(t, e, &Query{Key: k, Tokens: tokens}, &res)
			if len(res.Instances) != 1 || len(res.Instances[0].Ranks) != 1 {
				t.Fatalf("instances = %s", formatHits(res.Instances))
			}
			if got := res.Instances[0].Ranks[0].Tiers; got != tc.want {
				t.Fatalf("rank tiers = %+v, want %+v", got, tc.want)
			}
			if got := res.Instances[0].Tiers; got != tc.want {
				t.Fatalf("instance tiers = %+v, want %+v", got, tc.want)
			}
			// The naive model agrees on every worked case too.
			m := newRefModel(0)
			m.register(k, s)
			if _, err := m.apply(k, placeOps(s, keys, tc.layout)); err != nil {
				t.Fatal(err)
			}
			if want := m.query(k, keys, len(tokens), ""); !sameHits(res.Instances, want) {
				t.Fatalf("engine %s, model %s", formatHits(res.Instances), formatHits(want))
			}
		})
	}
}

// TestSGLangPartialTail: SGLang hashes the partial last block, so 40 tokens at bs 16 match
// 40 (not 48); bigram queries 39 positions.
func TestSGLangPartialTail(t *testing.T) {
	for _, tc := range []struct {
		strategy string
		want     int64
	}{{"sglang", 40}, {"sglang_bigram", 39}} {
		t.Run(tc.strategy, func(t *testing.T) {
			e, p, k, s := sglangEngine(t, tc.strategy, 16)
			tokens := seqTokens(40)
			keys := chainKeys(t, p, 16, "", "", tokens)
			if len(keys) != 3 {
				t.Fatalf("blocks = %d, want 3", len(keys))
			}
			all := [][]string{{"N", "L", "D", "S", "M"}, {"N", "L", "D", "S", "M"}, {"N", "L", "D", "S", "M"}}
			mustApply(t, e, k, placeOps(s, keys, all)...)
			var res Result
			mustQuery(t, e, &Query{Key: k, Tokens: tokens}, &res)
			want := Tiers{tc.want, tc.want, tc.want, tc.want}
			if got := res.Instances[0].Tiers; got != want {
				t.Fatalf("tiers = %+v, want %+v", got, want)
			}
			// A whole-block run short of the tail is not affected by the clamp.
			mustApply(t, e, k, Op{Kind: OpRemove, Slot: s, Tier: TierDevice, Hashes: keys[2:]})
			mustQuery(t, e, &Query{Key: k, Tokens: tokens}, &res)
			if got := res.Instances[0].Device; got != 32 {
				t.Fatalf("device after removing the tail = %d, want 32", got)
			}
		})
	}
}

// TestSGLangIntegrationVector: GPU 1 block, CPU_PINNED 2 blocks, DISK 3 blocks (bs 4)
// give device 4, cpu_local 8, cpu_share 8, disk 12 (notes §5.3).
func TestSGLangIntegrationVector(t *testing.T) {
	e, p, k, s := sglangEngine(t, "sglang", 4)
	tokens := seqTokens(12)
	keys := chainKeys(t, p, 4, "", "", tokens)
	mustApply(t, e, k,
		Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: keys[:1]},
		Op{Kind: OpStore, Slot: s, Tier: TierCPULocal, Hashes: keys[:2]},
		Op{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: keys[:3]})
	var res Result
	mustQuery(t, e, &Query{Key: k, Tokens: tokens}, &res)
	if got, want := res.Instances[0].Tiers, (Tiers{4, 8, 8, 12}); got != want {
		t.Fatalf("tiers = %+v, want %+v", got, want)
	}
}

func TestQueryHashErrorGivesEmptyAnswer(t *testing.T) {
	e, p, k, s := sglangEngine(t, "sglang", 4)
	keys := chainKeys(t, p, 4, "", "", seqTokens(4))
	mustApply(t, e, k, Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: keys})
	tokens := append(seqTokens(4), 5, -6, 7, 8)
	var res Result
	err := e.Query(&Query{Key: k, Tokens: tokens}, &res)
	var te *hashing.TokenError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *hashing.TokenError", err)
	}
	if len(res.Instances) != 0 {
		t.Fatalf("instances = %s, want none", formatHits(res.Instances))
	}
}

// storePrompt8 registers slot a in context k (block size 4) and stores the prompt 1..8 on
// its device tier, hashed with k's LoRA and salt as a query does; it returns the prompt.
func storePrompt8(t *testing.T, e *Engine, k ContextKey, salt string) []int32 {
	t.Helper()
	p, s := vllmProfile(t), Slot{"a", 0}
	mustRegister(t, e, k, p, s)
	tokens := seqTokens(8)
	mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 4, k.LoraName, salt, tokens)...))
	return tokens
}

// TestSaltChangesHashesNotContext: the salt is part of the hash chain, not the context.
func TestSaltChangesHashesNotContext(t *testing.T) {
	e := newTestEngine(t, Config{})
	k := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 4}
	tokens := storePrompt8(t, e, k, "tenant-salt")
	var res Result
	for _, tc := range []struct {
		salt string
		want int64
	}{{"tenant-salt", 8}, {"", 0}, {"other", 0}} {
		mustQuery(t, e, &Query{Key: k, Tokens: tokens, CacheSalt: tc.salt}, &res)
		if got := res.Instances[0].Device; got != tc.want {
			t.Errorf("salt %q: device = %d, want %d", tc.salt, got, tc.want)
		}
	}
	if n := len(e.GlobalView()); n != 1 {
		t.Fatalf("contexts = %d, want 1", n)
	}
}

func TestLoraIsPartOfContextAndHash(t *testing.T) {
	e := newTestEngine(t, Config{})
	base := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 4}
	lora := base
	lora.LoraName = "adapter-A"
	tokens := storePrompt8(t, e, lora, "")
	var res Result
	mustQuery(t, e, &Query{Key: lora, Tokens: tokens}, &res)
	if res.Instances[0].Device != 8 {
		t.Fatalf("lora context device = %d, want 8", res.Instances[0].Device)
	}
	if err := e.Query(&Query{Key: base, Tokens: tokens}, &res); err != nil || len(res.Instances) != 0 {
		t.Fatalf("base context: %v %s, want empty", err, formatHits(res.Instances))
	}
}

// TestQueryHashesLazily: the walk stops hashing at the first block no queried slot can
// use, so a miss on block 1 of a 64-block prompt hashes two blocks.
func TestQueryHashesLazily(t *testing.T) {
	p := vllmProfile(t)
	e := newTestEngine(t, Config{})
	s := Slot{"a", 0}
	mustRegister(t, e, ctxA, p, s)
	tokens := seqTokens(16 * 64)
	keys := chainKeys(t, p, 16, "", "", tokens)
	mustApply(t, e, ctxA, Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: keys[:1]})
	var res Result
	mustQuery(t, e, &Query{Key: ctxA, Tokens: tokens}, &res)
	if got := res.Instances[0].Disk; got != 16 {
		t.Fatalf("disk = %d", got)
	}
	if n := res.w.chain.Hashed(); n != 2 {
		t.Fatalf("hashed %d blocks, want 2", n)
	}
}
