package hashing

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestXXH64MatchesDigest: xxh64 gives xxhash.Digest's value for every length from 0 to
// 300 bytes (every path: stripes, 8-, 4- and 1-byte tails) under random seeds, so the
// memo's lane A is the XXH64 it always was.
func TestXXH64MatchesDigest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 300)
	var d xxhash.Digest
	for n := 0; n <= len(buf); n++ {
		for range 20 {
			for i := range buf[:n] {
				buf[i] = byte(r.Uint32())
			}
			seed := r.Uint64()
			d.ResetWithSeed(seed)
			_, _ = d.Write(buf[:n])
			if got, want := xxh64(seed, buf[:n]), d.Sum64(); got != want {
				t.Fatalf("%d bytes, seed %#x: %#x, want %#x", n, seed, got, want)
			}
		}
	}
}

// FuzzXXH64: any bytes under any seed hash as xxhash.Digest hashes them.
func FuzzXXH64(f *testing.F) {
	f.Add(uint64(0), []byte{})
	f.Add(uint64(1), make([]byte, 64))
	f.Fuzz(func(t *testing.T, seed uint64, b []byte) {
		d := xxhash.NewWithSeed(seed)
		_, _ = d.Write(b)
		if got, want := xxh64(seed, b), d.Sum64(); got != want {
			t.Fatalf("%#x, want %#x", got, want)
		}
	})
}
