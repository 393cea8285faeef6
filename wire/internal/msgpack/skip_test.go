package msgpack

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// FuzzSkip checks the iterative skipper, and the str and bin readers, against msgp's
// generic reader, which wire/ replaces only to avoid recursing on hostile nesting.
func FuzzSkip(f *testing.F) {
	for _, s := range [][]byte{
		{0x81, 0xa1, 'a', 0x92, 0x01, 0xcd, 0x01, 0x02},
		{0xc7, 0x02, 0x05, 0x01, 0x02, 0xd8, 0x01},
		{0xdd, 0x00, 0x00, 0x00, 0x02, 0xc0, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		{0xdf, 0x00, 0x00, 0x00, 0x01, 0xd9, 0x01, 'x', 0xc6, 0, 0, 0, 1, 0xff},
		{0xda, 0x00, 0x02, 'h', 'i', 0xc5, 0x00, 0x01, 0x07},
		{0xc1},
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Skip(b, 1)
		want, werr := msgp.Skip(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("Skip err=%v, msgp.Skip err=%v", err, werr)
		}
		if err == nil && len(got) != len(want) {
			t.Fatalf("Skip left %d bytes, msgp.Skip %d", len(got), len(want))
		}
		if err != nil && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Skip: unexpected error %v", err)
		}
		s, rest, err := Str(b)
		ws, wrest, werr := msgp.ReadStringZC(b)
		if (err == nil) != (werr == nil) || err == nil && (!bytes.Equal(s, ws) || len(rest) != len(wrest)) {
			t.Fatalf("Str = %q, %d left, %v; msgp %q, %d left, %v", s, len(rest), err, ws, len(wrest), werr)
		}
		v, rest, err := Bin(b)
		wv, wrest, werr := msgp.ReadBytesZC(b)
		if (err == nil) != (werr == nil) || err == nil && (!bytes.Equal(v, wv) || len(rest) != len(wrest)) {
			t.Fatalf("Bin = %x, %d left, %v; msgp %x, %d left, %v", v, len(rest), err, wv, len(wrest), werr)
		}
	})
}

func TestSkipDeepNestingIsIterative(t *testing.T) {
	// Nesting far past any recursion budget must neither fail nor recurse.
	const depth = 1 << 20
	b := make([]byte, depth+1)
	for i := range depth {
		b[i] = 0x91
	}
	b[depth] = 0xc0
	rest, err := Skip(b, 1)
	if err != nil || len(rest) != 0 {
		t.Fatalf("err=%v rest=%d", err, len(rest))
	}
	if _, err := Skip(b[:depth], 1); !errors.Is(err, ErrTruncated) {
		t.Fatalf("truncated nesting: err=%v", err)
	}
	if n := testing.AllocsPerRun(10, func() { _, _ = Skip(b, 1) }); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}

func TestSkipRefusesLyingCountsAndReservedByte(t *testing.T) {
	for _, c := range []struct {
		name  string
		b     []byte
		count int
		want  error
	}{
		{"count above bytes", []byte{0xc0, 0xc0}, 3, ErrTruncated},
		{"array32 claims 2^32-1", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}, 1, ErrTruncated},
		{"map16 claims too many", []byte{0xde, 0x00, 0x10, 0xc0, 0xc0}, 1, ErrTruncated},
		{"reserved 0xc1", []byte{0x92, 0x01, 0xc1}, 1, ErrInvalid},
		{"two values", []byte{0x01, 0xa1, 'x'}, 2, nil},
	} {
		rest, err := Skip(c.b, c.count)
		if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
			t.Errorf("%s: err=%v, want %v", c.name, err, c.want)
		}
		if err == nil && len(rest) != 0 {
			t.Errorf("%s: %d bytes left", c.name, len(rest))
		}
		if err != nil && len(rest) != len(c.b) {
			t.Errorf("%s: failure consumed input", c.name)
		}
	}
}
