package kvevent

import (
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
)

// EventType is what a decoded event asks the index to do. Mooncake's `stored`,
// `removed` and `cleared` map onto the same three values as the engines' tags.
type EventType uint8

// The event types.
const (
	// EventInvalid marks an event whose Err is set.
	EventInvalid EventType = iota
	// EventBlockStored is vLLM/SGLang `BlockStored` or Mooncake `stored`.
	EventBlockStored
	// EventBlockRemoved is vLLM/SGLang `BlockRemoved` or Mooncake `removed`.
	EventBlockRemoved
	// EventAllBlocksCleared is vLLM/SGLang `AllBlocksCleared` or Mooncake `cleared`.
	EventAllBlocksCleared
)

// String returns the engine tag of the type.
func (t EventType) String() string {
	switch t {
	case EventBlockStored:
		return "BlockStored"
	case EventBlockRemoved:
		return "BlockRemoved"
	case EventAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Invalid"
}

// NullInt is an integer field that may be nil or absent on the wire; the handler's
// rules differ between "absent/nil" and "zero", so the distinction is kept.
type NullInt struct {
	Int   int64
	Valid bool
}

// NullUint is a hash field that may be nil or absent (parent hashes).
type NullUint struct {
	Uint  uint64
	Valid bool
}

// NullBytes is a string field that may be nil or absent. Bytes is a sub-slice of the
// payload; an empty but present string has Valid set and len(Bytes) == 0.
type NullBytes struct {
	Bytes []byte
	Valid bool
}

// Structural failures: the payload is not one well-formed msgpack value, so nothing
// after the failure point can be located and the whole message is dropped. They are the
// shared reader's sentinels, so errors.Is works on either name.
var (
	// ErrPayloadTruncated means a msgpack value ran past the end of the payload, or a
	// container header claims more elements than the remaining bytes could hold.
	ErrPayloadTruncated = msgpack.ErrTruncated
	// ErrPayloadInvalid means the payload uses the msgpack reserved byte 0xc1.
	ErrPayloadInvalid = msgpack.ErrInvalid
)

// Envelope-level failures. Decode wraps them with the publisher and position; the
// whole message is dropped and, per the reference, the source is not marked stale.
var (
	// ErrPayloadEmpty means the third ZMQ frame had no bytes.
	ErrPayloadEmpty = errors.New("empty payload")
	// ErrPayloadTrailing means bytes follow the one msgpack value.
	ErrPayloadTrailing = errors.New("trailing bytes after msgpack value")
	// ErrEnvelopeShape means the batch is not [ts, [events], dp_rank] (or, for vLLM,
	// the {ts, events, data_parallel_rank} map form).
	ErrEnvelopeShape = errors.New("malformed batch envelope")
	// ErrTimestamp means the batch ts has the wrong type for the publisher (float for
	// engines, non-negative integer ms for Mooncake) or is not finite.
	ErrTimestamp = errors.New("invalid batch timestamp")
	// ErrDPRank means the batch dp_rank is neither nil nor a non-negative integer.
	ErrDPRank = errors.New("invalid batch dp_rank")
	// ErrTooManyEvents means the events array is longer than Decoder.MaxEvents.
	ErrTooManyEvents = errors.New("too many events in batch")
	// ErrUnknownPublisher means Decode was called with an undefined publisher.Kind.
	ErrUnknownPublisher = errors.New("unknown publisher kind")
)

// Event-level failures, found in EventError.Err. Only that event is skipped.
var (
	// ErrEventNotMap means the event is neither a msgpack map nor, for the engines, a
	// tagged positional array (Mooncake events must be maps).
	ErrEventNotMap = errors.New("event is not a map")
	// ErrEventKeyNotString means an event map key is not a str.
	ErrEventKeyNotString = errors.New("map key is not a string")
	// ErrEventDuplicateKey means a recognised key appears twice.
	ErrEventDuplicateKey = errors.New("duplicate key")
	// ErrEventMissingKey means a key required by the event's tag is absent.
	ErrEventMissingKey = errors.New("missing required key")
	// ErrEventUnexpectedKey means a recognised key that the event's tag forbids.
	ErrEventUnexpectedKey = errors.New("key not allowed for this event type")
	// ErrEventUnknownTag means the `type` / `event_type` value is not a known tag.
	ErrEventUnknownTag = errors.New("unknown event tag")
	// ErrEventWrongType means a recognised key holds a value of the wrong msgpack type
	// (the shared reader's msgpack.ErrWrongType).
	ErrEventWrongType = msgpack.ErrWrongType
	// ErrEventOutOfRange means a number is outside the field's range (negative rank,
	// token outside int32, short binary hash, non-positive SGLang block_size...); the
	// shared reader's msgpack.ErrOutOfRange.
	ErrEventOutOfRange = msgpack.ErrOutOfRange
	// ErrEventMismatch means two fields that must agree do not (Mooncake timestamp vs
	// batch ts, legacy aliases, extra_keys length vs block_hashes).
	ErrEventMismatch = errors.New("fields disagree")
)

// EventError says why one event was rejected. Decode keeps these in a reused buffer,
// so an *EventError is valid only until the next Decode, like the rest of the batch.
type EventError struct {
	// Index is the event's position in the batch.
	Index int
	// Field is the wire key at fault, or "" when the event as a whole is.
	Field string
	// Err is one of the ErrEvent* sentinels.
	Err error
}

// Error formats lazily: the decoder never builds strings for rejected events, the
// handler's logger does, and only when it logs.
func (e *EventError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("event %d: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("event %d: %s: %v", e.Index, e.Field, e.Err)
}

// Unwrap exposes the sentinel for errors.Is.
func (e *EventError) Unwrap() error { return e.Err }

// Batch is one decoded ZMQ payload. It and everything it points to belong to the
// Decoder and are valid until its next Decode.
type Batch struct {
	// TS is the batch timestamp in seconds (Mooncake: TSMillis/1000).
	TS float64
	// TSMillis is Mooncake's exact integer millisecond timestamp; 0 for engines.
	TSMillis int64
	// DPRank is the batch data-parallel rank when HasDPRank (it was not nil).
	DPRank int64
	// HasDPRank reports a non-nil batch dp_rank.
	HasDPRank bool
	// Events are in wire order; invalid ones are kept (Err set) so the handler can
	// log them with their index and still apply the rest in order.
	Events []Event
	// MapEvents and ArrayEvents count the batch's events by encoding: tagged maps
	// (current engines) and tagged positional arrays (vLLM up to 0.23, SGLang up to
	// 0.5.19), valid or not. Other shapes count in neither.
	MapEvents, ArrayEvents int
}

// Event is one decoded event. When Err is non-nil, Type is EventInvalid and every
// other field is zero. Slices point into the payload or into Decoder buffers.
// Fields a publisher does not send stay zero.
type Event struct {
	// Type is the event's tag.
	Type EventType
	// Err, when non-nil, is an *EventError saying why the event is invalid.
	Err error

	// BlockHashes (vLLM, SGLang) are the block ids as the index keys them: vLLM uint
	// as is, vLLM bin as its last 8 bytes big-endian, SGLang int64 as its bit pattern.
	BlockHashes []uint64
	// ParentBlockHash is vLLM/SGLang parent_block_hash or Mooncake parent_hash, in
	// the same projection as BlockHashes (a bin shorter than 8 bytes is read whole).
	ParentBlockHash NullUint
	// TokenIDs are the event's token ids; SGLang bigram pairs [a,b] are flattened
	// into a,b (see TokenPairs). Empty when HasTokenIDs is false.
	TokenIDs []int32
	// HasTokenIDs reports token_ids present and not nil.
	HasTokenIDs bool
	// TokenPairs reports that SGLang sent at least one [a,b] bigram pair.
	TokenPairs bool
	// BlockSize is block_size (always Valid on engine BlockStored).
	BlockSize NullInt
	// LoraID is lora_id.
	LoraID NullInt
	// Medium is medium, as sent (compare with MediumIs).
	Medium NullBytes
	// LoraName is lora_name (vLLM; SGLang >= 0.5.22 maps; Mooncake).
	LoraName NullBytes
	// ExtraKeys is the raw msgpack array of vLLM extra_keys (nil when absent or nil);
	// the decoder has checked one nil-or-array entry per block hash.
	ExtraKeys []byte
	// LookaheadTokenIDs are vLLM lookahead_token_ids (vLLM >= 0.33 with lookahead
	// hashing), flattened: LookaheadPerBlock ids for each block hash, in order. Empty
	// (and LookaheadPerBlock 0) when HasLookahead is false; nil with SkipTokenIDs.
	LookaheadTokenIDs []int32
	// LookaheadPerBlock is the number of lookahead ids per block (every list has it:
	// the decoder refuses lists of different lengths).
	LookaheadPerBlock int
	// HasLookahead reports lookahead_token_ids present and not nil; the decoder has
	// checked one list per block hash.
	HasLookahead bool
	// GroupIdx is vLLM group_idx.
	GroupIdx NullInt
	// KVCacheSpecKind is vLLM kv_cache_spec_kind (check with SupportedSpecKind).
	KVCacheSpecKind NullBytes
	// KVCacheSpecSlidingWindow is vLLM kv_cache_spec_sliding_window.
	KVCacheSpecSlidingWindow NullInt
	// CacheSalt is SGLang cache_salt (a named field, or the metadata map of a
	// positional BlockStoredWithMetadata).
	CacheSalt NullBytes
	// SessionID is SGLang session_id (attribution only).
	SessionID NullBytes

	// EventID is Mooncake event_id (for logs; events are not reordered by it).
	EventID uint64
	// Timestamp is Mooncake timestamp in ms; the decoder checked it equals the batch's.
	Timestamp int64
	// ModelName is Mooncake model_name.
	ModelName NullBytes
	// AdditionalSalt is Mooncake additional_salt.
	AdditionalSalt NullBytes
	// TenantID is Mooncake tenant_id (always a string, possibly empty).
	TenantID []byte
	// BackendID is Mooncake backend_id (always a string, possibly empty).
	BackendID []byte
	// DPRank is Mooncake's per-event dp_rank (never nil, >= 0).
	DPRank int64
	// GroupID is Mooncake group_id (stored/removed).
	GroupID NullBytes
	// SeqHashes is Mooncake seq_hashes (stored/removed; the key is required, an
	// empty array may decode as nil). A legacy block_hashes key has been checked
	// equal to it.
	SeqHashes []uint64
	// BaseBlockIdx is Mooncake base_block_idx.
	BaseBlockIdx NullInt
	// ObjectKey is Mooncake object_key.
	ObjectKey NullBytes
	// ConnectorBlockHash is Mooncake connector_block_hash (see ParseConnectorBlockHash).
	ConnectorBlockHash NullBytes
	// CachePrefix is Mooncake cache_prefix.
	CachePrefix NullBytes
	// TPRank is Mooncake tp_rank.
	TPRank NullInt
	// HeadOrTPRank is Mooncake head_or_tp_rank.
	HeadOrTPRank NullInt
	// PCPRank is Mooncake pcp_rank.
	PCPRank NullInt
	// DCPRank is Mooncake dcp_rank.
	DCPRank NullInt
	// PPRank is Mooncake pp_rank.
	PPRank NullInt
	// LayerID is Mooncake layer_id.
	LayerID NullInt
}

// MediumIs reports whether medium equals want, ignoring ASCII case (engines send
// "GPU", the handler rules are written in lower case). It allocates nothing.
func MediumIs(medium []byte, want string) bool {
	if len(medium) != len(want) {
		return false
	}
	for i := 0; i < len(medium); i++ {
		a, b := medium[i], want[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// SupportedSpecKind reports whether a vLLM kv_cache_spec_kind is one the index can
// serve: absent/nil, full_attention, mla_attention or sink_full_attention. Sliding
// window and other per-layer kinds hash differently and must not be indexed.
func SupportedSpecKind(kind NullBytes) bool {
	if !kind.Valid {
		return true
	}
	switch string(kind.Bytes) {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}
