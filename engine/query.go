package engine

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/conductor-go/conductor/hashing"
)

// Tiers are cumulative token counts: Device <= CPULocal <= CPUShare <= Disk.
type Tiers struct {
	Device, CPULocal, CPUShare, Disk int64
}

// RankHit is the result of one registered rank.
type RankHit struct {
	Rank int
	Tiers
}

// InstanceHit is the result of one instance. Its Tiers are the maximum over its Ranks
// (never a concatenation of ranks); longest_matched is Disk. dp is Ranks[i].Device.
type InstanceHit struct {
	InstanceID string
	Ranks      []RankHit
	Tiers
}

// Result receives a query answer. Reuse one per goroutine: after warm-up a query
// allocates nothing. Instances and their Ranks are valid until the next query into it.
type Result struct {
	// Instances are sorted by InstanceID; ranks ascending. Registered ranks without any hit
	// are present with zero counts.
	Instances []InstanceHit

	hook func(int, int) // test hook of the running walk1 (see testHooks.walkLoad)
	// testHints (tests) are record hints QueryKeys passes with its keys, one per key:
	// the walk tries them and corrects them in place (see sameAlive1).
	testHints []uint32
	clr       *clearSet // pending clears of the running walk1's view
	slow      bool      // hook or clr set: walk1 reads records through readSlow1
	chain     hashing.Chain
	keys      sliceKeys
	ranks     []RankHit
	counts    [][4]int64 // per slot number: the four tier counts
	alive     []uint64   // 4 tiers x w words
	words     []uint64   // one record's bitsets, 3 x w words
	pb        probeBuf   // records found ahead (probe.go)
	// noProbe turns the overlapped probes off (benchmarks compare both walks);
	// forceProbe turns them on for tables of any size (tests of the probes).
	noProbe, forceProbe bool
	// leanSwitch decides, in tests, what a walk in a large table does after its timed
	// lean start: 1 probes the rest, -1 does not, 0 goes by the time it took.
	leanSwitch int8

	// hashed and fromMemo describe the last Query: blocks it hashed, and how many of
	// those came from the key memo (both 0 for QueryKeys or a query that hashed nothing).
	hashed, fromMemo int
	// walked is the number of blocks the last walk went through (its stop included); a
	// walk that hashes ahead (probe.go) may have hashed up to a window more.
	walked int
}

// Query is one prefix lookup.
type Query struct {
	Key       ContextKey
	Tokens    []int32
	CacheSalt string // "" means no salt
	// InstanceFilter restricts the answer to one instance; "" means every instance.
	InstanceFilter string
}

// keySource yields the projected keys of consecutive blocks, computed lazily: the walk
// asks for block i only once it has reached it. KeysAhead returns keys of the blocks after
// the last one Next returned that are known without further work (hashing.Chain: memo
// hits), for the walk to take in a batch (and probe the table ahead, probe.go); it may be
// empty. Advance(n) consumes the first n of them as n calls of Next would. HintsAhead
// gives the record hints of those keys (nil or shorter: none; see sameAlive1), which the
// walk may overwrite with the records it found and write back with SaveHints(n) before
// Advance(n).
type keySource interface {
	Next() (uint64, error)
	KeysAhead() []uint64
	Advance(n int)
	HintsAhead() []uint32
	SaveHints(n int)
}

// sliceKeys serves precomputed keys (tests, benchmarks, callers that already hashed),
// and record hints when hints is set (tests: the walk corrects them in place).
type sliceKeys struct {
	keys  []uint64
	hints []uint32
	i     int
}

func (s *sliceKeys) Next() (uint64, error) {
	k := s.keys[s.i]
	s.i++
	return k, nil
}

func (s *sliceKeys) KeysAhead() []uint64 { return s.keys[s.i:] }

func (s *sliceKeys) Advance(n int) { s.i += n }

func (s *sliceKeys) HintsAhead() []uint32 {
	if s.hints == nil {
		return nil
	}
	return s.hints[s.i:]
}

func (s *sliceKeys) SaveHints(int) {}

// Query answers q into res. An unknown context, a context without engine slots, or a filter
// naming no registered instance give empty Instances and a nil error, and create nothing.
// A token the profile cannot hash (*hashing.TokenError) gives an error and empty Instances.
func (e *Engine) Query(q *Query, res *Result) error {
	res.Instances = res.Instances[:0]
	res.hashed, res.fromMemo = 0, 0
	c := e.lookup(q.Key)
	if c == nil {
		return nil
	}
	hook := e.walkHook()
	for attempt := 0; ; attempt++ {
		v := c.state.Load()
		insts, mask := v.slots.selectInstances(q.InstanceFilter)
		if insts == nil {
			res.Instances = res.Instances[:0]
			return nil
		}
		res.chain.ResetMemo(e.memo, &c.profile, int(q.Key.BlockSize), q.Key.LoraName, q.CacheSalt, q.Tokens)
		res.chain.SetHintOwner(c.hintOwner)
		err := res.run(v, insts, mask, hook, &res.chain, res.chain.NumBlocks(), int64(res.chain.Positions()), q.Key.BlockSize)
		res.chain.Done() // publishes the walk's memo inserts and counters
		res.hashed, res.fromMemo = res.chain.Hashed(), res.chain.MemoHits()
		if err != nil || res.settled(c, v, insts, attempt) {
			return err
		}
	}
}

// maxViewRetries bounds how often a query walks again because a slot number was reused
// during its walk.
const maxViewRetries = 8

// settled reports whether the answer just computed from view v stands: true unless a slot
// number was handed to a new registration since v's slot table was built (the walk may
// have credited the new owner's bits to the old one). After maxViewRetries such walks it
// settles for every covered rank with zero counts, which under-reports and never invents
// a hit.
func (r *Result) settled(c *cacheContext, v *view, insts []instSlots, attempt int) bool {
	if c.slotReuse.Load() == v.slots.reuse {
		return true
	}
	if attempt < maxViewRetries {
		return false
	}
	for i := range insts {
		for _, rs := range insts[i].ranks {
			r.counts[rs.slot] = [4]int64{}
		}
	}
	r.Instances = r.Instances[:0]
	r.assemble(insts)
	return true
}

// QueryKeys is Query with the block keys already computed: keys[i] is the projected key of
// block i and positions the number of queried token positions (the count clamp for a
// partial last block). It serves callers that hash elsewhere, and benchmarks of the walk.
func (e *Engine) QueryKeys(key ContextKey, keys []uint64, positions int, instanceFilter string, res *Result) error {
	res.Instances = res.Instances[:0]
	res.hashed, res.fromMemo = 0, 0
	c := e.lookup(key)
	if c == nil {
		return nil
	}
	hook := e.walkHook()
	for attempt := 0; ; attempt++ {
		v := c.state.Load()
		insts, mask := v.slots.selectInstances(instanceFilter)
		if insts == nil {
			res.Instances = res.Instances[:0]
			return nil
		}
		res.keys = sliceKeys{keys: keys, hints: res.testHints}
		err := res.run(v, insts, mask, hook, &res.keys, len(keys), int64(positions), key.BlockSize)
		res.keys = sliceKeys{}
		if err != nil || res.settled(c, v, insts, attempt) {
			return err
		}
	}
}

// selectInstances returns the instances a query covers and the bitset of their slots, or
// nil when there are none.
func (st *slotTable) selectInstances(filter string) ([]instSlots, []uint64) {
	if filter == "" {
		if len(st.insts) == 0 {
			return nil, nil
		}
		return st.insts, st.all
	}
	i, ok := st.byID[filter]
	if !ok {
		return nil, nil
	}
	return st.insts[i : i+1], st.insts[i].mask
}

func (r *Result) run(v *view, insts []instSlots, mask []uint64, hook func(int, int), src keySource, nblocks int, positions, bs int64) error {
	r.Instances = r.Instances[:0]
	r.walked = 0
	r.pb.probed, r.pb.ran, r.pb.loaded = 0, 0, 0
	w := len(mask)
	if need := w * 64; len(r.counts) < need {
		r.counts = make([][4]int64, need)
	}
	var err error
	if w == 1 {
		r.hook, r.clr, r.slow = hook, v.clr, hook != nil || v.clr != nil
		err = r.walk1(v.tab, src, nblocks, positions, bs, mask[0])
		r.hook, r.clr, r.slow = nil, nil, false
	} else {
		err = r.walkN(v.tab, v.clr, hook, src, nblocks, positions, bs, mask)
	}
	if err != nil {
		return err
	}
	r.assemble(insts)
	return nil
}

// drop records pos as tier t's count of every slot in word j of gone.
func (r *Result) drop(t, j int, gone uint64, pos int64) {
	for ; gone != 0; gone &= gone - 1 {
		r.counts[j*64+bits.TrailingZeros64(gone)][t] = pos
	}
}

// walk1 is the walk for contexts whose slot numbers fit one word (up to 64 slots).
//
// alive sets shrink block by block: device needs the slot's device bit, cpu_local its
// device or cpu_local bit, cpu_share any shared cpu owner or the local predicate, disk any
// shared owner or the slot's own disk bit or the cpu_local predicate. A slot leaving a set
// at block i gets min(i*bs, positions) for that tier. This is the upstream nested-phase
// walk (one cursor per tier, each accepting the tiers above it) at a few word operations
// per block.
func (r *Result) walk1(tab *table, src keySource, nblocks int, positions, bs int64, mask uint64) error {
	w := walk1State{a: [4]uint64{mask, mask, mask, mask}, tab: tab, prev: tab.prev.Load()} // prev: before any probe of tab, see table.findPrev
	switch {
	case r.forceProbe:
		return r.walk1Probed(&w, src, 0, nblocks, positions, bs)
	case r.noProbe || len(tab.entries) <= probeMinEntries:
		return r.walk1Lean(&w, src, 0, nblocks, nblocks, positions, bs)
	}
	// A large table: the first leanBlocks blocks go without probes, timed. When their
	// records were in the caches (a prompt asked again soon), probing ahead would only
	// add its bookkeeping; when they were not, the rest of the walk probes ahead.
	if nblocks <= leanBlocks {
		return r.walk1Lean(&w, src, 0, nblocks, nblocks, positions, bs)
	}
	t0 := time.Now()
	if err := r.walk1Lean(&w, src, 0, leanBlocks, nblocks, positions, bs); err != nil || w.done {
		return err
	}
	if r.leanSwitch < 0 || (r.leanSwitch == 0 && time.Since(t0) < leanBlocks*probeAboveNs) {
		return r.walk1Lean(&w, src, leanBlocks, nblocks, nblocks, positions, bs)
	}
	return r.walk1Probed(&w, src, leanBlocks, nblocks, positions, bs)
}

// walk1State is where a walk1 loop left off: the four alive sets, the table it reads
// (a retired table's reader moves on to the latest) and that table's predecessor, and
// whether the walk has ended (its counts are recorded).
type walk1State struct {
	a         [4]uint64
	tab, prev *table
	done      bool
}

// finish1 records the counts of the slots still alive when the walk ends at block end
// (nblocks: it went through every block).
func (r *Result) finish1(w *walk1State, end, nblocks int, positions, bs int64) {
	r.walked = min(end+1, nblocks)
	pos := min(int64(end)*bs, positions)
	for t, a := range w.a {
		r.drop(t, 0, a, pos)
	}
	w.done = true
}

// walk1Probed is walk1's loop with overlapped probes (probe.go), from block from on.
func (r *Result) walk1Probed(w *walk1State, src keySource, from, nblocks int, positions, bs int64) error {
	a0, a1, a2, a3 := w.a[0], w.a[1], w.a[2], w.a[3]
	tab, prev := w.tab, w.prev
	end := nblocks
	pb := &r.pb
	pb.reset()
	pb.read = !r.slow
	rs := runState{batch: probeFirst}
	for i := from; i < nblocks; {
		if i >= pb.end && i != pb.stop && !r.noProbe {
			// Keys known ahead (memo runs) go through sameRun; the block that ends its
			// loop starts a batch of probes, read below.
			if !r.slow {
				j, all := r.sameRun(tab, src, &rs, i, nblocks-i, a0, a1, a2, a3)
				if i += j; all {
					continue
				}
			}
			pb.next(tab, src, i, nblocks, a3)
		}
		var key uint64
		var err error
		if j := i - pb.base; uint(j) < uint(pb.kn) {
			key = pb.keys[j] // hashed ahead by the batch
		} else {
			key, err = src.Next()
		}
		if err != nil {
			r.Instances = r.Instances[:0]
			return fmt.Errorf("hash query block %d: %w", i, err)
		}
		rec, ok := pb.rec(i)
		if !ok {
			rec, ok = tab.find1(key)
		}
		if !ok {
			if tab, prev, rec, ok = tab.findMissed(prev, key); !ok {
				end = i
				break
			}
		}
		// Version check (see the record layout in table.go): meta, key, bitsets, meta.
		// Torn reads, test hooks and pending clears take the slow path (readSlow1),
		// which keeps this loop's live values in registers.
		var meta, dev, loc, dsk uint64
		switch j := uint(i - pb.base); {
		case r.slow:
			ok = false
		case j < uint(pb.n) && pb.good[j]: // read by the batch (probe.go)
			v := &pb.vals[j]
			meta, dev, loc, dsk = v[0], v[1], v[2], v[3]
		case tab.w == 0:
			meta, dev, loc, dsk, ok = readPacked1(rec, key)
		default:
			meta, dev, loc, dsk, ok = readWide1(rec, key)
		}
		if !ok {
			if meta, dev, loc, dsk, ok = r.readSlow1(tab, rec, key, i); !ok {
				end = i // gone, or changing faster than we can read it
				break
			}
		}
		n0, n1, n2, n3 := alive1(a0, a1, a2, a3, meta, dev, loc, dsk)
		if n0 != a0 || n1 != a1 || n2 != a2 || n3 != a3 {
			r.drop1(a0&^n0, a1&^n1, a2&^n2, a3&^n3, min(int64(i)*bs, positions))
			a0, a1, a2, a3 = n0, n1, n2, n3
			if a3 == 0 {
				r.walked = i + 1
				w.done = true
				return nil
			}
		}
		i++
	}
	w.a = [4]uint64{a0, a1, a2, a3}
	r.finish1(w, end, nblocks, positions, bs)
	return nil
}

// walk1Lean is walk1's loop without the overlapped probes, from block from up to limit
// (nblocks: to the end of the walk; less: it returns with w updated and the walk not
// done, unless it ended before limit). It serves tables that fit in the core's caches
// (probeMinEntries), where a batch's bookkeeping costs more than the misses it overlaps,
// and the timed start of a walk in a large one: the same reads, checks and tier rules
// as walk1Probed, in a loop with few live values.
func (r *Result) walk1Lean(w *walk1State, src keySource, from, limit, nblocks int, positions, bs int64) error {
	a0, a1, a2, a3 := w.a[0], w.a[1], w.a[2], w.a[3]
	tab, prev := w.tab, w.prev
	end := nblocks
	// Keys known ahead (memo runs) go through sameRun; the block that ends its loop, and
	// every block whose key is not known ahead, are read here.
	rs := runState{batch: probeFirst}
	for i := from; i < limit; {
		if !r.slow {
			j, all := r.sameRun(tab, src, &rs, i, limit-i, a0, a1, a2, a3)
			if i += j; all {
				continue
			}
		}
		key, err := src.Next()
		if err != nil {
			r.Instances = r.Instances[:0]
			return fmt.Errorf("hash query block %d: %w", i, err)
		}
		rec, ok := tab.find1(key)
		if !ok {
			if tab, prev, rec, ok = tab.findMissed(prev, key); !ok {
				end = i
				break
			}
		}
		var meta, dev, loc, dsk uint64
		switch {
		case r.slow:
			ok = false
		case tab.w == 0:
			meta, dev, loc, dsk, ok = readPacked1(rec, key)
		default:
			meta, dev, loc, dsk, ok = readWide1(rec, key)
		}
		if !ok {
			if meta, dev, loc, dsk, ok = r.readSlow1(tab, rec, key, i); !ok {
				end = i
				break
			}
		}
		n0, n1, n2, n3 := alive1(a0, a1, a2, a3, meta, dev, loc, dsk)
		if n0 != a0 || n1 != a1 || n2 != a2 || n3 != a3 {
			r.drop1(a0&^n0, a1&^n1, a2&^n2, a3&^n3, min(int64(i)*bs, positions))
			a0, a1, a2, a3 = n0, n1, n2, n3
			if a3 == 0 {
				r.walked = i + 1
				w.done = true
				return nil
			}
		}
		i++
	}
	w.a = [4]uint64{a0, a1, a2, a3}
	w.tab, w.prev = tab, prev
	if end == nblocks && limit < nblocks {
		return nil // paused at limit
	}
	r.finish1(w, end, nblocks, positions, bs)
	return nil
}

// sameRun walks, from the walk's block i, the keys src knows ahead (memo runs, or
// precomputed keys): at most st.batch of them and at most most. The batch starts at
// probeFirst and doubles (up to aheadWalk) only after a call went through all its keys,
// so a batch is never larger than probeFirst plus the blocks already walked, and the
// entries loaded past the block where the walk stops are at most that (and aheadWalk).
// The table entries of its blocks without a record hint are loaded first (independent
// loads: the misses overlap; never twice for one block), then sameAlive1 goes through
// the blocks that change no alive set. It consumes
// those blocks from src and returns their number, and whether that was every key it
// took; otherwise the next block (which ended the run, or whose key src does not know
// ahead) is the walk's to read.
func (r *Result) sameRun(tab *table, src keySource, st *runState, i, most int, a0, a1, a2, a3 uint64) (int, bool) {
	ks := src.KeysAhead()
	if len(ks) < 2 {
		return 0, false
	}
	n := min(len(ks), st.batch, most)
	hs := src.HintsAhead()
	if len(hs) < n {
		hs = nil
	} else {
		hs = hs[:n]
	}
	if from := max(st.touched-i, 0); from < n {
		// Blocks with a hint skip the table (their records are read directly), so only
		// the others' entries are loaded; two loops, so that the common cases (all
		// hinted, none hinted) test nothing per key but the hint.
		if hs == nil {
			r.pb.sink += tab.touch(ks[from:n])
		} else {
			r.pb.sink += tab.touchUnhinted(ks[from:n], hs[from:])
		}
		r.pb.loaded += n - from
		st.touched = i + n
	}
	j, found := tab.sameAlive1(ks[:n], hs, a0, a1, a2, a3)
	if found {
		// Block j's too, when the run ended there: its record was found (a block where a
		// tier's set shrinks would otherwise be probed again by every walk).
		src.SaveHints(min(j+1, n))
	}
	src.Advance(j)
	r.pb.ran += j
	if j < n {
		return j, false
	}
	st.batch = min(2*st.batch, aheadWalk)
	return j, true
}

// runState is a walk's sameRun state: the batch size, and the block before which every
// table entry sameRun will read was loaded already.
type runState struct{ batch, touched int }

// aheadWalk bounds the keys one sameRun takes.
const aheadWalk = 64

// sameAlive1 walks keys (consecutive blocks) in t while each block's record is found in
// t, reads whole (the version check of walk1) and keeps every slot of the alive sets a0..a3
// in its sets; it returns how many blocks it went through, len(keys) or the index of the
// first block that does not (the walk reads that one again and handles it). No counts
// change inside such a run, so the loop needs none of the walk's other state, and it makes
// no call (find1 and the record read are written out): a call would spill every live
// value, which cost more than the loop's own work.
//
// hints (nil, or one per key) are record hints (hashing.Chain.HintsAhead): a block whose
// hint names a record of t's arena holding the block's key takes that record without
// probing the table, and reads it whole, live and not busy, as any other. That is the
// record the probe would find: the writer never leaves a live, non-busy record holding a
// key that its tables do not hold (a deleted record is marked free before its key leaves
// the table, a created or reused one stays busy until its key is in the table; see
// deleteRecord and create), and the table holds one record per key. Any other hint
// (none, stale, torn, another index's) sends the block to the table; the record found
// there replaces the hint in hints, and found reports that some hint changed (the
// caller saves them). A block the walk ends at may have had its hint replaced too.
func (t *table) sameAlive1(keys []uint64, hints []uint32, a0, a1, a2, a3 uint64) (n int, found bool) {
	// The entries by address: a position is h>>shift or (pos+1)&mask, always below
	// len(entries) = mask+1 = 1<<(64-shift), which the compiler cannot see.
	entries, mask, shift := unsafe.Pointer(unsafe.SliceData(t.entries)), t.mask, t.shift
	// One copy of the arena's directory for the whole run: a record in a slab added since
	// ends the run (the walk reads it through Record).
	dir := t.ar.Dir()
	packed := t.w == 0
	hinted := hints != nil
	for j, key := range keys {
		var rec unsafe.Pointer
		if hinted {
			if h := hints[j]; h != 0 {
				if r, ok := dir.Words(h - 1); ok && atomic.LoadUint64(&(*[recBits]uint64)(r)[recKey]) == key {
					rec = r // read whole below: a busy, free or torn record ends the run
				}
			}
		}
		if rec == nil {
			h := mix(key)
			fp, pos := h&^0xFFFFFFFF, h>>(shift&63) // &63: one shift instruction (shift < 64 always)
			for {
				e := atomic.LoadUint64((*uint64)(unsafe.Add(entries, pos*8)))
				if e == 0 {
					return j, found
				}
				if e&^0xFFFFFFFF == fp && e != tombEntry {
					r, ok := dir.Words(uint32(e) - 1)
					if !ok {
						return j, found
					}
					if atomic.LoadUint64(&(*[recBits]uint64)(r)[recKey]) == key {
						rec = r
						if hinted && hints[j] != uint32(e) {
							hints[j], found = uint32(e), true // the entry holds index+1
						}
						break
					}
				}
				pos = (pos + 1) & mask
			}
		}
		// walk1's versioned read (readPacked1, readWide1).
		var meta, k, m2, dev, loc, dsk uint64
		if packed {
			p := (*[recBits + 1]uint64)(rec)
			meta = atomic.LoadUint64(&p[recMeta])
			k = atomic.LoadUint64(&p[recKey])
			x := atomic.LoadUint64(&p[recBits])
			m2 = atomic.LoadUint64(&p[recMeta])
			dev, loc, dsk = x&packedMask, x>>packedSlots&packedMask, x>>(2*packedSlots)&packedMask
		} else {
			p := (*[recBits + 3]uint64)(rec)
			meta = atomic.LoadUint64(&p[recMeta])
			k = atomic.LoadUint64(&p[recKey])
			dev = atomic.LoadUint64(&p[recBits])
			loc = atomic.LoadUint64(&p[recBits+1])
			dsk = atomic.LoadUint64(&p[recBits+2])
			m2 = atomic.LoadUint64(&p[recMeta])
		}
		if m2 != meta || meta&(metaBusy|metaFree) != 0 || k != key {
			return j, found
		}
		// The run goes on while no set loses a slot (one OR and one branch, where
		// comparing alive1's four results with the sets took four).
		if d0, d1, d2, d3 := dropped1(a0, a1, a2, a3, meta, dev, loc, dsk); d0|d1|d2|d3 != 0 {
			return j, found
		}
	}
	return len(keys), found
}

// touch loads the home entry of each key in t, so that their cache misses overlap before
// the walk probes them one by one; the sum of the loads only feeds the caller's sink.
func (t *table) touch(keys []uint64) uint64 {
	var sink uint64
	for _, k := range keys {
		sink += atomic.LoadUint64(&t.entries[mix(k)>>(t.shift&63)])
	}
	return sink
}

// touchUnhinted is touch for the keys whose hint is 0 (hints is at least as long as
// keys): a block with a hint reads its record directly.
func (t *table) touchUnhinted(keys []uint64, hints []uint32) uint64 {
	var sink uint64
	for j, k := range keys {
		if hints[j] == 0 {
			sink += atomic.LoadUint64(&t.entries[mix(k)>>(t.shift&63)])
		}
	}
	return sink
}

// alive1 is walk1's tier rule for one record: the alive sets after it (see walk1).
func alive1(a0, a1, a2, a3, meta, dev, loc, dsk uint64) (n0, n1, n2, n3 uint64) {
	d0, d1, d2, d3 := dropped1(a0, a1, a2, a3, meta, dev, loc, dsk)
	return a0 &^ d0, a1 &^ d1, a2 &^ d2, a3 &^ d3
}

// dropped1 is the tier rule itself: the slots that leave each alive set at this record.
// The device set (a0) keeps the slots holding the block on device; the local-CPU set (a1)
// those holding it on device or local CPU; the shared-CPU set (a2) the same, or all of
// them when a shared CPU binding owns the block; the disk set (a3) those holding it on
// device, local CPU or disk, or all of them when a shared CPU or disk binding owns it.
func dropped1(a0, a1, a2, a3, meta, dev, loc, dsk uint64) (d0, d1, d2, d3 uint64) {
	local := dev | loc
	d0, d1 = a0&^dev, a1&^local
	if meta&metaSharedCPU == 0 {
		d2 = a2 &^ local
		if meta&metaSharedDisk == 0 {
			d3 = a3 &^ (local | dsk)
		}
	}
	return d0, d1, d2, d3
}

// drop1 records pos as the count of the slots that left each tier's set (g0..g3).
func (r *Result) drop1(g0, g1, g2, g3 uint64, pos int64) {
	r.drop(0, 0, g0, pos)
	r.drop(1, 0, g1, pos)
	r.drop(2, 0, g2, pos)
	r.drop(3, 0, g3, pos)
}

// readPacked1 and readWide1 are walk1's versioned read of rec (meta, key, bitsets, meta)
// in packed and in wide records: ok is false when the read was torn or the record is
// busy, free or another key's, and the caller goes to readSlow1.
func readPacked1(rec []uint64, key uint64) (meta, dev, loc, dsk uint64, ok bool) {
	meta = atomic.LoadUint64(&rec[recMeta])
	k := atomic.LoadUint64(&rec[recKey])
	x := atomic.LoadUint64(&rec[recBits])
	ok = atomic.LoadUint64(&rec[recMeta]) == meta && meta&(metaBusy|metaFree) == 0 && k == key
	return meta, x & packedMask, x >> packedSlots & packedMask, x >> (2 * packedSlots) & packedMask, ok
}

func readWide1(rec []uint64, key uint64) (meta, dev, loc, dsk uint64, ok bool) {
	meta = atomic.LoadUint64(&rec[recMeta])
	k := atomic.LoadUint64(&rec[recKey])
	dev = atomic.LoadUint64(&rec[recBits])
	loc = atomic.LoadUint64(&rec[recBits+1])
	dsk = atomic.LoadUint64(&rec[recBits+2])
	ok = atomic.LoadUint64(&rec[recMeta]) == meta && meta&(metaBusy|metaFree) == 0 && k == key
	return meta, dev, loc, dsk, ok
}

// readSlow1 is walk1's read of rec (found for key) after a torn fast read, with the
// test hook or with pending clears: one read (hooked if a hook is set), rereads while it
// is torn, then the mask of the pending clears (clear.go) that the record does not
// reflect yet.
func (r *Result) readSlow1(tab *table, rec []uint64, key uint64, i int) (meta, dev, loc, dsk uint64, ok bool) {
	switch {
	case r.hook != nil:
		var k, m2 uint64
		meta, k, m2, dev, loc, dsk = hookedRead1(rec, tab.w == 0, r.hook, i)
		ok = m2 == meta && meta&(metaBusy|metaFree) == 0 && k == key
	case tab.w == 0:
		meta, dev, loc, dsk, ok = readPacked1(rec, key)
	default:
		meta, dev, loc, dsk, ok = readWide1(rec, key)
	}
	if !ok {
		var buf [3]uint64
		if meta, ok = reread(tab, r.hook, i, key, buf[:bitWords(tab.w)]); !ok {
			return 0, 0, 0, 0, false
		}
		dev, loc, dsk = tierBits(buf[:], tab.w, 0, 0), tierBits(buf[:], tab.w, 1, 0), tierBits(buf[:], tab.w, 2, 0)
	}
	if r.clr != nil {
		if m := r.clr.mask(meta); m != nil {
			dev &^= tierBits(m, tab.w, 0, 0)
			loc &^= tierBits(m, tab.w, 1, 0)
			dsk &^= tierBits(m, tab.w, 2, 0)
		}
	}
	return meta, dev, loc, dsk, true
}

// hookedRead1 is walk1's record read with the test hook before every load.
func hookedRead1(rec []uint64, packed bool, hook func(int, int), i int) (meta, k, m2, dev, loc, dsk uint64) {
	hook(i, recMeta)
	meta = atomic.LoadUint64(&rec[recMeta])
	hook(i, recKey)
	k = atomic.LoadUint64(&rec[recKey])
	hook(i, recBits)
	if packed {
		x := atomic.LoadUint64(&rec[recBits])
		dev, loc, dsk = x&packedMask, x>>packedSlots&packedMask, x>>(2*packedSlots)&packedMask
	} else {
		dev = atomic.LoadUint64(&rec[recBits])
		hook(i, recBits+1)
		loc = atomic.LoadUint64(&rec[recBits+1])
		hook(i, recBits+2)
		dsk = atomic.LoadUint64(&rec[recBits+2])
	}
	hook(i, recMeta)
	m2 = atomic.LoadUint64(&rec[recMeta])
	return
}

// maxRereads bounds how often a walk reads one block's record again after a torn read.
const maxRereads = 16

// reread reads the record of key again after a torn read (meta changed or busy, or the
// record holds another key): it looks key up anew, since the record may have been freed or
// reused, and copies the bitsets into words once one read sees the same meta before and
// after. It reports false when key is gone, or after maxRereads torn reads, which answers
// as a missing block: an under-report, never a hit that did not exist.
func reread(tab *table, hook func(int, int), i int, key uint64, words []uint64) (meta uint64, ok bool) {
	for try := 0; try < maxRereads; try++ {
		if try >= 4 {
			runtime.Gosched() // the writer may be descheduled in the middle of a change
		}
		rec, found := tab.find(key)
		if !found {
			if tab, rec, found = tab.retryMiss(key); !found {
				return 0, false
			}
		}
		if hook != nil {
			hook(i, recMeta)
		}
		m1 := atomic.LoadUint64(&rec[recMeta])
		if m1&(metaBusy|metaFree) != 0 {
			continue
		}
		if hook != nil {
			hook(i, recKey)
		}
		k := atomic.LoadUint64(&rec[recKey])
		for j := range words {
			if hook != nil {
				hook(i, recBits+j)
			}
			words[j] = atomic.LoadUint64(&rec[recBits+j])
		}
		if hook != nil {
			hook(i, recMeta)
		}
		if atomic.LoadUint64(&rec[recMeta]) == m1 && k == key {
			return m1, true
		}
	}
	return 0, false
}

// walkN is walk1 for any number of bitset words.
func (r *Result) walkN(tab *table, clr *clearSet, hook func(int, int), src keySource, nblocks int, positions, bs int64, mask []uint64) error {
	w := len(mask)
	if cap(r.alive) < 4*w {
		r.alive = make([]uint64, 4*w)
		r.words = make([]uint64, 3*w)
	}
	alive, words := r.alive[:4*w], r.words[:3*w]
	for t := 0; t < 4; t++ {
		copy(alive[t*w:(t+1)*w], mask)
	}
	end := nblocks
	prev := tab.prev.Load() // before any probe of tab: see table.findPrev
	pb := &r.pb
	pb.reset()
	// As walk1: no probes in a table that stays in the caches.
	probe := r.forceProbe || (!r.noProbe && len(tab.entries) > probeMinEntries)
	for i := 0; i < nblocks; i++ {
		if probe && i >= pb.end && i != pb.stop {
			pb.next(tab, src, i, nblocks, 0)
		}
		var key uint64
		var err error
		if j := i - pb.base; uint(j) < uint(pb.kn) {
			key = pb.keys[j] // hashed ahead by the batch
		} else {
			key, err = src.Next()
		}
		if err != nil {
			r.Instances = r.Instances[:0]
			return fmt.Errorf("hash query block %d: %w", i, err)
		}
		rec, ok := pb.rec(i)
		if !ok {
			rec, ok = tab.find1(key)
		}
		if !ok {
			if tab, prev, rec, ok = tab.findMissed(prev, key); !ok {
				end = i
				break
			}
		}
		var meta, k, m2 uint64
		if hook == nil {
			meta = atomic.LoadUint64(&rec[recMeta])
			k = atomic.LoadUint64(&rec[recKey])
			bw := rec[recBits : recBits+len(words)]
			for j := range words {
				words[j] = atomic.LoadUint64(&bw[j])
			}
			m2 = atomic.LoadUint64(&rec[recMeta])
		} else {
			meta, k, m2 = hookedReadN(rec, hook, i, words)
		}
		if m2 != meta || meta&(metaBusy|metaFree) != 0 || k != key {
			if meta, ok = reread(tab, hook, i, key, words); !ok {
				end = i
				break
			}
		}
		if clr != nil {
			clr.apply(meta, words) // pending clears (clear.go)
		}
		shCPU, shAny := meta&metaSharedCPU != 0, meta&(metaSharedCPU|metaSharedDisk) != 0
		pos := min(int64(i)*bs, positions)
		var any3 uint64
		for j := 0; j < w; j++ {
			dev, loc, dsk := words[j], words[w+j], words[2*w+j]
			local := dev | loc
			a0, a1, a2, a3 := alive[j], alive[w+j], alive[2*w+j], alive[3*w+j]
			n0, n1, n2, n3 := a0&dev, a1&local, a2, a3
			if !shCPU {
				n2 &= local
			}
			if !shAny {
				n3 &= local | dsk
			}
			if n0 != a0 || n1 != a1 || n2 != a2 || n3 != a3 {
				r.drop(0, j, a0&^n0, pos)
				r.drop(1, j, a1&^n1, pos)
				r.drop(2, j, a2&^n2, pos)
				r.drop(3, j, a3&^n3, pos)
				alive[j], alive[w+j], alive[2*w+j], alive[3*w+j] = n0, n1, n2, n3
			}
			any3 |= n3
		}
		if any3 == 0 {
			r.walked = i + 1
			return nil
		}
	}
	r.walked = min(end+1, nblocks)
	pos := min(int64(end)*bs, positions)
	for t := 0; t < 4; t++ {
		for j := 0; j < w; j++ {
			r.drop(t, j, alive[t*w+j], pos)
		}
	}
	return nil
}

// hookedReadN is walkN's record read with the test hook before every load.
func hookedReadN(rec []uint64, hook func(int, int), i int, words []uint64) (meta, k, m2 uint64) {
	hook(i, recMeta)
	meta = atomic.LoadUint64(&rec[recMeta])
	hook(i, recKey)
	k = atomic.LoadUint64(&rec[recKey])
	for j := range words {
		hook(i, recBits+j)
		words[j] = atomic.LoadUint64(&rec[recBits+j])
	}
	hook(i, recMeta)
	m2 = atomic.LoadUint64(&rec[recMeta])
	return
}

// assemble turns the per-slot counts into per-rank and per-instance hits.
func (r *Result) assemble(insts []instSlots) {
	nr := 0
	for i := range insts {
		nr += len(insts[i].ranks)
	}
	if cap(r.ranks) < nr {
		r.ranks = make([]RankHit, nr)
	}
	ranks := r.ranks[:nr]
	for i := range insts {
		in := &insts[i]
		hit := InstanceHit{InstanceID: in.id, Ranks: ranks[:len(in.ranks):len(in.ranks)]}
		ranks = ranks[len(in.ranks):]
		for k, rs := range in.ranks {
			cn := &r.counts[rs.slot]
			t := Tiers{Device: cn[0], CPULocal: cn[1], CPUShare: cn[2], Disk: cn[3]}
			hit.Ranks[k] = RankHit{Rank: rs.rank, Tiers: t}
			hit.Device = max(hit.Device, t.Device)
			hit.CPULocal = max(hit.CPULocal, t.CPULocal)
			hit.CPUShare = max(hit.CPUShare, t.CPUShare)
			hit.Disk = max(hit.Disk, t.Disk)
		}
		r.Instances = append(r.Instances, hit)
	}
}
