package engine

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// hintedEngine returns an engine whose slot a holds n blocks (benchKey 0..n-1) on device,
// with its deleting hook calling *onDelete when set, and the records' indices plus one
// (the hints a walk should find), read on the writer.
func hintedEngine(t *testing.T, cfg Config, n int, onDelete *func(key uint64)) (*Engine, Slot, []uint64, []uint32) {
	t.Helper()
	e := newTestEngine(t, cfg)
	e.hooks = &testHooks{deleting: func(key uint64) {
		if *onDelete != nil {
			(*onDelete)(key)
		}
	}}
	a := Slot{"a", 0}
	mustRegister(t, e, ctxA, vllmProfile(t), a)
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, keys...))
	settled(e) // no table migration running: a walk finds every key in the table it probes
	return e, a, keys, recordHints(t, e, keys)
}

// recordHints reads, on the writer, the index plus one of each key's record (0: none).
func recordHints(t *testing.T, e *Engine, keys []uint64) []uint32 {
	t.Helper()
	return recordHintsIn(t, e, ctxA, keys)
}

// recordHintsIn is recordHints in context k.
func recordHintsIn(t *testing.T, e *Engine, k ContextKey, keys []uint64) []uint32 {
	t.Helper()
	want := make([]uint32, len(keys))
	onWriter(t, e, k, func(c *cacheContext) {
		for i, k := range keys {
			if _, _, idx, _, ok := c.tab.locate(k); ok {
				want[i] = idx + 1
			}
		}
	})
	return want
}

// hintedQuery walks keys with hints (corrected in place) and returns slot a's device count
// in blocks.
func hintedQuery(t *testing.T, e *Engine, keys []uint64, hints []uint32) int64 {
	t.Helper()
	var res Result
	if err := e.queryKeysWith(ctxA, keys, hints, len(keys)*16, "", &res, walkAuto); err != nil {
		t.Fatal(err)
	}
	return rankTiers(t, res.Instances, "a", 0).Device / 16
}

// TestHintedWalkSkipsTheTable: a walk given right hints reads the records without
// probing the table (shown by taking a key out of the table behind the writer's back,
// which no writer path does: the hinted walk still credits the record, the unhinted one
// stops there), and a walk given none finds and returns them.
func TestHintedWalkSkipsTheTable(t *testing.T) {
	var none func(uint64)
	const n = 40
	e, _, keys, want := hintedEngine(t, Config{}, n, &none)
	hints := make([]uint32, n)
	if got := hintedQuery(t, e, keys, hints); got != n {
		t.Fatalf("unhinted walk: %d blocks, want %d", got, n)
	}
	filled := 0
	for i, h := range hints {
		if h != 0 && h != want[i] {
			t.Fatalf("block %d: the walk gave hint %d, its record is %d", i, h, want[i])
		}
		if h != 0 {
			filled++
		}
	}
	if filled < n-2 {
		t.Fatalf("the walk filled %d of %d hints", filled, n)
	}
	onWriter(t, e, ctxA, func(c *cacheContext) { c.tab.remove(keys[7]) })
	if got := hintedQuery(t, e, keys, append([]uint32(nil), want...)); got != n {
		t.Fatalf("hinted walk: %d blocks, want %d (it probed the table)", got, n)
	}
	if got := hintedQuery(t, e, keys, make([]uint32, n)); got != 7 {
		t.Fatalf("unhinted walk: %d blocks, want 7 (the table lacks block 7)", got)
	}
}

// TestWrongHintsAreCorrected: hints out of range, naming another block's record, or a
// record of another index change nothing in the answer, and the walk replaces them with
// the right ones.
func TestWrongHintsAreCorrected(t *testing.T) {
	var none func(uint64)
	const n = 40
	e, _, keys, want := hintedEngine(t, Config{}, n, &none)
	hints := make([]uint32, n)
	for i := range hints {
		switch i % 4 {
		case 0:
			hints[i] = 1 << 30 // past the arena
		case 1:
			hints[i] = want[(i+1)%n] // another block's record
		case 2:
			hints[i] = ^uint32(0)
		case 3:
			hints[i] = want[i] // right
		}
	}
	if got := hintedQuery(t, e, keys, hints); got != n {
		t.Fatalf("walk with wrong hints: %d blocks, want %d", got, n)
	}
	for i := 0; i < n-2; i++ {
		if hints[i] != want[i] {
			t.Fatalf("block %d: hint %d after the walk, its record is %d", i, hints[i], want[i])
		}
	}
}

// TestHintNeverCreditsADeletedRecord steps the writer to the point between a deleted
// record's free mark and its key leaving the table, through both delete paths (the
// last holder removing the block, and eviction), and queries there with the hints to
// that record: the walk must stop at the block, there and after, and after the record is
// reused for another key. Deleting in the other order (key out of the table first) would
// leave a live record that only a hint reaches, and the eviction case fails (a removed
// block's record holds no bits by then, so that case stops either way).
func TestHintNeverCreditsADeletedRecord(t *testing.T) {
	for _, path := range []string{"remove", "evict"} {
		t.Run(path, func(t *testing.T) {
			var onDelete func(uint64)
			const n = 40
			log, _ := captureLogger() // an eviction logs a warning
			cfg := Config{Logger: log}
			if path == "evict" {
				cfg.MaxBlocksPerContext = n
			}
			e, a, keys, want := hintedEngine(t, cfg, n, &onDelete)
			victim := 0 // eviction takes the oldest written
			if path == "remove" {
				victim = 9
			}
			inWindow := int64(-1)
			onDelete = func(key uint64) {
				if key != keys[victim] {
					return
				}
				// On the writer, between the two steps: a query on another goroutine.
				done := make(chan int64)
				go func() {
					var res Result
					_ = e.queryKeysWith(ctxA, keys, append([]uint32(nil), want...), n*16, "", &res, walkAuto)
					done <- rankTiers(t, res.Instances, "a", 0).Device / 16
				}()
				inWindow = <-done
			}
			if path == "remove" {
				mustApply(t, e, ctxA, remove(a, TierDevice, keys[victim]))
			} else {
				mustApply(t, e, ctxA, store(a, TierDevice, benchKey(n)))
			}
			onDelete = nil
			if inWindow != int64(victim) {
				t.Fatalf("query between free mark and unlink: %d blocks, want %d", inWindow, victim)
			}
			if got := hintedQuery(t, e, keys, append([]uint32(nil), want...)); got != int64(victim) {
				t.Fatalf("after the delete: %d blocks, want %d", got, victim)
			}
			// The freed record is reused for a new key: the old hint names a live record
			// of another key.
			fresh := benchKey(n + 1)
			mustApply(t, e, ctxA, store(a, TierDevice, fresh))
			if path == "remove" {
				if h := recordHints(t, e, []uint64{fresh}); h[0] != want[victim] {
					t.Fatalf("new key in record %d, want the freed %d reused", h[0], want[victim])
				}
			}
			if got := hintedQuery(t, e, keys, append([]uint32(nil), want...)); got != int64(victim) {
				t.Fatalf("after reuse: %d blocks, want %d", got, victim)
			}
		})
	}
}

// TestHintedQueriesDuringDeletes runs memo-served queries of one prompt (their hints
// kept in the memo, going stale as the writer frees the prompt's records and reuses them
// for other keys) while the writer cuts the prompt at random blocks and stores it again.
// Every answer must be a prefix the index held at some point of the query: between the
// least and the most it held while the query ran.
func TestHintedQueriesDuringDeletes(t *testing.T) {
	const (
		n       = 64
		rounds  = 150
		readers = 2
	)
	p := vllmProfile(t)
	e := newTestEngine(t, Config{MemoEntries: 1 << 12})
	a := Slot{"a", 0}
	mustRegister(t, e, ctxA, p, a)
	tokens := seqTokens(16 * n)
	keys := chainKeys(t, p, 16, "", "", tokens)
	mustApply(t, e, ctxA, store(a, TierDevice, keys...))

	// hist[s] is the range of prefixes the index may hold at sequence s: even s between
	// writes (one value), odd s during one (a cut goes straight to its block, a store
	// grows the prefix block by block).
	var mu sync.Mutex
	hist := [][2]int{{n, n}}
	var seq atomic.Int64
	mark := func(lo, hi int) {
		mu.Lock()
		hist = append(hist, [2]int{lo, hi})
		seq.Store(int64(len(hist) - 1))
		mu.Unlock()
	}
	for range readers { // every reader's first query fills the memo
		var res Result
		mustQuery(t, e, &Query{Key: ctxA, Tokens: tokens}, &res)
	}
	var stop, failed atomic.Bool
	var wg sync.WaitGroup
	var queries atomic.Int64
	// waitQueries yields until min queries have completed (or a reader failed): the
	// writes must not all be over before the readers run.
	waitQueries := func(min int64) {
		for queries.Load() < min && !failed.Load() {
			runtime.Gosched()
		}
	}
	for ri := range readers {
		wg.Go(func() {
			var res Result
			mode := walkAuto
			if ri == 0 {
				mode = walkProbed
			}
			for !stop.Load() {
				s0 := seq.Load()
				if err := e.queryWith(&Query{Key: ctxA, Tokens: tokens}, &res, mode); err != nil {
					t.Error(err)
					failed.Store(true)
					return
				}
				s1 := seq.Load()
				got := 0
				if len(res.Instances) > 0 {
					got = int(rankTiers(t, res.Instances, "a", 0).Device / 16)
				}
				mu.Lock()
				lo, hi := n, 0
				for s := s0; s <= s1; s++ {
					lo, hi = min(lo, hist[s][0]), max(hi, hist[s][1])
				}
				mu.Unlock()
				if got < lo || got > hi {
					t.Errorf("answer %d blocks, outside what the index held during the query (%d..%d)", got, lo, hi)
					failed.Store(true)
					return
				}
				queries.Add(1)
			}
		})
	}
	waitQueries(readers)
	rng := rand.New(rand.NewPCG(5, 6))
	for r := 0; r < rounds; r++ {
		q := queries.Load()
		k := rng.IntN(n)
		mark(k, n)
		mustApply(t, e, ctxA, remove(a, TierDevice, keys[k:]...))
		mark(k, k)
		// Other keys take the freed records (the prompt's hints now name them), on the
		// same tier: a walk that took one for the prompt's block would count past the cut.
		decoys := make([]uint64, n-k)
		for i := range decoys {
			decoys[i] = benchKey(1000 + r*n + i)
		}
		mustApply(t, e, ctxA, store(a, TierDevice, decoys...))
		mustApply(t, e, ctxA, remove(a, TierDevice, decoys...))
		mark(k, n)
		mustApply(t, e, ctxA, store(a, TierDevice, keys[k:]...))
		mark(n, n)
		// A query ends in each round (one may have overlapped its writes) before the
		// next round starts.
		waitQueries(q + 1)
	}
	stop.Store(true)
	wg.Wait()
	if queries.Load() == 0 {
		t.Fatal("no query ran during the writes")
	}
	if st := e.MemoStats(); st.Hits == 0 {
		t.Fatalf("memo served nothing: %+v", st)
	}
}

// TestContextsSharingMemoRunsKeepTheirHints: two contexts with the same profile share the
// key memo's runs of a prompt they both hold, in different records (another index's
// arena). Queries of both, in turn, answer each from its own index, and the runs' hints
// stay those of the context that saved them first: the other one's walks neither use nor
// overwrite them.
func TestContextsSharingMemoRunsKeepTheirHints(t *testing.T) {
	const n = 64
	p := vllmProfile(t)
	e := newTestEngine(t, Config{MemoEntries: 1 << 12})
	ctxB := ContextKey{TenantID: "other", ModelName: "m", BlockSize: 16}
	a, b := Slot{"a", 0}, Slot{"b", 0}
	mustRegister(t, e, ctxA, p, a)
	mustRegister(t, e, ctxB, p, b)
	tokens := seqTokens(16 * n)
	keys := chainKeys(t, p, 16, "", "", tokens)
	filler := make([]uint64, 100)
	for i := range filler {
		filler[i] = benchKey(5000 + i)
	}
	mustApply(t, e, ctxB, store(b, TierDevice, filler...)) // B's records elsewhere
	mustApply(t, e, ctxA, store(a, TierDevice, keys...))
	mustApply(t, e, ctxB, store(b, TierDevice, keys[:n/2]...))
	// No table migration running in A: a walk that finds a block's key only in the
	// previous table reads it without a hint, and saves none for it.
	settled(e)
	query := func(k ContextKey, slot string) int64 {
		var res Result
		mustQuery(t, e, &Query{Key: k, Tokens: tokens}, &res)
		return rankTiers(t, res.Instances, slot, 0).Device / 16
	}
	query(ctxA, "a") // hashes the prompt: the memo's runs, without hints yet
	for round := 0; round < 4; round++ {
		if got := query(ctxA, "a"); got != n { // the first saves the runs' hints
			t.Fatalf("round %d: context A answered %d blocks, want %d", round, got, n)
		}
		if got := query(ctxB, "b"); got != n/2 {
			t.Fatalf("round %d: context B answered %d blocks, want %d", round, got, n/2)
		}
	}
	wantA := recordHintsIn(t, e, ctxA, keys)
	if wantB := recordHintsIn(t, e, ctxB, keys); wantB[0] == wantA[0] {
		t.Fatal("the contexts' records share indices: the test shows nothing")
	}
	var ch hashing.Chain
	c := e.lookup(ctxA)
	ch.SetHintOwner(c.hintOwner)
	ch.ResetMemo(e.memo, &p, 16, "", "", tokens)
	got := 0
	for i := 0; i < n; {
		ks, hs := ch.KeysAhead(), ch.HintsAhead()
		if len(ks) == 0 {
			t.Fatalf("block %d: not from the memo", i)
		}
		for j, h := range hs {
			if h != wantA[i+j] && i+j < n-1 {
				t.Fatalf("block %d: the memo's hint is %d, context A's record is %d", i+j, h, wantA[i+j])
			}
			got++
		}
		ch.Advance(len(ks))
		i += len(ks)
	}
	if got < n-1 {
		t.Fatalf("%d hints read", got)
	}
}
