package httpapi

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
)

// vbmiModes are the array decode paths the reference tests check: the portable one
// always, tokensVBMI's where this CPU runs it.
func vbmiModes() []bool {
	if hasVBMI {
		return []bool{false, true}
	}
	return []bool{false}
}

// vbmiTakes reports the value of the array element at the start of b if tokensVBMI
// takes it (a fixint or an 8/16/32-bit integer in 0..MaxInt32), and its length.
func vbmiTakes(b []byte) (v int32, size int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	switch c := b[0]; {
	case c <= 0x7f:
		return int32(c), 1, true
	case c == 0xcc || c == 0xcd || c == 0xce || c == 0xd0 || c == 0xd1 || c == 0xd2:
		x, after, err := msgp.ReadInt64Bytes(b)
		if err != nil || x < 0 || x > math.MaxInt32 {
			return 0, 0, false
		}
		return int32(x), len(b) - len(after), true
	}
	return 0, 0, false
}

// TestTokensVBMIMatchesReference: on arrays of every style and width mix, with elements
// it does not take (negative, too large, wide, not integers) at random places, followed
// by more body, tokensVBMI decodes exactly the elements before the first it does not
// take, and stops there or only where fewer than 64 elements or 64 bytes are left: the
// values, the count and the offset are the element-by-element reference's.
func TestTokensVBMIMatchesReference(t *testing.T) {
	if !hasVBMI {
		t.Skip("no AVX-512 VBMI on this CPU")
	}
	r := rand.New(rand.NewPCG(91, 92))
	var dst []int32
	for iter := range 3000 {
		n := 64 + r.IntN(1500)
		odd := 0
		if iter%3 != 0 {
			odd = r.IntN(4)
		}
		var b []byte
		if iter%2 == 0 {
			b, _ = segArray(r, n, iter%7, odd)
		} else {
			// Widths, forms and runs at random, element by element.
			b = msgp.AppendArrayHeader(nil, uint32(n))
			kinds := []int{0, 2, 3, 4, 5}
			for range n {
				k := kinds[r.IntN(len(kinds))]
				if odd > 0 && r.IntN(n) < odd {
					k = []int{1, 6, 7, 8}[r.IntN(4)]
				}
				b = tokenElem(b, r, k)
			}
		}
		b = append(b, byte(r.IntN(256)), 0xcd, 0xce, 0x7f) // whatever follows
		_, body, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		// The reference: values and offsets of the leading elements it takes.
		var want []int32
		var offs []int
		at := 0
		for len(want) < n {
			v, size, ok := vbmiTakes(body[at:])
			if !ok {
				break
			}
			offs = append(offs, at)
			want, at = append(want, v), at+size
		}
		offs = append(offs, at)
		dst = slices.Grow(dst[:0], n)[:n]
		got, pos := tokensVBMI(body, dst)
		if got > len(want) || !slices.Equal(dst[:got], want[:got]) {
			t.Fatalf("iter %d: %d elements, reference takes %d; values differ", iter, got, len(want))
		}
		if pos != offs[got] {
			t.Fatalf("iter %d: stopped at byte %d after %d elements, element %d starts at %d", iter, pos, got, got, offs[got])
		}
		if got < len(want) && n-got >= 64 && len(body)-pos >= 64+4 {
			t.Fatalf("iter %d: stopped after %d of %d elements it takes, with %d elements and %d bytes left",
				iter, got, len(want), n-got, len(body)-pos)
		}
	}
}

// TestTokensVBMIEveryLead: a window whose elements are led by each byte value in turn (at
// every offset of a window, behind fixints of each count) stops at exactly the leads it
// does not take and decodes the rest.
func TestTokensVBMIEveryLead(t *testing.T) {
	if !hasVBMI {
		t.Skip("no AVX-512 VBMI on this CPU")
	}
	dst := make([]int32, 256)
	for c := range 256 {
		for lead := range 70 {
			body := make([]byte, 0, 512)
			for range lead {
				body = append(body, 5)
			}
			body = append(body, byte(c), 0x7f, 0x00, 0x10, 0x80)
			for len(body) < 400 {
				body = append(body, 1)
			}
			want, size, ok := vbmiTakes(body[lead:])
			got, pos := tokensVBMI(body, dst)
			if !ok {
				if got != lead || pos != lead {
					t.Fatalf("lead %#x after %d fixints: decoded %d (pos %d), want a stop there", c, lead, got, pos)
				}
				continue
			}
			if got <= lead || dst[lead] != want || pos < lead+size {
				t.Fatalf("lead %#x after %d fixints: decoded %d, value %d want %d", c, lead, got, dst[lead], want)
			}
		}
	}
}

// TestVBMITablesLayout: the assembly reads vbmiTables by these offsets.
func TestVBMITablesLayout(t *testing.T) {
	var v vbmiTables
	got := []uintptr{unsafe.Offsetof(v.iota), unsafe.Offsetof(v.win), unsafe.Offsetof(v.ones), unsafe.Offsetof(v.lenT),
		unsafe.Offsetof(v.clsLo), unsafe.Offsetof(v.clsHi), unsafe.Offsetof(v.pat), unsafe.Offsetof(v.sub),
		unsafe.Offsetof(v.maskT), unsafe.Offsetof(v.signT), unsafe.Offsetof(v.all59), unsafe.Offsetof(v.inval),
		unsafe.Offsetof(v.lanes), unsafe.Offsetof(v.patE)}
	want := []uintptr{0, 64, 128, 192, 256, 320, 384, 640, 704, 768, 832, 896, 960, 1008}
	if !slices.Equal(got, want) {
		t.Fatalf("offsets %v, the assembly reads %v", got, want)
	}
}
