package hashing

import (
	"slices"
	"testing"
	"unsafe"
)

// TestCBORTokensAVX2: the AVX2 encoder writes exactly what appendCBORInt does for every
// id of a multiple of 8, and nothing more than 7 bytes past it.
func TestCBORTokensAVX2(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU")
	}
	eachRandomIDs(11, 12, func(iter int, toks []int32) {
		toks = toks[:len(toks)&^7]
		checkCBOREncoder(t, iter, toks, func(b []byte) int {
			if len(toks) == 0 {
				return 0
			}
			return cborTokensAVX2(&b[0], &toks[0], len(toks), &cborAVX2Tabs)
		})
	})
}

// TestCBORAVX2TablesLayout: the assembly reads cborAVX2Tables by these offsets.
func TestCBORAVX2TablesLayout(t *testing.T) {
	var c cborAVX2Tables
	got := []uintptr{unsafe.Offsetof(c.lim), unsafe.Offsetof(c.neg), unsafe.Offsetof(c.four),
		unsafe.Offsetof(c.one), unsafe.Offsetof(c.bswap)}
	want := []uintptr{0, 12, 16, 20, 32}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets %v, the assembly reads %v", got, want)
	}
}
