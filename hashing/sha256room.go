package hashing

import (
	"encoding/binary"
	"math"
)

// SHA-256 of a message that has room after it, with the SHA-NI compression called
// directly (sha256BlocksNI): the padding is written into that room, so the message is
// compressed where it lies, with no copy into a hasher's buffer and no hash.Hash state to
// reset, fill and finish. For the 100-odd bytes of a block that wrapper is a large part of
// the cost (BenchmarkSum256Block measures both on the machine at hand).

// shaPadRoom is the room after a message that sum256Room needs to pad it in place: the
// 0x80 byte, up to 63 zero bytes and the 8-byte length.
const shaPadRoom = 72

// sha256Tables holds what sha256BlocksNI reads by offset.
type sha256Tables struct {
	k     [64]uint32 // 0: the round constants
	bswap [16]byte   // 256: PSHUFB mask turning each 4-byte group big-endian
}

// sha256Tabs is read-only after package initialisation.
var sha256Tabs = func() (t sha256Tables) {
	// FIPS 180-4: the first 32 bits of the fractional parts of the cube roots of the
	// first 64 primes (float64 carries them exactly: checked against crypto/sha256 by
	// the tests).
	p := 2
	for i := range t.k {
		_, frac := math.Modf(math.Cbrt(float64(p)))
		t.k[i] = uint32(frac * (1 << 32))
		for p++; !isPrime(p); p++ {
		}
	}
	for i := range t.bswap {
		t.bswap[i] = byte(i&^3 + 3 - i&3)
	}
	return t
}()

func isPrime(n int) bool {
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return n >= 2
}

// sha256IV is the initial state (FIPS 180-4 5.3.3).
var sha256IV = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// sum256Room is sum256(b), computed in place where the CPU has SHA-NI and b has
// shaPadRoom bytes of capacity after it: it overwrites those bytes with the padding
// (they must be scratch). Otherwise it is sum256.
func sum256Room(b []byte) [32]byte {
	var d [32]byte
	sum256RoomTo(&d, b)
	return d
}

// sum256RoomTo is sum256Room storing the digest in *d. The chain's hot path uses it:
// returning the digest by value had it stored as 4-byte words and copied at once with
// 16-byte loads (twice: the return, then *d), which cannot be forwarded from the stores
// still in flight and stalled each block (perf: a tenth of a cold query's hashing outside
// the compression). Here each pair of words is one 8-byte store, read later.
func sum256RoomTo(d *[32]byte, b []byte) {
	n := len(b)
	if !hasSHANI || cap(b)-n < shaPadRoom {
		*d = sum256(b)
		return
	}
	total := (n + 9 + 63) &^ 63
	p := b[:total]
	p[n] = 0x80
	clear(p[n+1 : total-8])
	binary.BigEndian.PutUint64(p[total-8:], uint64(n)<<3)
	h := sha256IV
	sha256BlocksNI(&h, &p[0], total/64, &sha256Tabs)
	binary.BigEndian.PutUint64(d[0:], uint64(h[0])<<32|uint64(h[1]))
	binary.BigEndian.PutUint64(d[8:], uint64(h[2])<<32|uint64(h[3]))
	binary.BigEndian.PutUint64(d[16:], uint64(h[4])<<32|uint64(h[5]))
	binary.BigEndian.PutUint64(d[24:], uint64(h[6])<<32|uint64(h[7]))
}
