package engine

import (
	"fmt"
	"math/bits"
	"time"

	"github.com/conductor-go/conductor/hashing"
)

// walker is a query's walk through the prefix table (see walk1): its key sources, the
// alive sets and per-slot counts, and the buffers a Result keeps from query to query so
// that a query allocates nothing after warm-up.
type walker struct {
	// The running walk's read settings (run sets them; nil and false between walks).
	hook func(int, int) // test hook of the running walk1 (see testHooks.walkLoad)
	clr  *clearSet      // pending clears of the running walk1's view
	slow bool           // hook or clr set: walk1 reads records through readSlow1

	chain  hashing.Chain // Query's key source
	keys   sliceKeys     // QueryKeys' key source
	ranks  []RankHit     // backing array of the answer's per-instance Ranks
	counts [][4]int64    // per slot number: the four tier counts
	alive  []uint64      // walkN: 4 tiers x w words
	words  []uint64      // walkN: one record's bitsets, 3 x w words
	pb     probeBuf      // records found ahead (probe.go)
	// walked is the number of blocks the last walk went through (its stop included); a
	// walk that hashes ahead (probe.go) may have hashed up to a window more.
	walked int
}

// walkMode chooses between the walk's loops with and without overlapped probes
// (probe.go). Queries walk as walkAuto; tests and benchmarks choose the others to compare
// the loops or to reach each of them with small tables.
type walkMode uint8

const (
	// walkAuto probes ahead in tables past probeMinEntries only, and in those (walk1)
	// only after a lean start that took probeAboveNs per block or more.
	walkAuto walkMode = iota
	// walkLean never probes ahead.
	walkLean
	// walkProbed probes ahead from the first block, in a table of any size.
	walkProbed
	// walkSwitchProbed and walkSwitchLean take walk1's lean start in a large table and
	// then probe the rest, or do not, whatever the start took.
	walkSwitchProbed
	walkSwitchLean
)

// hashError is the error of a walk that could not hash block i.
func hashError(i int, err error) error {
	return fmt.Errorf("hash query block %d: %w", i, err)
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

// run walks src's nblocks keys (positions queried token positions, block size bs) in v
// for the slots in mask, leaving their counts in r.counts.
func (r *walker) run(v *view, mask []uint64, hook func(int, int), mode walkMode, src keySource, nblocks int, positions, bs int64) error {
	r.walked = 0
	r.pb.probed, r.pb.ran, r.pb.loaded = 0, 0, 0
	w := len(mask)
	if need := w * 64; len(r.counts) < need {
		r.counts = make([][4]int64, need)
	}
	if w != 1 {
		return r.walkN(v.tab, v.clr, hook, mode, src, nblocks, positions, bs, mask)
	}
	r.hook, r.clr, r.slow = hook, v.clr, hook != nil || v.clr != nil
	err := r.walk1(v.tab, mode, src, nblocks, positions, bs, mask[0])
	r.hook, r.clr, r.slow = nil, nil, false
	return err
}

// drop records pos as tier t's count of every slot in word j of gone.
func (r *walker) drop(t, j int, gone uint64, pos int64) {
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
func (r *walker) walk1(tab *table, mode walkMode, src keySource, nblocks int, positions, bs int64, mask uint64) error {
	w := walk1State{a: [4]uint64{mask, mask, mask, mask}, tab: tab, prev: tab.prev.Load()} // prev: before any probe of tab, see table.findPrev
	switch {
	case mode == walkProbed:
		return r.walk1Loop(&w, src, 0, nblocks, nblocks, positions, bs, true)
	case mode == walkLean || len(tab.entries) <= probeMinEntries:
		return r.walk1Loop(&w, src, 0, nblocks, nblocks, positions, bs, false)
	}
	// A large table: the first leanBlocks blocks go without probes, timed. When their
	// records were in the caches (a prompt asked again soon), probing ahead would only
	// add its bookkeeping; when they were not, the rest of the walk probes ahead. A
	// hashed prompt probes from block hashAfter (below).
	if nblocks <= leanBlocks {
		return r.walk1Loop(&w, src, 0, nblocks, nblocks, positions, bs, false)
	}
	t0 := time.Now()
	if err := r.walk1Loop(&w, src, 0, hashAfter, nblocks, positions, bs, false); err != nil || w.done {
		return err
	}
	// A prompt whose first blocks were SHA-hashed (a cold one: the key memo lacks them)
	// probes ahead from here: hashing alone takes longer than probeAboveNs a block, so the
	// timed start would only delay the switch, paying two memory round trips a block
	// (table entry, then record) that the probes overlap (probeBuf.next).
	if mode != walkSwitchLean && shaHashed(src) {
		return r.walk1Loop(&w, src, hashAfter, nblocks, nblocks, positions, bs, true)
	}
	if err := r.walk1Loop(&w, src, hashAfter, leanBlocks, nblocks, positions, bs, false); err != nil || w.done {
		return err
	}
	if mode == walkSwitchLean || (mode != walkSwitchProbed && time.Since(t0) < leanBlocks*probeAboveNs) {
		return r.walk1Loop(&w, src, leanBlocks, nblocks, nblocks, positions, bs, false)
	}
	return r.walk1Loop(&w, src, leanBlocks, nblocks, nblocks, positions, bs, true)
}

// shaHashed reports whether src SHA-hashed any block it returned (a hashing.Chain whose
// key memo lacked them, or that has none).
func shaHashed(src keySource) bool {
	c, ok := src.(*hashing.Chain)
	return ok && c.Hashed() > c.MemoHits()
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
func (r *walker) finish1(w *walk1State, end, nblocks int, positions, bs int64) {
	r.walked = min(end+1, nblocks)
	pos := min(int64(end)*bs, positions)
	for t, a := range w.a {
		r.drop(t, 0, a, pos)
	}
	w.done = true
}

// walk1Loop is walk1's loop, from block from up to limit (nblocks: to the end of the
// walk; less: it returns with w updated and the walk not done, unless it ended before
// limit). Keys known ahead (memo runs) go through sameRun; the block that ends its run
// is read here, as is every block whose key is not known ahead. With probe, that block
// also starts a batch of overlapped probes (probe.go) whose records are read here. Without,
// the loop serves tables that fit in the core's caches (probeMinEntries), where a batch's
// bookkeeping costs more than the misses it overlaps, and the timed start of a walk in a
// large one.
func (r *walker) walk1Loop(w *walk1State, src keySource, from, limit, nblocks int, positions, bs int64, probe bool) error {
	a0, a1, a2, a3 := w.a[0], w.a[1], w.a[2], w.a[3]
	tab, prev := w.tab, w.prev
	end := nblocks
	pb := &r.pb
	pb.reset(src)
	pb.read = !r.slow
	rs := runState{batch: probeFirst}
	for i := from; i < limit; {
		if i >= pb.end && i != pb.stop {
			if !r.slow && pb.an == 0 { // with an, the batch hashed ahead: keys from src are past it
				j, all := r.sameRun(tab, src, &rs, i, limit-i, a0, a1, a2, a3)
				if i += j; all {
					continue
				}
			}
			if probe {
				pb.next(tab, i, limit, a3)
			}
		}
		key, rec := pb.ahead(i)
		if rec == nil {
			if key, rec = pb.fetch(tab, i); rec == nil {
				if tab, prev, rec = pb.missed(tab, prev, key); rec == nil {
					end = i // not indexed, or not hashed (pb.err)
					break
				}
			}
		}
		// Version check (see the record layout in table.go): meta, key, bitsets, meta.
		// Torn reads, test hooks and pending clears take the slow path (readSlow1),
		// which keeps this loop's live values in registers.
		var meta, dev, loc, dsk uint64
		var ok bool
		switch j := uint(i - pb.base); {
		case r.slow:
		case j < uint(pb.n) && pb.good[j]: // read by the batch (probe.go)
			v := &pb.vals[j]
			meta, dev, loc, dsk, ok = v[0], v[1], v[2], v[3], true
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
		// The tier rule (dropped1, inlined: one OR and one branch per block while no set
		// loses a slot); the drops themselves are recorded out of line.
		if d0, d1, d2, d3 := dropped1(a0, a1, a2, a3, meta, dev, loc, dsk); d0|d1|d2|d3 != 0 {
			if a0, a1, a2, a3 = r.drop1(a0, a1, a2, a3, d0, d1, d2, d3, min(int64(i)*bs, positions)); a3 == 0 {
				r.walked = i + 1
				w.done = true
				return nil
			}
		}
		i++
	}
	if pb.err != nil {
		return hashError(end, pb.err)
	}
	w.a = [4]uint64{a0, a1, a2, a3}
	w.tab, w.prev = tab, prev
	if end == nblocks && limit < nblocks {
		return nil // paused at limit
	}
	r.finish1(w, end, nblocks, positions, bs)
	return nil
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

// drop1 records pos as the count of the slots that left each tier's set a0..a3 (d0..d3)
// and returns the sets without them.
func (r *walker) drop1(a0, a1, a2, a3, d0, d1, d2, d3 uint64, pos int64) (uint64, uint64, uint64, uint64) {
	r.drop(0, 0, d0, pos)
	r.drop(1, 0, d1, pos)
	r.drop(2, 0, d2, pos)
	r.drop(3, 0, d3, pos)
	return a0 &^ d0, a1 &^ d1, a2 &^ d2, a3 &^ d3
}

// maxTiers is the tier-by-tier maximum of a and b (an instance's tiers are the maximum
// over its ranks).
func maxTiers(a, b Tiers) Tiers {
	return Tiers{max(a.Device, b.Device), max(a.CPULocal, b.CPULocal), max(a.CPUShare, b.CPUShare), max(a.Disk, b.Disk)}
}

// zeroCounts sets the counts of every rank of insts to zero.
func (r *walker) zeroCounts(insts []instSlots) {
	for i := range insts {
		for _, rs := range insts[i].ranks {
			r.counts[rs.slot] = [4]int64{}
		}
	}
}

// assemble appends to dst[:0] the per-rank and per-instance hits of the counts, and
// returns it.
func (r *walker) assemble(insts []instSlots, dst []InstanceHit) []InstanceHit {
	dst = dst[:0]
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
			hit.Tiers = maxTiers(hit.Tiers, t)
		}
		dst = append(dst, hit)
	}
	return dst
}
