package hashing

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestCBORTokensAVX2: the AVX2 encoder writes exactly what appendCBORInt does for every
// id of a multiple of 8, and nothing more than 7 bytes past it; cborTokens, on a CPU
// without AVX-512 VBMI2, encodes every id through it and the word path together.
func TestCBORTokensAVX2(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU")
	}
	r := rand.New(rand.NewPCG(9, 10))
	for iter := range 3000 {
		toks := randomCBORIDs(r)
		n := len(toks) &^ 7
		var want []byte
		for _, v := range toks {
			want = appendCBORInt(want, v)
		}
		b := bytes.Repeat([]byte{0xa5}, 5*len(toks)+cborSlack)
		var w int
		if n > 0 {
			w = cborTokensAVX2(&b[0], &toks[0], n, &cborAVX2Tabs)
		}
		var wantN []byte
		for _, v := range toks[:n] {
			wantN = appendCBORInt(wantN, v)
		}
		if !bytes.Equal(b[:w], wantN) {
			t.Fatalf("iter %d: %d ids, %d bytes\n got %x\nwant %x", iter, n, w, b[:w], wantN)
		}
		if tail := b[w+7:]; bytes.Count(tail, []byte{0xa5}) != len(tail) {
			t.Fatalf("iter %d: wrote more than 7 bytes past the encoding: %x", iter, b[w:])
		}
		if hasCBORVector {
			continue
		}
		got, w2 := cborTokens(b, toks)
		if got != len(toks) || !bytes.Equal(b[:w2], want) {
			t.Fatalf("iter %d: cborTokens took %d of %d ids\n got %x\nwant %x", iter, got, len(toks), b[:w2], want)
		}
	}
}

// TestCBORAVX2TablesLayout: the assembly reads cborAVX2Tables by these offsets.
func TestCBORAVX2TablesLayout(t *testing.T) {
	var c cborAVX2Tables
	got := []uintptr{unsafe.Offsetof(c.lim), unsafe.Offsetof(c.neg), unsafe.Offsetof(c.four),
		unsafe.Offsetof(c.one), unsafe.Offsetof(c.bswap)}
	want := []uintptr{0, 12, 16, 20, 32}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("offsets %v, the assembly reads %v", got, want)
		}
	}
}
