package hashing

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// growPrompts returns n prompts of blocks whole 16-token blocks (vllm_v1 blocks, so that
// every run of 8 is memoised).
func growPrompts(r *rand.Rand, n, blocks int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		out[i] = make([]int32, 16*blocks)
		for j := range out[i] {
			out[i][j] = int32(r.IntN(150000))
		}
	}
	return out
}

// heldRuns returns, for each prompt, which of its runs the memo's current table holds.
func heldRuns(m *Memo, p *Profile, prompts [][]int32) [][]bool {
	out := make([][]bool, len(prompts))
	for i, toks := range prompts {
		a, b := lanesOf(m, p, 16, "", "", toks)
		for j := memoRun - 1; j < len(a); j += memoRun {
			var v memoRunVal
			out[i] = append(out[i], m.cur().lookup(a[j], b[j], &v))
		}
	}
	return out
}

// TestMemoGrowKeepsEntries: growing (by 2, and by 8 at once) keeps every run the memo
// held, at its new set, with its record hints and their owner, and the table is the new
// size; asking a held prompt again takes every block from the memo.
func TestMemoGrowKeepsEntries(t *testing.T) {
	p := allProfiles(t)["cbor"]
	for _, factor := range []int{2, 8} {
		t.Run(fmt.Sprintf("x%d", factor), func(t *testing.T) {
			const start = 1 << 12
			m := NewGrowingMemo(start, 1<<16, true)
			m.grower.setsStep = 3 // several steps, one of them partial
			r := rand.New(rand.NewPCG(1, uint64(factor)))
			prompts := growPrompts(r, 48, 64) // 384 runs in 128 sets of 4: some overflow
			var ch Chain
			ch.SetHintOwner(7)
			for i, toks := range prompts { // inserted, then walked with hints saved
				for range 2 {
					ch.ResetMemo(m, &p, 16, "", "", toks)
					walkHints(t, &ch, 64, func(j int) uint32 { return uint32(i<<8 | j + 1) })
				}
			}
			before := heldRuns(m, &p, prompts)
			// A prompt held whole with the hints its last walk saved (a run evicted by its
			// own prompt's later runs was inserted again by the second walk, which saves
			// no hints for blocks it hashed): they must come along.
			q := -1
			var hintsBefore []uint32
			for i := range before {
				if !allTrue(before[i]) {
					continue
				}
				ch.ResetMemo(m, &p, 16, "", "", prompts[i])
				hs := walkHints(t, &ch, 64, nil)
				if ownHints(hs, i) {
					q, hintsBefore = i, hs
				}
			}
			if q < 0 {
				t.Fatal("no prompt held whole with its own hints")
			}
			grew, err := m.Grow(factor*start, nil)
			if !grew || err != nil && m.region != nil {
				t.Fatalf("Grow: grew %v, err %v", grew, err)
			}
			if got := m.Stats().Capacity; got != factor*start {
				t.Fatalf("capacity %d after growing to %d", got, factor*start)
			}
			after := heldRuns(m, &p, prompts)
			held := 0
			for i := range before {
				for j := range before[i] {
					if before[i][j] && !after[i][j] {
						t.Fatalf("prompt %d run %d was held before growing and is not after", i, j)
					}
					if before[i][j] {
						held++
					}
				}
			}
			if held == len(prompts)*64/memoRun {
				t.Fatalf("%d runs held: no set overflowed, the workload proves little", held)
			}
			ch.ResetMemo(m, &p, 16, "", "", prompts[q])
			if got := walkHints(t, &ch, 64, nil); !ownHints(got, q) {
				t.Fatalf("prompt %d's hints after growing %v, before %v", q, got, hintsBefore)
			}
			// Every prompt held whole is served whole (asked before any prompt whose lost
			// runs would be inserted again, evicting others).
			for i := range prompts {
				if !allTrue(after[i]) {
					continue
				}
				want := runChain(&Chain{}, nil, &p, 16, "", "", prompts[i], -1)
				if got := runChain(&ch, m, &p, 16, "", "", prompts[i], -1); !sameRun(want, got) || ch.MemoHits() != 64 {
					t.Fatalf("prompt %d after growing: same keys %v, %d blocks from the memo", i, sameRun(want, got), ch.MemoHits())
				}
			}
		})
	}
}

// ownHints reports whether hs are the hints TestMemoGrowKeepsEntries saves for prompt i.
func ownHints(hs []uint32, i int) bool {
	for j, h := range hs {
		if h != uint32(i<<8|j+1) {
			return false
		}
	}
	return true
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// TestMemoGrowInterleavings steps Grow through every point between its steps (each
// populated huge page, each copied step of sets, before the publication) and at each
// one runs chains beside it: chains that insert new prompts and ask old ones (into sets
// copied already, and not yet), and one chain that starts before the new table is
// published and finishes after it. Every chain's keys, digests and errors equal the plain
// chain's (the inserts beside Grow evict and lose runs, so which runs survive is
// TestMemoGrowKeepsEntries's business), and the grown memo serves the prompts asked
// throughout. No sleeps: Grow waits in its hook until the test lets it go on.
func TestMemoGrowInterleavings(t *testing.T) {
	ps := allProfiles(t)
	p := ps["cbor"]
	r := rand.New(rand.NewPCG(3, 4))
	const start = 1 << 11
	m := NewGrowingMemo(start, 1<<14, true)
	m.grower.setsStep = 5
	old := growPrompts(r, 12, 48)
	var ch Chain
	for _, toks := range old {
		runChain(&ch, m, &p, 16, "", "", toks, -1)
	}
	fresh := memoWorkload(r, 300, true)
	want := plainRuns(&p, "", fresh)
	wantOld := make([]chainRun, len(old))
	for i, toks := range old {
		wantOld[i] = runChain(&Chain{}, nil, &p, 16, "", "", toks, -1)
	}

	type stop struct {
		stage growStage
		at    int
	}
	at := make(chan stop)
	cont := make(chan struct{})
	m.grower.hook = func(s growStage, n int) {
		at <- stop{s, n}
		<-cont
	}
	done := make(chan error, 1)
	go func() {
		grew, err := m.Grow(8*start, nil)
		if !grew && err == nil {
			err = fmt.Errorf("did not grow")
		}
		if m.region == nil {
			err = nil // on the heap: no populating, the rest is the same
		}
		done <- err
	}()
	// straddle starts before the publication and ends after it.
	var straddle Chain
	straddleAt := -1
	k, stages := 0, map[growStage]int{}
	for s := range at {
		stages[s.stage]++
		for range 6 {
			i := k % len(fresh)
			k++
			if got := runChain(&ch, m, &p, 4, "", "", fresh[i], -1); !sameRun(want[i], got) {
				t.Fatalf("stage %d at %d: fresh prompt %d differs", s.stage, s.at, i)
			}
			j := k % len(old)
			if got := runChain(&ch, m, &p, 16, "", "", old[j], -1); !sameRun(wantOld[j], got) {
				t.Fatalf("stage %d at %d: old prompt %d differs", s.stage, s.at, j)
			}
		}
		if s.stage == growPublish {
			straddleAt = k % len(old)
			straddle.ResetMemo(m, &p, 16, "", "", old[straddleAt])
			if key, err := straddle.Next(); err != nil || key != wantOld[straddleAt].keys[0] {
				t.Fatalf("straddling chain: block 0 %x, %v", key, err)
			}
		}
		cont <- struct{}{}
		if s.stage == growPublish {
			break
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if stages[growCopied] < 2 || stages[growPublish] != 1 || m.region != nil && stages[growPopulated] < 2 {
		t.Fatalf("stages seen %v", stages)
	}
	if m.Stats().Capacity != 8*start {
		t.Fatalf("capacity %d", m.Stats().Capacity)
	}
	// The straddling chain finishes on the table it started with.
	for i := 1; i < len(wantOld[straddleAt].keys); i++ {
		if key, err := straddle.Next(); err != nil || key != wantOld[straddleAt].keys[i] {
			t.Fatalf("straddling chain: block %d %x, %v", i, key, err)
		}
	}
	straddle.Done()
	served := 0
	for i, toks := range old {
		runChain(&ch, m, &p, 16, "", "", toks, -1) // a run lost meanwhile is inserted again
		if got := runChain(&ch, m, &p, 16, "", "", toks, -1); !sameRun(wantOld[i], got) {
			t.Fatalf("after growing: old prompt %d differs", i)
		}
		served += ch.MemoHits()
	}
	if served != 48*len(old) {
		t.Fatalf("after growing: %d of %d blocks from the memo", served, 48*len(old))
	}
}

// TestMemoGrowWhileInUse: chains on four goroutines, on a memo small enough to evict
// constantly, while another goroutine grows it step by step to its limit: every chain
// gets exactly the plain chain's keys. Under -race this checks that Grow's accesses are
// atomic where they race with queries'.
func TestMemoGrowWhileInUse(t *testing.T) {
	p := allProfiles(t)["sglang"]
	prompts := memoWorkload(rand.New(rand.NewPCG(8, 10)), 40, false)
	m := NewGrowingMemo(32, 1<<12, true)
	m.grower.setsStep = 1
	concurrentChains(t, m, &p, prompts, func() error {
		for c := 64; c <= 1<<12; c *= 2 {
			if _, err := m.Grow(c, nil); err != nil && m.region != nil {
				return err
			}
		}
		return nil
	})
	if m.Stats().Capacity != 1<<12 {
		t.Fatalf("capacity %d", m.Stats().Capacity)
	}
}

// TestMemoGrowRequests: a growing memo asks to grow once chains have inserted runs for
// half its capacity, not before; after Grow (whether it grew or declined) it asks again
// only after another half of the capacity then; the owner's own requests (RequestGrow)
// come through once each and move nothing; at its limit it never asks. A fixed memo never
// asks.
func TestMemoGrowRequests(t *testing.T) {
	p := allProfiles(t)["cbor"]
	r := rand.New(rand.NewPCG(5, 5))
	const start = 1 << 10 // 128 runs: asks after 64
	m := NewGrowingMemo(start, 4*start, false)
	if fixed := NewMemo(start); fixed.GrowRequests() != nil || fixed.HalfFilled() {
		t.Fatal("a fixed memo has grow requests")
	}
	NewMemo(start).RequestGrow() // a fixed memo ignores it
	asked := func() bool {
		select {
		case <-m.GrowRequests():
			return true
		default:
			return false
		}
	}
	var ch Chain
	insert := func(runs int) { // runs distinct new runs, whole prompts of 8
		for _, toks := range growPrompts(r, runs/8, 64) {
			runChain(&ch, m, &p, 16, "", "", toks, -1)
		}
	}
	// insertAsks inserts runs new runs and checks whether the memo then asked to grow.
	insertAsks := func(runs int, want bool, when string) {
		t.Helper()
		insert(runs)
		if asked() != want {
			t.Fatalf("after %s: asked to grow %v, want %v", when, !want, want)
		}
	}
	insertAsks(56, false, "56 of 128 runs")
	insertAsks(8, true, "64 of 128 runs")
	if asked() {
		t.Fatal("asked twice")
	}
	if grew, _ := m.Grow(start, nil); grew { // no growth: the owner said no
		t.Fatal("grew to its own size")
	}
	insertAsks(56, false, "56 more runs")
	// The owner's own request, declined, does not move the mark.
	m.RequestGrow()
	m.RequestGrow()
	if !asked() || asked() || m.HalfFilled() {
		t.Fatal("RequestGrow: not one request, or half filled")
	}
	if grew, _ := m.Grow(start, nil); grew {
		t.Fatal("grew to its own size")
	}
	insert(8)
	if !asked() || !m.HalfFilled() {
		t.Fatal("did not ask again after another 64 runs")
	}
	if grew, _ := m.Grow(2*start, nil); !grew || m.Stats().Capacity != 2*start {
		t.Fatalf("grow to %d: capacity %d", 2*start, m.Stats().Capacity)
	}
	insertAsks(120, false, "120 of 256 runs")
	insertAsks(8, true, "128 of 256 runs")
	if grew, _ := m.Grow(1<<30, nil); !grew || m.Stats().Capacity != m.Limit() || m.Limit() != 4*start {
		t.Fatalf("grow past the limit: capacity %d, limit %d", m.Stats().Capacity, m.Limit())
	}
	insert(4 * start / memoRun)
	if asked() {
		t.Fatal("asked to grow at its limit")
	}
}

// TestMemoGrowStops: a closed stop ends Grow between steps without publishing: the memo
// keeps its size and its entries, and a later Grow completes.
func TestMemoGrowStops(t *testing.T) {
	p := allProfiles(t)["cbor"]
	r := rand.New(rand.NewPCG(6, 6))
	m := NewGrowingMemo(1<<11, 1<<14, true)
	m.grower.setsStep = 4
	prompts := growPrompts(r, 8, 32)
	var ch Chain
	for _, toks := range prompts {
		runChain(&ch, m, &p, 16, "", "", toks, -1)
	}
	held := heldRuns(m, &p, prompts)
	for _, stage := range []growStage{growPopulated, growCopied} {
		stop := make(chan struct{})
		seen := false
		m.grower.hook = func(s growStage, _ int) {
			if s == stage && !seen {
				seen = true
				close(stop)
			}
		}
		if grew, _ := m.Grow(1<<14, stop); grew {
			t.Fatalf("stopped at stage %d: grew", stage)
		}
		if stage == growPopulated && m.region == nil {
			continue // nothing to populate on the heap
		}
		if !seen || m.Stats().Capacity != 1<<11 {
			t.Fatalf("stopped at stage %d (seen %v): capacity %d", stage, seen, m.Stats().Capacity)
		}
	}
	m.grower.hook = nil
	if grew, _ := m.Grow(1<<14, nil); !grew || m.Stats().Capacity != 1<<14 {
		t.Fatalf("Grow after stops: capacity %d", m.Stats().Capacity)
	}
	after := heldRuns(m, &p, prompts)
	for i := range held {
		for j := range held[i] {
			if held[i][j] && !after[i][j] {
				t.Fatalf("prompt %d run %d lost", i, j)
			}
		}
	}
}

// TestMemoGhosts: a run evicted from a set leaves its ghost in the way that replaced it,
// so a lookup of it is told apart from one of a run never inserted; a way remembers only
// the last run it lost (after four more evictions from the set, the ghost is gone).
func TestMemoGhosts(t *testing.T) {
	m := NewMemo(memoWays * memoRun) // one set
	tab := m.cur()
	run := func(i uint64) memoRunVal {
		v := memoVal(i)
		v.b = i<<32 | i // distinct ghost tags and preferred ways
		return v
	}
	for i := uint64(1); i <= memoWays; i++ {
		v := run(i)
		if _, evicted := tab.insert(&v); evicted {
			t.Fatalf("run %d evicted a run from a set with room", i)
		}
	}
	for i := uint64(1); i <= 2*memoWays; i++ {
		if tab.ghostOf(run(i).a, run(i).b) {
			t.Fatalf("run %d has a ghost before any eviction", i)
		}
	}
	v := run(5)
	if _, evicted := tab.insert(&v); !evicted {
		t.Fatal("a fifth run into a full set evicted nothing")
	}
	lost := 0
	for i := uint64(1); i <= memoWays; i++ {
		var got memoRunVal
		if !tab.lookup(run(i).a, run(i).b, &got) {
			lost++
			if !tab.ghostOf(run(i).a, run(i).b) {
				t.Fatalf("run %d was evicted but left no ghost", i)
			}
		} else if tab.ghostOf(run(i).a, run(i).b) {
			t.Fatalf("run %d is held and has a ghost", i)
		}
	}
	if lost != 1 || tab.ghostOf(run(99).a, run(99).b) {
		t.Fatalf("%d runs lost (want 1), or a run never inserted has a ghost", lost)
	}
	for i := uint64(6); i < 6+2*memoWays; i++ { // every way replaced twice more
		v := run(i)
		tab.insert(&v)
	}
	for i := uint64(1); i <= memoWays; i++ {
		if tab.ghostOf(run(i).a, run(i).b) {
			t.Fatalf("run %d's ghost outlived the replacements of every way", i)
		}
	}
}

// TestMemoOutgrown: the memo reports it has outgrown its size when, in the window since
// it last grew or declined, reasked lookups come at least once per reaskedPer runs
// inserted; the window restarts when Grow answers a due request.
func TestMemoOutgrown(t *testing.T) {
	m := NewGrowingMemo(64*memoRun, 1024*memoRun, false)
	g, reasked := &m.grower, &m.stripes[3].reasked
	if m.Outgrown() {
		t.Fatal("a new memo has outgrown its size")
	}
	g.filled.Store(reaskedPer * 3)
	reasked.Store(2)
	if m.Outgrown() {
		t.Fatal("2 reasked lookups in 768 runs inserted: outgrown")
	}
	reasked.Store(3)
	if !m.Outgrown() || !m.HalfFilled() {
		t.Fatalf("3 reasked lookups in 768 runs inserted: outgrown %v, half filled %v", m.Outgrown(), m.HalfFilled())
	}
	// Declined (Grow to the same size while half filled): a new window.
	if grew, _ := m.Grow(64*memoRun, nil); grew || m.Outgrown() || m.HalfFilled() {
		t.Fatalf("after a declined request: grew %v, outgrown %v, half filled %v", grew, m.Outgrown(), m.HalfFilled())
	}
	reasked.Add(1)
	if !m.Outgrown() {
		t.Fatal("a reasked lookup with nothing inserted since the window began: not outgrown")
	}
	var nilMemo *Memo
	if nilMemo.Outgrown() {
		t.Fatal("a nil memo has outgrown its size")
	}
}

// TestMemoSecondSight: with SetSecondSight a prompt whose first run nobody asked is
// hashed without the memo (no memo hit, nothing inserted, one lookup), the second ask
// remembers its runs, the third takes them from the memo; the keys are those of a chain
// without a memo every time, through Next and KeysAhead batches alike. A prompt sharing
// a remembered first run is served it on its first ask. The doorkeeper forgets all once
// half its bits are set.
func TestMemoSecondSight(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	prompt := func() []int32 {
		toks := make([]int32, 16*40) // 5 whole runs
		for i := range toks {
			toks[i] = int32(r.IntN(150000))
		}
		return toks
	}
	for name, p := range allProfiles(t) {
		m := NewMemo(1 << 12)
		m.SetSecondSight(true)
		toks := prompt()
		plain := runChain(&Chain{}, nil, &p, 16, "l", "s", toks, -1)
		var ch Chain
		runs := len(plain.keys) / memoRun // whole runs (a lookahead profile hashes fewer blocks)
		for ask, want := range []struct{ hits, inserts, probes int }{{0, 0, 1}, {0, runs, -1}, {runs * memoRun, 0, -1}} {
			before := m.Stats().Inserts
			got := runChainAdvance(&ch, m, &p, 16, "l", "s", toks, -1, r)
			probes := ch.mc.probes
			ch.Done()
			if !sameRun(plain, got) {
				t.Fatalf("%s: ask %d: keys differ from a chain without the memo", name, ask+1)
			}
			if ch.MemoHits() != want.hits || int(m.Stats().Inserts-before) != want.inserts || want.probes >= 0 && probes != want.probes {
				t.Fatalf("%s: ask %d: %d memo hits, %d runs inserted, %d lookups; want %+v", name, ask+1,
					ch.MemoHits(), m.Stats().Inserts-before, probes, want)
			}
		}
		// A new prompt with the same first run (and the block after it, whose first
		// tokens the bigram and lookahead strategies read for the run's last block): that
		// run from the memo at once.
		other := append(append([]int32{}, toks[:16*(memoRun+1)]...), prompt()[16*(memoRun+1):]...)
		if got, want := runChain(&ch, m, &p, 16, "l", "s", other, -1), runChain(&Chain{}, nil, &p, 16, "l", "s", other, -1); !sameRun(got, want) || ch.MemoHits() != memoRun {
			t.Fatalf("%s: a prompt sharing a remembered first run: %d memo hits, want %d (same keys: %v)", name, ch.MemoHits(), memoRun, sameRun(got, want))
		}
		ch.Done()
	}
	// The doorkeeper: 4,096 bits for a small memo, cleared when 2,048 are set.
	m := NewMemo(1 << 12)
	m.SetSecondSight(true)
	if len(m.seen)*64 != 1<<12 {
		t.Fatalf("doorkeeper of %d bits, want 4096", len(m.seen)*64)
	}
	if !m.firstSight(1, 2) || m.firstSight(1, 2) {
		t.Fatal("a first run is not seen once, then known")
	}
	for i := uint64(0); m.seenSet.Load() != 0; i++ {
		if i > 1<<16 {
			t.Fatalf("the doorkeeper never cleared: %d bits set", m.seenSet.Load())
		}
		m.firstSight(r.Uint64(), i)
	}
	if !m.firstSight(1, 2) {
		t.Fatal("a cleared doorkeeper still knows a first run")
	}
	var nilMemo *Memo
	nilMemo.SetSecondSight(true) // no panic
}

// TestMemoSecondSightKnowsEvicted: a prompt whose first run the memo held until lately
// (its ghost is in the set) is not a first sight, even once the doorkeeper has forgotten
// it: the ask that misses remembers it again at once.
func TestMemoSecondSightKnowsEvicted(t *testing.T) {
	p := allProfiles(t)["cbor"]
	m := NewMemo(memoWays * memoRun) // one set
	m.SetSecondSight(true)
	toks := make([]int32, 16*memoRun)
	for i := range toks {
		toks[i] = int32(i*31 + 7)
	}
	var ch Chain
	for range 2 { // first sight, then remembered
		runChain(&ch, m, &p, 16, "", "", toks, -1)
		ch.Done()
	}
	tab := m.cur()
	w := -1
	for i := range tab.ents {
		if tab.ents[i].check != 0 {
			w = i
		}
	}
	if w < 0 || m.Stats().Inserts != 1 {
		t.Fatalf("the prompt's run not remembered on its second ask: %+v", m.Stats())
	}
	v := memoVal(99) // another run replaces it: its ghost stays in the way
	tab.write(&tab.ents[w], &v, tab.checkOf(&v))
	for j := range m.seen { // the doorkeeper forgets
		m.seen[j].Store(0)
	}
	runChain(&ch, m, &p, 16, "", "", toks, -1)
	ch.Done()
	if st := m.Stats(); st.Inserts != 2 || st.Reasked != 1 {
		t.Fatalf("an evicted prompt asked again: %d inserts (want 2), %d reasked (want 1)", st.Inserts, st.Reasked)
	}
}
