package hashing

import "encoding/binary"

// Pickle protocol 5 opcodes used for vLLM's (parent, tokens, extras) tuples.
const (
	opProto           = 0x80
	opFrame           = 0x95
	opStop            = 0x2e
	opMemoize         = 0x94
	opBinGet          = 0x68
	opLongBinGet      = 0x6a
	opMark            = 0x28
	opTuple           = 0x74
	opEmptyTuple      = 0x29
	opTuple1          = 0x85
	opNone            = 0x4e
	opBinInt          = 0x4a
	opBinInt1         = 0x4b
	opBinInt2         = 0x4d
	opShortBinBytes   = 0x43
	opBinBytes        = 0x42
	opBinBytes8       = 0x8e
	opShortBinUnicode = 0x8c
	opBinUnicode      = 0x58
	opBinUnicode8     = 0x8d
)

// CPython _pickle.c framing constants.
const (
	frameSizeTarget = 64 * 1024 // a frame is committed at an opcode boundary once this full
	frameSizeMin    = 4         // shorter frames lose their FRAME header on commit
	frameHeaderSize = 9         // FRAME + u64 LE length
)

// pickler reproduces the bytes of CPython's C pickler (pickle.dumps, protocol 5) for the
// few shapes vLLM hashes: bytes, str, int32, None and tuples of those. It follows
// _pickle.c rather than Lib/pickle.py: a frame is opened lazily by the first write,
// committed by the opcode-boundary check at the start of every save() once it holds
// >= 64 KiB, and bytes/str payloads >= 64 KiB are written outside any frame.
// This is the exact, general path; Chain uses a precomputed fast path for blocks that
// provably fit in one frame and falls back to this one otherwise.
type pickler struct {
	b          []byte
	frameStart int // offset of the open frame's header, -1 when none is open
	memo       int // number of memoized objects; the next MEMOIZE gets this index
	// inFrame writes opcodes with no framing at all: the bytes of a part that Chain
	// splices into a block it knows fits one frame (see appendPickleExtrasFast).
	inFrame bool
	// shared are the strings saved so far that CPython shares by value (shareable),
	// with their memo indices, for the back-references saveUserStr writes.
	shared    [3]string
	sharedIdx [3]int
	nShared   int
}

// begin starts a dump into the reused buffer: PROTO 5 is written before framing starts.
func (p *pickler) begin() {
	p.b = append(p.b[:0], opProto, 5)
	p.frameStart = -1
	p.memo = 0
	p.nShared = 0
}

// open starts a frame if none is open, as _Pickler_Write does when framing is on.
func (p *pickler) open() {
	if p.frameStart < 0 && !p.inFrame {
		p.frameStart = len(p.b)
		p.b = append(p.b, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	}
}

// commit closes the open frame: it gets its FRAME header, or loses the placeholder
// header if shorter than frameSizeMin (_Pickler_CommitFrame).
func (p *pickler) commit() {
	if p.frameStart < 0 {
		return
	}
	fs := p.frameStart
	n := len(p.b) - fs - frameHeaderSize
	if n >= frameSizeMin {
		p.b[fs] = opFrame
		binary.LittleEndian.PutUint64(p.b[fs+1:], uint64(n))
	} else {
		copy(p.b[fs:], p.b[fs+frameHeaderSize:])
		p.b = p.b[:len(p.b)-frameHeaderSize]
	}
	p.frameStart = -1
}

// boundary is _Pickler_OpcodeBoundary, run at the start of every save().
func (p *pickler) boundary() {
	if p.frameStart >= 0 && len(p.b)-p.frameStart-frameHeaderSize >= frameSizeTarget {
		p.commit()
	}
}

// op writes opcodes inside the current (possibly new) frame.
func (p *pickler) op(ops ...byte) {
	p.open()
	p.b = append(p.b, ops...)
}

// memoize writes MEMOIZE, numbering the object as the C pickler's memo table does.
func (p *pickler) memoize() {
	p.open()
	p.b = append(p.b, opMemoize)
	p.memo++
}

// saveInt writes an int32 the way save_long does for values that fit a C long.
func (p *pickler) saveInt(v int32) {
	p.boundary()
	p.open()
	p.b = appendPickleInt(p.b, v)
}

// saveNone writes None (atoms are never memoized).
func (p *pickler) saveNone() {
	p.boundary()
	p.op(opNone)
}

// writeLarge is _Pickler_write_bytes: payloads of 64 KiB or more bypass framing.
func writeLarge[T ~string | ~[]byte](p *pickler, header []byte, data T) {
	if len(data) >= frameSizeTarget && !p.inFrame {
		p.commit()
		p.b = append(p.b, header...)
		p.b = append(p.b, data...)
		return
	}
	p.open()
	p.b = append(p.b, header...)
	p.b = append(p.b, data...)
}

// saveBytes writes a bytes object (SHORT_BINBYTES / BINBYTES / BINBYTES8) and memoizes it.
func (p *pickler) saveBytes(data []byte) {
	saveSized(p, [3]byte{opShortBinBytes, opBinBytes, opBinBytes8}, data)
}

// saveStr writes a str given as its UTF-8 bytes (SHORT_BINUNICODE / BINUNICODE /
// BINUNICODE8) and memoizes it.
func (p *pickler) saveStr(s string) {
	saveSized(p, [3]byte{opShortBinUnicode, opBinUnicode, opBinUnicode8}, s)
}

// saveSized writes a length-prefixed object with the short (1-byte), 4-byte or 8-byte
// length opcode of ops, then memoizes it.
func saveSized[T ~string | ~[]byte](p *pickler, ops [3]byte, data T) {
	p.boundary()
	var h [9]byte
	n := len(data)
	switch {
	case n <= 0xff:
		h[0], h[1] = ops[0], byte(n)
		writeLarge(p, h[:2], data)
	case uint64(n) <= 0xffffffff:
		h[0] = ops[1]
		binary.LittleEndian.PutUint32(h[1:], uint32(n))
		writeLarge(p, h[:5], data)
	default:
		h[0] = ops[2]
		binary.LittleEndian.PutUint64(h[1:], uint64(n))
		writeLarge(p, h[:9], data)
	}
	p.memoize()
}

// saveGet writes a memo back-reference (BINGET / LONG_BINGET) for an object pickled
// earlier in the same dump.
func (p *pickler) saveGet(idx int) {
	p.boundary()
	if idx < 256 {
		p.op(opBinGet, byte(idx))
		return
	}
	p.open()
	p.b = append(p.b, opLongBinGet)
	p.b = binary.LittleEndian.AppendUint32(p.b, uint32(idx))
}

// endTuple closes a tuple of n elements whose items were saved after startTuple.
func (p *pickler) endTuple(n int) {
	switch {
	case n == 0:
		// The empty tuple is a singleton: EMPTY_TUPLE, never memoized.
		p.op(opEmptyTuple)
		return
	case n <= 3:
		p.op(opTuple1 + byte(n-1))
	default:
		p.op(opTuple)
	}
	p.memoize()
}

// startTuple is the save() entry of a tuple with n elements: MARK for n > 3.
func (p *pickler) startTuple(n int) {
	p.boundary()
	if n > 3 {
		p.op(opMark)
	}
}

// saveTokens writes tuple(tokens).
func (p *pickler) saveTokens(tokens []int32) {
	p.startTuple(len(tokens))
	for _, t := range tokens {
		p.saveInt(t)
	}
	p.endTuple(len(tokens))
}

// stop writes STOP and commits the last frame, finishing the dump.
func (p *pickler) stop() {
	p.op(opStop)
	p.commit()
}

// Tags of vLLM >= 0.31's extra keys (kv_cache_utils.py).
const (
	extraTagLora = "lora"
	extraTagSalt = "cache_salt"
)

// blockExtras is what vLLM hashes as one block's extra keys besides lookahead tokens:
// the LoRA adapter (on every block of a LoRA request) and the cache salt (block 0 only),
// untagged, (lora_name, cache_salt), or tagged, (("lora", lora_name, lora_path),
// ("cache_salt", cache_salt)); each part only when its name or salt is non-empty, and
// None when neither is.
type blockExtras struct {
	tagged           bool
	lora, path, salt string
}

// parts is the number of parts of ex's value: the LoRA and the salt, each where set.
func (ex blockExtras) parts() int {
	n := 0
	if ex.lora != "" {
		n++
	}
	if ex.salt != "" {
		n++
	}
	return n
}

// vllmBlock pickles (parent, tuple(tokens), extras) exactly, whatever the sizes. extras is
// ex's value (see saveExtras), or, with lookahead tokens, (that value, *look), as vLLM >=
// 0.33 hashes a block with num_hash_lookahead_tokens = len(look).
func (p *pickler) vllmBlock(parent []byte, tokens []int32, ex blockExtras, look []int32) {
	p.begin()
	p.startTuple(3)
	p.saveBytes(parent)
	p.saveTokens(tokens)
	p.saveLookahead(ex, look)
	p.endTuple(3)
	p.stop()
}

// saveLookahead saves the extras field of a block: ex's value alone, or (ex's value,
// *look) when look is not empty.
func (p *pickler) saveLookahead(ex blockExtras, look []int32) {
	if len(look) == 0 {
		p.saveExtras(ex)
		return
	}
	p.startTuple(1 + len(look))
	p.saveExtras(ex)
	for _, t := range look {
		p.saveInt(t)
	}
	p.endTuple(1 + len(look))
}

// saveExtras saves None, or the tuple of ex's parts (blockExtras).
func (p *pickler) saveExtras(ex blockExtras) {
	n := ex.parts()
	if n == 0 {
		p.saveNone()
		return
	}
	p.startTuple(n)
	if ex.lora != "" {
		if ex.tagged {
			p.startTuple(3)
			p.saveStr(extraTagLora)
			p.saveUserStr(ex.lora)
			p.saveUserStr(ex.path)
			p.endTuple(3)
		} else {
			p.saveUserStr(ex.lora)
		}
	}
	if ex.salt != "" {
		if ex.tagged {
			p.startTuple(2)
			p.saveStr(extraTagSalt)
			p.saveUserStr(ex.salt)
			p.endTuple(2)
		} else {
			p.saveUserStr(ex.salt)
		}
	}
	p.endTuple(n)
}

// saveUserStr saves a string that came from a request (lora name, lora path, salt). The
// pickler memoizes objects by identity; requests hand each field its own object, except
// that CPython shares the empty string and every one-character Latin-1 string, so a
// second such string equal to one saved before is a memo back-reference.
func (p *pickler) saveUserStr(s string) {
	if shareable(s) {
		for i := range p.nShared {
			if p.shared[i] == s {
				p.saveGet(p.sharedIdx[i])
				return
			}
		}
	}
	p.saveStr(s)
	if shareable(s) && p.nShared < len(p.shared) {
		p.shared[p.nShared], p.sharedIdx[p.nShared] = s, p.memo-1
		p.nShared++
	}
}

// shareable reports whether CPython represents s by a cached singleton object.
func shareable(s string) bool { return s == "" || isLatin1Singleton(s) }

// isLatin1Singleton reports whether CPython represents s by one of its cached
// one-character strings (a single code point below 256), which are shared objects.
func isLatin1Singleton(s string) bool {
	switch len(s) {
	case 1:
		return s[0] < 0x80
	case 2:
		// U+0080..U+00FF encode as C2 xx or C3 xx.
		return (s[0] == 0xc2 || s[0] == 0xc3) && s[1] >= 0x80 && s[1] <= 0xbf
	}
	return false
}

// appendPickleInt appends BININT1 / BININT2 / BININT for an int32 (negative values need
// all four bytes, as in save_long).
func appendPickleInt(b []byte, v int32) []byte {
	u := uint32(v)
	switch {
	case u < 0x100:
		return append(b, opBinInt1, byte(u))
	case u < 0x10000:
		return append(b, opBinInt2, byte(u), byte(u>>8))
	}
	return append(b, opBinInt, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
}

// appendPickleExtrasFast appends the in-frame encoding of the extras field up to its
// lookahead tokens, for the single-frame fast path (Chain splices it after the token
// tuple): ex's value, preceded when lookahead > 0 by the opening of the (value, *tokens)
// tuple, whose end is pickleLookaheadEnd. The memo count before it is 2 (the parent
// bytes and the token tuple).
func appendPickleExtrasFast(b []byte, ex blockExtras, lookahead int) []byte {
	pk := pickler{b: b, frameStart: -1, memo: 2, inFrame: true}
	if lookahead > 0 {
		pk.startTuple(1 + lookahead)
	}
	pk.saveExtras(ex)
	return pk.b
}

// pickleLookaheadEnd appends the end of a (value, *tokens) extras tuple with lookahead
// tokens (nothing for 0).
func pickleLookaheadEnd(b []byte, lookahead int) []byte {
	if lookahead == 0 {
		return b
	}
	pk := pickler{b: b, frameStart: -1, inFrame: true}
	pk.endTuple(1 + lookahead)
	return pk.b
}
