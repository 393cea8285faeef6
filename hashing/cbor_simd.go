package hashing

import "encoding/binary"

// Token ids encoded as CBOR without a branch on their widths: 8 at a time with AVX-512
// VBMI2 (cbor_amd64.s) or AVX2 (cbor_avx2_amd64.s), else a word at a time
// (cborTokensWord).
//
// A block's ids take 1, 2, 3 or 5 bytes each by their size; ids of a large vocabulary
// mix 3 and 5 at random, and a branch per id mispredicts about every other one (most of
// encodeCBORBlock's time). The AVX-512 path builds, for each of 8 ids, the widest
// encoding in an 8-byte lane (head byte, then the 4 big-endian bytes of the argument),
// picks the bytes its width needs by comparing its width class with each byte's
// threshold, and packs the picked bytes of all 8 lanes together with one VPCOMPRESSB:
// no branch depends on the data.

// cborSlack is how many bytes past the encoding cborTokens may write (its stores are
// 64 bytes wide): encodeCBORBlock takes the vector path only with that much room.
const cborSlack = 64

// cborTables holds the constants of cborTokensAsm, which reads them by offset.
type cborTables struct {
	lim  [3]uint32 // 0: 24, 256, 65536: the smallest argument of each wider class
	one  uint32    // 12
	base uint32    // 16: 23, the head's low bits are 23 + class for classes 1..3
	neg  uint32    // 20: the major type of negative ids (major 1)
	_    [2]uint32
	rep  [64]byte // 32: lane k's bytes all take byte 0 of dword k (its class)
	thr  [64]byte // 96: byte j of a lane is kept when the class is at least thr[j]
	perm [64]byte // 160: lane k = head k (dword k of the high half), argument k big-endian
}

// cborTabs is read-only after package initialisation.
var cborTabs = func() (t cborTables) {
	t.lim = [3]uint32{24, 256, 65536}
	t.one, t.base, t.neg = 1, 23, cborMajorNeg
	// Class 0 keeps the head only (it holds the value); class 1 also the argument's low
	// byte, class 2 its low two, class 3 all four.
	thr := [8]byte{0, 3, 3, 2, 1, 0xff, 0xff, 0xff}
	for k := range 8 {
		for j := range 8 {
			t.rep[8*k+j] = byte(4 * k)
			t.thr[8*k+j] = thr[j]
		}
		t.perm[8*k] = byte(32 + 4*k)
		for j := 1; j <= 4; j++ {
			t.perm[8*k+j] = byte(4*k + 4 - j)
		}
	}
	return t
}()

// cborTokensWord encodes toks into b as CBOR integers without a branch on their values,
// for CPUs without cborTokensAsm: each id's widest encoding (head byte, then up to 4
// big-endian argument bytes) is built in one 64-bit word, stored whole, and the position
// advanced by the id's width (1, 2, 3 or 5), so it writes up to 7 bytes past the
// encoding. b must have room for 5*len(toks)+7 bytes. Returns the bytes written.
func cborTokensWord(b []byte, toks []int32) int {
	pos := 0
	for _, t := range toks {
		neg := uint32(t >> 31) // all ones for a negative id (major 1, argument ^t)
		u := uint32(t) ^ neg
		c1, c2, c3 := b2u(u >= 24), b2u(u > 0xff), b2u(u > 0xffff)
		class := c1 + c2 + c3 // 0: the head holds u; 1, 2, 3: 1, 2, 4 argument bytes
		width := 1 + class + c3
		small := c1 - 1 // all ones for class 0
		head := uint64(neg&cborMajorNeg) | uint64(u)&small | uint64(23+class)&^small
		word := head<<56 | uint64(u)<<(64-8*width)&^small
		binary.BigEndian.PutUint64(b[pos:pos+8], word)
		pos += int(width)
	}
	return pos
}

// b2u is 1 for true and 0 for false, without a branch.
func b2u(c bool) uint64 {
	var x uint64
	if c {
		x = 1
	}
	return x
}
