package sim

import (
	"fmt"

	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// ParseKind accepts "vllm" or "sglang" in any case: the engine kinds a simulated rank
// can imitate (which decides the event encoding and which tiers exist).
func ParseKind(s string) (publisher.Kind, error) {
	switch s {
	case "vLLM", "vllm", "VLLM":
		return publisher.VLLM, nil
	case "SGLang", "sglang", "SGLANG":
		return publisher.SGLang, nil
	}
	return 0, fmt.Errorf("engine kind %q: want vllm or sglang", s)
}

// Tier is a cache tier of one rank.
type Tier uint8

// Tiers, fastest first. Only SGLang ranks have CPU and disk tiers (HiCache).
const (
	TierDevice Tier = iota
	TierCPU
	TierDisk
	numTiers
)

// String returns the tier's event medium (SGLang StorageMedium names; vLLM only ever
// uses "GPU").
func (t Tier) String() string {
	switch t {
	case TierDevice:
		return "GPU"
	case TierCPU:
		return "CPU_PINNED"
	case TierDisk:
		return "DISK"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// EventStyle selects which optional vLLM BlockStored fields are written.
type EventStyle uint8

// Event styles.
const (
	// StyleMinimal writes the eight required keys (vLLM between lora_name and extra_keys).
	StyleMinimal EventStyle = iota
	// StyleCurrent adds extra_keys, group_idx and kv_cache_spec_kind, as vLLM after
	// PR #42892 emits them.
	StyleCurrent
)

// BatchEncoder builds one KV-event batch payload, [ts, [event maps], dp_rank], in reused
// buffers: after warm-up it allocates nothing. Events are appended one by one; Finish
// wraps them with the envelope.
type BatchEncoder struct {
	kind      publisher.Kind
	style     EventStyle
	blockSize int
	loraName  string
	body      []byte
	n         int
	out       []byte
}

// NewBatchEncoder returns an encoder for one rank's events. loraName "" is written as nil.
func NewBatchEncoder(kind publisher.Kind, style EventStyle, blockSize int, loraName string) *BatchEncoder {
	return &BatchEncoder{kind: kind, style: style, blockSize: blockSize, loraName: loraName}
}

// Len is the number of events appended since the last Finish.
func (e *BatchEncoder) Len() int { return e.n }

// Size is the number of event bytes appended since the last Finish.
func (e *BatchEncoder) Size() int { return len(e.body) }

// appendInt writes v in the smallest msgpack integer form, unsigned when non-negative, as
// msgspec (the engines' encoder) does.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(b, uint64(v))
	}
	return msgp.AppendInt64(b, v)
}

func (e *BatchEncoder) appendHash(b []byte, k uint64) []byte {
	if e.kind == publisher.SGLang {
		return appendInt(b, int64(k))
	}
	return msgp.AppendUint64(b, k)
}

// appendBlocksEvent starts an event map of fields entries of type typ with its
// block_hashes, keys; the caller appends the other fields-2 entries.
func (e *BatchEncoder) appendBlocksEvent(b []byte, fields uint32, typ string, keys []uint64) []byte {
	b = msgp.AppendMapHeader(b, fields)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, typ)
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, uint32(len(keys)))
	for _, k := range keys {
		b = e.appendHash(b, k)
	}
	return b
}

func (e *BatchEncoder) appendLora(b []byte) []byte {
	if e.loraName == "" {
		return msgp.AppendNil(b)
	}
	return msgp.AppendString(b, e.loraName)
}

// Stored appends a BlockStored event for keys (consecutive blocks of one prompt) whose
// tokens are tokens; parent is the key of the block before keys[0], if any. SGLang events
// carry one page each, so for publisher.SGLang call Stored once per key. tokens may be empty for
// tier moves, where the simulator no longer holds the block's tokens.
func (e *BatchEncoder) Stored(keys []uint64, parent uint64, hasParent bool, tokens []int32, tier Tier) {
	b := e.body
	fields := uint32(8)
	if e.kind == publisher.SGLang {
		fields = 7
	} else if e.style == StyleCurrent {
		fields = 11
	}
	b = e.appendBlocksEvent(b, fields, "BlockStored", keys)
	b = msgp.AppendString(b, "parent_block_hash")
	if hasParent {
		b = e.appendHash(b, parent)
	} else {
		b = msgp.AppendNil(b)
	}
	b = msgp.AppendString(b, "token_ids")
	b = msgp.AppendArrayHeader(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = appendInt(b, int64(t))
	}
	b = msgp.AppendString(b, "block_size")
	bs := e.blockSize
	if e.kind == publisher.SGLang && len(tokens) > 0 {
		bs = len(tokens)
	}
	b = appendInt(b, int64(bs))
	b = msgp.AppendString(b, "lora_id")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "medium")
	b = msgp.AppendString(b, tier.String())
	if e.kind == publisher.VLLM {
		b = msgp.AppendString(b, "lora_name")
		b = e.appendLora(b)
		if e.style == StyleCurrent {
			b = msgp.AppendString(b, "extra_keys")
			b = msgp.AppendArrayHeader(b, uint32(len(keys)))
			for range keys {
				if e.loraName == "" {
					b = msgp.AppendNil(b)
				} else {
					b = msgp.AppendArrayHeader(b, 1)
					b = msgp.AppendString(b, e.loraName)
				}
			}
			b = msgp.AppendString(b, "group_idx")
			b = msgp.AppendUint64(b, 0)
			b = msgp.AppendString(b, "kv_cache_spec_kind")
			b = msgp.AppendString(b, "full_attention")
		}
	}
	e.body = b
	e.n++
}

// Removed appends a BlockRemoved event for keys in tier.
func (e *BatchEncoder) Removed(keys []uint64, tier Tier) {
	b := e.body
	fields := uint32(3)
	if e.kind == publisher.VLLM && e.style == StyleCurrent {
		fields = 4
	}
	b = e.appendBlocksEvent(b, fields, "BlockRemoved", keys)
	b = msgp.AppendString(b, "medium")
	b = msgp.AppendString(b, tier.String())
	if fields == 4 {
		b = msgp.AppendString(b, "group_idx")
		b = msgp.AppendUint64(b, 0)
	}
	e.body = b
	e.n++
}

// Cleared appends an AllBlocksCleared event.
func (e *BatchEncoder) Cleared() {
	b := msgp.AppendMapHeader(e.body, 1)
	b = msgp.AppendString(b, "type")
	e.body = msgp.AppendString(b, "AllBlocksCleared")
	e.n++
}

// Finish returns the batch payload [ts, events, dpRank] and starts a new batch. The
// result is valid until the next Finish.
func (e *BatchEncoder) Finish(ts float64, dpRank int) []byte {
	b := msgp.AppendArrayHeader(e.out[:0], 3)
	b = msgp.AppendFloat64(b, ts)
	b = msgp.AppendArrayHeader(b, uint32(e.n))
	b = append(b, e.body...)
	b = appendInt(b, int64(dpRank))
	e.out = b
	e.body = e.body[:0]
	e.n = 0
	return b
}
