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

// appendCBORExtras appends ex's value (blockExtras): null, or an array of its parts,
// each a text (untagged) or an array [tag, text...] (tagged).
func appendCBORExtras(b []byte, ex blockExtras) []byte {
	n := ex.parts()
	if n == 0 {
		return append(b, cborNull)
	}
	b = appendCBORHead(b, cborMajorArray, uint64(n))
	if ex.lora != "" {
		if ex.tagged {
			b = appendCBORText(append(b, cborMajorArray|3), extraTagLora)
			b = appendCBORText(appendCBORText(b, ex.lora), ex.path)
		} else {
			b = appendCBORText(b, ex.lora)
		}
	}
	if ex.salt != "" {
		if ex.tagged {
			b = appendCBORText(append(b, cborMajorArray|2), extraTagSalt)
		}
		b = appendCBORText(b, ex.salt)
	}
	return b
}

// appendCBORText appends a text string.
func appendCBORText(b []byte, s string) []byte {
	return append(appendCBORHead(b, cborMajorText, uint64(len(s))), s...)
}

// appendCBORExtrasLookahead appends the extras field up to its lookahead tokens: ex's
// value, preceded when lookahead > 0 by the head of the [value, *tokens] array whose
// tokens the chain appends per block.
func appendCBORExtrasLookahead(b []byte, ex blockExtras, lookahead int) []byte {
	if lookahead > 0 {
		b = appendCBORHead(b, cborMajorArray, uint64(1+lookahead))
	}
	return appendCBORExtras(b, ex)
}

// appendCBORVLLMBlock appends cbor2.dumps((parent, tuple(tokens), extras), canonical=True),
// extras being ex's value or, with lookahead tokens, (value, *look). It is the
// straightforward reference; Chain inlines the same layout with precomputed extras.
func appendCBORVLLMBlock(b []byte, parent []byte, tokens []int32, ex blockExtras, look []int32) []byte {
	b = append(b, cborMajorArray|3)
	b = appendCBORHead(b, cborMajorBytes, uint64(len(parent)))
	b = append(b, parent...)
	b = appendCBORHead(b, cborMajorArray, uint64(len(tokens)))
	for _, t := range tokens {
		b = appendCBORInt(b, t)
	}
	b = appendCBORExtrasLookahead(b, ex, len(look))
	for _, t := range look {
		b = appendCBORInt(b, t)
	}
	return b
}
