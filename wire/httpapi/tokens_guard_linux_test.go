//go:build linux

package httpapi

import (
	"math/rand/v2"
	"syscall"
	"testing"
)

// guarded maps room for len(b) bytes between two inaccessible pages and returns two
// len(b)-byte windows of it, one against the page before (lead) and one against the page
// after (tail), so that reading a byte outside a window faults, and the function that
// unmaps it.
func guarded(t *testing.T, b []byte) (lead, tail []byte, free func()) {
	t.Helper()
	pg := syscall.Getpagesize()
	size := (len(b) + pg - 1) / pg * pg
	mem, err := syscall.Mmap(-1, 0, size+2*pg, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip("mmap:", err)
	}
	for _, g := range [][]byte{mem[:pg], mem[pg+size:]} {
		if err := syscall.Mprotect(g, syscall.PROT_NONE); err != nil {
			t.Skip("mprotect:", err)
		}
	}
	body := mem[pg : pg+size]
	lead = body[:len(b):len(b)]
	tail = body[size-len(b) : size : size]
	return lead, tail, func() { syscall.Munmap(mem) }
}

// TestTokenArrayNoReadOutside: decoding long arrays placed against an inaccessible page
// on either side (and cut anywhere) reads nothing outside the body, on every path: the
// segmented chains' 4-byte loads end where the element does and start up to 3 bytes
// before it; tokenarray.DecodeVBMI's 64-byte loads start at an element and end inside the body.
func TestTokenArrayNoReadOutside(t *testing.T) {
	r := rand.New(rand.NewPCG(77, 78))
	var dst, scratch []int32
	for iter := range 150 {
		b, _ := segArray(r, segMinElems+r.IntN(6000), iter%7, iter%3/2)
		if iter%2 == 1 {
			b = b[:len(b)-r.IntN(min(len(b), 40))]
		}
		lead, tail, free := guarded(t, b)
		for _, g := range [][]byte{lead, tail} {
			copy(g, b)
			checkTokenArray(t, iter, g, &dst, &scratch)
		}
		free()
	}
}

func equalPrefix(got, want []int32) bool {
	if len(got) < len(want) {
		return false
	}
	for i := range want {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}
