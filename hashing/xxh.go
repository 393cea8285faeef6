package hashing

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// xxhDigest writes the XXH3-128 digest of b into the last 16 bytes of d and zeroes the
// first 16. vLLM's xxhash algorithms hash with xxhash.xxh3_128_digest, whose bytes are
// the canonical form: the high 64 bits, then the low 64 bits, each big-endian. The
// event hash (the digest's last 8 bytes, big-endian) is therefore the low 64 bits, which
// ProjLow64BE reads from the same place as for a SHA-256 digest.
func xxhDigest(d *[32]byte, b []byte) {
	h := xxh3.Hash128(b)
	*d = [32]byte{}
	binary.BigEndian.PutUint64(d[16:24], h.Hi)
	binary.BigEndian.PutUint64(d[24:32], h.Lo)
}
