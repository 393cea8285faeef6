package hashing

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
)

// DefaultMemoEntries is the memo capacity servers use when none is configured: 2,097,152
// blocks (32M tokens at block size 16), 128 MiB once every entry has been written.
const DefaultMemoEntries = 1 << 21

// MemoEntryBytes is the memory one memo entry takes (one cache line).
const MemoEntryBytes = 64

// Memo remembers, for blocks that queries hashed, the block's full SHA-256 digest under a
// cheap content chain of the prompt up to and including that block, so that a later query
// sharing the prefix skips SHA-256 for it (see Chain.ResetMemo).
//
// The cheap chain is two independent 64-bit lanes, each keyed by its own random
// per-Memo secrets: a lane's value after a block is a keyed multiply hash of the block's
// token bytes, its length and the lane's previous value (blockLanes: 64x64->128 multiplies
// of key-masked word pairs, folded and summed, then one multiply with the lane's fold
// key). Both lanes start from a keyed xxhash64 of everything the digest depends on
// besides the tokens: strategy, algorithm, root digest, block size, LoRA name and cache
// salt. The block hashes do not depend on the chain, so consecutive blocks' hashes
// overlap and the chain is one multiply per block and lane. An entry matches only if both
// 64-bit lanes equal the stored ones and a keyed check over (lanes, digest) verifies, so
// a false match needs both lanes, under independent secret keys, to collide at once plus
// the check word; the 64-bit index keys themselves collide far more often.
//
// The table is a fixed array of 4-way sets (256 bytes, one entry a cache line) with a
// reference bit per entry: an insert replaces an empty or unreferenced way, and when every
// way was used since the set was last passed over it clears their bits and takes one (a
// clock per set). Each entry has a preferred way (two bits of lane B, pref) that inserts
// take when they can and lookups try first, so a lookup usually loads one line, not four
// (nearly every entry at low load, 79% at half load, 75% at three quarters). Nothing locks: words are read and written whole (ldw, stw), a torn
// read (a writer replacing the entry meanwhile) fails the check word and counts as a miss,
// and two writers racing on one entry can leave it inconsistent, which the check word also
// rejects until the entry is replaced.
//
// A Memo is safe for concurrent use. Its table is mapped once by NewMemo, outside the Go
// heap and on transparent huge pages where the kernel allows (allocEntries); pages become
// resident as entries are written, and the mapping goes when the Memo is unreachable.
type Memo struct {
	ents    []memoEntry
	setMask uint64 // sets - 1
	// seedA and seedB seed the two lanes' start values, laneA and laneB key their block
	// hashes and chain folds (blockLanes); seedC keys the check word. Random per Memo.
	seedA, seedB, seedC uint64
	laneA, laneB        laneKeys

	stripe  atomic.Uint32
	stripes [memoStripes]memoCounters
}

// memoStripes spreads the statistics counters over cache lines so that concurrent queries
// flushing their per-query counts do not contend on one line.
const memoStripes = 8

type memoCounters struct {
	hits, misses, inserts, evictions atomic.Uint64
	_                                [32]byte
}

// memoEntry is one cache line: both chain lanes, the digest, a check word over all of them
// (0 = empty) and the reference bit.
type memoEntry struct {
	a, b  uint64
	d     [4]uint64
	check uint64
	ref   uint64
}

// MemoStats are a Memo's cumulative counters.
type MemoStats struct {
	// Capacity is the number of entries (a power of two).
	Capacity int
	// Hits counts blocks whose digest a query took from the memo; Misses counts blocks a
	// query had to SHA-hash while a memo was attached.
	Hits, Misses uint64
	// Inserts counts entries written; Evictions counts inserts that replaced a valid entry.
	Inserts, Evictions uint64
}

// NewMemo returns a memo of at least entries entries (rounded up to a power of two, at
// least 4), or nil when entries <= 0: a nil *Memo disables memoisation.
func NewMemo(entries int) *Memo {
	if entries <= 0 {
		return nil
	}
	n := memoWays
	for n < entries {
		n <<= 1
	}
	m := &Memo{
		setMask: uint64(n/memoWays - 1),
		seedA:   rand.Uint64(),
		seedB:   rand.Uint64(),
		seedC:   rand.Uint64() | 1,
		laneA:   newLaneKeys(),
		laneB:   newLaneKeys(),
	}
	m.ents = allocEntries(n, m)
	return m
}

// Stats returns the memo's counters; a nil Memo has none.
func (m *Memo) Stats() MemoStats {
	if m == nil {
		return MemoStats{}
	}
	s := MemoStats{Capacity: len(m.ents)}
	for i := range m.stripes {
		st := &m.stripes[i]
		s.Hits += st.hits.Load()
		s.Misses += st.misses.Load()
		s.Inserts += st.inserts.Load()
		s.Evictions += st.evictions.Load()
	}
	return s
}

// memoMul folds the 128-bit product of x and y: the mixing step of the check word.
func memoMul(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// checkOf is the keyed check word of an entry; never 0, so 0 marks an empty entry.
func (m *Memo) checkOf(a, b, d0, d1, d2, d3 uint64) uint64 {
	const k0, k1, k2 = 0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb
	h := memoMul(a^m.seedC, b^k0)
	h = memoMul(h^d0, d1^k1)
	h = memoMul(h^d2, d3^k2^m.seedC)
	return h | 1
}

// memoWays is the associativity: a set is four entries, 256 bytes, two pairs of lines.
const memoWays = 4

// set returns the first entry of the set of lane a.
func (m *Memo) set(a uint64) int { return int(a&m.setMask) * memoWays }

// pref is the way an entry of lane b goes to when it can: lookups try it first, and
// touch loads only its line, so a set's other lines are fetched only for entries that
// found their way taken.
func pref(b uint64) int { return int(b >> 62) }

// touch loads a word of the line of (a, b)'s preferred way so that it is on its way before
// the real lookup or insert; the result only feeds a sink.
func (m *Memo) touch(a, b uint64) uint64 {
	return ldw(&m.ents[m.set(a)+pref(b)].a)
}

// touchSet loads a word of each line of the set of lane a, for an insert whose preferred
// way is taken, which reads every way.
func (m *Memo) touchSet(a uint64) uint64 {
	s := m.set(a)
	e := m.ents[s : s+memoWays : s+memoWays]
	return ldw(&e[0].a) + ldw(&e[1].a) + ldw(&e[2].a) + ldw(&e[3].a)
}

// preferredEmpty reports whether the preferred way of (a, b) is empty, so that an insert
// of (a, b) writes only that line (see insert).
func (m *Memo) preferredEmpty(a, b uint64) bool {
	return ldw(&m.ents[m.set(a)+pref(b)].check) == 0
}

// lookup copies the digest stored under (a, b) into d and reports whether it was there:
// the preferred way first, then the others.
func (m *Memo) lookup(a, b uint64, d *[32]byte) bool {
	s := m.set(a)
	p := pref(b)
	for i := 0; i < memoWays; i++ {
		e := &m.ents[s+(p+i)&(memoWays-1)]
		if ldw(&e.a) != a || ldw(&e.b) != b {
			continue
		}
		d0, d1, d2, d3 := ldw(&e.d[0]), ldw(&e.d[1]), ldw(&e.d[2]), ldw(&e.d[3])
		if ldw(&e.check) != m.checkOf(a, b, d0, d1, d2, d3) {
			return false // torn or half-written: treat as absent
		}
		if ldw(&e.ref) == 0 {
			stw(&e.ref, 1)
		}
		binary.LittleEndian.PutUint64(d[0:], d0)
		binary.LittleEndian.PutUint64(d[8:], d1)
		binary.LittleEndian.PutUint64(d[16:], d2)
		binary.LittleEndian.PutUint64(d[24:], d3)
		return true
	}
	return false
}

// insert stores d under (a, b) unless it is already there, and reports whether it wrote
// and whether it replaced a valid entry. The victim is an empty way, else one not
// referenced since the set was last passed over, the preferred way first in both cases;
// when every way was referenced, their bits are cleared and the preferred way is taken (a
// clock per set).
func (m *Memo) insert(a, b uint64, d *[32]byte) (wrote, evicted bool) {
	s := m.set(a)
	p := s + pref(b)
	d0 := binary.LittleEndian.Uint64(d[0:])
	d1 := binary.LittleEndian.Uint64(d[8:])
	d2 := binary.LittleEndian.Uint64(d[16:])
	d3 := binary.LittleEndian.Uint64(d[24:])
	ck := m.checkOf(a, b, d0, d1, d2, d3)
	if ldw(&m.ents[p].check) == 0 {
		// The preferred way is empty, which is what the scan below would take (an empty
		// preferred way comes first), and the set cannot hold (a, b) elsewhere: entries
		// are never removed, so the way was empty whenever an entry of this preference
		// was inserted, and that entry took it. One line read instead of four.
		return true, m.write(&m.ents[p], a, b, d0, d1, d2, d3, ck)
	}
	empty, unref := -1, -1
	for w := s; w < s+memoWays; w++ {
		e := &m.ents[w]
		c := ldw(&e.check)
		if c == ck && ldw(&e.a) == a && ldw(&e.b) == b {
			return false, false
		}
		if c == 0 && (empty < 0 || w == p) {
			empty = w
		}
		if ldw(&e.ref) == 0 && (unref < 0 || w == p) {
			unref = w
		}
	}
	v := empty
	if v < 0 {
		v = unref
	}
	if v < 0 {
		v = p
		for w := s; w < s+memoWays; w++ {
			if w != v {
				stw(&m.ents[w].ref, 0)
			}
		}
	}
	return true, m.write(&m.ents[v], a, b, d0, d1, d2, d3, ck)
}

// write fills e and reports whether it held a valid-looking entry before.
func (m *Memo) write(e *memoEntry, a, b, d0, d1, d2, d3, ck uint64) bool {
	w := memoWriter{e: e, v: [8]uint64{a, b, d0, d1, d2, d3, 1, ck}}
	var old uint64
	for k := 0; k < memoWriteSteps; k++ {
		old |= w.step(k)
	}
	return old != 0
}

// memoWriteSteps is the number of word stores of one entry write.
const memoWriteSteps = 9

// memoWriter is one entry write as separate word stores, so that tests can interleave
// writers store by store. The check word goes first (as 0: readers see the entry absent
// while it changes) and last.
type memoWriter struct {
	e *memoEntry
	v [8]uint64 // a, b, d0..d3, ref, check
}

func (m *Memo) newWriter(e *memoEntry, a, b uint64, d *[32]byte) memoWriter {
	d0 := binary.LittleEndian.Uint64(d[0:])
	d1 := binary.LittleEndian.Uint64(d[8:])
	d2 := binary.LittleEndian.Uint64(d[16:])
	d3 := binary.LittleEndian.Uint64(d[24:])
	return memoWriter{e: e, v: [8]uint64{a, b, d0, d1, d2, d3, 1, m.checkOf(a, b, d0, d1, d2, d3)}}
}

// step performs store k (0..memoWriteSteps-1); step 0 returns the old check word.
func (w *memoWriter) step(k int) uint64 {
	e := w.e
	switch k {
	case 0:
		old := ldw(&e.check)
		stw(&e.check, 0)
		return old
	case 1:
		stw(&e.a, w.v[0])
	case 2:
		stw(&e.b, w.v[1])
	case 3, 4, 5, 6:
		stw(&e.d[k-3], w.v[k-1])
	case 7:
		stw(&e.ref, w.v[6])
	case 8:
		stw(&e.check, w.v[7])
	}
	return 0
}
