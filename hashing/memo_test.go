package hashing

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
)

// chainRun is what a chain produced for one prompt: every key, then the terminating error.
type chainRun struct {
	keys    []uint64
	digests [][32]byte
	known   []bool // digests[i] is block i's (a memo chain knows it at hashed blocks and run ends)
	err     error
}

// runChain consumes up to limit blocks (all when limit < 0) of one prompt with Next.
func runChain(ch *Chain, m *Memo, p *Profile, bs int, lora, salt string, toks []int32, limit int) chainRun {
	return runChainAdvance(ch, m, p, bs, lora, salt, toks, limit, nil)
}

// runChainAdvance is runChain consuming keys, when r is not nil, in random mixes of Next
// and KeysAhead batches taken by Advance (all, part or none of each); a block's digest is
// recorded where the chain exposes it (after Next, after the last block of an Advance), so
// that sameRun compares keys, the exposed digests and the error.
func runChainAdvance(ch *Chain, m *Memo, p *Profile, bs int, lora, salt string, toks []int32, limit int, r *rand.Rand) chainRun {
	ch.ResetMemo(m, p, bs, lora, salt, toks)
	var got chainRun
	add := func(k uint64) {
		got.keys = append(got.keys, k)
		got.digests = append(got.digests, ch.Digest())
		got.known = append(got.known, ch.digestKnown())
	}
	for limit < 0 || len(got.keys) < limit {
		if r != nil && r.IntN(2) == 0 {
			ahead := ch.KeysAhead()
			n := min(len(ahead), r.IntN(len(ahead)+2))
			if limit >= 0 {
				n = min(n, limit-len(got.keys))
			}
			if n > 0 {
				keys := append([]uint64(nil), ahead[:n]...)
				ch.Advance(n)
				for _, k := range keys[:n-1] {
					got.keys = append(got.keys, k)
					got.digests = append(got.digests, [32]byte{})
					got.known = append(got.known, false)
				}
				add(keys[n-1])
				if ch.Hashed() != len(got.keys) {
					return chainRun{err: errors.New("Hashed after Advance")}
				}
				continue
			}
		}
		k, err := ch.Next()
		if err != nil {
			got.err = err
			break
		}
		add(k)
	}
	ch.Done()
	return got
}

func sameRun(a, b chainRun) bool {
	if len(a.keys) != len(b.keys) {
		return false
	}
	for i := range a.keys {
		if a.keys[i] != b.keys[i] || a.known[i] && b.known[i] && a.digests[i] != b.digests[i] {
			return false
		}
	}
	var ta, tb *TokenError
	if errors.As(a.err, &ta) != errors.As(b.err, &tb) {
		return false
	}
	if ta != nil {
		return *ta == *tb
	}
	return a.err == b.err
}

// memoWorkload builds prompts that share prefixes the way router traffic does: repeats,
// extensions, truncations, edits in the middle, and fresh prompts.
func memoWorkload(r *rand.Rand, n int, negatives bool) [][]int32 {
	var out [][]int32
	for range n {
		var toks []int32
		if len(out) > 0 && r.IntN(4) != 0 {
			base := out[r.IntN(len(out))]
			switch r.IntN(4) {
			case 0: // same prompt again
				toks = append(toks, base...)
			case 1: // extension
				toks = append(toks, base...)
				for range r.IntN(80) {
					toks = append(toks, int32(r.IntN(300000)))
				}
			case 2: // truncation
				toks = append(toks, base[:r.IntN(len(base)+1)]...)
			case 3: // one token changed
				toks = append(toks, base...)
				if len(toks) > 0 {
					toks[r.IntN(len(toks))] ^= 1
				}
			}
		} else {
			toks = make([]int32, r.IntN(200))
			for i := range toks {
				toks[i] = int32(r.IntN(300000))
			}
		}
		if negatives && len(toks) > 0 && r.IntN(10) == 0 {
			toks[r.IntN(len(toks))] = -1 - int32(r.IntN(5))
		}
		out = append(out, toks)
	}
	return out
}

// TestMemoChainDifferential: with a memo (large, and tiny so that it evicts constantly)
// every key, digest and error equals the plain chain's, over prompts sharing prefixes in
// every profile, with LoRAs, salts and block sizes drawn at random; consuming only part of
// a prompt (a walk that stops early) changes nothing either. The memo must also serve hits.
func TestMemoChainDifferential(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	strs := []string{"", "", "lora-a", "s1", "é", randString(r, 20)}
	for name, p := range allProfiles(t) {
		for _, entries := range []int{1 << 12, 4} {
			m := NewMemo(entries)
			var plain, memo, adv Chain
			prompts := memoWorkload(r, 400, true)
			for i, toks := range prompts {
				bs := []int{1, 3, 16}[i%3]
				// LoRA and salt repeat per prompt family so that prefixes can hit.
				lora, salt := strs[len(toks)%len(strs)], strs[(len(toks)/7)%len(strs)]
				if i%50 == 0 {
					bs = 14000 // vLLM pickle beyond one frame
					toks = append(toks[:0:0], make([]int32, 30000)...)
				}
				limit := -1
				if r.IntN(3) == 0 {
					limit = r.IntN(20)
				}
				want := runChain(&plain, nil, &p, bs, lora, salt, toks, limit)
				got := runChain(&memo, m, &p, bs, lora, salt, toks, limit)
				if !sameRun(want, got) {
					t.Fatalf("%s memo %d prompt %d (bs %d, %d tokens, lora %q salt %q): memo run differs: %d keys %v vs %d keys %v",
						name, entries, i, bs, len(toks), lora, salt, len(got.keys), got.err, len(want.keys), want.err)
				}
				if memo.Hashed() != len(want.keys) || memo.MemoHits() > memo.Hashed() {
					t.Fatalf("%s: Hashed %d MemoHits %d for %d keys", name, memo.Hashed(), memo.MemoHits(), len(want.keys))
				}
				// The same prompt again, keys taken ahead in batches (Advance).
				if got := runChainAdvance(&adv, m, &p, bs, lora, salt, toks, limit, r); !sameRun(want, got) {
					t.Fatalf("%s memo %d prompt %d (bs %d, %d tokens): Advance run differs: %d keys %v vs %d keys %v",
						name, entries, i, bs, len(toks), len(got.keys), got.err, len(want.keys), want.err)
				}
				if adv.Hashed() != len(want.keys) || adv.MemoHits() > adv.Hashed() {
					t.Fatalf("%s: after Advance, Hashed %d MemoHits %d for %d keys", name, adv.Hashed(), adv.MemoHits(), len(want.keys))
				}
			}
			st := m.Stats()
			if entries > 4 && (st.Hits == 0 || st.Misses == 0 || st.Inserts == 0) {
				t.Errorf("%s memo %d: stats %+v: want hits, misses and inserts", name, entries, st)
			}
			if entries == 4 && st.Evictions == 0 {
				t.Errorf("%s: a 4-entry memo never evicted: %+v", name, st)
			}
		}
	}
}

// TestMemoChainServesPrefix: a repeated prompt is served from the memo but for its last,
// partial run (runs of memoRun blocks are what the memo keeps), an extension hashes only
// its new blocks and that run, and a different salt, LoRA, block size or profile shares
// nothing.
func TestMemoChainServesPrefix(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	toks := make([]int32, 16*40)
	for i := range toks {
		toks[i] = int32(r.IntN(150000))
	}
	ps := allProfiles(t)
	for name, p := range ps {
		m := NewMemo(1 << 12)
		var ch Chain
		first := runChain(&ch, m, &p, 16, "l", "s", toks[:16*30], -1)
		if ch.MemoHits() != 0 {
			t.Fatalf("%s: cold prompt had %d memo hits", name, ch.MemoHits())
		}
		const wantHits = 30 / memoRun * memoRun // whole runs
		again := runChain(&ch, m, &p, 16, "l", "s", toks[:16*30], -1)
		if !sameRun(first, again) || ch.MemoHits() != wantHits {
			t.Fatalf("%s: repeat: %d of %d blocks from the memo, want %d", name, ch.MemoHits(), ch.Hashed(), wantHits)
		}
		for i, k := range again.known {
			if (i%memoRun == memoRun-1 || i >= wantHits) && !k {
				t.Fatalf("%s: repeat: no digest after block %d, a run end or a hashed block", name, i)
			}
		}
		ext := runChain(&ch, m, &p, 16, "l", "s", toks, -1)
		if ch.MemoHits() != wantHits || len(ext.keys) != ch.NumBlocks() {
			t.Fatalf("%s: extension: %d memo hits, want %d", name, ch.MemoHits(), wantHits)
		}
		for _, v := range []struct {
			what       string
			p          Profile
			bs         int
			lora, salt string
		}{{"salt", p, 16, "l", "t"}, {"lora", p, 16, "m", "s"}, {"block size", p, 8, "l", "s"},
			{"profile", ps[map[string]string{"pickle": "cbor", "cbor": "pickle", "sglang": "sglang_bigram", "sglang_bigram": "sglang"}[name]], 16, "l", "s"}} {
			plain := runChain(&Chain{}, nil, &v.p, v.bs, v.lora, v.salt, toks, -1)
			got := runChain(&ch, m, &v.p, v.bs, v.lora, v.salt, toks, -1)
			if !sameRun(plain, got) || ch.MemoHits() != 0 {
				t.Fatalf("%s: other %s: %d memo hits (want 0), same keys %v", name, v.what, ch.MemoHits(), sameRun(plain, got))
			}
		}
	}
}

// TestMemoKeysAhead: keys known ahead are exactly the keys Next returns next; over the
// memoised prefix they come in batches, past it only the next block (hashed, as Next would),
// and the cold suffix costs a logarithmic number of lookups. A chain without a memo has none.
func TestMemoKeysAhead(t *testing.T) {
	p := allProfiles(t)["cbor"]
	toks := make([]int32, 16*2000)
	for i := range toks {
		toks[i] = int32(i * 7)
	}
	m := NewMemo(1 << 14)
	var ch Chain
	want := runChain(&Chain{}, nil, &p, 16, "", "", toks, -1)
	runChain(&ch, m, &p, 16, "", "", toks[:16*150], -1)
	ch.ResetMemo(m, &p, 16, "", "", toks)
	const held = 150 / memoRun * memoRun // the prefix's whole runs
	var ahead []uint64
	batches := 0
	for i := range 2000 {
		if len(ahead) == 0 {
			ahead = append(ahead[:0], ch.KeysAhead()...)
			if i >= held && len(ahead) > 1 {
				t.Fatalf("block %d: %d keys ahead past the memoised prefix", i, len(ahead))
			}
			if i < held && len(ahead) < 2 {
				t.Fatalf("block %d: %d keys ahead inside the memoised prefix", i, len(ahead))
			}
			if i < held {
				batches++
			}
		}
		got, err := ch.Next()
		if err != nil || got != want.keys[i] {
			t.Fatalf("block %d: Next %d (%v), want %d", i, got, err, want.keys[i])
		}
		if len(ahead) > 0 {
			if ahead[0] != got {
				t.Fatalf("block %d: ahead %d, Next %d", i, ahead[0], got)
			}
			ahead = ahead[1:]
		}
	}
	if ch.MemoHits() != held || batches > 8 {
		t.Fatalf("memo hits %d (want %d) in %d batches", ch.MemoHits(), held, batches)
	}
	// The prefix's runs in doubling batches (1+2+...+8 runs, 8 lookups past it at most),
	// then about log2(1850/memoRun) re-probes.
	if ch.mc.probes > held/memoRun+aheadRuns+2*8 {
		t.Fatalf("%d lookups for %d memoised and %d new blocks", ch.mc.probes, held, 2000-held)
	}
	ch.Done()
	var plain Chain
	plain.Reset(&p, 16, "", "", toks)
	if plain.KeysAhead() != nil {
		t.Fatal("keys ahead without a memo")
	}
}

// memoVal returns a run value whose every word derives from seed.
func memoVal(seed uint64) memoRunVal {
	v := memoRunVal{a: seed << 1, b: seed * 0x1234567}
	for i := range v.k {
		v.k[i] = seed*1000 + uint64(i)
	}
	for i := range v.d {
		v.d[i] = seed*2000 + uint64(i)
	}
	return v
}

// TestMemoWriteInterleavings steps two writers through interleavings of their word stores
// on one entry (the entry first holds run A; writer 1 stores B, writer 2 stores C) and
// checks after every step that a lookup of A, B or C either misses or returns that run's
// own keys and digest: a reader never gets another run's words, whatever it races with.
// Every interleaving of 17 stores each is C(34,17), too many: the test takes every
// interleaving of the writers' stores in groups (check, lanes, keys, digest, ref, check:
// C(12,6)) and 20,000 random interleavings store by store.
func TestMemoWriteInterleavings(t *testing.T) {
	m := NewMemo(1) // one set
	vals := []memoRunVal{memoVal(1), memoVal(2), memoVal(3)}
	check := func(where string) {
		for _, v := range vals {
			var got memoRunVal
			if m.cur().lookup(v.a, v.b, &got) && got != v {
				t.Fatalf("%s: lookup of run %d returned another run's words", where, v.a)
			}
		}
	}
	run := func(order []int, groups [][2]int) {
		for w := range m.ents {
			m.ents[w] = memoEntry{}
		}
		if wrote, _ := m.cur().insert(&vals[0]); !wrote {
			t.Fatal("insert into an empty set did not write")
		}
		w := [2]memoWriter{m.cur().newWriter(&m.ents[0], &vals[1]), m.cur().newWriter(&m.ents[0], &vals[2])}
		var n [2]int
		for _, who := range order {
			g := groups[n[who]]
			for k := g[0]; k < g[1]; k++ {
				w[who].step(k)
			}
			n[who]++
			check("interleaving")
		}
	}
	// Groups of stores: check=0; a, b; keys; digest; ref; check.
	groups := [][2]int{{0, 1}, {1, 3}, {3, 3 + memoRun}, {3 + memoRun, 7 + memoRun}, {7 + memoRun, 8 + memoRun}, {8 + memoRun, memoWriteSteps}}
	count := 0
	var walk func(i, j int, order []int)
	walk = func(i, j int, order []int) {
		if i == len(groups) && j == len(groups) {
			count++
			run(order, groups)
			return
		}
		if i < len(groups) {
			walk(i+1, j, append(order, 0))
		}
		if j < len(groups) {
			walk(i, j+1, append(order, 1))
		}
	}
	walk(0, 0, nil)
	if count != 924 {
		t.Fatalf("%d grouped interleavings, want C(12,6)", count)
	}
	single := make([][2]int, memoWriteSteps)
	for k := range single {
		single[k] = [2]int{k, k + 1}
	}
	r := rand.New(rand.NewPCG(4, 4))
	for range 20000 {
		order := make([]int, 0, 2*memoWriteSteps)
		var left [2]int
		left[0], left[1] = memoWriteSteps, memoWriteSteps
		for left[0]+left[1] > 0 {
			who := r.IntN(2)
			if left[who] == 0 {
				who = 1 - who
			}
			order = append(order, who)
			left[who]--
		}
		run(order, single)
	}
	// A complete write by one writer is found.
	m.ents[0] = memoEntry{}
	m.cur().insert(&vals[1])
	var got memoRunVal
	if !m.cur().lookup(vals[1].a, vals[1].b, &got) || got != vals[1] {
		t.Fatal("complete write not found")
	}
}

// TestMemoWriteMatchesSteps: the insert's written-out stores (memoTable.write) leave an
// entry exactly as the stepped writer the interleaving tests use (memoWriter), from an
// empty entry and over another run, and report the same "held a valid entry" flag.
func TestMemoWriteMatchesSteps(t *testing.T) {
	m := NewMemo(1)
	tab := m.cur()
	for _, before := range []memoEntry{{}, {a: 5, b: 6, check: 7, ref: 1<<40 | 1}} {
		v := memoVal(9)
		var byWrite, bySteps memoEntry = before, before
		got := tab.write(&byWrite, &v, tab.checkOf(&v))
		w := tab.newWriter(&bySteps, &v)
		var old uint64
		for k := 0; k < memoWriteSteps; k++ {
			old |= w.step(k)
		}
		if byWrite != bySteps || got != (old != 0) {
			t.Fatalf("from %+v: write %+v (%v), steps %+v (%v)", before, byWrite, got, bySteps, old != 0)
		}
	}
}

// TestMemoConcurrentChains: goroutines sharing one small memo (constant evictions and
// replacements of the same entries) each get exactly the plain chain's keys. Under -race
// this also checks that every shared word is accessed atomically.
func TestMemoConcurrentChains(t *testing.T) {
	p := allProfiles(t)["sglang"]
	prompts := memoWorkload(rand.New(rand.NewPCG(8, 9)), 40, false)
	concurrentChains(t, NewMemo(16), &p, prompts, nil)
	// With the second-sight doorkeeper, whose bits concurrent first sights set (and
	// clear: 4,096 bits, cleared at 2,048) while others read them.
	m := NewMemo(16)
	m.SetSecondSight(true)
	concurrentChains(t, m, &p, prompts, func() error {
		r := rand.New(rand.NewPCG(1, 2))
		for range 6000 {
			m.firstSight(r.Uint64(), r.Uint64())
		}
		return nil
	})
}

// plainRuns returns what a chain without memo produces for each prompt (block size 4).
func plainRuns(p *Profile, salt string, prompts [][]int32) []chainRun {
	want := make([]chainRun, len(prompts))
	for i, toks := range prompts {
		want[i] = runChain(&Chain{}, nil, p, 4, "", salt, toks, -1)
	}
	return want
}

// concurrentChains runs chains on four goroutines over prompts (block size 4, salt "s"),
// three rounds each, with memo m, and beside them beside (when not nil) on a fifth; it
// fails the test when a chain's keys differ from the plain chain's or beside fails.
func concurrentChains(t *testing.T, m *Memo, p *Profile, prompts [][]int32, beside func() error) {
	t.Helper()
	want := plainRuns(p, "s", prompts)
	var wg sync.WaitGroup
	errs := make(chan string, 5)
	for g := range 4 {
		wg.Go(func() {
			var ch Chain
			for k := range 3 * len(prompts) {
				i := (k*7 + g*13) % len(prompts)
				if got := runChain(&ch, m, p, 4, "", "s", prompts[i], -1); !sameRun(want[i], got) {
					errs <- "prompt differs under concurrency"
					return
				}
			}
		})
	}
	if beside != nil {
		wg.Go(func() {
			if err := beside(); err != nil {
				errs <- err.Error()
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestMemoChainZeroAllocs: after warm-up a memo chain allocates nothing per prompt,
// cold (inserting) or warm (served).
func TestMemoChainZeroAllocs(t *testing.T) {
	for name, p := range allProfiles(t) {
		// Whole runs of blocks (the memo keeps whole runs), lookahead tokens included.
		toks := make([]int32, 8192+p.Lookahead)
		for i := range toks {
			toks[i] = int32(i*31) % 150000
		}
		// A memo of 32K runs for the test's 512: a set-associative memo keeps a run only
		// while its set of 4 ways is not overflowed, and with 2K runs a warm prompt lost one
		// of its runs about once in 1,500 tests (the seeds that place runs are random).
		m := NewMemo(1 << 18)
		var ch Chain
		salts := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
		salt := 0
		cold := func() {
			salt++
			ch.ResetMemo(m, &p, 16, "", salts[salt%len(salts)], toks)
			drain(&ch)
			ch.Done()
		}
		warm := func() {
			ch.ResetMemo(m, &p, 16, "", "w", toks)
			drain(&ch)
			ch.Done()
		}
		cold()
		warm()
		if a := testing.AllocsPerRun(5, cold); a != 0 {
			t.Errorf("%s cold: %v allocs", name, a)
		}
		if a := testing.AllocsPerRun(5, warm); a != 0 || ch.MemoHits() != ch.NumBlocks() {
			t.Errorf("%s warm: %v allocs, %d of %d blocks from the memo", name, a, ch.MemoHits(), ch.NumBlocks())
		}
	}
}

func TestNewMemoSizes(t *testing.T) {
	if NewMemo(0) != nil || NewMemo(-1) != nil {
		t.Fatal("a non-positive size must disable the memo")
	}
	for _, c := range []struct{ in, want int }{{1, 4 * memoRun}, {4 * memoRun, 4 * memoRun}, {4*memoRun + 1, 8 * memoRun}, {1000, 1024}} {
		if got := NewMemo(c.in).Stats().Capacity; got != c.want {
			t.Errorf("NewMemo(%d) capacity %d, want %d", c.in, got, c.want)
		}
	}
	var nilMemo *Memo
	if nilMemo.Stats() != (MemoStats{}) {
		t.Error("nil memo has stats")
	}
}

// FuzzMemoChain: for any tokens, block size, LoRA and salt, a chain with a tiny memo,
// asked for the prompt, a prefix of it and the prompt again, returns the plain chain's keys.
func FuzzMemoChain(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(2), uint8(0), "l", "s", uint8(3))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1}, uint8(1), uint8(2), "", "", uint8(1))
	ps := allProfiles(f)
	names := []string{"pickle", "cbor", "sglang", "sglang_bigram"}
	f.Fuzz(func(t *testing.T, raw []byte, bs, prof uint8, lora, salt string, cut uint8) {
		toks := make([]int32, len(raw)/2)
		for i := range toks {
			toks[i] = int32(int16(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8))
		}
		p := ps[names[int(prof)%len(names)]]
		b := 1 + int(bs%8)
		m := NewMemo(8)
		var ch Chain
		for _, n := range []int{len(toks), min(int(cut), len(toks)), len(toks)} {
			want := runChain(&Chain{}, nil, &p, b, lora, salt, toks[:n], -1)
			if got := runChain(&ch, m, &p, b, lora, salt, toks[:n], -1); !sameRun(want, got) {
				t.Fatalf("memo chain differs on %d tokens", n)
			}
		}
	})
}

// lanesOf returns the lanes of every block of a prompt, as a memo chain computes them.
func lanesOf(m *Memo, p *Profile, bs int, lora, salt string, toks []int32) (a, b []uint64) {
	var ch Chain
	ch.ResetMemo(m, p, bs, lora, salt, toks)
	for ch.mc.cx < ch.NumBlocks() {
		ch.advance()
		a, b = append(a, ch.mc.la), append(b, ch.mc.lb)
	}
	return a, b
}

// TestMemoLostRunCostsItsBlocks fills a memo to half its capacity (the load a server
// with a million indexed blocks sees), so that 4-way sets overflow and evict, then asks
// every prompt again. A block evicted from the middle of a memoised prompt costs that
// block's SHA-256 only: every block still in the memo is taken from it, unless two
// neighbours were both lost (the sign of a cold suffix, after which lookups back off),
// and a prompt nobody asked before pays a handful of lookups.
func TestMemoLostRunCostsItsBlocks(t *testing.T) {
	p := allProfiles(t)["cbor"]
	const entries, blocks, bs = 1 << 15, 512, 16
	m := NewMemo(entries)
	r := rand.New(rand.NewPCG(15, 1))
	prompt := func() []int32 {
		toks := make([]int32, blocks*bs)
		for i := range toks {
			toks[i] = int32(r.IntN(151936))
		}
		return toks
	}
	prompts := make([][]int32, entries/2/blocks)
	var ch Chain
	for i := range prompts {
		prompts[i] = prompt()
		runChain(&ch, m, &p, bs, "", "s", prompts[i], -1)
	}
	const runs = blocks / memoRun
	st := m.Stats()
	if st.Inserts != uint64(len(prompts)*runs) || st.Evictions == 0 {
		t.Fatalf("after the fill: %+v; want %d inserts and some evictions", st, len(prompts)*runs)
	}
	present := 0
	for _, toks := range prompts {
		a, b := lanesOf(m, &p, bs, "", "s", toks)
		for j := memoRun - 1; j < len(a); j += memoRun {
			var v memoRunVal
			if m.cur().lookup(a[j], b[j], &v) {
				present++
			}
		}
	}
	if uint64(present) != st.Inserts-st.Evictions {
		t.Fatalf("%d entries present, want inserts-evictions %d", present, st.Inserts-st.Evictions)
	}
	var there, taken, lost, isolated int
	for i, toks := range prompts {
		// What the memo holds of this prompt now (asking earlier prompts again re-inserted
		// their lost blocks, which may have evicted some of this one's).
		a, b := lanesOf(m, &p, bs, "", "s", toks)
		have := make([]bool, runs)
		n, pairs := 0, 0
		for r := range have {
			j := r*memoRun + memoRun - 1
			var v memoRunVal
			if have[r] = m.cur().lookup(a[j], b[j], &v); have[r] {
				n += memoRun
			} else if r > 0 && !have[r-1] {
				pairs++
			}
		}
		want := runChain(&Chain{}, nil, &p, bs, "", "s", toks, -1)
		got := runChain(&ch, m, &p, bs, "", "s", toks, -1)
		if !sameRun(want, got) {
			t.Fatalf("prompt %d: keys differ with the memo", i)
		}
		hits := ch.MemoHits()
		if hits > n || pairs == 0 && hits != n {
			t.Fatalf("prompt %d: %d blocks from the memo, which held %d of %d (%d adjacent lost runs)", i, hits, n, blocks, pairs)
		}
		if pairs == 0 {
			isolated++
		}
		there, taken, lost = there+n, taken+hits, lost+blocks-n
	}
	t.Logf("load %.0f%%: %d evictions in the fill; asked again: %d of %d blocks held, %d taken; %d of %d prompts lost no two neighbouring runs",
		100*float64(len(prompts)*blocks)/entries, st.Evictions, there, len(prompts)*blocks, taken, isolated, len(prompts))
	if lost == 0 || float64(taken) < 0.99*float64(there) {
		t.Fatalf("%d lost blocks; %d of the %d held were taken from the memo", lost, taken, there)
	}
	// A prompt never asked: three lookups find it cold, then re-probes at doubling gaps.
	runChain(&ch, m, &p, bs, "", "s", prompt(), -1)
	if ch.MemoHits() != 0 || ch.mc.probes > 2+12 {
		t.Fatalf("cold prompt: %d memo hits, %d lookups for %d blocks", ch.MemoHits(), ch.mc.probes, blocks)
	}
}

// fullScanInsert is Memo.insert without its preferred-way shortcut: every way read, the
// policy as documented on Memo (a duplicate is not written; the victim is an empty way,
// else an unreferenced one, the preferred way first in both cases; else the preferred
// way after clearing the others' reference bits).
func fullScanInsert(m *memoTable, v *memoRunVal) (wrote, evicted bool) {
	s := m.set(v.a)
	p := s + pref(v.b)
	ck := m.checkOf(v)
	empty, unref := -1, -1
	for i := s; i < s+memoWays; i++ {
		e := &m.ents[i]
		if e.check == ck && e.a == v.a && e.b == v.b {
			return false, false
		}
		if e.check == 0 && (empty < 0 || i == p) {
			empty = i
		}
		if e.ref&1 == 0 && (unref < 0 || i == p) {
			unref = i
		}
	}
	victim := empty
	if victim < 0 {
		victim = unref
	}
	if victim < 0 {
		victim = p
		for i := s; i < s+memoWays; i++ {
			if i != victim {
				m.ents[i].ref &^= 1
			}
		}
	}
	evicted = m.ents[victim].check != 0
	var ghost uint64 // the replaced run's ghost (see ghostTag)
	if evicted {
		ghost = ghostTag(m.ents[victim].b) << 1
	}
	m.ents[victim] = memoEntry{a: v.a, b: v.b, k: v.k, d: v.d, ref: 1 | ghost, check: ck}
	return true, evicted
}

// TestMemoInsertMatchesFullScan: inserts through a chain's flush (preferred line first,
// the whole set only when the preferred way is taken) leave the memo exactly as the
// full-scan policy does, entry for entry, over random inserts (repeats included) and
// lookups (which set reference bits) into a few sets: the shortcut changes which lines
// are read, never which way an entry goes to.
func TestMemoInsertMatchesFullScan(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	m := NewMemo(32 * memoRun) // 8 sets
	ref := &memoTable{ents: make([]memoEntry, len(m.ents)), setMask: m.cur().setMask, ck: &m.ck}
	pool := make([]memoRunVal, 120)
	for i := range pool {
		pool[i] = memoVal(r.Uint64())
		pool[i].a, pool[i].b = r.Uint64(), r.Uint64()
	}
	var mc memoChain
	mc.reset(m)
	shortcuts := 0
	for step := 0; step < 4000; step++ {
		k := &pool[r.IntN(len(pool))]
		if r.IntN(3) == 0 {
			var v1, v2 memoRunVal
			if m.cur().lookup(k.a, k.b, &v1) != ref.lookup(k.a, k.b, &v2) || v1 != v2 {
				t.Fatalf("step %d: lookups differ", step)
			}
			continue
		}
		if m.cur().preferredEmpty(k.a, k.b) {
			shortcuts++
		}
		before := mc.inserts
		mc.pend = append(mc.pend, *k)
		mc.flush()
		wrote, _ := fullScanInsert(ref, k)
		if (mc.inserts != before) != wrote {
			t.Fatalf("step %d: flush wrote %v, full scan %v", step, mc.inserts != before, wrote)
		}
		for i := range m.ents {
			if m.ents[i] != ref.ents[i] {
				t.Fatalf("step %d: entry %d is %+v, full scan %+v", step, i, m.ents[i], ref.ents[i])
			}
		}
	}
	if shortcuts < 8 || mc.evictions == 0 {
		t.Fatalf("workload too easy: %d shortcut inserts, %d evictions", shortcuts, mc.evictions)
	}
}

// TestAdvanceCountsLikeNext: a chain consuming a prompt through KeysAhead and Advance (in
// random batches, mixed with Next) counts the same memo hits and SHA-hashed blocks as one
// calling Next for every block, given the same memo contents: prompts whose first part is
// memoised and the rest new, so that batches mix memo keys with blocks KeysAhead hashed.
func TestAdvanceCountsLikeNext(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	for name, p := range allProfiles(t) {
		for round := range 40 {
			toks := make([]int32, 16*(8+r.IntN(120)))
			for i := range toks {
				toks[i] = int32(r.IntN(151936))
			}
			known := 16 * r.IntN(len(toks)/16+1)
			// Two memos with the same contents: the prompt's first known tokens asked once.
			var next, adv Chain
			m1, m2 := NewMemo(1<<12), NewMemo(1<<12)
			runChain(&next, m1, &p, 16, "", "", toks[:known], -1)
			runChain(&adv, m2, &p, 16, "", "", toks[:known], -1)
			want := runChain(&next, m1, &p, 16, "", "", toks, -1)
			got := runChainAdvance(&adv, m2, &p, 16, "", "", toks, -1, r)
			if !sameRun(want, got) {
				t.Fatalf("%s round %d: keys differ", name, round)
			}
			if adv.MemoHits() != next.MemoHits() || adv.Hashed() != next.Hashed() {
				t.Fatalf("%s round %d (%d blocks, %d memoised): Advance counts %d hits of %d, Next %d of %d",
					name, round, len(toks)/16, known/16, adv.MemoHits(), adv.Hashed(), next.MemoHits(), next.Hashed())
			}
		}
	}
}

// TestMemoBytesMatchesNewMemo: MemoBytes predicts the memory of the memo NewMemo builds,
// so that a configuration is checked before anything is allocated.
func TestMemoBytesMatchesNewMemo(t *testing.T) {
	for _, blocks := range []int{-1, 0, 1, 31, 32, 33, 1000, 1 << 16} {
		m := NewMemo(blocks)
		if got, want := MemoBytes(blocks), int64(m.Bytes()); got != want {
			t.Errorf("MemoBytes(%d) = %d, NewMemo(%d).Bytes() = %d", blocks, got, blocks, want)
		}
	}
	if got := MemoBytes(200_000_000); got != 1<<25*MemoEntryBytes {
		t.Errorf("MemoBytes(2e8) = %d, want %d", got, 1<<25*MemoEntryBytes)
	}
}
