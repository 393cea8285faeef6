package hashing

import "encoding/binary"

// CBOR major types, pre-shifted into the initial byte.
const (
	cborMajorUint  = 0x00
	cborMajorNeg   = 0x20
	cborMajorBytes = 0x40
	cborMajorText  = 0x60
	cborMajorArray = 0x80
	cborNull       = 0xf6
)

// appendCBORHead appends a data item head with the shortest argument encoding, which is
// what canonical (RFC 7049 §3.9 / RFC 8949 core deterministic) encoding requires and what
// cbor2.dumps(canonical=True) emits.
func appendCBORHead(b []byte, major byte, v uint64) []byte {
	switch {
	case v < 24:
		return append(b, major|byte(v))
	case v <= 0xff:
		return append(b, major|24, byte(v))
	case v <= 0xffff:
		return append(b, major|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(b, major|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	b = append(b, major|27)
	return binary.BigEndian.AppendUint64(b, v)
}

// appendCBORInt appends an int32 as major type 0 or 1 (-1-v for negatives).
func appendCBORInt(b []byte, v int32) []byte {
	if v < 0 {
		return appendCBORHead(b, cborMajorNeg, uint64(uint32(^v)))
	}
	return appendCBORHead(b, cborMajorUint, uint64(v))
}

// appendCBORExtras appends vLLM's extra_keys: null, or an array of the non-empty strings.
func appendCBORExtras(b []byte, lora, salt string) []byte {
	n := 0
	if lora != "" {
		n++
	}
	if salt != "" {
		n++
	}
	if n == 0 {
		return append(b, cborNull)
	}
	b = appendCBORHead(b, cborMajorArray, uint64(n))
	if lora != "" {
		b = appendCBORHead(b, cborMajorText, uint64(len(lora)))
		b = append(b, lora...)
	}
	if salt != "" {
		b = appendCBORHead(b, cborMajorText, uint64(len(salt)))
		b = append(b, salt...)
	}
	return b
}

// appendCBORVLLMBlock appends cbor2.dumps((parent, tuple(tokens), extras), canonical=True).
// It is the straightforward reference; Chain inlines the same layout with precomputed
// extras.
func appendCBORVLLMBlock(b []byte, parent *[32]byte, tokens []int32, lora, salt string) []byte {
	b = append(b, cborMajorArray|3, cborMajorBytes|24, 32)
	b = append(b, parent[:]...)
	b = appendCBORHead(b, cborMajorArray, uint64(len(tokens)))
	for _, t := range tokens {
		b = appendCBORInt(b, t)
	}
	return appendCBORExtras(b, lora, salt)
}
