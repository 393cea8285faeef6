package engine

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

var (
	coldBlocks  = flag.Int("coldblocks", 1<<20, "blocks in the index of the cold-walk benchmarks")
	noProbe     = flag.Bool("noprobe", false, "walk without overlapped probes (A/B of BenchmarkQueryWalkCold)")
	warmPrompts = flag.Int("warmprompts", 16, "prompts BenchmarkQueryWarm asks in turn")
)

// benchWalkMode is the walk of the query benchmarks: without probes with -noprobe.
func benchWalkMode() walkMode {
	if *noProbe {
		return walkLean
	}
	return walkAuto
}

// coldContext stores nprompts prompts of blocks keys each (key of block j of prompt p:
// benchKey(p*blocks+j)) for 8 slots of one instance pair: every slot holds every block on
// disk, slot s its first (s%4+1)/4 on cpu_local and s%4/4 on device.
func coldContext(b *testing.B, prompts, blocks int) *Engine {
	e := New(Config{MaxBlocksPerContext: -1, MemoEntries: 4 * prompts * blocks,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	p := benchProfile(b)
	buf := make([]uint64, blocks)
	for i := 0; i < 8; i++ {
		s := Slot{fmt.Sprintf("inst-%03d", i/4), i % 4}
		if _, err := e.RegisterSlot(ctxA, p, s); err != nil {
			b.Fatal(err)
		}
	}
	for pr := 0; pr < prompts; pr++ {
		for j := range buf {
			buf[j] = benchKey(pr*blocks + j)
		}
		var ops []Op
		for i := 0; i < 8; i++ {
			s := Slot{fmt.Sprintf("inst-%03d", i/4), i % 4}
			ops = append(ops, Op{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: buf},
				Op{Kind: OpStore, Slot: s, Tier: TierCPULocal, Hashes: buf[:blocks*(1+i%4)/4]},
				Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: buf[:blocks*(i%4)/4]})
		}
		if err := e.Apply(ctxA, ops); err != nil {
			b.Fatal(err)
		}
	}
	settled(e)
	return e
}

// BenchmarkQueryWalkCold measures the walk (precomputed keys, no hashing) of 512-block
// prompts that every slot matches to the end, over an index of -coldblocks blocks
// (default 1M): each query asks another prompt, so its table entries and records are
// not in the core's caches. -noprobe walks without the overlapped probes.
func BenchmarkQueryWalkCold(b *testing.B) {
	const blocks = 512
	prompts := max(*coldBlocks/blocks, 1)
	e := coldContext(b, prompts, blocks)
	defer e.Close()
	keys := make([]uint64, prompts*blocks)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	var res Result
	mode := benchWalkMode()
	timeBlocks(b, blocks, func(i int) {
		p := (i * 7919) % prompts
		_ = e.queryKeysWith(ctxA, keys[p*blocks:(p+1)*blocks], nil, blocks*16, "", &res, mode)
	})
	if res.Instances[0].Disk != blocks*16 {
		b.Fatalf("walk stopped early: %d", res.Instances[0].Disk)
	}
}

// BenchmarkQueryCold is BenchmarkQueryWalkCold through the public Query of real prompts
// (vllm_v1 sha256_cbor, 512 blocks) over an index of -coldblocks/4 blocks. "memo": every
// block key is in the key memo (each prompt queried once before), the memo-warm full
// hit; "hashed": no memo, every block SHA-hashed (the walk hashes windows ahead);
// "memo-cold": a prompt nobody asked before, with a server's memo (default size,
// populated): every block SHA-hashed and its runs inserted, as a router's new prompt.
// memo-cold asks each prompt once per server, and starts a new one (untimed) when they
// are used up.
func BenchmarkQueryCold(b *testing.B) {
	const blocks = 512
	prompts := max(*coldBlocks/blocks/4, 1) // hashing the setup is the cost: a quarter
	p := benchProfile(b)
	toks := make([]int32, prompts*blocks*16)
	for i := range toks {
		toks[i] = int32(i*7 + 1)
	}
	keys := make([]uint64, prompts*blocks)
	var ch hashing.Chain
	for pr := 0; pr < prompts; pr++ {
		ch.Reset(&p, 16, "", "", toks[pr*blocks*16:(pr+1)*blocks*16])
		for j := 0; j < blocks; j++ {
			k, err := ch.Next()
			if err != nil {
				b.Fatal(err)
			}
			keys[pr*blocks+j] = k
		}
	}
	for _, name := range []string{"memo", "hashed", "memo-cold"} {
		memo, cold := name != "hashed", name == "memo-cold"
		b.Run(name, func(b *testing.B) {
			entries := 0
			if memo {
				entries = 16 * prompts * blocks // 4-way sets: room enough that few are lost
			}
			if cold {
				entries = hashing.DefaultMemoEntries
			}
			build := func() *Engine {
				e := New(Config{MaxBlocksPerContext: -1, MemoEntries: entries, MemoStartEntries: entries, PopulateMemo: cold,
					Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				for i := 0; i < 8; i++ {
					s := Slot{fmt.Sprintf("inst-%03d", i/4), i % 4}
					if _, err := e.RegisterSlot(ctxA, p, s); err != nil {
						b.Fatal(err)
					}
					if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: keys}}); err != nil {
						b.Fatal(err)
					}
				}
				settled(e)
				return e
			}
			e := build()
			defer func() { e.Close() }()
			var res Result
			mode := benchWalkMode()
			q := &Query{Key: ctxA}
			for pr := 0; memo && !cold && pr < prompts; pr++ { // fills the memo
				q.Tokens = toks[pr*blocks*16 : (pr+1)*blocks*16]
				if err := e.queryWith(q, &res, mode); err != nil {
					b.Fatal(err)
				}
			}
			ask := func(i int) {
				pr := (i * 7919) % prompts
				q.Tokens = toks[pr*blocks*16 : (pr+1)*blocks*16]
				_ = e.queryWith(q, &res, mode)
			}
			if cold {
				// Each prompt once per server: a new one (untimed) when they are used up.
				timeBlocksInPasses(b, blocks, prompts, func() { e.Close(); e = build() }, ask)
			} else {
				timeBlocks(b, blocks, ask)
			}
			// Every block comes from the memo but those its 4-way sets lost to overflow
			// (rare at this load, counted as evictions: each costs one hashed block).
			want := 0
			if memo && !cold {
				want = blocks - int(min(e.MemoStats().Evictions, blocks))
			}
			if res.Instances[0].Disk != blocks*16 || res.fromMemo < want || (!memo || cold) && res.fromMemo != 0 {
				b.Fatalf("walk stopped early or hashed: %d, %d of %d from the memo (%d evictions)",
					res.Instances[0].Disk, res.fromMemo, blocks, e.MemoStats().Evictions)
			}
		})
	}
}

// BenchmarkQueryWarm is the memo-warm full hit a router sees most: 16 prompts of 512
// blocks (vllm_v1 sha256_cbor) asked in turn, each held by one of 8 single-rank
// instances on every tier, in an index of -coldblocks blocks (the rest filler keys). Every
// block key comes from the key memo and the prompts' memo entries, table entries and
// records stay in the caches between turns: what is left is the per-block work.
func BenchmarkQueryWarm(b *testing.B) {
	const blocks = 512
	prompts := *warmPrompts
	p := benchProfile(b)
	toks := make([]int32, prompts*blocks*16)
	for i := range toks {
		toks[i] = int32(i*7 + 1)
	}
	e := New(Config{MaxBlocksPerContext: -1, MemoEntries: hashing.DefaultMemoEntries, MemoStartEntries: hashing.DefaultMemoEntries,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer e.Close()
	slots := make([]Slot, 8)
	for i := range slots {
		slots[i] = Slot{fmt.Sprintf("inst-%03d", i), 0}
		if _, err := e.RegisterSlot(ctxA, p, slots[i]); err != nil {
			b.Fatal(err)
		}
	}
	keys := make([]uint64, blocks)
	var ch hashing.Chain
	for pr := 0; pr < prompts; pr++ {
		promptKeys(b, &ch, &p, toks[pr*blocks*16:(pr+1)*blocks*16], keys)
		s := slots[pr%len(slots)]
		if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: keys},
			{Kind: OpStore, Slot: s, Tier: TierCPULocal, Hashes: keys},
			{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: keys}}); err != nil {
			b.Fatal(err)
		}
	}
	filler := make([]uint64, 4096)
	for n := prompts * blocks; n < *coldBlocks; n += len(filler) {
		for j := range filler {
			filler[j] = benchKey(n + j)
		}
		if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: slots[n/len(filler)%len(slots)], Tier: TierDevice, Hashes: filler}}); err != nil {
			b.Fatal(err)
		}
	}
	settled(e)
	var res Result
	mode := benchWalkMode()
	q := &Query{Key: ctxA}
	ask := func(i int) {
		pr := i % prompts
		q.Tokens = toks[pr*blocks*16 : (pr+1)*blocks*16]
		if err := e.queryWith(q, &res, mode); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 2*prompts; i++ { // fills the memo, then warms the caches
		ask(i)
	}
	timeBlocks(b, blocks, ask)
	hit := res.Instances[(b.N-1)%prompts%len(slots)]
	if hit.Device != blocks*16 || res.fromMemo != blocks {
		b.Fatalf("not a memo-warm full hit: device %d, %d of %d blocks from the memo", hit.Device, res.fromMemo, blocks)
	}
}

// BenchmarkQueryWarmTwoContexts is BenchmarkQueryWarm's memo-warm full hits asked of two
// contexts in turn that hold the same 16 prompts in different records (another tenant,
// the same profile, so the same key memo runs): one context's walks read their records
// through the runs' hints, the other's probe the table; neither overwrites the other's
// hints.
func BenchmarkQueryWarmTwoContexts(b *testing.B) {
	const blocks, prompts = 512, 16
	p := benchProfile(b)
	toks := make([]int32, prompts*blocks*16)
	for i := range toks {
		toks[i] = int32(i*7 + 1)
	}
	ctxB := ContextKey{TenantID: "other", ModelName: "m", BlockSize: 16}
	e := New(Config{MaxBlocksPerContext: -1, MemoEntries: hashing.DefaultMemoEntries, MemoStartEntries: hashing.DefaultMemoEntries,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer e.Close()
	keys := make([]uint64, blocks)
	for ci, ck := range []ContextKey{ctxA, ctxB} {
		slots := make([]Slot, 8)
		for i := range slots {
			slots[i] = Slot{fmt.Sprintf("inst-%03d", i), 0}
			if _, err := e.RegisterSlot(ck, p, slots[i]); err != nil {
				b.Fatal(err)
			}
		}
		if ci == 1 { // B's records at other indices than A's
			for j := range keys {
				keys[j] = benchKey(1<<30 + j)
			}
			if err := e.Apply(ck, []Op{{Kind: OpStore, Slot: slots[0], Tier: TierDevice, Hashes: keys}}); err != nil {
				b.Fatal(err)
			}
		}
		var ch hashing.Chain
		for pr := 0; pr < prompts; pr++ {
			promptKeys(b, &ch, &p, toks[pr*blocks*16:(pr+1)*blocks*16], keys)
			if err := e.Apply(ck, []Op{{Kind: OpStore, Slot: slots[pr%len(slots)], Tier: TierDevice, Hashes: keys}}); err != nil {
				b.Fatal(err)
			}
		}
	}
	settled(e)
	var res Result
	q := &Query{}
	ask := func(i int) {
		q.Key = ctxA
		if i%2 == 1 {
			q.Key = ctxB
		}
		pr := i / 2 % prompts
		q.Tokens = toks[pr*blocks*16 : (pr+1)*blocks*16]
		if err := e.Query(q, &res); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 4*prompts; i++ { // fills the memo, then warms the caches
		ask(i)
	}
	timeBlocks(b, blocks, ask)
	if hit := res.Instances[(b.N-1)/2%prompts%8]; hit.Device != blocks*16 || res.fromMemo != blocks {
		b.Fatalf("not a memo-warm full hit: device %d, %d of %d blocks from the memo", hit.Device, res.fromMemo, blocks)
	}
}

// promptKeys hashes tokens with ch (block size 16) into keys, one per block.
func promptKeys(b *testing.B, ch *hashing.Chain, p *hashing.Profile, tokens []int32, keys []uint64) {
	ch.Reset(p, 16, "", "", tokens)
	for j := range keys {
		k, err := ch.Next()
		if err != nil {
			b.Fatal(err)
		}
		keys[j] = k
	}
}
