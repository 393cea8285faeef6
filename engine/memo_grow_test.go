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
// ahead of the index to one memo block per memoAhead indexed blocks; when cold queries
// have filled half of it, it doubles, but to no more than memoPerBlock memo blocks per
// indexed block; never past MemoEntries, after which queries ask nothing. Every answer is
// the full hit. The memo's requests are answered by the test (manualMemoGrowth) right
// after the query that made them.
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
	// ask asks n indexed prompts not asked yet (8 runs inserted each), answering the
	// memo's requests as they come.
	ask := func(n int) {
		warned := false
		for range n {
			mustQuery(t, e, &Query{Key: k, Tokens: growTokens(asked)}, &res)
			if res.Instances[0].Device != 16*64 || res.BlocksFromMemo() != 0 {
				t.Fatalf("prompt %d: %s, %d blocks from the memo", asked, formatHits(res.Instances), res.BlocksFromMemo())
			}
			asked++
			select {
			case <-e.memo.GrowRequests():
				steps++
				if e.growMemoStep(nil, &warned) {
					grown++
				}
			default:
			}
		}
	}
	check := func(what string, capacity, wantSteps, wantGrown int) {
		t.Helper()
		if got := e.MemoStats().Capacity; got != capacity || steps != wantSteps || grown != wantGrown {
			t.Fatalf("%s: capacity %d after %d requests, %d steps that grew; want %d, %d, %d",
				what, got, steps, grown, capacity, wantSteps, wantGrown)
		}
	}
	check("start", 256, 0, 0)
	for _, st := range []struct {
		what                          string
		index, ask                    int // prompts of 64 blocks indexed, then asked
		capacity, requests, grewSoFar int
	}{
		// 128 blocks indexed (no more than 4 per memo block): no request ahead. 16 runs
		// fill half of the 32 the memo holds, but it holds twice the blocks indexed.
		{"128 indexed, half filled", 2, 2, 256, 1, 0},
		// 640 indexed (2.5 per memo block): still no request ahead, and 8 more runs do not
		// reach the next half.
		{"640 indexed", 8, 1, 256, 1, 0},
		// 1,280 indexed: the next query asks ahead, for 320 blocks: 512.
		{"1,280 indexed", 10, 1, 512, 2, 1},
		// 32 more runs fill half of the 64: doubled (1,024 <= 2 x 1,280).
		{"half filled again", 0, 4, 1024, 3, 2},
		// 8,192 indexed: ahead to 2,048.
		{"8,192 indexed", 108, 1, 2048, 4, 3},
		// 32,768 indexed: ahead to the limit, 8,192.
		{"32,768 indexed", 384, 1, 8192, 5, 4},
		// At the limit no more requests, whatever fills it.
		{"at the limit", 0, 200, 8192, 5, 4},
	} {
		index(st.index)
		ask(st.ask)
		check(st.what, st.capacity, st.requests, st.grewSoFar)
	}
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
	for i := range 2 { // 16 runs: half of 256 blocks; 128 indexed blocks allow 256 more
		mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", "", growTokens(i))...))
		mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", "", growTokens(100+i))...))
		mustQuery(t, e, &Query{Key: k, Tokens: growTokens(i)}, &res)
	}
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
