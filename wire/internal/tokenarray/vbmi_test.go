package tokenarray

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
)

// takes reports the value of the array element at the start of b if DecodeVBMI takes it
// (a fixint or an 8/16/32-bit integer in 0..MaxInt32), and its length: the reference the
// tests hold DecodeVBMI to, element by element.
func takes(b []byte) (v int32, size int, ok bool) {
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

// intForms are the integer forms a token id may come in: lead byte and value bytes
// (a positive fixint has no lead of its own).
var intForms = [...]struct {
	lead  byte
	bytes int
}{{0, 0}, {0xcc, 1}, {0xcd, 2}, {0xce, 4}, {0xd0, 1}, {0xd1, 2}, {0xd2, 4}}

// appendInt appends x (which must fit) in form f of intForms, big-endian.
func appendInt(b []byte, f int, x uint64) []byte {
	if intForms[f].bytes == 0 {
		return append(b, byte(x&0x7f))
	}
	b = append(b, intForms[f].lead)
	for s := 8 * (intForms[f].bytes - 1); s >= 0; s -= 8 {
		b = append(b, byte(x>>s))
	}
	return b
}

// appendToken appends one element DecodeVBMI takes: a token id below vocab in form f,
// or in the narrowest unsigned form (what Python's msgpack writes) when f < 0.
func appendToken(b []byte, r *rand.Rand, vocab, f int) []byte {
	v := uint64(r.IntN(vocab))
	if f < 0 {
		switch {
		case v < 1<<7:
			f = 0
		case v < 1<<8:
			f = 1
		case v < 1<<16:
			f = 2
		default:
			f = 3
		}
	}
	bits := max(7, 8*intForms[f].bytes)
	if intForms[f].lead >= 0xd0 {
		bits-- // the sign bit stays clear
	}
	return appendInt(b, f, v&(1<<bits-1))
}

// appendOdd appends one element DecodeVBMI does not take: a negative integer, one above
// MaxInt32, a 64-bit form, or no integer at all.
func appendOdd(b []byte, r *rand.Rand) []byte {
	switch r.IntN(8) {
	case 0: // negative fixint
		return append(b, byte(0xe0+r.IntN(32)))
	case 1: // negative int8/16/32
		f := 4 + r.IntN(3)
		return appendInt(b, f, math.MaxUint64-uint64(r.IntN(100)))
	case 2: // uint32 above MaxInt32
		return appendInt(b, 3, math.MaxInt32+1+uint64(r.IntN(1<<31)))
	case 3:
		return msgp.AppendUint64(append(b, 0xcf, 0, 0, 0, 0)[:len(b)], r.Uint64()>>uint(r.IntN(64)))
	case 4:
		return msgp.AppendInt64(b, -int64(r.IntN(1<<20)))
	case 5:
		return msgp.AppendNil(b)
	case 6:
		return msgp.AppendString(b, "7")
	default: // an SGLang [a, b] pair
		return append(b, 0x92, 1, 2)
	}
}

// randomArray is an n-element array body of one style, with about odd elements that
// DecodeVBMI does not take at random places.
func randomArray(r *rand.Rand, n, style, odd int) []byte {
	var b []byte
	for range n {
		switch {
		case odd > 0 && r.IntN(n) < odd:
			b = appendOdd(b, r)
		case style == 0: // a 152K vocabulary as Python writes it
			b = appendToken(b, r, 151936, -1)
		case style == 1: // every form taken, element by element
			b = appendToken(b, r, math.MaxInt32, r.IntN(len(intForms)))
		case style == 2: // a 32K vocabulary, mostly uint16
			b = appendToken(b, r, 32000, -1)
		default: // runs of one form
			b = appendToken(b, r, 151936, len(b)/97%len(intForms))
		}
	}
	return b
}

// TestDecodeVBMIMatchesReference: on arrays of every style, with elements it does not
// take at random places and followed by more bytes, DecodeVBMI decodes exactly the
// elements before the first it does not take, and stops there or only where fewer than
// MinElems elements or 64 bytes are left: the values, the count and the offset are the
// element-by-element reference's.
func TestDecodeVBMIMatchesReference(t *testing.T) {
	if !HasVBMI {
		t.Skip("no AVX-512 VBMI on this CPU")
	}
	r := rand.New(rand.NewPCG(91, 92))
	var dst []int32
	for iter := range 3000 {
		n := MinElems + r.IntN(1500)
		odd := 0
		if iter%3 != 0 {
			odd = r.IntN(4)
		}
		body := randomArray(r, n, iter%4, odd)
		body = append(body, byte(r.IntN(256)), 0xcd, 0xce, 0x7f) // whatever follows
		var want []int32
		var offs []int
		at := 0
		for len(want) < n {
			v, size, ok := takes(body[at:])
			if !ok {
				break
			}
			offs = append(offs, at)
			want, at = append(want, v), at+size
		}
		offs = append(offs, at)
		dst = slices.Grow(dst[:0], n)[:n]
		got, pos := DecodeVBMI(body, dst)
		if got > len(want) || !slices.Equal(dst[:got], want[:got]) {
			t.Fatalf("iter %d: %d elements, reference takes %d; values differ", iter, got, len(want))
		}
		if pos != offs[got] {
			t.Fatalf("iter %d: stopped at byte %d after %d elements, element %d starts at %d", iter, pos, got, got, offs[got])
		}
		if got < len(want) && n-got >= MinElems && len(body)-pos >= 64+4 {
			t.Fatalf("iter %d: stopped after %d of %d elements it takes, with %d elements and %d bytes left",
				iter, got, len(want), n-got, len(body)-pos)
		}
	}
}

// TestDecodeVBMIEveryLead: a window whose elements are led by each byte value in turn (at
// every offset of a window, behind fixints of each count) stops at exactly the leads it
// does not take and decodes the rest.
func TestDecodeVBMIEveryLead(t *testing.T) {
	if !HasVBMI {
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
			want, size, ok := takes(body[lead:])
			got, pos := DecodeVBMI(body, dst)
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

// TestDecodeVBMIShortInputs: below MinElems elements of room or 64 bytes it decodes
// nothing, so that a caller's exact path sees every element of a short array.
func TestDecodeVBMIShortInputs(t *testing.T) {
	body := make([]byte, 200)
	for i := range body {
		body[i] = 3
	}
	dst := make([]int32, 200)
	for _, c := range []struct{ bytes, room int }{{63, 200}, {200, MinElems - 1}, {0, 0}} {
		if n, pos := DecodeVBMI(body[:c.bytes], dst[:c.room]); n != 0 || pos != 0 {
			t.Errorf("%d bytes, %d elements of room: decoded %d (pos %d)", c.bytes, c.room, n, pos)
		}
	}
	if !HasVBMI {
		return
	}
	if n, pos := DecodeVBMI(body, dst); n < len(body)-MinElems || pos != n || dst[0] != 3 || dst[n-1] != 3 {
		t.Errorf("200 fixints: decoded %d (pos %d)", n, pos)
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
