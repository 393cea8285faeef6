package engine

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// growTokens returns prompt i of a set of distinct 64-block prompts.
func growTokens(i int) []int32 {
	r := rand.New(rand.NewPCG(uint64(i), 77))
	toks := make([]int32, 16*64)
	for j := range toks {
		toks[j] = int32(r.IntN(150000))
	}
	return toks
}

// TestMemoGrowsWithUseAndIndex: a growing memo starts small; once queries hash, it grows
// ahead of the index to one memo block per memoAhead indexed blocks; when queries have
// filled half of it and prompts come back after it evicted their runs, it doubles, but to
// no more than memoPerBlock memo blocks per indexed block; prompts that are all new fill
// it without growing it; never past MemoEntries, after which queries ask nothing. Every
// answer is the full hit. The memo's requests are answered by the test (manualMemoGrowth)
// right after the query that made them.
func TestMemoGrowsWithUseAndIndex(t *testing.T) {
	p := resolve(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
	log, _ := captureLogger()
	e := newTestEngine(t, Config{MemoEntries: 8192, MemoStartEntries: 256, manualMemoGrowth: true, Logger: log})
	k := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	s := Slot{"a", 0}
	mustRegister(t, e, k, p, s)
	indexed := 0 // prompts of 64 blocks
	index := func(n int) {
		for range n {
			mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", "", growTokens(indexed))...))
			indexed++
		}
	}
	asked, steps, grown := 0, 0, 0
	var res Result
	warned := false
	// query asks indexed prompt i and answers the memo's request, if it made one.
	query := func(i int) {
		mustQuery(t, e, &Query{Key: k, Tokens: growTokens(i)}, &res)
		if res.Instances[0].Device != 16*64 {
			t.Fatalf("prompt %d: %s", i, formatHits(res.Instances))
		}
		select {
		case <-e.memo.GrowRequests():
			steps++
			if e.growMemoStep(nil, &warned) {
				grown++
			}
		default:
		}
	}
	// ask asks n indexed prompts not asked yet (8 runs inserted each).
	ask := func(n int) {
		for range n {
			query(asked)
			if res.BlocksFromMemo() != 0 {
				t.Fatalf("prompt %d: %d blocks from the memo", asked, res.BlocksFromMemo())
			}
			asked++
		}
	}
	check := func(what string, capacity, wantSteps, wantGrown int) {
		t.Helper()
		if got := e.MemoStats().Capacity; got != capacity || steps != wantSteps || grown != wantGrown {
			t.Fatalf("%s: capacity %d after %d requests, %d steps that grew; want %d, %d, %d",
				what, got, steps, grown, capacity, wantSteps, wantGrown)
		}
	}
	type step struct {
		what                          string
		index, ask                    int // prompts of 64 blocks indexed, then asked
		capacity, requests, grewSoFar int
	}
	run := func(steps []step) {
		t.Helper()
		for _, st := range steps {
			index(st.index)
			ask(st.ask)
			check(st.what, st.capacity, st.requests, st.grewSoFar)
		}
	}
	check("start", 256, 0, 0)
	run([]step{
		// 128 blocks indexed (no more than 4 per memo block): no request ahead. 16 runs
		// fill half of the 32 the memo holds, but it holds twice the blocks indexed.
		{"128 indexed, half filled", 2, 2, 256, 1, 0},
		// 640 indexed (2.5 per memo block): still no request ahead, and 8 more runs do not
		// reach the next half.
		{"640 indexed", 8, 1, 256, 1, 0},
		// 1,280 indexed: the next query asks ahead, for 320 blocks: 512.
		{"1,280 indexed", 10, 1, 512, 2, 1},
		// 32 more runs of new prompts fill half of the 64: asked, and declined (nothing
		// came back after its eviction).
		{"half filled by new prompts", 0, 4, 512, 3, 1},
	})
	if st := e.MemoStats(); st.Reasked != 0 {
		t.Fatalf("new prompts only, yet %d lookups reasked evicted runs", st.Reasked)
	}
	// 16 prompts (128 runs, twice the memo) asked round and round: prompts come back
	// after their runs were evicted, and the memo doubles (1,024 <= 2 x 1,280).
	for q := 0; e.MemoStats().Capacity == 512; q++ {
		if q == 20*16 {
			t.Fatalf("prompts asked again after eviction for 20 rounds: %+v", e.MemoStats())
		}
		query(q % 16)
	}
	if st := e.MemoStats(); st.Capacity != 1024 || st.Reasked == 0 || grown != 2 {
		t.Fatalf("asked again: capacity %d, %d steps grew, %+v", st.Capacity, grown, st)
	}
	asked = 16
	steps, grown = 0, 0
	run([]step{
		// 8,192 indexed: ahead to 2,048.
		{"8,192 indexed", 108, 1, 2048, 1, 1},
		// 32,768 indexed: ahead to the limit, 8,192.
		{"32,768 indexed", 384, 1, 8192, 2, 2},
		// At the limit no more requests, whatever fills it.
		{"at the limit", 0, 200, 8192, 2, 2},
	})
	// Prompts asked again come from the memo, those its sets still hold.
	from := 0
	for i := asked - 32; i < asked; i++ {
		mustQuery(t, e, &Query{Key: k, Tokens: growTokens(i)}, &res)
		from += res.BlocksFromMemo()
	}
	if from < 32*64/2 {
		t.Fatalf("asked again: %d of %d blocks from the memo", from, 32*64)
	}
}

// TestMemoGrowerGrowsAndStops: the engine's grower answers the memo's requests on its
// own goroutine, and Close stops it (Close waits for it).
func TestMemoGrowerGrowsAndStops(t *testing.T) {
	p := resolve(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
	log, logs := captureLogger()
	e := New(Config{MemoEntries: 1 << 12, MemoStartEntries: 256, PopulateMemo: true, Logger: log})
	grew := make(chan bool, 16)
	e.hooks = &testHooks{memoGrew: func(g bool) { grew <- g }}
	k := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	s := Slot{"a", 0}
	mustRegister(t, e, k, p, s)
	var res Result
	for i := range 20 { // 1,280 indexed blocks: more than memoAhead per memo block
		mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", "", growTokens(i))...))
	}
	mustQuery(t, e, &Query{Key: k, Tokens: growTokens(0)}, &res) // hashes: asks ahead
	if g := <-grew; !g || e.MemoStats().Capacity != 512 {
		t.Fatalf("grower: grew %v, capacity %d", g, e.MemoStats().Capacity)
	}
	e.Close()
	if !strings.Contains(logs(), "query key memo grew") {
		t.Fatalf("growth not logged: %q", logs())
	}
	var nilMemo *hashing.Memo
	if nilMemo.GrowRequests() != nil || nilMemo.Limit() != 0 {
		t.Fatal("a nil memo asks to grow")
	}
}
