package hashing

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/minio/sha256-simd"
)

// ErrChainEnd is returned by Chain.Next once every block of the prompt has been hashed.
var ErrChainEnd = errors.New("hashing: no more blocks in chain")

// errNoProfile and errBlockSize make a misconfigured chain fail loudly on Next instead of
// returning keys that can never match.
var (
	errNoProfile = errors.New("hashing: chain reset without a resolved profile")
	errBlockSize = errors.New("hashing: block size must be positive")
)

// sglangSaltPrefix is the domain separator SGLang uses to seed a salted event chain.
const sglangSaltPrefix = "sglang-cache-salt-v1\x00"

// TokenError reports a token that the profile's strategy cannot encode: SGLang hashes
// tokens as uint32, so negative ids have no representation. Index is the position of
// the token in the prompt.
type TokenError struct {
	Index int
	Value int32
}

// Error names the token and why it cannot be hashed.
func (e *TokenError) Error() string {
	return fmt.Sprintf("token_ids[%d] = %d cannot be hashed: sglang encodes tokens as uint32", e.Index, e.Value)
}

// sum256 is the SHA-256 of messages without room after them (seeds, pickle frames); a
// block with room goes through sum256Room, which pads it in place and calls the SHA-NI
// compression directly where the CPU has it. minio/sha256-simd measured faster than
// crypto/sha256 on a SHA-NI machine for block-sized inputs (see hashing_timing_test.go);
// calling the concrete Sum256 on a reused buffer avoids a hash.Hash interface and its
// per-call allocation.
func sum256(b []byte) [32]byte { return sha256.Sum256(b) }

// Chain lazily hashes the blocks of one prompt: block i is encoded and hashed only when
// Next reaches it, so a query that stops matching early pays for the blocks it used.
// The zero value is usable after Reset. Reuse one Chain across prompts: after warm-up
// its buffers are large enough and Reset+Next allocate nothing. A Chain is not safe for
// concurrent use, and it reads the token slice given to Reset until the last Next, so the
// caller must not modify it meanwhile.
type Chain struct {
	strategy  Strategy
	algo      Algorithm
	proj      Projection
	blockSize int
	tokens    []int32
	positions int
	numBlocks int
	next      int

	// parent is the previous block's full digest (the root or salt seed before block 0).
	parent [32]byte
	// hasParent is false only for an unsalted SGLang chain before its first block.
	hasParent bool
	// pickleFast is true when every block provably fits in one pickle frame, so the
	// precomputed extras can be spliced in without the framer's bookkeeping.
	pickleFast bool
	// lookahead is the profile's Lookahead (vllm_v1): block i also hashes the tokens
	// after it, tokens[(i+1)*bs : (i+1)*bs+lookahead].
	lookahead int
	// dlen is the digest size (16 for xxhash, kept in parent[16:]); xxh selects XXH3-128.
	dlen int
	xxh  bool
	// ex0 and exN are the extras of block 0 (lora + salt) and of later blocks (lora).
	ex0, exN blockExtras
	// nsSeed, when ns, is the SGLang LoRA namespace the published keys are in.
	nsSeed [32]byte
	ns     bool
	err    error

	buf       []byte
	extra0    []byte // encoded extras of block 0 up to the lookahead tokens
	extraN    []byte // encoded extras of later blocks up to the lookahead tokens
	extraPost []byte // encoded end of the extras after the lookahead tokens (pickle)
	pk        pickler

	mc memoChain // key memo state; inert unless ResetMemo attached a Memo
}

// Reset points the chain at a new prompt. p must be a Profile from Resolve or
// ResolveSpec; loraName is part of vllm_v1 hashes only (SGLang event hashes ignore it),
// with p.LoraPath when p's extra keys are tagged; cacheSalt salts block 0 for vllm_v1 and
// seeds the SGLang chain. An empty string means "none" for both. With p.Lookahead L > 0,
// a vllm_v1 block is hashed only when the prompt holds L tokens after it. Reset does not
// hash anything.
func (c *Chain) Reset(p *Profile, blockSize int, loraName, cacheSalt string, tokens []int32) {
	c.ResetMemo(nil, p, blockSize, loraName, cacheSalt, tokens)
}

// ResetMemo is Reset with a key memo: Next then serves blocks whose digest m remembers
// without SHA-256 (resuming the SHA chain from the last remembered digest) and records the
// blocks it hashes in m. A nil m is Reset. Call Done when the prompt is finished, so that
// its pending memo inserts and counters are published (the next Reset does it otherwise).
// Keys and errors are exactly those of Reset: the memo changes the cost, never the result.
func (c *Chain) ResetMemo(m *Memo, p *Profile, blockSize int, loraName, cacheSalt string, tokens []int32) {
	c.Done()
	c.mc.reset(m)
	c.tokens = tokens
	c.next = 0
	c.err = nil
	c.numBlocks = 0
	c.positions = 0
	c.blockSize = blockSize
	c.hasParent = false
	c.parent = [32]byte{}
	c.pickleFast = false
	c.lookahead, c.dlen, c.xxh, c.ns = 0, 32, false, false
	if p == nil || p.Strategy.String() == "" || p.Algorithm.String() == "" || p.Projection.String() == "" {
		c.err = errNoProfile
		return
	}
	c.strategy, c.algo, c.proj = p.Strategy, p.Algorithm, p.Projection
	n := len(tokens)
	c.positions = n
	if c.strategy == StrategySGLangBigram {
		c.positions = max(n-1, 0)
	}
	if blockSize <= 0 {
		c.err = errBlockSize
		return
	}
	bs := blockSize
	// Bytes per token unit and the largest block actually present, so buffer size
	// follows the prompt, not a huge configured block size.
	unit := min(bs, c.positions)
	var need int
	switch c.strategy {
	case StrategyVLLMV1:
		if p.Lookahead < 0 {
			c.err = errNoProfile
			return
		}
		L := p.Lookahead
		c.lookahead = L
		c.numBlocks = max(n-L, 0) / bs
		c.parent = p.Root
		c.hasParent = true
		c.dlen, c.xxh = p.Algorithm.DigestSize(), p.Algorithm.xxh()
		c.ex0 = blockExtras{tagged: p.ExtraKeys == ExtraKeysTagged, lora: loraName, path: p.LoraPath, salt: cacheSalt}
		c.exN = c.ex0
		c.exN.salt = ""
		// Bytes per lookahead token are at most 5, as for block tokens.
		switch c.algo {
		case AlgoSHA256Pickle, AlgoXXHashPickle:
			c.extra0 = appendPickleExtrasFast(c.extra0[:0], c.ex0, L)
			c.extraN = appendPickleExtrasFast(c.extraN[:0], c.exN, L)
			c.extraPost = pickleLookaheadEnd(c.extraPost[:0], L)
			// Frame payload: parent(dlen+3) + MARK/TUPLE/MEMOIZE(3) + ints + extras +
			// lookahead ints + their tuple end + TUPLE3 MEMOIZE STOP(3).
			body := c.dlen + 3 + 3 + 5*unit + max(len(c.extra0), len(c.extraN)) + 5*L + len(c.extraPost) + 3
			c.pickleFast = body < frameSizeTarget
			need = 2 + frameHeaderSize + body
		case AlgoSHA256CBOR, AlgoXXHashCBOR:
			c.extra0 = appendCBORExtrasLookahead(c.extra0[:0], c.ex0, L)
			c.extraN = appendCBORExtrasLookahead(c.extraN[:0], c.exN, L)
			need = 3 + c.dlen + 9 + 5*unit + max(len(c.extra0), len(c.extraN)) + 5*L + cborSlack
		default:
			c.err = errNoProfile
			return
		}
	case StrategySGLang, StrategySGLangBigram:
		if c.algo != AlgoSHA256Raw {
			c.err = errNoProfile
			return
		}
		c.numBlocks = (c.positions + bs - 1) / bs
		per := 4
		if c.strategy == StrategySGLangBigram {
			per = 8
		}
		need = max(32+per*unit, len(sglangSaltPrefix)+len(cacheSalt))
		if loraName != "" && p.LoraPath != "" {
			c.buf = sglangLoraNamespace(c.buf, loraName, p.LoraPath, &c.nsSeed)
			c.ns = true
		}
		if cacheSalt != "" {
			c.ensure(need)
			b := append(c.buf[:0], sglangSaltPrefix...)
			b = append(b, cacheSalt...)
			c.parent = sum256(b)
			c.hasParent = true
		}
	}
	c.ensure(need + shaPadRoom) // hashBlock pads each block in place (sum256Room)
	if c.mc.on {
		c.mc.start(p, blockSize, loraName, cacheSalt)
	}
}

// ensure grows the reusable encode buffer; it only allocates while warming up.
func (c *Chain) ensure(n int) {
	if cap(c.buf) < n {
		c.buf = make([]byte, n)
	}
}

// NumBlocks is the number of blocks Next will produce: floor(max(n-L,0)/bs) for vllm_v1
// with lookahead L (partial tails are never hashed, nor a block without its L following
// tokens), ceil(n/bs) for sglang, ceil(max(n-1,0)/bs) for sglang_bigram.
func (c *Chain) NumBlocks() int { return c.numBlocks }

// Positions is the number of KV positions the prompt occupies: n, or max(n-1,0) for
// sglang_bigram whose units are adjacent token pairs. Matched-token counts are capped by it.
func (c *Chain) Positions() int { return c.positions }

// Hashed is the number of blocks Next has hashed since Reset.
func (c *Chain) Hashed() int { return c.next }

// Digest returns the full digest of the last block Next hashed (the parent of the next
// block); a 16-byte xxhash digest is its last 16 bytes (Profile.DigestSize), the first
// 16 are zero. Before the first Next it is the chain seed: the vLLM root, the SGLang salt
// seed, or zeros. Simulators use it to publish vLLM bytes-mode or SGLang hex hashes. With
// a memo (ResetMemo) it is only kept up to date after a block that was hashed or that ends
// a run the memo remembered (the memo keeps the keys of a run's blocks, and the digest of
// its last one only).
func (c *Chain) Digest() [32]byte { return c.parent }

// Next hashes the next block (0, 1, 2, ...) and returns its projected 64-bit key. It
// returns ErrChainEnd after the last block, a *TokenError for a token the strategy cannot
// encode, and keeps returning the first error once one occurred.
func (c *Chain) Next() (uint64, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.next >= c.numBlocks {
		return 0, ErrChainEnd
	}
	if c.mc.on {
		return c.nextMemo()
	}
	return c.hashNext()
}

// hashNext SHA-hashes block c.next from c.parent.
func (c *Chain) hashNext() (uint64, error) {
	if err := c.hashBlock(c.next, &c.parent); err != nil {
		return 0, err
	}
	c.hasParent = true
	c.next++
	return c.key(&c.parent), nil
}

// key is the published key of a block with digest d: its projection, in the SGLang LoRA
// namespace when there is one.
func (c *Chain) key(d *[32]byte) uint64 {
	if c.ns {
		return sglangNamespacedKey(&c.nsSeed, d)
	}
	return c.proj.Apply(d)
}

// hashBlock writes the digest of block i into *d, hashed from c.parent, which must be
// block i-1's (the chain seed for block 0); d may be &c.parent, which is read before *d
// is written. An error sticks in c.err and leaves *d alone.
func (c *Chain) hashBlock(i int, d *[32]byte) error {
	bs := c.blockSize
	switch c.strategy {
	case StrategyVLLMV1:
		end := (i + 1) * bs
		toks := c.tokens[i*bs : end]
		look := c.tokens[end : end+c.lookahead]
		extra := c.extraN
		if i == 0 {
			extra = c.extra0
		}
		parent := c.parent[32-c.dlen:]
		var pre []byte
		switch {
		case c.algo.cbor():
			pre = encodeCBORBlock(c.buf[:cap(c.buf)], parent, toks, extra, look)
		case c.pickleFast:
			pre = encodePickleBlock(c.buf[:cap(c.buf)], parent, toks, extra, look, c.extraPost)
		default:
			ex := c.exN
			if i == 0 {
				ex = c.ex0
			}
			c.pk.vllmBlock(parent, toks, ex, look)
			pre = c.pk.b
		}
		if c.xxh {
			xxhDigest(d, pre)
		} else {
			sum256RoomTo(d, pre)
		}
	case StrategySGLang:
		s := i * bs
		e := min(s+bs, c.positions)
		toks := c.tokens[s:e]
		if err := checkNonNegative(toks, s); err != nil {
			c.err = err
			return err
		}
		sum256RoomTo(d, encodeSGLangBlock(c.buf[:cap(c.buf)], c.hasParent, &c.parent, toks))
	case StrategySGLangBigram:
		s := i * bs
		e := min(s+bs, c.positions)
		toks := c.tokens[s : e+1] // positions s..e-1 use tokens s..e
		if err := checkNonNegative(toks, s); err != nil {
			c.err = err
			return err
		}
		sum256RoomTo(d, encodeBigramBlock(c.buf[:cap(c.buf)], c.hasParent, &c.parent, toks))
	}
	return nil
}

// checkNonNegative returns a *TokenError for the first negative token; base is the prompt
// index of toks[0]. The OR-reduction keeps the common all-valid case branch-free.
func checkNonNegative(toks []int32, base int) error {
	var acc int32
	for _, t := range toks {
		acc |= t
	}
	if acc >= 0 {
		return nil
	}
	for j, t := range toks {
		if t < 0 {
			return &TokenError{Index: base + j, Value: t}
		}
	}
	return nil
}

// encodePickleBlock writes the single-frame pickle of (parent, tuple(toks), extras) into
// b (which must be large enough, see Chain.Reset) and returns the used prefix. extra is
// the precomputed in-frame encoding of the extras field up to its lookahead tokens
// (appendPickleExtrasFast), look those tokens and post the end of their tuple
// (pickleLookaheadEnd). parent is 32 or 16 bytes.
func encodePickleBlock(b []byte, parent []byte, toks []int32, extra []byte, look []int32, post []byte) []byte {
	b[0], b[1], b[2] = opProto, 5, opFrame
	b[11], b[12] = opShortBinBytes, byte(len(parent))
	pos := 13 + copy(b[13:], parent)
	b[pos] = opMemoize
	pos++
	if len(toks) > 3 {
		b[pos] = opMark
		pos++
	}
	// Widest class first: with real vocabularies most ids exceed 65535. A branch-free
	// version (table lookup, fixed 5-byte writes) measured slower than this.
	for _, t := range toks {
		u := uint32(t)
		if u > 0xffff {
			b[pos] = opBinInt
			binary.LittleEndian.PutUint32(b[pos+1:], u)
			pos += 5
		} else if u > 0xff {
			b[pos], b[pos+1], b[pos+2] = opBinInt2, byte(u), byte(u>>8)
			pos += 3
		} else {
			b[pos], b[pos+1] = opBinInt1, byte(u)
			pos += 2
		}
	}
	if len(toks) > 3 {
		b[pos] = opTuple
	} else {
		b[pos] = opTuple1 + byte(len(toks)-1)
	}
	b[pos+1] = opMemoize
	pos += 2
	pos += copy(b[pos:], extra)
	if len(look) > 0 {
		for _, t := range look {
			pos += len(appendPickleInt(b[pos:pos], t))
		}
		pos += copy(b[pos:], post)
	}
	b[pos], b[pos+1], b[pos+2] = opTuple1+2, opMemoize, opStop
	pos += 3
	binary.LittleEndian.PutUint64(b[3:11], uint64(pos-2-frameHeaderSize))
	return b[:pos]
}

// encodeCBORBlock writes canonical CBOR of [parent, [toks...], extras] into b. With
// cborSlack bytes of room beyond the encoding, its ids go the vector path. extra is the
// extras field up to its lookahead tokens (appendCBORExtrasLookahead), look those tokens;
// parent is 32 or 16 bytes.
func encodeCBORBlock(b []byte, parent []byte, toks []int32, extra []byte, look []int32) []byte {
	var pos int
	if len(parent) == 32 {
		b[0], b[1], b[2] = cborMajorArray|3, cborMajorBytes|24, 32
		pos = 3
	} else {
		b[0], b[1] = cborMajorArray|3, cborMajorBytes|byte(len(parent))
		pos = 2
	}
	pos += copy(b[pos:], parent)
	n := len(toks)
	switch {
	case n < 24:
		b[pos] = cborMajorArray | byte(n)
		pos++
	case n <= 0xff:
		b[pos], b[pos+1] = cborMajorArray|24, byte(n)
		pos += 2
	default:
		pos += len(appendCBORHead(b[pos:pos], cborMajorArray, uint64(n)))
	}
	// Eight at a time without branches where the CPU and b's room allow (cborTokens),
	// the rest here, widest class first, as in encodePickleBlock.
	done, w := cborTokens(b[pos:], toks)
	pos += w
	for _, t := range toks[done:] {
		u := uint32(t)
		var major byte
		if t < 0 {
			major, u = cborMajorNeg, ^u
		}
		if u > 0xffff {
			b[pos] = major | 26
			binary.BigEndian.PutUint32(b[pos+1:], u)
			pos += 5
		} else if u > 0xff {
			b[pos], b[pos+1], b[pos+2] = major|25, byte(u>>8), byte(u)
			pos += 3
		} else if u >= 24 {
			b[pos], b[pos+1] = major|24, byte(u)
			pos += 2
		} else {
			b[pos] = major | byte(u)
			pos++
		}
	}
	pos += copy(b[pos:], extra)
	for _, t := range look {
		pos += len(appendCBORInt(b[pos:pos], t))
	}
	return b[:pos]
}

// encodeSGLangBlock writes [parent ||] u32le(tokens) into b.
func encodeSGLangBlock(b []byte, hasParent bool, parent *[32]byte, toks []int32) []byte {
	pos := 0
	if hasParent {
		pos = copy(b, parent[:])
	}
	for _, t := range toks {
		binary.LittleEndian.PutUint32(b[pos:], uint32(t))
		pos += 4
	}
	return b[:pos]
}

// encodeBigramBlock writes [parent ||] u32le(t[j]) u32le(t[j+1]) for each adjacent pair
// of toks (len(toks)-1 units) into b.
func encodeBigramBlock(b []byte, hasParent bool, parent *[32]byte, toks []int32) []byte {
	pos := 0
	if hasParent {
		pos = copy(b, parent[:])
	}
	for j := 0; j+1 < len(toks); j++ {
		binary.LittleEndian.PutUint32(b[pos:], uint32(toks[j]))
		binary.LittleEndian.PutUint32(b[pos+4:], uint32(toks[j+1]))
		pos += 8
	}
	return b[:pos]
}
