package kvevent_test

import (
	"encoding/hex"
	"testing"

	"github.com/conductor-go/conductor/wire/internal/testmap"
	"github.com/tinylib/msgp/msgp"
)

// Payload builders shared by the event tests, fuzz seeds and benchmarks. Everything
// is built with msgp's Append* functions so the bytes are what a msgpack encoder
// writes, not what this package's reader expects.

// evKV is one map entry; v is an already-encoded msgpack value.
type evKV struct {
	k string
	v []byte
}

// Key is the entry's key (testmap.Entry).
func (e evKV) Key() string { return e.k }

// evMap is an ordered map, so tests control key order and can repeat keys.
type evMap []evKV

// with returns a copy whose key k holds v (replaced in place, or appended).
func (m evMap) with(k string, v []byte) evMap { return testmap.With(m, evKV{k, v}) }

// without returns a copy without key k.
func (m evMap) without(k string) evMap { return testmap.Without(m, k) }

// plus appends an entry even if the key exists (for duplicate-key tests).
func (m evMap) plus(k string, v []byte) evMap { return testmap.Plus(m, evKV{k, v}) }

func (m evMap) enc() []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(m)))
	for _, kv := range m {
		b = msgp.AppendString(b, kv.k)
		b = append(b, kv.v...)
	}
	return b
}

func evU(v uint64) []byte    { return msgp.AppendUint64(nil, v) }
func evI(v int64) []byte     { return msgp.AppendInt64(nil, v) }
func evS(s string) []byte    { return msgp.AppendString(nil, s) }
func evBin(b []byte) []byte  { return msgp.AppendBytes(nil, b) }
func evF64(f float64) []byte { return msgp.AppendFloat64(nil, f) }
func evF32(f float32) []byte { return msgp.AppendFloat32(nil, f) }
func evBool(v bool) []byte   { return msgp.AppendBool(nil, v) }
func evNil() []byte          { return msgp.AppendNil(nil) }

func evArr(items ...[]byte) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func evUints(vs ...uint64) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(len(vs)))
	for _, v := range vs {
		b = msgp.AppendUint64(b, v)
	}
	return b
}

func evTokens(from, to int) []byte {
	b := msgp.AppendArrayHeader(nil, uint32(to-from))
	for t := from; t < to; t++ {
		b = msgp.AppendUint64(b, uint64(t))
	}
	return b
}

// evBatch is the [ts, [events], dp_rank] envelope.
func evBatch(ts, dp []byte, events ...[]byte) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = append(b, ts...)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, e := range events {
		b = append(b, e...)
	}
	return append(b, dp...)
}

func evHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex: %v", err)
	}
	return b
}

const evTS = 1757500000.25

// evVLLMStored is a current (post #42892) vLLM BlockStored with every required key.
func evVLLMStored() evMap {
	return evMap{
		{"type", evS("BlockStored")},
		{"block_hashes", evUints(11, 12)},
		{"parent_block_hash", evNil()},
		{"token_ids", evTokens(1, 33)},
		{"block_size", evU(16)},
		{"lora_id", evNil()},
		{"medium", evS("GPU")},
		{"lora_name", evNil()},
	}
}

func evVLLMRemoved() evMap {
	return evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evUints(11)}, {"medium", evS("GPU")}}
}

func evCleared() evMap { return evMap{{"type", evS("AllBlocksCleared")}} }

// evSGLangStored is an SGLang map-form BlockStored (defaults omitted).
func evSGLangStored() evMap {
	return evMap{
		{"type", evS("BlockStored")},
		{"block_hashes", evArr(evI(-685567553150498463))},
		{"parent_block_hash", evNil()},
		{"token_ids", evTokens(11, 15)},
		{"block_size", evU(4)},
		{"lora_id", evNil()},
	}
}

const evMooncakeTS = 1757500000250

const evVLLMKey = "Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325"

// evMooncakeCommon holds the keys every Mooncake master event carries.
func evMooncakeCommon(eventType string) evMap {
	return evMap{
		{"event_id", evU(7)},
		{"timestamp", evU(evMooncakeTS)},
		{"event_type", evS(eventType)},
		{"model_name", evS("Qwen3-8B")},
		{"block_size", evU(16)},
		{"additional_salt", evNil()},
		{"lora_name", evNil()},
		{"tenant_id", evS("tenant-a")},
		{"backend_id", evS("pool-a")},
		{"medium", evS("cpu")},
		{"dp_rank", evU(0)},
	}
}

// evMooncakeObject is evMooncakeCommon with the object fields every stored and removed
// event carries.
func evMooncakeObject(eventType string) evMap {
	return append(evMooncakeCommon(eventType),
		evKV{"group_id", evNil()},
		evKV{"seq_hashes", evUints()},
		evKV{"base_block_idx", evNil()},
		evKV{"object_key", evS(evVLLMKey)},
	)
}

func evMooncakeRemoved() evMap { return evMooncakeObject("removed") }

func evMooncakeStored() evMap {
	return append(evMooncakeObject("stored"), evKV{"parent_hash", evNil()}, evKV{"token_ids", evNil()})
}

// evWidths encodes v (0 <= v < 128) in every msgpack integer width.
func evWidths(v byte) [][]byte {
	out := [][]byte{{v}} // positive fixint
	for _, code := range []byte{0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3} {
		width := 1 << (code & 3) // uint8..uint64, then int8..int64: 1, 2, 4, 8 bytes
		out = append(out, append(append([]byte{code}, make([]byte, width-1)...), v))
	}
	return out
}
