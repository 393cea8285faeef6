package engine

import (
	"sync/atomic"
	"unsafe"
)

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
func (r *walker) sameRun(tab *table, src keySource, st *runState, i, most int, a0, a1, a2, a3 uint64) (int, bool) {
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
		// comparing the four new sets with the old took four).
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
