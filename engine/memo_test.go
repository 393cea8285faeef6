package engine

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// TestMemoDifferential drives two engines, one with a key memo (a small one, so that it
// also evicts, or one that grows from a single set between queries) and one without, with the same random stores, removes and clears of blocks
// hashed from real prompts, and checks that every Query (prompts repeating, extending,
// truncating and editing earlier ones, with LoRAs, salts, instance filters and negative
// tokens) gets the same answer and the same error from both, in every hash profile.
func TestMemoDifferential(t *testing.T) {
	profiles := []struct{ strategy, algo, proj string }{
		{"vllm_v1", "sha256_cbor", "low64_be"},
		{"vllm_v1", "sha256", "low64_be"},
		{"sglang", "sha256_raw", "first64_be"},
		{"sglang_bigram", "sha256_raw", "first64_be"},
	}
	for pi, pc := range profiles {
		for _, entries := range []int{1 << 14, 16, -1} {
			name := fmt.Sprintf("%s-%s/memo%d", pc.strategy, pc.algo, entries)
			cfg := Config{MemoEntries: entries}
			if entries < 0 {
				name = fmt.Sprintf("%s-%s/growing", pc.strategy, pc.algo)
				log, _ := captureLogger()
				cfg = Config{MemoEntries: 1 << 14, MemoStartEntries: 32, manualMemoGrowth: true, Logger: log}
			}
			t.Run(name, func(t *testing.T) {
				p := resolve(t, pc.strategy, pc.algo, "0", pc.proj)
				on := newTestEngine(t, cfg)
				grown, warned := 0, false
				off := newTestEngine(t, Config{})
				r := rand.New(rand.NewPCG(uint64(pi), uint64(entries&0xFFFF)))
				loras, salts := []string{"", "lora-a"}, []string{"", "s1", "s2"}
				slots := []Slot{{"a", 0}, {"a", 1}, {"b", 0}, {"c", 0}}
				var keys []ContextKey
				for _, lora := range loras {
					for _, bs := range []int64{4, 16} {
						k := ContextKey{TenantID: "t", ModelName: "m", LoraName: lora, BlockSize: bs}
						keys = append(keys, k)
						for _, s := range slots {
							mustRegister(t, on, k, p, s)
							mustRegister(t, off, k, p, s)
						}
					}
				}
				var prompts [][]int32
				newPrompt := func() []int32 {
					if len(prompts) > 0 && r.IntN(3) != 0 {
						base := prompts[r.IntN(len(prompts))]
						toks := append([]int32(nil), base[:r.IntN(len(base)+1)]...)
						for range r.IntN(60) {
							toks = append(toks, int32(r.IntN(1000)))
						}
						if len(toks) > 0 && r.IntN(8) == 0 {
							toks[r.IntN(len(toks))] = -1 // sglang cannot hash it
						}
						return toks
					}
					toks := make([]int32, r.IntN(150))
					for i := range toks {
						toks[i] = int32(r.IntN(1000))
					}
					return toks
				}
				var ron, roff Result
				queries, hits := 0, 0
				for step := range 600 {
					k := keys[r.IntN(len(keys))]
					salt := salts[r.IntN(len(salts))]
					toks := newPrompt()
					prompts = append(prompts, toks)
					switch r.IntN(4) {
					case 0, 1: // a slot caches a prefix of the prompt
						var ch hashing.Chain
						ch.Reset(&p, int(k.BlockSize), k.LoraName, salt, toks)
						var hs []uint64
						for n := r.IntN(ch.NumBlocks() + 1); len(hs) < n; {
							h, err := ch.Next()
							if err != nil {
								break
							}
							hs = append(hs, h)
						}
						if len(hs) == 0 {
							continue
						}
						op := store(slots[r.IntN(len(slots))], EngineTier(r.IntN(3)), hs...)
						if r.IntN(4) == 0 {
							op = remove(op.Slot, op.Tier, hs[r.IntN(len(hs)):]...)
						}
						mustApply(t, on, k, op)
						mustApply(t, off, k, op)
					case 2:
						op := Op{Kind: OpClear, Slot: slots[r.IntN(len(slots))], ClearTiers: TierMask(1 + r.IntN(7))}
						if r.IntN(5) == 0 {
							mustApply(t, on, k, op)
							mustApply(t, off, k, op)
						}
					}
					// Query this prompt and an earlier one.
					for _, qt := range [][]int32{toks, prompts[r.IntN(len(prompts))]} {
						filter := ""
						if r.IntN(6) == 0 {
							filter = []string{"a", "b", "zz"}[r.IntN(3)]
						}
						q := &Query{Key: k, Tokens: qt, CacheSalt: salt, InstanceFilter: filter}
						// With the memo, the probes take its keys ahead.
						errOn, errOff := on.queryWith(q, &ron, walkProbed), off.Query(q, &roff)
						if fmt.Sprint(errOn) != fmt.Sprint(errOff) || !sameHits(ron.Instances, roff.Instances) {
							t.Fatalf("step %d: memo %v %s, no memo %v %s", step, errOn, formatHits(ron.Instances), errOff, formatHits(roff.Instances))
						}
						if ron.w.walked != roff.w.walked {
							t.Fatalf("step %d: walk went through %d blocks with the memo, %d without", step, ron.w.walked, roff.w.walked)
						}
						queries++
						if filter != "zz" { // a filter naming no instance returns before hashing
							hits += ron.BlocksFromMemo()
						}
						select {
						case <-on.memo.GrowRequests(): // nil but for the growing memo
							if on.growMemoStep(nil, &warned) {
								grown++
							}
						default:
						}
					}
				}
				if entries < 0 && grown < 3 {
					t.Fatalf("the memo grew %d times", grown)
				}
				st := on.MemoStats()
				if hits == 0 || st.Hits != uint64(hits) || st.Misses == 0 {
					t.Fatalf("%d queries: %d blocks from the memo, stats %+v", queries, hits, st)
				}
				if off.MemoStats() != (hashing.MemoStats{}) {
					t.Fatalf("engine without memo has stats %+v", off.MemoStats())
				}
			})
		}
	}
}

// TestQueryWithMemoAllocatesNothing: cold (hashing and inserting) and warm (served from
// the memo) queries allocate nothing once the Result is warm.
func TestQueryWithMemoAllocatesNothing(t *testing.T) {
	skipAllocUnderRace(t)
	e, p, k, s := memoEngine(t, 1<<16)
	tokens := seqTokens(16 * 512)
	salts := []string{"", "x", "y", "z", "w", "v", "u", "q"}
	for _, salt := range salts {
		mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", salt, tokens)...))
	}
	var res Result
	i := 0
	cold := func() {
		i++
		mustQuery(t, e, &Query{Key: k, Tokens: tokens, CacheSalt: salts[i%len(salts)]}, &res)
	}
	cold()
	if a := testing.AllocsPerRun(5, cold); a != 0 {
		t.Fatalf("cold query allocates %.1f", a)
	}
	warm := &Query{Key: k, Tokens: tokens}
	_ = e.Query(warm, &res)
	if a := testing.AllocsPerRun(20, func() { _ = e.Query(warm, &res) }); a != 0 {
		t.Fatalf("warm query allocates %.1f", a)
	}
	if res.BlocksFromMemo() != 512 || res.Instances[0].Device != 16*512 {
		t.Fatalf("warm query: %d blocks from the memo, %s", res.BlocksFromMemo(), formatHits(res.Instances))
	}
}

// TestBlocksHashedDescribesTheLastQuery: a query that hashes nothing (unknown context or
// filter, or QueryKeys) reports 0 blocks hashed, not the previous query's count, which
// the server puts in metrics and the access log.
func TestBlocksHashedDescribesTheLastQuery(t *testing.T) {
	e, p, k, s := memoEngine(t, 1<<12)
	tokens := seqTokens(16 * 8)
	keys := chainKeys(t, p, 16, "", "", tokens)
	mustApply(t, e, k, store(s, TierDevice, keys...))
	var res Result
	full := func() {
		t.Helper()
		if err := e.Query(&Query{Key: k, Tokens: tokens}, &res); err != nil || res.BlocksHashed() != 8 {
			t.Fatalf("full query: err %v, %d blocks hashed", err, res.BlocksHashed())
		}
	}
	full()
	unknown := k
	unknown.ModelName = "other"
	if _ = e.Query(&Query{Key: unknown, Tokens: tokens}, &res); res.BlocksHashed() != 0 || res.BlocksFromMemo() != 0 {
		t.Errorf("unknown context: %d hashed, %d from memo", res.BlocksHashed(), res.BlocksFromMemo())
	}
	full()
	if _ = e.Query(&Query{Key: k, Tokens: tokens, InstanceFilter: "nobody"}, &res); res.BlocksHashed() != 0 {
		t.Errorf("unknown filter: %d hashed", res.BlocksHashed())
	}
	full()
	if err := e.QueryKeys(k, keys, len(tokens), "", &res); err != nil || res.BlocksHashed() != 0 || res.Instances[0].Device != int64(len(tokens)) {
		t.Errorf("QueryKeys: err %v, %d hashed, %s", err, res.BlocksHashed(), formatHits(res.Instances))
	}
}

// TestPopulateMemoAtNew: PopulateMemo makes New populate the memo and say so (where the
// platform cannot, it says why), and an engine without the option says nothing of it.
func TestPopulateMemoAtNew(t *testing.T) {
	for _, populate := range []bool{true, false} {
		log, logs := captureLogger()
		e := New(Config{MemoEntries: 1 << 16, PopulateMemo: populate, Logger: log})
		e.Close()
		out := logs()
		said := strings.Contains(out, "query key memo populated") || strings.Contains(out, "query key memo not populated")
		if said != populate {
			t.Fatalf("PopulateMemo %v: log %q", populate, out)
		}
		if populate && runtime.GOOS == "linux" && !strings.Contains(out, "query key memo populated") {
			t.Fatalf("not populated on Linux: %q", out)
		}
	}
}
