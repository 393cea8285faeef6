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

// cborTokens encodes toks into b as CBOR integers when b has room for them plus
// cborSlack, and returns how many tokens and bytes it wrote (0, 0 without the room):
// with cborTokensAsm the leading multiple of 8 where hasCBORVector, else all of them with
// cborTokensWord.
func cborTokens(b []byte, toks []int32) (int, int) {
	if len(b) < 5*len(toks)+cborSlack {
		return 0, 0
	}
	if !hasCBORVector {
		return len(toks), cborTokensWord(b, toks)
	}
	n := len(toks) &^ 7
	if n == 0 {
		return 0, 0
	}
	return n, cborTokensAsm(&b[0], &toks[0], n, &cborTabs)
}
