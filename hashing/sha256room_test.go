package hashing

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"testing"
)

// TestSum256Room: the in-place SHA-256 equals crypto/sha256 for every length from 0 to
// 300 (every count of blocks and padding split), with room after the message and without
// (the fallback), and it writes nothing past the room it needs.
func TestSum256Room(t *testing.T) {
	if !hasSHANI {
		t.Log("no SHA-NI on this CPU: only the fallback is exercised")
	}
	r := rand.New(rand.NewPCG(31, 32))
	for n := 0; n <= 300; n++ {
		for range 4 {
			msg := make([]byte, n)
			for i := range msg {
				msg[i] = byte(r.Uint32())
			}
			want := sha256.Sum256(msg)
			buf := bytes.Repeat([]byte{0x5a}, n+shaPadRoom+16)
			copy(buf, msg)
			if got := sum256Room(buf[: n : n+shaPadRoom]); got != want {
				t.Fatalf("length %d with room: %x, want %x", n, got, want)
			}
			if tail := buf[n+shaPadRoom:]; bytes.Count(tail, []byte{0x5a}) != len(tail) {
				t.Fatalf("length %d: wrote past the room", n)
			}
			if got := sum256Room(msg[:n:n]); got != want {
				t.Fatalf("length %d without room: %x, want %x", n, got, want)
			}
		}
	}
}

// TestSum256RoomZeroAllocs: hashing in place allocates nothing.
func TestSum256RoomZeroAllocs(t *testing.T) {
	buf := make([]byte, 106, 106+shaPadRoom)
	var sink byte
	if a := testing.AllocsPerRun(100, func() { d := sum256Room(buf); sink ^= d[0] }); a != 0 {
		t.Fatalf("%v allocations per hash", a)
	}
	_ = sink
}

// BenchmarkSum256Block hashes a 106-byte CBOR-sized block: in place (sum256Room, SHA-NI
// where the CPU has it) and through sum256 (the minio hasher).
func BenchmarkSum256Block(b *testing.B) {
	buf := make([]byte, 106, 106+shaPadRoom)
	b.Run("room", func(b *testing.B) {
		for b.Loop() {
			d := sum256Room(buf)
			buf[0] = d[0]
		}
	})
	b.Run("sum256", func(b *testing.B) {
		for b.Loop() {
			d := sum256(buf)
			buf[0] = d[0]
		}
	})
}
