package wire

import (
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// FuzzHTTPSkip checks the iterative skipper against msgp.Skip, which the strict decoders
// replace only to avoid recursing on hostile nesting.
func FuzzHTTPSkip(f *testing.F) {
	for _, s := range [][]byte{
		{0x81, 0xa1, 'a', 0x92, 0x01, 0xcd, 0x01, 0x02},
		{0xc7, 0x02, 0x05, 0x01, 0x02, 0xd8, 0x01},
		{0xdd, 0x00, 0x00, 0x00, 0x02, 0xc0, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		{0xdf, 0x00, 0x00, 0x00, 0x01, 0xd9, 0x01, 'x', 0xc6, 0, 0, 0, 1, 0xff},
		{0xc1},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := httpSkip(b, 1)
		want, err := msgp.Skip(b)
		if ok != (err == nil) {
			t.Fatalf("httpSkip ok=%v, msgp.Skip err=%v", ok, err)
		}
		if ok && len(got) != len(want) {
			t.Fatalf("httpSkip left %d bytes, msgp.Skip %d", len(got), len(want))
		}
	})
}

func TestHTTPSkipDeepNestingIsIterative(t *testing.T) {
	// Nesting far past any recursion budget must neither fail nor recurse.
	const depth = 1 << 20
	b := make([]byte, depth+1)
	for i := range depth {
		b[i] = 0x91
	}
	b[depth] = 0xc0
	rest, ok := httpSkip(b, 1)
	if !ok || len(rest) != 0 {
		t.Fatalf("ok=%v rest=%d", ok, len(rest))
	}
	if _, ok := httpSkip(b[:depth], 1); ok {
		t.Fatal("truncated nesting accepted")
	}
	if n := testing.AllocsPerRun(10, func() { httpSkip(b, 1) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
