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

// TestMemoGrowsWithUseAndIndex: a growing memo starts small, grows when cold queries
// have filled half of it, only while it holds fewer than twice the blocks indexed, and
// never past MemoEntries; every answer is the full hit. The memo's requests are answered
// by the test (manualMemoGrowth) right after the query that made them.
func TestMemoGrowsWithUseAndIndex(t *testing.T) {
	p := resolve(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
	log, _ := captureLogger()
	e := newTestEngine(t, Config{MemoEntries: 2048, MemoStartEntries: 256, manualMemoGrowth: true, Logger: log})
	k := ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	s := Slot{"a", 0}
	mustRegister(t, e, k, p, s)
	indexed := 0
	index := func(n int) {
		for range n {
			mustApply(t, e, k, store(s, TierDevice, chainKeys(t, p, 16, "", "", growTokens(indexed))...))
			indexed++
		}
	}
	asked, grown := 0, 0
	var res Result
	// ask asks every indexed prompt not asked yet (8 runs inserted each), answering the
	// memo's requests as they come.
	ask := func() {
		warned := false
		for ; asked < indexed; asked++ {
			mustQuery(t, e, &Query{Key: k, Tokens: growTokens(asked)}, &res)
			if res.Instances[0].Device != 16*64 || res.BlocksFromMemo() != 0 {
				t.Fatalf("prompt %d: %s, %d blocks from the memo", asked, formatHits(res.Instances), res.BlocksFromMemo())
			}
			select {
			case <-e.memo.GrowRequests():
				if e.growMemoStep(nil, &warned) {
					grown++
				}
			default:
			}
		}
	}
	capacity := func() int { return e.MemoStats().Capacity }
	if capacity() != 256 || e.memo.Limit() != 2048 {
		t.Fatalf("start: capacity %d, limit %d", capacity(), e.memo.Limit())
	}
	// 2 prompts, 128 blocks: 16 runs fill half, but 256 blocks are twice the index.
	index(2)
	ask()
	if capacity() != 256 || grown != 0 {
		t.Fatalf("128 blocks indexed: capacity %d after %d steps", capacity(), grown)
	}
	// 6 prompts, 384 blocks: the next request (another 16 runs, at 32) doubles it; the
	// next one would come at 64 runs, after 8 prompts.
	index(4)
	ask()
	if capacity() != 512 || grown != 1 {
		t.Fatalf("384 blocks indexed: capacity %d after %d steps", capacity(), grown)
	}
	// 16 prompts, 1,024 blocks: at 64 runs it doubles (1,024 < 2,048), at 128 it reaches
	// the limit.
	index(10)
	ask()
	if capacity() != 2048 || grown != 3 {
		t.Fatalf("1,024 blocks indexed: capacity %d after %d steps", capacity(), grown)
	}
	index(16)
	ask()
	if capacity() != 2048 || grown != 3 {
		t.Fatalf("at the limit: capacity %d after %d steps", capacity(), grown)
	}
	// Prompts asked again come from the memo, those its sets still hold (at a load of 1,
	// and asking again inserts what was lost, evicting others: about half).
	from := 0
	for i := 0; i < indexed; i++ {
		mustQuery(t, e, &Query{Key: k, Tokens: growTokens(i)}, &res)
		from += res.BlocksFromMemo()
	}
	if from < indexed*64/4 {
		t.Fatalf("asked again: %d of %d blocks from the memo", from, indexed*64)
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
