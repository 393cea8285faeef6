package engine

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/conductor-go/conductor/hashing"
)

var bigMem = flag.Bool("bigmem", false, "run the 10M-block resident-memory benchmarks (~1 GiB)")

// benchKey is splitmix64 of i: block keys are SHA-256 projections, i.e. random bits.
func benchKey(i int) uint64 {
	z := uint64(i) + 0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

func benchProfile(b *testing.B) hashing.Profile {
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// benchContext registers nslots slots (8 ranks per instance) and stores blocks so that a
// query over keys walks every block: every slot holds all blocks on disk, and the device
// and cpu_local tiers end at different depths per slot.
func benchContext(b *testing.B, nslots int, keys []uint64, extra int) *Engine {
	e := New(Config{MaxBlocksPerContext: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	p := benchProfile(b)
	for i := 0; i < nslots; i++ {
		s := Slot{fmt.Sprintf("inst-%03d", i/8), i % 8}
		if _, err := e.RegisterSlot(ctxA, p, s); err != nil {
			b.Fatal(err)
		}
		ops := []Op{
			{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: keys},
			{Kind: OpStore, Slot: s, Tier: TierCPULocal, Hashes: keys[:len(keys)*(1+i%4)/4]},
			{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: keys[:len(keys)*(i%4)/4]},
		}
		if err := e.Apply(ctxA, ops); err != nil {
			b.Fatal(err)
		}
	}
	// Unrelated blocks make the table larger than the prompt.
	buf := make([]uint64, 4096)
	s := Slot{"inst-000", 0}
	for done := 0; done < extra; done += len(buf) {
		for j := range buf {
			buf[j] = benchKey(1<<30 + done + j)
		}
		if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: buf}}); err != nil {
			b.Fatal(err)
		}
	}
	// Measure the steady state: let the writer finish a table migration the stores left
	// running (it does so between requests, in bounded steps).
	settled(e)
	return e
}

// timeBlocks runs op(i) for i < b.N on a thread of its own with the timer reset, reports
// that thread's CPU per block (blocks per op: on a shared machine wall time also counts
// waiting for a CPU) and stops the timer.
func timeBlocks(b *testing.B, blocks int, op func(i int)) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	c0 := threadCPU()
	for i := 0; i < b.N; i++ {
		op(i)
	}
	b.ReportMetric(float64(threadCPU()-c0)/float64(b.N*blocks), "cpu-ns/block")
	b.StopTimer()
}

// timeBlocksInPasses is timeBlocks for ops that each state serves once: op(i) gets i in
// [0, pass), and after every pass ops, fresh (neither timed nor counted) makes a new state.
func timeBlocksInPasses(b *testing.B, blocks, pass int, fresh func(), op func(i int)) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	var cpu time.Duration
	for i := 0; i < b.N; i++ {
		if i > 0 && i%pass == 0 {
			b.StopTimer()
			fresh()
			b.StartTimer()
		}
		c0 := threadCPU()
		op(i % pass)
		cpu += threadCPU() - c0
	}
	b.ReportMetric(float64(cpu)/float64(b.N*blocks), "cpu-ns/block")
	b.StopTimer()
}

// BenchmarkQueryWalk measures the walk alone (precomputed keys, no hashing) over a prompt
// of 1024 blocks that every slot matches to the end. "hot": the table holds just the
// prompt; "table1M": one million other blocks share the table (cache misses).
func BenchmarkQueryWalk(b *testing.B) {
	const blocks = 1024
	keys := make([]uint64, blocks)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	for _, extra := range []int{0, 1 << 20} {
		for _, nslots := range []int{8, 64, 256} {
			name := fmt.Sprintf("hot/slots=%d", nslots)
			if extra > 0 {
				name = fmt.Sprintf("table1M/slots=%d", nslots)
			}
			b.Run(name, func(b *testing.B) {
				e := benchContext(b, nslots, keys, extra)
				defer e.Close()
				var res Result
				mode := benchWalkMode()
				if err := e.queryKeysWith(ctxA, keys, nil, blocks*16, "", &res, mode); err != nil {
					b.Fatal(err)
				}
				if res.Instances[0].Disk != blocks*16 {
					b.Fatalf("walk stopped early: %d", res.Instances[0].Disk)
				}
				timeBlocks(b, blocks, func(int) { _ = e.queryKeysWith(ctxA, keys, nil, blocks*16, "", &res, mode) })
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*blocks), "ns/block")
			})
		}
	}
}

// BenchmarkQueryWalkShrinking is the walk's other extreme: 60 slots whose disk sets end at
// blocks 1, 2, ..., 60, so that a set loses a slot at every block and walk1's loop reads
// every record itself (sameRun's runs are all empty).
func BenchmarkQueryWalkShrinking(b *testing.B) {
	const slots = 60
	keys := make([]uint64, slots+4)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	e := New(Config{})
	defer e.Close()
	p := benchProfile(b)
	for i := range slots {
		s := Slot{"inst", i}
		if _, err := e.RegisterSlot(ctxA, p, s); err != nil {
			b.Fatal(err)
		}
		if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDisk, Hashes: keys[:i+1]}}); err != nil {
			b.Fatal(err)
		}
	}
	settled(e)
	var res Result
	if err := e.QueryKeys(ctxA, keys, len(keys)*16, "", &res); err != nil {
		b.Fatal(err)
	}
	if res.w.walked != slots+1 {
		b.Fatalf("walked %d blocks, want %d", res.w.walked, slots+1)
	}
	timeBlocks(b, slots, func(int) { _ = e.QueryKeys(ctxA, keys, len(keys)*16, "", &res) })
}

// BenchmarkQueryHashed is a full public Query (vLLM sha256_cbor hashing included) of a
// 16K-token prompt, 64 slots.
func BenchmarkQueryHashed(b *testing.B) {
	p := benchProfile(b)
	tokens := make([]int32, 16*1024)
	for i := range tokens {
		tokens[i] = int32(i * 7)
	}
	var c hashing.Chain
	c.Reset(&p, 16, "", "", tokens)
	keys := make([]uint64, c.NumBlocks())
	for i := range keys {
		k, err := c.Next()
		if err != nil {
			b.Fatal(err)
		}
		keys[i] = k
	}
	e := benchContext(b, 64, keys, 0)
	defer e.Close()
	q := &Query{Key: ctxA, Tokens: tokens}
	var res Result
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := e.Query(q, &res); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/block")
}

// procCPU returns the CPU time (user and system) the process has used.
func procCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuClock follows a benchmark's timer and adds up the process CPU time spent while it
// runs, so that a throughput can be read per CPU second too: on a machine shared with
// other work, wall time also counts the time the benchmark waited for a CPU.
type cpuClock struct {
	b          *testing.B
	from, used time.Duration
}

func (c *cpuClock) reset() { c.b.ResetTimer(); c.used, c.from = 0, procCPU() }
func (c *cpuClock) stop()  { c.b.StopTimer(); c.used += procCPU() - c.from }
func (c *cpuClock) start() { c.from = procCPU(); c.b.StartTimer() }

// report reports ops per CPU second of the timed part (the timer running).
func (c *cpuClock) report(ops int, unit string) {
	c.used += procCPU() - c.from
	c.b.ReportMetric(float64(ops)/c.used.Seconds(), unit)
}

// BenchmarkApply measures one writer: batches of 64 hashes through Apply (hand-off to the
// context writer included), reported as block-ops/s.
func BenchmarkApply(b *testing.B) {
	const batch = 64
	newEngine := func(b *testing.B) (*Engine, Slot) {
		e := New(Config{MaxBlocksPerContext: -1})
		s := Slot{"a", 0}
		if _, err := e.RegisterSlot(ctxA, benchProfile(b), s); err != nil {
			b.Fatal(err)
		}
		return e, s
	}
	report := func(b *testing.B, cc *cpuClock) {
		b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "block-ops/s")
		cc.report(b.N*batch, "block-ops/cpu-s")
	}
	// store-new: every hash is a new block (table inserts and growth); the context is
	// cleared (and swept), untimed, every 8192 batches to bound memory.
	b.Run("store-new", func(b *testing.B) {
		e, s := newEngine(b)
		defer e.Close()
		hs := make([]uint64, batch)
		ops := []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: hs}}
		b.ReportAllocs()
		cc := &cpuClock{b: b}
		cc.reset()
		for i := 0; i < b.N; i++ {
			if i%8192 == 8191 {
				cc.stop()
				_ = e.Apply(ctxA, []Op{{Kind: OpClear, Slot: s, ClearTiers: MaskAllEngine}})
				settle(b, e, ctxA) // the clear's sweep too, untimed
				cc.start()
			}
			for j := range hs {
				hs[j] = benchKey(i*batch + j)
			}
			_ = e.Apply(ctxA, ops)
		}
		report(b, cc)
	})
	// store-existing: the blocks exist, the slot bit is set again and the write order
	// refreshed (engines re-announcing blocks).
	b.Run("store-existing", func(b *testing.B) {
		e, s := newEngine(b)
		defer e.Close()
		all := make([]uint64, 1<<16)
		for i := range all {
			all[i] = benchKey(i)
		}
		_ = e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: all}})
		ops := []Op{{Kind: OpStore, Slot: s, Tier: TierDevice}}
		b.ReportAllocs()
		cc := &cpuClock{b: b}
		cc.reset()
		for i := 0; i < b.N; i++ {
			off := (i * batch) & (len(all) - 1)
			ops[0].Hashes = all[off : off+batch]
			_ = e.Apply(ctxA, ops)
		}
		report(b, cc)
	})
	// remove: each batch removes 64 stored blocks (record deletion); refilled untimed.
	b.Run("remove", func(b *testing.B) {
		e, s := newEngine(b)
		defer e.Close()
		const refill = 1024
		all := make([]uint64, refill*batch)
		for i := range all {
			all[i] = benchKey(i)
		}
		ops := []Op{{Kind: OpRemove, Slot: s, Tier: TierDevice}}
		b.ReportAllocs()
		cc := &cpuClock{b: b}
		cc.reset()
		for i := 0; i < b.N; i++ {
			if i%refill == 0 {
				cc.stop()
				_ = e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: all}})
				cc.start()
			}
			off := (i % refill) * batch
			ops[0].Hashes = all[off : off+batch]
			_ = e.Apply(ctxA, ops)
		}
		report(b, cc)
	})
	// shared-store / shared-remove: Mooncake bindings (SGLang HiCache on a Mooncake store:
	// the object key is the block's 64 hex digits, K and V components, one op each) of
	// new blocks stored, then removed (the binding with its last component, and its
	// block); 64K blocks stored and removed in turn, the other half untimed.
	for _, kind := range []OpKind{OpSharedStore, OpSharedRemove} {
		name := map[OpKind]string{OpSharedStore: "shared-store", OpSharedRemove: "shared-remove"}[kind]
		b.Run(name, func(b *testing.B) {
			e, _ := newEngine(b)
			defer e.Close()
			const blocks = 1 << 16
			stores, removes := sharedOps(nil, OpSharedStore, 0, blocks), sharedOps(nil, OpSharedRemove, 0, blocks)
			timed, other := stores, removes
			if kind == OpSharedRemove {
				timed, other = removes, stores
				_ = e.Apply(ctxA, stores)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				off := (i * 2 * batch) % len(timed)
				if i > 0 && off == 0 {
					b.StopTimer()
					_ = e.Apply(ctxA, other)
					b.StartTimer()
				}
				_ = e.Apply(ctxA, timed[off:off+2*batch])
			}
			b.ReportMetric(float64(b.N*2*batch)/b.Elapsed().Seconds(), "binding-ops/s")
		})
	}
}

// BenchmarkClearSlot measures the whole work of an OpClear of a slot owning 1M blocks (a
// stale engine or AllBlocksCleared): the clear itself is one short step (clear.go); the
// sweep of the record arena that follows, no per-slot ownership lists, is timed here in
// one go (settle) although the writer spreads it over later steps.
func BenchmarkClearSlot(b *testing.B) {
	const n = 1 << 20
	e := New(Config{MaxBlocksPerContext: -1})
	defer e.Close()
	s := Slot{"a", 0}
	if _, err := e.RegisterSlot(ctxA, benchProfile(b), s); err != nil {
		b.Fatal(err)
	}
	buf := make([]uint64, 4096)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for done := 0; done < n; done += len(buf) {
			for j := range buf {
				buf[j] = benchKey(done + j)
			}
			_ = e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: buf}})
		}
		b.StartTimer()
		_ = e.Apply(ctxA, []Op{{Kind: OpClear, Slot: s, ClearTiers: MaskAllEngine}})
		settle(b, e, ctxA) // the sweep: the work of the clear, spread over steps otherwise
	}
	if st, _ := e.Stats(ctxA); st.Blocks != 0 {
		b.Fatalf("blocks after clear = %d", st.Blocks)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/block")
}

// BenchmarkResidentBytes fills one context and reports per block the Go heap it holds
// (runtime.MemStats.HeapInuse after GC, minus the empty engine: "heap-bytes/block") and
// the process's resident memory growth ("rss-bytes/block", which counts the tables and
// record slabs mapped outside the heap; free heap pages are returned first, so that the
// garbage the benchmark makes building its ops does not count; the whole test process, so indicative: the
// product figure is the spawned binary's, see bench/). The 10M-block cases run only
// with -bigmem.
func BenchmarkResidentBytes(b *testing.B) {
	sizes := []int{1_000_000}
	if *bigMem {
		sizes = append(sizes, 10_000_000)
	}
	for _, n := range sizes {
		for _, nslots := range []int{8, 64} {
			b.Run(fmt.Sprintf("blocks=%dM/slots=%d", n/1_000_000, nslots), func(b *testing.B) {
				b.ReportAllocs()
				var heap, rss float64
				for i := 0; i < b.N; i++ {
					heap, rss = residentPerBlock(b, n, nslots)
				}
				b.ReportMetric(heap, "heap-bytes/block")
				b.ReportMetric(rss, "rss-bytes/block")
			})
		}
		// Mooncake-bound blocks: each block held by one shared binding whose object key is
		// the block's 64-hex-digit hash with K and V components (SGLang HiCache on a
		// Mooncake store), no engine slot.
		// 100K of them at 1M unless -bigmem: a Mooncake block takes about five times an
		// engine block's time to index (two ops, a binding look-up each) and, with its
		// compact binding (bindings.go: a 32-byte entry, the key's first 64 bits its block
		// hash, read from the block's engine record, and a block-index slot), about 1.85
		// times its memory (-bigmem, RSS bytes per block: 1M 90.0 against 49.2, 10M 84.3
		// against 45.5; 98.1 and 92.3 with 40-byte entries, 123 at 1M with 56-byte entries
		// and two indexes, 450 heap / 621 RSS bytes with Go-map bindings).
		nm := n
		if !*bigMem {
			nm = n / 10
		}
		b.Run(fmt.Sprintf("blocks=%dK/mooncake", nm/1000), func(b *testing.B) {
			var heap, rss float64
			for i := 0; i < b.N; i++ {
				heap, rss = residentPerSharedBlock(b, nm)
			}
			b.ReportMetric(heap, "heap-bytes/block")
			b.ReportMetric(rss, "rss-bytes/block")
		})
	}
}

func residentPerSharedBlock(b *testing.B, n int) (heap, rss float64) {
	return residentAfter(b, n, func(e *Engine) {
		if _, err := e.RegisterSlot(ctxA, benchProfile(b), Slot{"inst-000", 0}); err != nil {
			b.Fatal(err)
		}
		ops := make([]Op, 0, 2048)
		for done := 0; done < n; done += 1024 {
			ops = sharedOps(ops[:0], OpSharedStore, done, min(1024, n-done))
			if err := e.Apply(ctxA, ops); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// sharedOps appends the Mooncake Store ops of the given kind (a K and a V object on the
// shared CPU tier) of the blocks benchKey(from) .. benchKey(from+n-1).
func sharedOps(ops []Op, kind OpKind, from, n int) []Op {
	for i := from; i < from+n; i++ {
		h := benchKey(i)
		obj := fmt.Sprintf("%016x%016x%016x%016x", h, h^1, h^2, h^3)
		for _, comp := range []string{"_0_k", "_0_v"} {
			ops = append(ops, Op{Kind: kind, Source: "tcp://10.0.0.1:50001", Backend: "mooncake",
				ObjectKey: obj, Component: comp, SharedTier: SharedCPU, Hash: h})
		}
	}
	return ops
}

// residentAfter returns the heap and resident memory per block that an engine holding
// n blocks (put there by fill) takes, in the steady state (no table migration or slab
// release pending).
func residentAfter(b *testing.B, n int, fill func(e *Engine)) (heap, rss float64) {
	var before, after runtime.MemStats
	debug.FreeOSMemory() // a GC, and the free heap pages (the ops built on the way) go back
	runtime.ReadMemStats(&before)
	rss0 := processRSS(b)
	e := New(Config{MaxBlocksPerContext: -1})
	fill(e)
	if st, _ := e.Stats(ctxA); st.Blocks != n {
		b.Fatalf("blocks = %d, want %d", st.Blocks, n)
	}
	settle(b, e, ctxA)
	debug.FreeOSMemory()
	runtime.ReadMemStats(&after)
	rss1 := processRSS(b)
	runtime.KeepAlive(e)
	e.Close()
	return float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n), float64(rss1-rss0) / float64(n)
}

// processRSS returns the resident memory of this process, from /proc/self/statm.
func processRSS(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		b.Fatal(err)
	}
	var size, rss int64
	if _, err := fmt.Sscan(string(data), &size, &rss); err != nil {
		b.Fatal(err)
	}
	return rss * int64(os.Getpagesize())
}

func residentPerBlock(b *testing.B, n, nslots int) (heap, rss float64) {
	return residentAfter(b, n, func(e *Engine) {
		buf := make([]uint64, 4096)
		p := benchProfile(b)
		slots := make([]Slot, nslots)
		for i := range slots {
			slots[i] = Slot{fmt.Sprintf("inst-%03d", i/8), i % 8}
			if _, err := e.RegisterSlot(ctxA, p, slots[i]); err != nil {
				b.Fatal(err)
			}
		}
		ops := make([]Op, 1)
		for done := 0; done < n; done += len(buf) {
			m := min(len(buf), n-done)
			for j := 0; j < m; j++ {
				buf[j] = benchKey(done + j)
			}
			s := slots[(done/len(buf))%nslots]
			ops[0] = Op{Kind: OpStore, Slot: s, Tier: EngineTier((done / len(buf)) % 3), Hashes: buf[:m]}
			if err := e.Apply(ctxA, ops); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkWriterSteps grows one context from empty by batches of 64 new blocks and
// reports the longest and the 99th-percentile writer step (one applied request, timed on
// the writer goroutine): "grow" without a capacity, "evict" with a capacity of half the
// blocks, counting only the steps applied at capacity (each new block evicts the oldest),
// "clear" the step of an OpClear of the slot owning every block (SGLang AllBlocksCleared,
// a retraction) and the n/64 store steps of another slot that follow it (its sweep).
// "widen" stores every block with one of 21 slots (packed records) and records the steps
// from the registration of a 22nd slot (which widens every record) until it is
// acknowledged, while 64-block store batches go on; "clears" issues 70 clears of a slot
// owning every block, one Apply each (past 62 pending clears, a clear waits for the sweep),
// driven by empty requests, and records every step until the last is acknowledged. Both
// run without idle steps (the step hook times requests only), so that all the work is
// timed.
// Wall time (-wall-µs) includes the time other processes hold the CPU; thread CPU time
// (-cpu-µs, the writer's thread, page faults included) does not. 256K blocks by default;
// 10M with -bigmem.
func BenchmarkWriterSteps(b *testing.B) {
	n := 1 << 18
	if *bigMem {
		n = 10_000_000
	}
	for _, mode := range []string{"grow", "evict", "clear", "shared", "clear-shared", "widen", "clears"} {
		n := n
		if strings.HasSuffix(mode, "shared") {
			n = min(n/4, 2_000_000) // Mooncake-bound blocks: 64K, 2M with -bigmem
		}
		b.Run(fmt.Sprintf("%s/blocks=%d", mode, n), func(b *testing.B) {
			var wall, cpu []time.Duration
			var faults int64
			for i := 0; i < b.N; i++ {
				wall, cpu, faults = writerSteps(b, n, mode)
			}
			b.ReportMetric(float64(faults), "max-faults/step")
			b.ReportMetric(float64(wall[len(wall)-1].Microseconds()), "max-wall-µs")
			b.ReportMetric(float64(wall[len(wall)*99/100].Microseconds()), "p99-wall-µs")
			b.ReportMetric(float64(cpu[len(cpu)-1].Microseconds()), "max-cpu-µs")
			b.ReportMetric(float64(cpu[len(cpu)*99/100].Microseconds()), "p99-cpu-µs")
			over := len(cpu) - sort.Search(len(cpu), func(i int) bool { return cpu[i] > time.Millisecond })
			b.ReportMetric(float64(over), "steps-over-1ms-cpu")
			b.ReportMetric(float64(len(cpu)), "steps")
		})
	}
}

// stepUntil drives ctxA's writer with empty requests (one step each) until done closes.
func stepUntil(b *testing.B, e *Engine, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		default:
			if err := e.Apply(ctxA, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// releasePending is the number of retired table words c has still to give back.
func releasePending(c *cacheContext) int {
	n := 0
	for _, w := range c.toRelease {
		n += len(w)
	}
	return n
}

// threadCPU returns the CPU time of the calling thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// threadFaults returns the page faults (minor) of the calling thread.
func threadFaults() int64 {
	var ru syscall.Rusage
	const rusageThread = 1
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

// writerSteps returns the sorted wall and thread-CPU durations of the recorded steps, and
// the most page faults one of them took.
func writerSteps(b *testing.B, n int, mode string) (wall, cpu []time.Duration, maxFaults int64) {
	const batch = 64
	evict := mode == "evict"
	limit := -1
	if evict {
		limit = n / 2
	}
	e := New(Config{MaxBlocksPerContext: limit, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer e.Close()
	wall = make([]time.Duration, 0, n/batch+16)
	cpu = make([]time.Duration, 0, n/batch+16)
	record, locked := false, false
	var w0 time.Time
	var c0 time.Duration
	var f0 int64
	var rel0, migr0 int
	c := func() *cacheContext { return e.lookup(ctxA) }
	e.hooks = &testHooks{step: func(begin bool) {
		if !locked {
			runtime.LockOSThread() // the writer goroutine keeps its thread: thread CPU time is its own
			locked = true
		}
		if begin {
			if x := c(); x != nil {
				rel0, migr0 = releasePending(x), x.migrations
			}
			w0, c0, f0 = time.Now(), threadCPU(), threadFaults()
			return
		}
		if record {
			wall = append(wall, time.Since(w0))
			cpu = append(cpu, threadCPU()-c0)
			faults := threadFaults() - f0
			maxFaults = max(maxFaults, faults)
			if d := cpu[len(cpu)-1]; d > time.Millisecond && c() != nil {
				// What the step did, to tell work from time the thread was charged
				// for something else (interrupts, the hypervisor).
				x := c()
				b.Logf("%s: step %d took %v CPU (%v wall): %d page faults, %d table words released, migration running %v (started this step: %v)",
					mode, len(cpu), d, wall[len(wall)-1], faults, rel0-releasePending(x), x.tab.prev.Load() != nil, x.migrations != migr0)
			}
		}
	}}
	s := Slot{"a", 0}
	if _, err := e.RegisterSlot(ctxA, benchProfile(b), s); err != nil {
		b.Fatal(err)
	}
	hs := make([]uint64, batch)
	ops := []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: hs}}
	if strings.HasSuffix(mode, "shared") {
		// Mooncake-bound blocks (one binding each, 64-hex key, K and V) in batches of 64
		// blocks; "clear-shared" records the steps of the ClearShared that drops them all.
		sops := make([]Op, 0, 2*batch)
		for done := 0; done < n; done += batch {
			record = mode == "shared"
			sops = sharedOps(sops[:0], OpSharedStore, done, batch)
			if err := e.Apply(ctxA, sops); err != nil {
				b.Fatal(err)
			}
		}
		if mode == "clear-shared" {
			// The clear goes on in bounded steps: here only with requests (no idle
			// steps, which the hook does not time), empty ones until it returns.
			e.hooks.noIdleMigration = true
			record = true
			done := make(chan struct{})
			go func() {
				e.ClearShared("tcp://10.0.0.1:50001", "mooncake", ctxA.TenantID)
				close(done)
			}()
			stepUntil(b, e, done)
			if e.TotalBlocks() != 0 {
				b.Fatalf("%d blocks after ClearShared", e.TotalBlocks())
			}
		}
		slices.Sort(wall)
		slices.Sort(cpu)
		return wall, cpu, maxFaults
	}
	if mode == "widen" {
		for i := 1; i < packedSlots; i++ {
			if _, err := e.RegisterSlot(ctxA, benchProfile(b), Slot{"pad", i}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for done := 0; done < n; done += batch {
		record = mode == "grow" || evict && done >= limit+batch // set between requests: the writer reads it after the hand-off
		for j := range hs {
			hs[j] = benchKey(done + j)
		}
		if err := e.Apply(ctxA, ops); err != nil {
			b.Fatal(err)
		}
	}
	switch mode {
	case "widen":
		// The writer goes on in bounded steps only with requests (no idle steps, which
		// the hook does not time): store batches of new blocks until the registration
		// that widens the records returns.
		e.hooks.noIdleMigration = true
		record = true
		done := make(chan struct{})
		go func() {
			if _, err := e.RegisterSlot(ctxA, benchProfile(b), Slot{"pad", packedSlots}); err != nil {
				panic(err)
			}
			close(done)
		}()
		next := n
		for registered := false; !registered; next += batch {
			select {
			case <-done:
				registered = true
			default:
			}
			for j := range hs {
				hs[j] = benchKey(next + j)
			}
			if err := e.Apply(ctxA, ops); err != nil {
				b.Fatal(err)
			}
		}
	case "clears":
		e.hooks.noIdleMigration = true
		record = true
		for i := 0; i < 70; i++ {
			done := make(chan struct{})
			go func() {
				_ = e.Apply(ctxA, []Op{{Kind: OpClear, Slot: s, ClearTiers: MaskDevice}})
				close(done)
			}()
			stepUntil(b, e, done)
		}
	}
	if mode == "clear" {
		s2 := Slot{"b", 0}
		if _, err := e.RegisterSlot(ctxA, benchProfile(b), s2); err != nil {
			b.Fatal(err)
		}
		record = true
		if err := e.Apply(ctxA, []Op{{Kind: OpClear, Slot: s, ClearTiers: MaskAllEngine}}); err != nil {
			b.Fatal(err)
		}
		ops[0].Slot = s2
		for done := n; done < 2*n; done += batch {
			for j := range hs {
				hs[j] = benchKey(done + j)
			}
			if err := e.Apply(ctxA, ops); err != nil {
				b.Fatal(err)
			}
		}
	}
	slices.Sort(wall)
	slices.Sort(cpu)
	return wall, cpu, maxFaults
}

// BenchmarkQueryWhileGrowing reports query latency (a 512-block prompt that every one of
// 8 slots holds, precomputed keys) while another goroutine grows the context from 1M to
// 5M blocks in batches of 64 (incremental table growth, record slabs mapped on the way),
// and the same queries on the grown index with no writer ("idle"). grow-max-cpu-µs is the
// longest query in thread CPU time: the wall-clock maximum includes the time the query's
// thread waited for a core (two goroutines busy on this 2-core machine). 64K to 320K
// blocks without -bigmem.
func BenchmarkQueryWhileGrowing(b *testing.B) {
	from, to := 1<<16, 5<<16
	if *bigMem {
		from, to = 1_000_000, 5_000_000
	}
	const prompt = 512
	keys := make([]uint64, prompt)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	b.Run(fmt.Sprintf("from=%d/to=%d", from, to), func(b *testing.B) {
		var grow, idle []time.Duration
		var maxCPU time.Duration // the longest query in thread CPU time (wall minus waits)
		for n := 0; n < b.N; n++ {
			e := benchContext(b, 8, keys, from-prompt)
			s := Slot{"inst-000", 1}
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]uint64, 64)
				ops := []Op{{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: buf}}
				for next := from; next < to; next += len(buf) {
					for j := range buf {
						buf[j] = benchKey(1<<31 + next + j)
					}
					if err := e.Apply(ctxA, ops); err != nil {
						panic(err)
					}
				}
			}()
			var res Result
			grow = grow[:0]
			runtime.LockOSThread()
			for running := true; running; {
				select {
				case <-done:
					running = false
				default:
				}
				t0, c0 := time.Now(), threadCPU()
				_ = e.QueryKeys(ctxA, keys, prompt*16, "", &res)
				grow = append(grow, time.Since(t0))
				maxCPU = max(maxCPU, threadCPU()-c0)
				if res.Instances[0].Disk != prompt*16 {
					b.Fatalf("query during growth missed blocks: %+v", res.Instances[0])
				}
			}
			runtime.UnlockOSThread()
			idle = idle[:0]
			for i := 0; i < 2000; i++ {
				t0 := time.Now()
				_ = e.QueryKeys(ctxA, keys, prompt*16, "", &res)
				idle = append(idle, time.Since(t0))
			}
			e.Close()
		}
		slices.Sort(grow)
		slices.Sort(idle)
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(float64(len(grow)), "queries-during-growth")
		b.ReportMetric(us(grow[len(grow)/2]), "grow-p50-µs")
		b.ReportMetric(us(grow[len(grow)*99/100]), "grow-p99-µs")
		b.ReportMetric(us(grow[len(grow)-1]), "grow-max-µs")
		b.ReportMetric(us(maxCPU), "grow-max-cpu-µs")
		b.ReportMetric(us(idle[len(idle)/2]), "idle-p50-µs")
		b.ReportMetric(us(idle[len(idle)*99/100]), "idle-p99-µs")
	})
}
