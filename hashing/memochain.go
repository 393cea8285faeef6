package hashing

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// aheadMax bounds the blocks a chain looks up in its memo ahead of the walk (whole runs):
// the lookups of one batch are independent, so their cache misses overlap.
const aheadMax = 64

// aheadRuns is aheadMax in runs; batches start at one run and double up to it, so a
// query that stops early (a miss) looks up at most about twice the runs it uses.
const aheadRuns = aheadMax / memoRun

// pendMax is how many memo inserts (runs) a chain buffers before writing them in one pass:
// a cold prompt of up to 512 blocks (8K tokens at block size 16) writes all its runs in
// one pass at Done, whose loads of the runs' sets overlap; in passes of 8 runs (the
// lookahead's), each pass waited for its own misses, a tenth of a cold query's CPU in the
// memo-cold benchmark.
const pendMax = 64

// errMemoDigest is the error of a chain asked to hash a block whose parent digest it does
// not have; the chain's invariant (below) rules it out, and it is an error rather than a
// wrong key should a bug ever break it.
var errMemoDigest = errors.New("hashing: memo chain lost the digest it resumes from")

// memoChain is the memo side of a Chain: the cheap content chain, the blocks looked up
// ahead, the inserts not yet written and the per-prompt counters.
//
// Blocks are remembered in runs (Memo). A batch computes the lanes of its blocks and
// looks up the runs that end in it: a run found gives the keys of its blocks and the
// digest of its last one; a run the memo lacks leaves its blocks to be hashed, each from
// the digest before it. The chain's invariant: the block before one it must hash is
// either hashed itself or the last block of a run from the memo, so its digest is known
// (parentOK). Batches end at run ends, a lacking run lacks all its blocks, and a block
// inside a run from the memo is never hashed. A run whose blocks were all hashed in this
// prompt is inserted once its last block is.
//
// Only a batch ending in missRun or more lacking runs in a row, the sign of a suffix
// nobody asked before, stops the lookups; the chain then re-probes single runs at gaps
// doubling from 1 run, so a cold suffix of n runs pays about log2(n) lookups after the
// batch that found it, and a re-probe that hits resumes the batched lookups.
type memoChain struct {
	m *Memo
	// t is m's table as the prompt found it (ResetMemo): the whole prompt uses one table,
	// even when the memo grows meanwhile (see Memo.Grow).
	t  *memoTable
	on bool
	// owner is the hint owner the chain walks for (SetHintOwner; 0: no hints).
	owner uint32
	// run counts the lacking runs in a row that the last lookups found; gap is the
	// distance in runs from the last lookup to the next re-probe while a run stops the
	// lookups; no batch is looked up before block probeAt.
	run, gap, probeAt int
	// la, lb are the lanes of block cx-1 (the start value when cx == 0).
	la, lb uint64
	cx     int
	x      xxhash.Digest

	// The buffer: slot j in [aheadPos, aheadLen) is block next+j-aheadPos, whose lanes are
	// aheadA[j], aheadB[j]. known[j] says aheadK[j] holds its key: from the memo, or hashed
	// (hashed[j]) by resolve once its parent was known. dv[j] says aheadD[j] holds its
	// digest (a hashed block, or the last block of a run from the memo).
	batch              int // runs
	aheadLen, aheadPos int
	aheadK             [aheadMax]uint64
	aheadD             [aheadMax][32]byte
	aheadA, aheadB     [aheadMax]uint64
	known, hashed, dv  [aheadMax]bool
	// aheadH[j] is the record hint of slot j's block as the memo held it when its run was
	// looked up (0: none, or a block not from the memo), for the walk to try and correct;
	// aheadW[j], for a slot j that ends a run, is the memo entry the run came from, where
	// SaveHints writes the run's hints back (-1: none, its blocks are hashed, or its hints
	// are another owner's).
	aheadH [aheadMax]uint32
	aheadW [aheadMax]int32
	// ownRuns counts the buffer's runs whose hints the chain may read and save: with
	// none, HintsAhead returns nil and the walk probes without hints' bookkeeping.
	ownRuns int
	val     memoRunVal // a lookup's result
	// knownEnd: every slot in [aheadPos, knownEnd) is known (the stretch the last
	// KeysAhead found; a slot stays known until the next fill), so that KeysAhead, called
	// once per batch the walk takes, does not scan the same flags again. hashedIn counts
	// the buffer's hashed slots: none (a memo-served batch) spares Advance its count.
	knownEnd, hashedIn int

	// parentOK: the chain's parent digest is block next-1's (or the seed at block 0).
	parentOK bool
	// The blocks hashed in a row end at streakEnd and began at streakFrom; runK holds the
	// keys of the current run's hashed blocks.
	streakFrom, streakEnd int
	runK                  [memoRun]uint64

	pend []memoRunVal

	sha    int // blocks SHA-hashed since reset
	probes int // memo lookups since reset (tests bound them)
	// firstSight: the prompt's first run was asked for the first time (Memo.SetSecondSight),
	// and the chain hashes the prompt without the memo (on is false); Done counts its
	// hashed blocks as misses.
	firstSight bool

	hits, misses, inserts, evictions uint64
	reasked                          uint64 // lookups that missed a run the memo had evicted (ghostOf)
	stripe                           int
	sink                             uint64
}

// missRun is the number of lacking runs in a row that stops a chain's memo lookups.
const missRun = 2

func (mc *memoChain) reset(m *Memo) {
	mc.m = m
	mc.t = nil
	if m != nil {
		mc.t = m.tab.Load()
	}
	mc.on = m != nil
	mc.firstSight = false
	mc.run, mc.gap, mc.probeAt = 0, 1, 0
	mc.cx, mc.sha, mc.probes = 0, 0, 0
	mc.aheadLen, mc.aheadPos = 0, 0
	mc.knownEnd, mc.hashedIn, mc.ownRuns = 0, 0, 0
	mc.batch = 1
	mc.parentOK = true
	mc.streakFrom, mc.streakEnd = -1, -1
}

// start derives the lanes' start value from everything an entry depends on besides the
// tokens: the whole profile (its root, extra-key form, lora path and lookahead; a run's
// keys also depend on the projection), the block size, the lora name and the salt.
func (mc *memoChain) start(p *Profile, blockSize int, lora, salt string) {
	var hdr [8 + 5*8]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = byte(p.Strategy), byte(p.Algorithm), byte(p.Projection), byte(p.ExtraKeys)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(blockSize))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(lora)))
	binary.LittleEndian.PutUint64(hdr[24:], uint64(len(salt)))
	binary.LittleEndian.PutUint64(hdr[32:], uint64(len(p.LoraPath)))
	binary.LittleEndian.PutUint64(hdr[40:], uint64(p.Lookahead))
	lane := func(seed uint64) uint64 {
		mc.x.ResetWithSeed(seed)
		_, _ = mc.x.Write(hdr[:])
		_, _ = mc.x.Write(p.Root[:])
		_, _ = mc.x.WriteString(lora)
		_, _ = mc.x.WriteString(salt)
		_, _ = mc.x.WriteString(p.LoraPath)
		return mc.x.Sum64()
	}
	mc.la, mc.lb = lane(mc.m.seedA), lane(mc.m.seedB)
}

// blockTokens returns the tokens block i's digest depends on besides its parent's: with
// lookahead, the windows of consecutive blocks overlap, and the lanes of block i still
// determine every token up to its window's end.
func (c *Chain) blockTokens(i int) []int32 {
	bs := c.blockSize
	s := i * bs
	switch c.strategy {
	case StrategyVLLMV1:
		return c.tokens[s : s+bs+c.lookahead]
	case StrategySGLangBigram:
		return c.tokens[s : min(s+bs, c.positions)+1]
	}
	return c.tokens[s:min(s+bs, c.positions)]
}

// advance computes the cheap chain of block c.mc.cx.
func (c *Chain) advance() {
	mc := &c.mc
	toks := c.blockTokens(mc.cx)
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(toks))), 4*len(toks))
	mc.la, mc.lb = mc.m.blockLanes(mc.la, mc.lb, b)
	mc.cx++
}

// fill computes the lanes of the next batch of blocks, which ends at a run end (or the
// prompt's end), and looks up every run that ends in it (only called with the buffer
// empty, so cx == next). A lacking run does not end the batch: its blocks are hashed when
// their turn comes. Only a batch that ends with missRun or more lacking runs in a row
// stops the lookups, until a re-probe at a doubled gap.
func (c *Chain) fill() {
	mc := &c.mc
	m, t := mc.m, mc.t
	end := min((c.next/memoRun+mc.batch)*memoRun, c.numBlocks)
	n := end - c.next
	// Lanes first (pure arithmetic), then a pass that starts every entry's cache misses,
	// then the verified lookups, so that the misses of one batch overlap.
	if c.strategy == StrategyVLLMV1 && c.blockSize == 16 && c.lookahead == 0 {
		// Every block is 16 whole tokens, one 64-byte lane group: the lanes in one loop.
		toks, outA, outB := c.tokens[mc.cx*16:(mc.cx+n)*16], mc.aheadA[:n], mc.aheadB[:n]
		if n > 0 {
			mc.la, mc.lb = laneRun16(&m.laneA, &m.laneB, &toks[0], n, mc.la, mc.lb, &outA[0], &outB[0])
		}
		mc.cx += n
	} else {
		for j := 0; j < n; j++ {
			c.advance()
			mc.aheadA[j], mc.aheadB[j] = mc.la, mc.lb
		}
	}
	clear(mc.known[:n])
	clear(mc.hashed[:n])
	clear(mc.dv[:n])
	clear(mc.aheadH[:n])
	mc.ownRuns = 0
	mc.aheadPos, mc.aheadLen = 0, n
	mc.knownEnd, mc.hashedIn = 0, 0
	// Run ends in the batch: blocks e with e%memoRun == memoRun-1, from j0 on.
	j0 := (c.next/memoRun+1)*memoRun - 1 - c.next
	if j0 >= n {
		return // only the prompt's last, partial run: nothing to look up
	}
	var sink uint64
	for j := j0; j < n; j += memoRun {
		sink += t.touch(mc.aheadA[j], mc.aheadB[j]) + t.touchHints(mc.aheadA[j], mc.aheadB[j])
	}
	mc.sink += sink
	run := mc.run
	v := &mc.val
	reasked := false // a lookup missed a run the memo held until lately
	for j := j0; j < n; j += memoRun {
		mc.probes++
		w := t.lookupAt(mc.aheadA[j], mc.aheadB[j], v)
		mc.aheadW[j] = int32(w)
		if w < 0 {
			if t.ghostOf(mc.aheadA[j], mc.aheadB[j]) {
				mc.reasked++
				reasked = true
			}
			run++
			continue
		}
		run = 0
		from := max(j-(memoRun-1), 0) // the batch may start inside the run
		first := j - (memoRun - 1)    // the run's first block, maybe before the batch
		copy(mc.aheadK[from:j+1], v.k[from-first:])
		for i := from; i <= j; i++ {
			mc.known[i] = true
		}
		// The run's hints, unless they are another owner's (another index's records):
		// those stay theirs, and this walk probes. A stale hint (racing SaveHints) is
		// only a wrong one, which the walk checks.
		if o := t.hintOwner(w); mc.owner == 0 || o != 0 && o != mc.owner {
			mc.aheadW[j] = -1
		} else {
			mc.ownRuns++
			hints := t.hints[w*memoRun : w*memoRun+memoRun : w*memoRun+memoRun]
			for i := from; i <= j; i++ {
				mc.aheadH[i] = atomic.LoadUint32(&hints[i-first])
			}
		}
		d := &mc.aheadD[j]
		binary.LittleEndian.PutUint64(d[0:], v.d[0])
		binary.LittleEndian.PutUint64(d[8:], v.d[1])
		binary.LittleEndian.PutUint64(d[16:], v.d[2])
		binary.LittleEndian.PutUint64(d[24:], v.d[3])
		mc.dv[j] = true
	}
	mc.run = run
	if c.next == 0 && j0 == memoRun-1 && mc.aheadW[j0] < 0 && !reasked && m.seen != nil && m.firstSight(mc.aheadA[j0], mc.aheadB[j0]) {
		// A prompt whose first run nobody asked before (SetSecondSight), nor the memo
		// held lately: hashed without the memo, which remembers it from its second sight.
		mc.on, mc.firstSight = false, true
		mc.aheadPos, mc.aheadLen = 0, 0
		return
	}
	switch {
	case run >= missRun:
		// Probably a cold suffix: the next lookup is one run, gap runs on.
		mc.probeAt = end + (mc.gap-1)*memoRun
		mc.gap = min(2*mc.gap, c.numBlocks)
		mc.batch = 1
	case run == 0:
		mc.gap = 1
		mc.batch = min(2*mc.batch, aheadRuns)
	default:
		mc.batch = min(2*mc.batch, aheadRuns)
	}
}

// resolve hashes buffered block j, which must be the next block (aheadPos), from the
// chain's current digest, and notes it for the insert of its run.
func (c *Chain) resolve(j int) error {
	mc := &c.mc
	if !mc.parentOK {
		c.err = errMemoDigest
		return c.err
	}
	if err := c.hashBlock(c.next, &mc.aheadD[j]); err != nil {
		return err
	}
	mc.aheadK[j] = c.key(&mc.aheadD[j])
	mc.known[j], mc.hashed[j], mc.dv[j] = true, true, true
	mc.hashedIn++
	mc.hashedBlock(c.next, mc.aheadK[j], mc.aheadA[j], mc.aheadB[j], &mc.aheadD[j])
	return nil
}

// hashedBlock notes that block i (lanes la, lb) was hashed to digest d and key: when it
// ends a run whose blocks were all hashed in a row, the run is queued for insertion.
func (mc *memoChain) hashedBlock(i int, key, la, lb uint64, d *[32]byte) {
	if i != mc.streakEnd {
		mc.streakFrom = i
	}
	mc.streakEnd = i + 1
	mc.runK[i%memoRun] = key
	if i%memoRun == memoRun-1 && mc.streakFrom <= i-(memoRun-1) {
		mc.queue(la, lb, d)
	}
}

// queue buffers the insert of the run in runK ending with digest d under lanes a, b,
// writing the buffer out when it is full. (Prefetching the insert's set here, a run of
// hashing before the flush, made memo-cold queries slower: BenchmarkQueryCold.)
func (mc *memoChain) queue(a, b uint64, d *[32]byte) {
	if len(mc.pend) == cap(mc.pend) && cap(mc.pend) > 0 {
		mc.flush()
	}
	if mc.pend == nil {
		mc.pend = make([]memoRunVal, 0, pendMax)
	}
	mc.pend = append(mc.pend, memoRunVal{a: a, b: b, k: mc.runK, d: [4]uint64{
		binary.LittleEndian.Uint64(d[0:]), binary.LittleEndian.Uint64(d[8:]),
		binary.LittleEndian.Uint64(d[16:]), binary.LittleEndian.Uint64(d[24:])}})
}

// consume makes buffered block j the last one the chain returned.
func (c *Chain) consume(j int) {
	mc := &c.mc
	if mc.dv[j] {
		c.parent = mc.aheadD[j]
		mc.parentOK = true
	} else {
		mc.parentOK = false // inside a run from the memo: no digest until its end
	}
	c.hasParent = true
}

// nextMemo is Next with a memo attached.
func (c *Chain) nextMemo() (uint64, error) {
	mc := &c.mc
	if mc.aheadPos == mc.aheadLen && c.next >= mc.probeAt {
		if c.fill(); !mc.on {
			return c.hashNext() // a first sight (fill)
		}
	}
	if j := mc.aheadPos; j < mc.aheadLen {
		if !mc.known[j] {
			if err := c.resolve(j); err != nil {
				return 0, err
			}
		}
		mc.aheadPos++
		c.consume(j)
		c.next++
		if mc.hashed[j] {
			mc.misses++
			mc.sha++
		} else {
			mc.hits++
		}
		return mc.aheadK[j], nil
	}
	// Between re-probes: the lanes (for the insert), then SHA-256.
	if !mc.parentOK {
		c.err = errMemoDigest
		return 0, c.err
	}
	c.advance()
	key, err := c.hashNext()
	if err != nil {
		return 0, err
	}
	mc.misses++
	mc.sha++
	mc.hashedBlock(c.next-1, key, mc.la, mc.lb, &c.parent)
	return key, nil
}

// flush writes the buffered inserts: a pass that loads every insert's preferred entry, a
// pass that loads the other entries of the sets whose preferred way is taken (an insert
// into an empty preferred way reads and writes that entry alone, see Memo.insert), each
// pass independent loads whose cache misses overlap, then the writes, which find their
// lines cached.
func (mc *memoChain) flush() {
	m := mc.t
	var sink uint64
	for i := range mc.pend {
		sink += m.touch(mc.pend[i].a, mc.pend[i].b)
	}
	for i := range mc.pend {
		if p := &mc.pend[i]; !m.preferredEmpty(p.a, p.b) {
			sink += m.touchSet(p.a)
		}
	}
	mc.sink += sink
	for i := range mc.pend {
		wrote, evicted := m.insert(&mc.pend[i])
		if wrote {
			mc.inserts++
		}
		if evicted {
			mc.evictions++
		}
	}
	mc.pend = mc.pend[:0]
}

// Done writes the chain's pending memo inserts and adds its counters to the memo's. It is
// a no-op without a memo, and idempotent.
func (c *Chain) Done() {
	mc := &c.mc
	if mc.m == nil {
		return
	}
	if len(mc.pend) > 0 {
		mc.flush()
	}
	if mc.firstSight {
		mc.misses += uint64(c.next) // hashed without the memo
		mc.firstSight = false
	}
	if mc.hits|mc.misses|mc.inserts|mc.evictions|mc.reasked == 0 {
		return
	}
	if mc.stripe == 0 {
		mc.stripe = int(mc.m.stripe.Add(1))
	}
	st := &mc.m.stripes[mc.stripe%memoStripes]
	if mc.hits != 0 {
		st.hits.Add(mc.hits)
	}
	if mc.misses != 0 {
		st.misses.Add(mc.misses)
	}
	if mc.inserts != 0 {
		st.inserts.Add(mc.inserts)
		mc.m.noteInserts(mc.inserts)
	}
	if mc.evictions != 0 {
		st.evictions.Add(mc.evictions)
	}
	if mc.reasked != 0 {
		st.reasked.Add(mc.reasked)
	}
	mc.hits, mc.misses, mc.inserts, mc.evictions, mc.reasked = 0, 0, 0, 0, 0
}

// MemoHits is the number of blocks Next took from the memo since the last Reset (0
// without a memo); Hashed()-MemoHits() blocks were SHA-hashed.
func (c *Chain) MemoHits() int {
	if !c.mc.on {
		return 0
	}
	return c.next - c.mc.sha
}

// digestKnown reports whether Digest is the last returned block's: always without a memo;
// with one, after a block that was hashed or that ends a run from the memo.
func (c *Chain) digestKnown() bool { return !c.mc.on || c.mc.parentOK }

// Advance moves the chain past the first n keys of the slice the last KeysAhead returned,
// as n calls of Next returning them would: the keys, the digest the chain resumes from and
// the counters are the same. It is how a walk consumes keys it took ahead without a call
// per block. Nothing may be called on the chain between that KeysAhead and Advance, and n
// may not exceed the slice's length (it panics: a caller's bug, not a prompt's).
func (c *Chain) Advance(n int) {
	if n <= 0 {
		return
	}
	mc := &c.mc
	p, e := mc.aheadPos, mc.aheadPos+n
	if !mc.on || e > mc.aheadLen || !mc.known[e-1] {
		panic("hashing: Chain.Advance past the keys KeysAhead returned")
	}
	sha := 0
	if mc.hashedIn > 0 {
		for _, h := range mc.hashed[p:e] {
			if h {
				sha++
			}
		}
	}
	mc.sha += sha
	mc.misses += uint64(sha)
	mc.hits += uint64(n - sha)
	c.consume(e - 1)
	c.next += n
	mc.aheadPos = e
}

// HintsAhead returns the record hints of the blocks whose keys the last KeysAhead
// returned, one for each (nil without a memo or a hint owner, SetHintOwner, or when
// every run they come from has another owner's hints): what the memo held for them, 0
// where it held none, they are another owner's, or the block was hashed. A hint is an
// index plus one of the record a walk last found the block's key at; it may be stale,
// point into another index, or be wrong in any way (racing writers), so a walk uses one
// only after checking that the record holds the key. A walk may overwrite the slice's
// values with what it found and then write them back with SaveHints. Valid until the
// next call on the chain but SaveHints.
func (c *Chain) HintsAhead() []uint32 {
	mc := &c.mc
	if !mc.on || mc.ownRuns == 0 || mc.knownEnd < mc.aheadPos {
		return nil
	}
	return mc.aheadH[mc.aheadPos:mc.knownEnd]
}

// SetHintOwner sets who the chain walks for, until it is set again (Reset and ResetMemo
// keep it): a nonzero tag naming the index whose records the hints it reads and saves
// point into. A run's hints belong to the first owner that saved them until the memo
// replaces the run; a chain of another owner gets no hints for the run and saves none
// (two indexes sharing a prompt would otherwise overwrite each other's hints on every
// walk). With owner 0, the default, HintsAhead returns nil.
func (c *Chain) SetHintOwner(owner uint32) { c.mc.owner = owner }

// SaveHints writes the first n values of the slice the last HintsAhead returned back to
// the memo, where they differ from what it holds and the block came from it, for the next
// walk of these blocks. It must come before the Advance that consumes them.
func (c *Chain) SaveHints(n int) {
	mc := &c.mc
	if !mc.on {
		return
	}
	p := mc.aheadPos
	t := mc.t
	hints := t.hints
	for j := p; j < p+n && j < mc.knownEnd; j++ {
		// Slot j holds block c.next+j-p; its run ends at slot e.
		in := (c.next + j - p) % memoRun
		e := j + memoRun - 1 - in
		if e >= mc.aheadLen || mc.aheadW[e] < 0 {
			continue // hashed here (not in the memo yet), or another owner's hints
		}
		w := int(mc.aheadW[e])
		if hp := &hints[w*memoRun+in]; atomic.LoadUint32(hp) != mc.aheadH[j] {
			if t.hintOwner(w) != mc.owner {
				t.claimHints(w, mc.owner) // unowned when the run was looked up
			}
			atomic.StoreUint32(hp, mc.aheadH[j])
		}
	}
}

// KeysAhead returns the projected keys of the blocks after the last one Next returned
// that are known without hashing any block Next would not reach first: keys from the
// memo's runs looked up ahead, led by the next block itself, which is hashed here if the
// memo lacked it (Next would hash it anyway). The slice is valid until the next call on
// the chain; a caller may probe the index for these keys before consuming them with Next
// or Advance. It is empty without a memo, after an error, and between re-probes of a
// suffix the memo lacks.
func (c *Chain) KeysAhead() []uint64 {
	mc := &c.mc
	if !mc.on || c.err != nil || c.next >= c.numBlocks {
		return nil
	}
	if mc.aheadPos == mc.aheadLen && c.next >= mc.probeAt {
		c.fill()
	}
	p := mc.aheadPos
	if p == mc.aheadLen || !mc.known[p] && c.resolve(p) != nil {
		return nil
	}
	e := max(p+1, mc.knownEnd)
	for e < mc.aheadLen && mc.known[e] {
		e++
	}
	mc.knownEnd = e
	return mc.aheadK[p:e]
}
