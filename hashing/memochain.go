package hashing

import (
	"encoding/binary"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// aheadMax bounds the keys a chain looks up in its memo ahead of the walk: the lookups of
// one batch are independent, so their cache misses overlap.
const aheadMax = 64

// aheadFirst is the first batch; batches double up to aheadMax, so a query that stops
// early (a miss) looks up at most about twice the blocks it uses.
const aheadFirst = 4

// pendMax is how many memo inserts a chain buffers before writing them in one pass.
const pendMax = 64

type memoPend struct {
	a, b uint64
	d    [32]byte
}

// memoChain is the memo side of a Chain: the cheap content chain, the keys found ahead,
// the inserts not yet written and the per-prompt counters.
type memoChain struct {
	m  *Memo
	on bool
	// probing is true until the memo lacks a block and then the block after it: from then
	// on the chain only inserts, it does not look up (a miss must not pay a lookup per
	// block). One lacking block (evicted from the middle of a memoised prefix) costs one
	// SHA-256, not the rest of the prefix: retry marks the one-block probe after it.
	probing, retry bool
	// la, lb are the lanes of block cx-1 (the start value when cx == 0).
	la, lb uint64
	cx     int
	x      xxhash.Digest

	batch              int
	aheadLen, aheadPos int
	aheadK             [aheadMax]uint64
	aheadD             [aheadMax][32]byte
	aheadA, aheadB     [aheadMax]uint64

	pend []memoPend

	sha                              int // blocks SHA-hashed since reset
	hits, misses, inserts, evictions uint64
	stripe                           int
	sink                             uint64
}

func (mc *memoChain) reset(m *Memo) {
	mc.m = m
	mc.on = m != nil
	mc.probing, mc.retry = mc.on, mc.on
	mc.cx, mc.sha = 0, 0
	mc.aheadLen, mc.aheadPos = 0, 0
	mc.batch = aheadFirst
}

// start derives the lanes' start value from everything a block digest depends on besides
// its tokens (the projection is applied to the digest afterwards, so it is not needed).
func (mc *memoChain) start(p *Profile, blockSize int, lora, salt string) {
	var hdr [8 + 3*8]byte
	hdr[0], hdr[1] = byte(p.Strategy), byte(p.Algorithm)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(blockSize))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(lora)))
	binary.LittleEndian.PutUint64(hdr[24:], uint64(len(salt)))
	lane := func(seed uint64) uint64 {
		mc.x.ResetWithSeed(seed)
		_, _ = mc.x.Write(hdr[:])
		_, _ = mc.x.Write(p.Root[:])
		_, _ = mc.x.WriteString(lora)
		_, _ = mc.x.WriteString(salt)
		return mc.x.Sum64()
	}
	mc.la, mc.lb = lane(mc.m.seedA), lane(mc.m.seedB)
}

// blockTokens returns the tokens block i's digest depends on.
func (c *Chain) blockTokens(i int) []int32 {
	bs := c.blockSize
	s := i * bs
	switch c.strategy {
	case StrategyVLLMV1:
		return c.tokens[s : s+bs]
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
	mc.la = xxh64(mc.la^mc.m.seedA, b)
	mc.lb = mc.m.laneB(mc.lb, b)
	mc.cx++
}

// laneB is the second lane: a keyed multiply-fold over the block's bytes, chained through
// the previous lane value. It is independent of lane A (another function under other
// secrets, so a structural weakness of one does not carry over) and costs a fraction of
// a second xxhash pass: four dependent 64x64->128 multiplies for a 16-token block.
func (m *Memo) laneB(prev uint64, b []byte) uint64 {
	k0, k1, k2 := m.seedB, m.seedB^0xa0761d6478bd642f, m.seedB^0xe7037ed1a0b428db
	h := prev ^ k0
	i := 0
	for ; i+16 <= len(b); i += 16 {
		h = memoMul(binary.LittleEndian.Uint64(b[i:])^k1, binary.LittleEndian.Uint64(b[i+8:])^h)
	}
	if i+8 <= len(b) {
		h = memoMul(binary.LittleEndian.Uint64(b[i:])^k2, h^k1)
		i += 8
	}
	if i < len(b) { // token bytes come in fours
		h = memoMul(uint64(binary.LittleEndian.Uint32(b[i:]))^k1, h^k2)
	}
	return memoMul(h^k2, uint64(len(b))^k0)
}

// fill looks up the next batch of blocks in the memo, stopping at the first it lacks
// (which ends probing for this prompt). Only called with the ahead buffer empty.
func (c *Chain) fill() {
	mc := &c.mc
	n := min(mc.batch, c.numBlocks-c.next)
	mc.batch = min(2*mc.batch, aheadMax)
	// Lanes first (pure arithmetic), then a pass that starts every set's cache misses,
	// then the verified lookups, so that the misses of one batch overlap.
	for j := 0; j < n; j++ {
		c.advance()
		mc.aheadA[j], mc.aheadB[j] = mc.la, mc.lb
	}
	var sink uint64
	for j := 0; j < n; j++ {
		sink += mc.m.touch(mc.aheadA[j])
	}
	mc.sink += sink
	mc.aheadPos, mc.aheadLen = 0, 0
	for j := 0; j < n; j++ {
		if !mc.m.lookup(mc.aheadA[j], mc.aheadB[j], &mc.aheadD[j]) {
			mc.probing = false
			mc.batch = aheadFirst
			// Lanes computed past the miss are dropped: rewind to the missed block.
			mc.cx = c.next + j + 1
			mc.la, mc.lb = mc.aheadA[j], mc.aheadB[j]
			break
		}
		mc.aheadK[j] = c.proj.Apply(&mc.aheadD[j])
		mc.aheadLen++
	}
}

// nextMemo is Next with a memo attached.
func (c *Chain) nextMemo() (uint64, error) {
	mc := &c.mc
	if mc.aheadPos == mc.aheadLen && mc.probing {
		c.fill()
	}
	if mc.aheadPos < mc.aheadLen {
		j := mc.aheadPos
		mc.aheadPos++
		c.parent = mc.aheadD[j]
		c.hasParent = true
		c.next++
		mc.hits++
		return mc.aheadK[j], nil
	}
	if mc.cx == c.next {
		if mc.retry && c.next > 0 {
			// The block after the first lacking one: probe it alone.
			mc.retry = false
			mc.probing = true
			mc.batch = 1
			return c.nextMemo()
		}
		c.advance()
	}
	key, err := c.hashNext()
	if err != nil {
		return 0, err
	}
	mc.misses++
	mc.sha++
	if len(mc.pend) == cap(mc.pend) && cap(mc.pend) > 0 {
		mc.flush()
	}
	if mc.pend == nil {
		mc.pend = make([]memoPend, 0, pendMax)
	}
	mc.pend = append(mc.pend, memoPend{a: mc.la, b: mc.lb, d: c.parent})
	return key, nil
}

// flush writes the buffered inserts: one pass that loads every set (independent loads,
// so their cache misses overlap), then the writes, which find the lines cached.
func (mc *memoChain) flush() {
	var sink uint64
	for i := range mc.pend {
		sink += mc.m.touch(mc.pend[i].a)
	}
	mc.sink += sink
	for i := range mc.pend {
		p := &mc.pend[i]
		wrote, evicted := mc.m.insert(p.a, p.b, &p.d)
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
	if mc.hits|mc.misses|mc.inserts|mc.evictions == 0 {
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
	}
	if mc.evictions != 0 {
		st.evictions.Add(mc.evictions)
	}
	mc.hits, mc.misses, mc.inserts, mc.evictions = 0, 0, 0, 0
}

// MemoHits is the number of blocks Next took from the memo since the last Reset (0
// without a memo); Hashed()-MemoHits() blocks were SHA-hashed.
func (c *Chain) MemoHits() int {
	if !c.mc.on {
		return 0
	}
	return c.next - c.mc.sha
}

// KeysAhead returns the projected keys of the blocks after the last one Next returned
// that are already known without hashing (memo hits looked up ahead), filling the next
// batch if none is buffered. The slice is valid until the next call on the chain; a
// caller may probe the index for these keys before consuming them with Next. It is empty
// without a memo, and once the prompt's memoised prefix is used up.
func (c *Chain) KeysAhead() []uint64 {
	mc := &c.mc
	if !mc.on || c.err != nil || c.next >= c.numBlocks {
		return nil
	}
	if mc.aheadPos == mc.aheadLen && mc.probing {
		c.fill()
	}
	return mc.aheadK[mc.aheadPos:mc.aheadLen]
}
