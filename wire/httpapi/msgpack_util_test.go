package httpapi_test

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/conductor-go/conductor/wire/internal/testmap"
	"github.com/tinylib/msgp/msgp"
)

// Test-side msgpack builder. Values are encoded by Go type so a table can say exactly
// which msgpack type it sends; htRaw carries hand-made bytes (a specific int width,
// malformed input).

type htRaw []byte

// htSigned is a token array encoded with signed ints only ([]int32 encodes like Python).
type htSigned []int32

// htKV is one entry of an htMap; keys are encoded like values (so a test can send a
// key that is not a string).
type htKV struct {
	k any
	v any
}

// Key is the entry's key (testmap.Entry).
func (e htKV) Key() any { return e.k }

// htMap is an ordered msgpack map; order and duplicates are kept as written.
type htMap []htKV

// with returns a copy with key k set to v (replaced in place, or appended).
func (m htMap) with(k string, v any) htMap { return testmap.With(m, htKV{k, v}) }

// without returns a copy with key k removed.
func (m htMap) without(k string) htMap { return testmap.Without(m, any(k)) }

// plus returns a copy with an extra entry appended, even if the key is already present.
func (m htMap) plus(k, v any) htMap { return testmap.Plus(m, htKV{k, v}) }

func htEnc(v any) []byte { return htAppend(nil, v) }

func htAppend(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return msgp.AppendNil(b)
	case bool:
		return msgp.AppendBool(b, x)
	case string:
		return msgp.AppendString(b, x)
	case int:
		return msgp.AppendInt64(b, int64(x))
	case int64:
		return msgp.AppendInt64(b, x)
	case uint64:
		return msgp.AppendUint64(b, x)
	case float64:
		return msgp.AppendFloat64(b, x)
	case []byte:
		return msgp.AppendBytes(b, x)
	case htRaw:
		return append(b, x...)
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = htAppend(b, e)
		}
		return b
	case []int32:
		// As Python's msgpack (the usual client) writes them: non-negative ints unsigned.
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			if e >= 0 {
				b = msgp.AppendUint64(b, uint64(e))
			} else {
				b = msgp.AppendInt64(b, int64(e))
			}
		}
		return b
	case htSigned:
		// As Go's msgp writes them: every int signed.
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = msgp.AppendInt64(b, int64(e))
		}
		return b
	case htMap:
		b = msgp.AppendMapHeader(b, uint32(len(x)))
		for _, kv := range x {
			b = htAppend(b, kv.k)
			b = htAppend(b, kv.v)
		}
		return b
	}
	panic(fmt.Sprintf("htAppend: unsupported %T", v))
}

// htWidth encodes v with an explicit msgpack integer code (0xcc..0xd3), so tests cover
// every width regardless of what an encoder would choose.
func htWidth(code byte, v int64) htRaw {
	b := []byte{code}
	switch code {
	case 0xcc, 0xd0:
		return append(b, byte(v))
	case 0xcd, 0xd1:
		return binary.BigEndian.AppendUint16(b, uint16(v))
	case 0xce, 0xd2:
		return binary.BigEndian.AppendUint32(b, uint32(v))
	case 0xcf, 0xd3:
		return binary.BigEndian.AppendUint64(b, uint64(v))
	}
	panic("htWidth: not an int code")
}

// htLE packs int32 tokens as the little-endian binary form token_ids accepts.
func htLE(tokens ...int32) []byte { return htLittleEndian(tokens) }

// htLittleEndian packs vs as consecutive little-endian words: the binary form of
// token_ids (int32) and of block_hashes (uint64).
func htLittleEndian[T int32 | uint64](vs []T) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, vs)
	if err != nil {
		panic(err)
	}
	return b
}

const htMaxUint64 = uint64(math.MaxUint64)
