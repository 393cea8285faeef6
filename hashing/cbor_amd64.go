package hashing

import "golang.org/x/sys/cpu"

// hasCBORVector tells whether this CPU (and OS) runs cborTokensAsm: AVX-512 with
// 256-bit forms (VL), byte permutes (VBMI) and byte compress (VBMI2). Read-only after
// package initialisation.
var hasCBORVector = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VBMI && cpu.X86.HasAVX512VBMI2 && cpu.X86.HasPOPCNT

// cborTokensAsm writes the CBOR encodings of toks[0:n] (n a multiple of 8) at dst and
// returns their length; it may write up to cborSlack bytes past them (cbor_amd64.s).
//
//go:noescape
func cborTokensAsm(dst *byte, toks *int32, n int, t *cborTables) int

// hasAVX2 tells whether this CPU (and OS) runs cborTokensAVX2. Read-only after package
// initialisation.
var hasAVX2 = cpu.X86.HasAVX2

// cborTokensAVX2 writes the CBOR encodings of toks[0:n] (n a multiple of 8) at dst and
// returns their length; it writes up to 7 bytes past them (cbor_avx2_amd64.s).
//
//go:noescape
func cborTokensAVX2(dst *byte, toks *int32, n int, t *cborAVX2Tables) int

// cborAVX2Tables holds the constants of cborTokensAVX2, which reads them by offset.
type cborAVX2Tables struct {
	lim   [3]uint32 // 0: 23, 255, 65535: the largest argument of classes 0, 1, 2
	neg   uint32    // 12: the major type of negative ids
	four  uint32    // 16
	one   uint32    // 20
	_     [2]uint32
	bswap [32]byte // 32: PSHUFB mask turning each dword big-endian
}

// cborAVX2Tabs is read-only after package initialisation.
var cborAVX2Tabs = func() (t cborAVX2Tables) {
	t.lim = [3]uint32{23, 255, 65535}
	t.neg, t.four, t.one = cborMajorNeg, 4, 1
	for i := range t.bswap {
		t.bswap[i] = byte(i&12 + 3 - i&3) // in-lane indexes: 0..15 in each half
	}
	return t
}()

// cborTokens encodes toks into b as CBOR integers when b has room for them plus
// cborSlack, and returns how many tokens and bytes it wrote (0, 0 without the room):
// with cborTokensAsm the leading multiple of 8 where hasCBORVector; else all of them,
// 8 at a time with cborTokensAVX2 where hasAVX2 and the rest with cborTokensWord.
func cborTokens(b []byte, toks []int32) (int, int) {
	if len(b) < 5*len(toks)+cborSlack {
		return 0, 0
	}
	if !hasCBORVector {
		w := 0
		n := len(toks) &^ 7
		if hasAVX2 && n > 0 {
			w = cborTokensAVX2(&b[0], &toks[0], n, &cborAVX2Tabs)
		} else {
			n = 0
		}
		return len(toks), w + cborTokensWord(b[w:], toks[n:])
	}
	n := len(toks) &^ 7
	if n == 0 {
		return 0, 0
	}
	return n, cborTokensAsm(&b[0], &toks[0], n, &cborTabs)
}
