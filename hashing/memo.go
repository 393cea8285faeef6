package hashing

import (
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"
)

// DefaultMemoEntries is the memo capacity, in blocks, that servers use when none is
// configured: 8,388,608 blocks (128M tokens at block size 16) in 1,048,576 runs of
// memoRun blocks, 160 MiB once every entry has been written.
const DefaultMemoEntries = 1 << 23

// DefaultMemoStart is the size, in blocks, that servers' memos start at and grow from
// (NewGrowingMemo): 131,072 blocks, 2.5 MiB once written.
const DefaultMemoStart = 1 << 17

// MemoEntryBytes is the memory one memo entry takes, for a run of memoRun blocks (20
// bytes a block): two cache lines for the entry, and its record hints (memoRun 32-bit
// words, kept apart from the entry; see Chain.HintsAhead).
const MemoEntryBytes = memoLineBytes + 4*memoRun

// memoLineBytes is the size of a memoEntry: two cache lines.
const memoLineBytes = 128

// A memoEntry is exactly memoLineBytes (the hints that follow the entries, and the sets'
// alignment, depend on it): either array has a negative length otherwise.
var (
	_ [memoLineBytes - unsafe.Sizeof(memoEntry{})]byte
	_ [unsafe.Sizeof(memoEntry{}) - memoLineBytes]byte
)

// memoRun is the number of consecutive blocks one memo entry remembers: the blocks
// r*memoRun .. r*memoRun+memoRun-1 of a prompt (runs are aligned to the prompt's start).
const memoRun = 8

// Memo remembers, for runs of memoRun consecutive blocks that queries hashed, the
// blocks' projected keys and the full SHA-256 digest of the run's last block, under a
// cheap content chain of the prompt up to and including that block, so that a later query
// sharing the prefix skips SHA-256 for the run and the key projection for each of its
// blocks, and resumes the SHA chain from the remembered digest (see Chain.ResetMemo). One
// entry serves memoRun blocks: a lookup, its cache lines and its check word are paid once
// per run, not once per block. A run that is not whole (the prompt's last blocks, or a
// walk that stopped inside it) is not remembered: those blocks are hashed each time.
//
// The cheap chain is two independent 64-bit lanes, each keyed by its own random
// per-Memo secrets: a lane's value after a block is a keyed multiply hash of the block's
// token bytes, its length and the lane's previous value (blockLanes: 64x64->128 multiplies
// of key-masked word pairs, folded and summed, then one multiply with the lane's fold
// key). Both lanes start from a keyed xxhash64 of everything the entry depends on
// besides the tokens: strategy, algorithm, key projection, root digest, block size, LoRA
// name and cache salt. The block hashes do not depend on the chain, so consecutive blocks' hashes
// overlap and the chain is one multiply per block and lane. An entry matches only if both
// 64-bit lanes equal the stored ones and a keyed check over (lanes, keys, digest) verifies, so
// a false match needs both lanes, under independent secret keys, to collide at once plus
// the check word; the 64-bit index keys themselves collide far more often.
//
// The table is an array of 4-way sets (512 bytes, one entry two adjacent cache
// lines, 128-byte aligned) with a reference bit per entry: an insert replaces an empty or unreferenced way, and when every
// way was used since the set was last passed over it clears their bits and takes one (a
// clock per set). Each entry has a preferred way (two bits of lane B, pref) that inserts
// take when they can and lookups try first, so a lookup usually loads one entry, not four
// (nearly every entry at low load, 79% at half load, 75% at three quarters). Nothing locks: words are read and written whole (ldw, stw), a torn
// read (a writer replacing the entry meanwhile) fails the check word and counts as a miss,
// and two writers racing on one entry can leave it inconsistent, which the check word also
// rejects until the entry is replaced.
//
// Next to the entries, each block of a run has a record hint: where the walk that last
// took the run from the memo found the block's record in the index (Chain.HintsAhead,
// SaveHints), so that the next walk reads the record without probing the index's table.
// Hints are not covered by the check word: a walk checks a hint against the record
// itself, and a replaced entry's hints are stale until a walk corrects them.
//
// A Memo is safe for concurrent use. Its largest table is mapped once by NewMemo or
// NewGrowingMemo, outside the Go heap and on transparent huge pages where the kernel
// allows (allocEntries); the table queries use is a prefix of it, which a growing memo
// enlarges (Grow, memo_grow.go); pages become resident as entries are written or
// populated, and the mapping goes when the Memo is unreachable.
type Memo struct {
	// tab is the table queries use now: the first sets of the mapping (ents, hints) that
	// the memo has grown to. Grow publishes a larger one; a chain loads it once per
	// prompt (ResetMemo), so a prompt sees one table from start to end.
	tab atomic.Pointer[memoTable]
	// ents and hints are the whole reservation, the limit's sets: the current table is a
	// prefix of each (entry e's hints at e*memoRun of hints, whatever the table's size).
	ents  []memoEntry
	hints []uint32
	// seedA and seedB seed the two lanes' start values, laneA and laneB key their block
	// hashes and chain folds (blockLanes); ck keys the check word. Random per Memo.
	seedA, seedB uint64
	laneA, laneB laneKeys
	ck           [memoEntryWords]uint64

	// region is the mapping that holds ents and hints (nil where they are on the heap);
	// entsOff and hintsOff are where they start in it.
	region            []byte
	entsOff, hintsOff int

	grower memoGrower

	// seen is the second-sight doorkeeper (SetSecondSight; nil: off): a bitmap of the
	// first runs of the prompts asked, 2^seenShift bits, seenSet of them set since it was
	// last cleared.
	seen      []atomic.Uint64
	seenShift uint
	seenSet   atomic.Uint64

	stripe  atomic.Uint32
	stripes [memoStripes]memoCounters
}

// memoTable is a memo's table at one size: its first len(ents)/memoWays sets, their
// record hints, and the memo's check keys. Queries read and write entries through it;
// it never changes once published (Grow publishes another).
type memoTable struct {
	ents    []memoEntry
	hints   []uint32
	setMask uint64 // sets - 1
	ck      *[memoEntryWords]uint64
}

// Populate makes the memo's current table resident now, where its pages otherwise become
// resident as queries first write to them (a growing memo's later sizes are populated by
// Grow, NewGrowingMemo). In a fresh process the first writes land on untouched
// pages at random, and each costs the query that makes it a page fault that zeroes a
// (huge) page: on a VM, cold queries of a new conductor cost several times what they
// cost once the memo has been used (docs/performance.md has the figures). Populating
// moves that cost out of the queries (to start-up, or to the grower) and makes the
// memory the memo will hold visible in RSS at once. It changes no entry, so it may run while queries use the memo. It returns
// an error where it cannot (not Linux, a kernel before 5.14, the memo on the Go heap);
// the memo then works as before. A nil Memo has nothing to populate.
func (m *Memo) Populate() error {
	if m == nil {
		return nil
	}
	return m.populate()
}

// Bytes is the memory the memo's current table and record hints take once resident.
func (m *Memo) Bytes() int {
	if m == nil {
		return 0
	}
	return len(m.tab.Load().ents) * MemoEntryBytes
}

// memoStripes spreads the statistics counters over cache lines so that concurrent queries
// flushing their per-query counts do not contend on one line.
const memoStripes = 8

type memoCounters struct {
	hits, misses, inserts, evictions, reasked atomic.Uint64
	_                                         [24]byte
}

// memoEntry is one run: both chain lanes after its last block, the projected keys of its
// blocks, the digest of its last block, a check word over all of them (0 = empty), and
// the ref word: the reference bit (bit 0), the ghost of the entry it replaced (bits
// 1-31, 0 = none; see ghostTag) and the owner of the run's record hints (bits 32-63, 0 =
// none; see Chain.SetHintOwner). Two cache lines.
type memoEntry struct {
	a, b  uint64
	k     [memoRun]uint64
	d     [4]uint64
	check uint64
	ref   uint64
}

// memoEntryWords is the number of words an entry's check covers plus the check itself
// (a, b, keys, digest, check): the ref bit is not covered.
const memoEntryWords = 2 + memoRun + 4 + 1

// memoRunVal is what an entry holds besides its check and ref, in store order.
type memoRunVal struct {
	a, b uint64
	k    [memoRun]uint64
	d    [4]uint64
}

// MemoStats are a Memo's cumulative counters.
type MemoStats struct {
	// Capacity is the number of blocks the memo can hold at its current size (runs times
	// memoRun, a power of two; a growing memo's grows, see Grow).
	Capacity int
	// Hits counts blocks whose key a query took from the memo; Misses counts blocks a
	// query had to SHA-hash while a memo was attached.
	Hits, Misses uint64
	// Inserts counts entries (runs of memoRun blocks) written; Evictions counts inserts
	// that replaced a valid entry.
	Inserts, Evictions uint64
	// Reasked counts lookups that missed a run its set had evicted lately (its ghost
	// is among the set's, see ghostTag): runs a memo about twice the size would have
	// served. A growing memo grows with use only on them (Outgrown).
	Reasked uint64
}

// NewMemo returns a memo of at least blocks blocks (rounded up to a power of two, at
// least 4 runs of memoRun), or nil when blocks <= 0: a nil *Memo disables memoisation.
// Its size is fixed (NewGrowingMemo makes one that grows).
func NewMemo(blocks int) *Memo {
	return NewGrowingMemo(blocks, blocks, false)
}

// memoRuns is the number of entries (runs) of a memo of at least blocks blocks: a power
// of two, at least one set.
func memoRuns(blocks int) int {
	n := memoWays
	for n*memoRun < blocks {
		n <<= 1
	}
	return n
}

// NewGrowingMemo returns a memo of at least start blocks that Grow can enlarge up to at
// least limit blocks (both rounded up to powers of two), or nil when limit <= 0. Only
// address space is reserved for the limit: pages become resident as entries are written,
// or, with prefault, as Grow makes them part of the table (see Grow). Once queries have
// inserted runs for half of its capacity since it last grew (or was made), the memo asks
// to grow through GrowRequests; whoever owns it decides by how much and calls Grow
// (the engine's grower doubles it only when it has also Outgrown its size).
func NewGrowingMemo(start, limit int, prefault bool) *Memo {
	if limit <= 0 {
		return nil
	}
	total := memoRuns(limit)
	n := min(memoRuns(start), total)
	m := &Memo{
		seedA: rand.Uint64(),
		seedB: rand.Uint64(),
		laneA: newLaneKeys(),
		laneB: newLaneKeys(),
	}
	for i := range m.ck {
		m.ck[i] = rand.Uint64()
	}
	m.ents, m.hints, m.region, m.entsOff, m.hintsOff = allocEntries(total, m)
	m.tab.Store(m.table(n))
	m.grower.init(n, n < total, prefault)
	return m
}

// table returns the table of the first n entries (a power of two, at least one set).
func (m *Memo) table(n int) *memoTable {
	return &memoTable{ents: m.ents[:n:n], hints: m.hints[: n*memoRun : n*memoRun],
		setMask: uint64(n/memoWays - 1), ck: &m.ck}
}

// cur returns the table queries use now.
func (m *Memo) cur() *memoTable { return m.tab.Load() }

// MemoBytes is the memory a memo of at most blocks blocks takes once grown to its bound
// and written all over (0 for blocks <= 0), so that a configuration can be checked before
// the memo is made.
func MemoBytes(blocks int) int64 {
	if blocks <= 0 {
		return 0
	}
	return int64(memoRuns(blocks)) * MemoEntryBytes
}

// Stats returns the memo's counters; a nil Memo has none.
func (m *Memo) Stats() MemoStats {
	if m == nil {
		return MemoStats{}
	}
	s := MemoStats{Capacity: len(m.tab.Load().ents) * memoRun}
	for i := range m.stripes {
		st := &m.stripes[i]
		s.Hits += st.hits.Load()
		s.Misses += st.misses.Load()
		s.Inserts += st.inserts.Load()
		s.Evictions += st.evictions.Load()
		s.Reasked += st.reasked.Load()
	}
	return s
}

// memoMul folds the 128-bit product of x and y: the mixing step of the lanes and the
// check word.
func memoMul(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

// checkOf is the keyed check word of an entry holding v; never 0, so 0 marks an empty
// entry. Independent products of key-masked word pairs, summed and mixed once more:
// any mix of two entries' words (a torn read) gives another value but with probability
// about 2^-64.
func (m *memoTable) checkOf(v *memoRunVal) uint64 {
	k := m.ck
	h := memoMul(v.a^k[0], v.b^k[1]) +
		memoMul(v.k[0]^k[2], v.k[1]^k[3]) + memoMul(v.k[2]^k[4], v.k[3]^k[5]) +
		memoMul(v.k[4]^k[6], v.k[5]^k[7]) + memoMul(v.k[6]^k[8], v.k[7]^k[9]) +
		memoMul(v.d[0]^k[10], v.d[1]^k[11]) + memoMul(v.d[2]^k[12], v.d[3]^k[13])
	return memoMul(h, k[14]|1) | 1
}

// memoWays is the associativity: a set is four entries, 512 bytes.
const memoWays = 4

// set returns the first entry of the set of lane a.
func (m *memoTable) set(a uint64) int { return int(a&m.setMask) * memoWays }

// pref is the way an entry of lane b goes to when it can: lookups try it first, and
// touch loads only its lines, so a set's other entries are fetched only for inserts that
// found their way taken.
func pref(b uint64) int { return int(b >> 62) }

// touch loads a word of each line of (a, b)'s preferred way so that both are on their
// way before the real lookup or insert; the result only feeds a sink.
func (m *memoTable) touch(a, b uint64) uint64 {
	e := &m.ents[m.set(a)+pref(b)]
	return ldw(&e.a) + ldw(&e.d[0])
}

// hintOwner returns the owner of entry w's record hints (0: none).
func (m *memoTable) hintOwner(w int) uint32 { return uint32(ldw(&m.ents[w].ref) >> 32) }

// claimHints makes owner the owner of entry w's record hints, keeping its reference bit.
func (m *memoTable) claimHints(w int, owner uint32) {
	e := &m.ents[w]
	stw(&e.ref, ldw(&e.ref)&0xFFFFFFFF|uint64(owner)<<32)
}

// touchHints is touch for the preferred way's record hints (a lookup that finds the run
// reads them).
func (m *memoTable) touchHints(a, b uint64) uint64 {
	return uint64(atomic.LoadUint32(&m.hints[(m.set(a)+pref(b))*memoRun]))
}

// touchSet loads a word of both lines of every entry of the set of lane a, for an insert
// whose preferred way is taken, which reads every way's lanes (first line), check word
// and reference bit (second line; see insert).
func (m *memoTable) touchSet(a uint64) uint64 {
	s := m.set(a)
	e := m.ents[s : s+memoWays : s+memoWays]
	return ldw(&e[0].a) + ldw(&e[1].a) + ldw(&e[2].a) + ldw(&e[3].a) +
		ldw(&e[0].check) + ldw(&e[1].check) + ldw(&e[2].check) + ldw(&e[3].check)
}

// SetSecondSight makes the memo remember a prompt's runs only from the second time its
// first run is asked (on; query_memo_second_sight, on by default), or from the first (off,
// a new Memo's state). Prompts asked once (a router's traffic is full of them) then cost
// what they cost without a memo: a chain looks up the prompt's first run, and when the
// memo lacks it, has not seen it asked and did not hold it lately (no ghost, see
// ghostTag), notes it and hashes the prompt without the memo (no lanes, lookups or inserts
// past that run); the second time, the chain looks it up, misses, and remembers the
// prompt's runs, which the third serves. Conversations lose the memo's help on the turn
// after their first (turns that share a system prompt's first run are seen from the
// start). The doorkeeper is a bitmap of one bit a memo entry at the memo's limit (128 KiB
// at the default), cleared when half its bits are set, so that what it remembers is
// recent. Call it before the memo is used; a nil Memo ignores it.
func (m *Memo) SetSecondSight(on bool) {
	if m == nil {
		return
	}
	if !on {
		m.seen = nil
		return
	}
	m.seenShift = uint(bits.Len(uint(max(len(m.ents), 1<<12))) - 1)
	m.seen = make([]atomic.Uint64, max((1<<m.seenShift)/64, 1))
}

// firstSight records the first run of a prompt (its lanes a, b) in the doorkeeper and
// reports whether it was not there: the first time (since the last clear) that run was
// asked. Half the bits set clears them all (one goroutine, the one that set that bit).
func (m *Memo) firstSight(a, b uint64) bool {
	i := ((a ^ bits.RotateLeft64(b, 29)) * 0x9E3779B97F4A7C15) >> (64 - m.seenShift)
	w, bit := &m.seen[i>>6], uint64(1)<<(i&63)
	if w.Load()&bit != 0 || w.Or(bit)&bit != 0 {
		return false
	}
	if m.seenSet.Add(1) == uint64(len(m.seen))*32 {
		for j := range m.seen {
			m.seen[j].Store(0)
		}
		m.seenSet.Store(0)
	}
	return true
}

// ghostTag is what an entry keeps of the entry it replaced, in bits 1-31 of its ref word:
// 30 bits of the evicted run's lane b (not those pref uses) and a presence bit. A set's
// four ways thus remember the last run evicted from each, which is enough to tell a
// lookup that misses because the memo is too small for the prompts asked again (the run
// was here a few replacements ago) from one that misses because the prompt is new; a new
// prompt's lookup matches a ghost by chance about once in 2^28.
func ghostTag(b uint64) uint64 { return (b>>32)&0x3FFFFFFF | 0x40000000 }

// ghostOf reports whether the set of lane a remembers evicting the run of lanes (a, b):
// one of its ways holds its ghost tag. Only lookups that missed ask, a few a prompt.
func (m *memoTable) ghostOf(a, b uint64) bool {
	s := m.set(a)
	g := ghostTag(b)
	for w := s; w < s+memoWays; w++ {
		if ldw(&m.ents[w].ref)>>1&0x7FFFFFFF == g {
			return true
		}
	}
	return false
}

// preferredEmpty reports whether the preferred way of (a, b) is empty, so that an insert
// of (a, b) writes only that entry (see insert).
func (m *memoTable) preferredEmpty(a, b uint64) bool {
	return ldw(&m.ents[m.set(a)+pref(b)].check) == 0
}

// lookup copies the run stored under (a, b) into v and reports whether it was there: the
// preferred way first, then the others.
func (m *memoTable) lookup(a, b uint64, v *memoRunVal) bool { return m.lookupAt(a, b, v) >= 0 }

// lookupAt is lookup returning the index of the entry found, or -1.
func (m *memoTable) lookupAt(a, b uint64, v *memoRunVal) int {
	s := m.set(a)
	p := pref(b)
	for i := 0; i < memoWays; i++ {
		w := s + (p+i)&(memoWays-1)
		e := &m.ents[w]
		if ldw(&e.a) != a || ldw(&e.b) != b {
			continue
		}
		v.a, v.b = a, b
		for j := range v.k {
			v.k[j] = ldw(&e.k[j])
		}
		for j := range v.d {
			v.d[j] = ldw(&e.d[j])
		}
		if ldw(&e.check) != m.checkOf(v) {
			return -1 // torn or half-written: treat as absent
		}
		if r := ldw(&e.ref); r&1 == 0 {
			stw(&e.ref, r|1)
		}
		return w
	}
	return -1
}

// insert stores v under (v.a, v.b) unless it is already there, and reports whether it
// wrote and whether it replaced a valid entry. The victim is an empty way, else one not
// referenced since the set was last passed over, the preferred way first in both cases;
// when every way was referenced, their bits are cleared and the preferred way is taken (a
// clock per set).
func (m *memoTable) insert(v *memoRunVal) (wrote, evicted bool) {
	_, wrote, evicted = m.place(v)
	return wrote, evicted
}

// place is insert, also returning the entry written (or found).
func (m *memoTable) place(v *memoRunVal) (at int, wrote, evicted bool) {
	a, b := v.a, v.b
	s := m.set(a)
	p := s + pref(b)
	ck := m.checkOf(v)
	if ldw(&m.ents[p].check) == 0 {
		// The preferred way is empty, which is what the scan below would take (an empty
		// preferred way comes first), and the set cannot hold (a, b) elsewhere: entries
		// are never removed, so the way was empty whenever an entry of this preference
		// was inserted, and that entry took it. One entry read instead of four.
		return p, true, m.write(&m.ents[p], v, ck)
	}
	empty, unref := -1, -1
	for w := s; w < s+memoWays; w++ {
		e := &m.ents[w]
		c := ldw(&e.check)
		if c == ck && ldw(&e.a) == a && ldw(&e.b) == b {
			return w, false, false
		}
		if c == 0 && (empty < 0 || w == p) {
			empty = w
		}
		if ldw(&e.ref)&1 == 0 && (unref < 0 || w == p) {
			unref = w
		}
	}
	victim := empty
	if victim < 0 {
		victim = unref
	}
	if victim < 0 {
		victim = p
		for w := s; w < s+memoWays; w++ {
			if w != victim {
				stw(&m.ents[w].ref, ldw(&m.ents[w].ref)&^1) // the hints' owner stays
			}
		}
	}
	return victim, true, m.write(&m.ents[victim], v, ck)
}

// write fills e and reports whether it held a valid-looking entry before. It stores the
// words in memoWriter's order (the check as 0 first, so that readers see the entry absent
// while it changes, the check last), written out rather than stepped: the tests'
// interleavings step a memoWriter, and TestMemoWriteMatchesSteps holds the two equal.
func (m *memoTable) write(e *memoEntry, v *memoRunVal, ck uint64) bool {
	old := ldw(&e.check)
	var ghost uint64
	if old != 0 {
		ghost = ghostTag(ldw(&e.b)) << 1
	}
	stw(&e.check, 0)
	stw(&e.a, v.a)
	stw(&e.b, v.b)
	for j := range v.k {
		stw(&e.k[j], v.k[j])
	}
	for j := range v.d {
		stw(&e.d[j], v.d[j])
	}
	stw(&e.ref, 1|ghost)
	stw(&e.check, ck)
	return old != 0
}

// memoWriteSteps is the number of word stores of one entry write: the check (as 0), the
// lanes, the keys, the digest, the ref bit and the check.
const memoWriteSteps = memoEntryWords + 2

// memoWriter is one entry write as separate word stores, so that tests can interleave
// writers store by store. The check word goes first (as 0: readers see the entry absent
// while it changes) and last.
type memoWriter struct {
	e     *memoEntry
	v     *memoRunVal
	check uint64
	ghost uint64 // the replaced entry's ghost, taken at step 0 (see write)
}

func (m *memoTable) newWriter(e *memoEntry, v *memoRunVal) memoWriter {
	return memoWriter{e: e, v: v, check: m.checkOf(v)}
}

// step performs store k (0..memoWriteSteps-1); step 0 returns the old check word.
func (w *memoWriter) step(k int) uint64 {
	e, v := w.e, w.v
	switch {
	case k == 0:
		old := ldw(&e.check)
		if old != 0 {
			w.ghost = ghostTag(ldw(&e.b)) << 1
		}
		stw(&e.check, 0)
		return old
	case k == 1:
		stw(&e.a, v.a)
	case k == 2:
		stw(&e.b, v.b)
	case k < 3+memoRun:
		stw(&e.k[k-3], v.k[k-3])
	case k < 3+memoRun+4:
		stw(&e.d[k-3-memoRun], v.d[k-3-memoRun])
	case k == 3+memoRun+4:
		stw(&e.ref, 1|w.ghost)
	default:
		stw(&e.check, w.check)
	}
	return 0
}
