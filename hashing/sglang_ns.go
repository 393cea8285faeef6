package hashing

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
)

// SGLang >= 0.5.23 publishes the pages of a LoRA request in the adapter's namespace
// (disaggregation/kv_events.py, default event format): the page's event value v (first
// 8 digest bytes, a signed int64) becomes the first 8 bytes of
// SHA256(seed || v as 8 big-endian bytes), with
// seed = SHA256("sglang-kv-event-namespace-v1" || part(extra_key) || part(None)),
// part(None) = 00, part(s) = 01 || u64 LE len(s) || s. A request's extra_key is its
// LoRA id (with no caller extra_key), which for an adapter given with --lora-paths is
// uuid5(NAMESPACE_URL, name + "\x00" + path).hex (LoRARef.deterministic_id). The page
// chain itself (and so Chain.Digest) is not namespaced.
const sglangNamespaceTag = "sglang-kv-event-namespace-v1"

// uuidNamespaceURL is RFC 4122's NAMESPACE_URL, 6ba7b811-9dad-11d1-80b4-00c04fd430c8.
var uuidNamespaceURL = [16]byte{0x6b, 0xa7, 0xb8, 0x11, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8}

// sglangLoraNamespace writes into seed the namespace seed of the adapter (name, path),
// using b (grown as needed, returned) as scratch.
func sglangLoraNamespace(b []byte, name, path string, seed *[32]byte) []byte {
	// uuid5: SHA-1 of the namespace and the name, version 5 and the RFC 4122 variant.
	b = append(b[:0], uuidNamespaceURL[:]...)
	b = append(b, name...)
	b = append(b, 0)
	b = append(b, path...)
	u := sha1.Sum(b)
	u[6] = u[6]&0x0f | 0x50
	u[8] = u[8]&0x3f | 0x80
	var id [32]byte
	hex.Encode(id[:], u[:16])
	b = append(b[:0], sglangNamespaceTag...)
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(id)))
	b = append(b, id[:]...)
	b = append(b, 0) // no cache_salt in the default format's seed
	*seed = sum256(b)
	return b
}

// sglangNamespacedKey is the published value of a page with event digest d.
func sglangNamespacedKey(seed *[32]byte, d *[32]byte) uint64 {
	var b [40]byte
	copy(b[:32], seed[:])
	copy(b[32:], d[:8])
	h := sum256(b[:])
	return binary.BigEndian.Uint64(h[:8])
}
