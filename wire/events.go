package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Publisher is the kind of KV-event stream a subscription was registered as. The
// registration, never the topic or the payload, picks the decoder (reference notes
// §5.1), so the caller passes it with every payload.
type Publisher uint8

// The publisher kinds accepted by Decoder.Decode.
const (
	// PublisherVLLM is a vLLM engine: float ts, tagged-map events with uint or bin hashes.
	PublisherVLLM Publisher = iota + 1
	// PublisherSGLang is an SGLang engine: float ts, tagged-map events with int64 hashes.
	PublisherSGLang
	// PublisherMooncake is the Mooncake Store master: integer ms ts, `event_type` maps.
	PublisherMooncake
)

// String names the publisher as the registration API spells its `type`.
func (p Publisher) String() string {
	switch p {
	case PublisherVLLM:
		return "vLLM"
	case PublisherSGLang:
		return "SGLang"
	case PublisherMooncake:
		return "Mooncake"
	}
	return fmt.Sprintf("Publisher(%d)", uint8(p))
}

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
	// ErrUnknownPublisher means Decode was called with an undefined Publisher.
	ErrUnknownPublisher = errors.New("unknown publisher kind")
)

// Event-level failures, found in EventError.Err. Only that event is skipped.
var (
	// ErrEventNotMap means the event is not a msgpack map (legacy array events included).
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
	// ErrEventWrongType means a recognised key holds a value of the wrong msgpack type.
	ErrEventWrongType = errors.New("wrong msgpack type")
	// ErrEventOutOfRange means a number is outside the field's range (negative rank,
	// token outside int32, short binary hash, non-positive SGLang block_size...).
	ErrEventOutOfRange = errors.New("value out of range")
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
	// LoraName is lora_name.
	LoraName NullBytes
	// ExtraKeys is the raw msgpack array of vLLM extra_keys (nil when absent or nil);
	// the decoder has checked one nil-or-array entry per block hash.
	ExtraKeys []byte
	// GroupIdx is vLLM group_idx.
	GroupIdx NullInt
	// KVCacheSpecKind is vLLM kv_cache_spec_kind (check with SupportedSpecKind).
	KVCacheSpecKind NullBytes
	// KVCacheSpecSlidingWindow is vLLM kv_cache_spec_sliding_window.
	KVCacheSpecSlidingWindow NullInt
	// CacheSalt is SGLang cache_salt.
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

// DefaultMaxEvents bounds a batch when Decoder.MaxEvents is zero. Every event costs
// a reused Event slot, so the cap is what bounds memory for a payload made of
// one-byte events; real batches hold one scheduler step (Mooncake: at most 64).
const DefaultMaxEvents = 1 << 16

// Decoder decodes KV-event payloads. Use one per subscriber goroutine (it is not safe
// for concurrent use): after warm-up, Decode allocates nothing, because events, hash
// and token slices live in buffers it reuses. The zero value is ready to use.
type Decoder struct {
	// MaxEvents caps the events per batch; 0 means DefaultMaxEvents.
	MaxEvents int

	batch  Batch
	events []Event
	hashes []uint64
	tokens []int32
	errs   []EventError
}

// Decode decodes one payload (the third ZMQ frame) from a publisher of the given
// kind. A non-nil error is an envelope failure: nothing in the message may be
// applied. Otherwise event failures are reported per event in Event.Err. The
// returned batch and its slices (including sub-slices of payload) are valid until
// the next Decode and as long as payload is not modified.
func (d *Decoder) Decode(kind Publisher, payload []byte) (*Batch, error) {
	if kind < PublisherVLLM || kind > PublisherMooncake {
		return nil, fmt.Errorf("decode batch: %w: %d", ErrUnknownPublisher, uint8(kind))
	}
	if len(payload) == 0 {
		return nil, fmt.Errorf("decode %s batch: %w", kind, ErrPayloadEmpty)
	}
	d.batch = Batch{}
	d.events = d.events[:0]
	d.hashes = d.hashes[:0]
	d.tokens = d.tokens[:0]
	d.errs = d.errs[:0]
	r := evReader{buf: payload}
	var err error
	if kind == PublisherVLLM && evIsMap(payload[0]) {
		err = d.decodeMapEnvelope(&r)
	} else {
		err = d.decodeArrayEnvelope(kind, &r)
	}
	if err == nil && r.pos != len(payload) {
		err = fmt.Errorf("%w: %d bytes", ErrPayloadTrailing, len(payload)-r.pos)
	}
	if err != nil {
		d.events = d.events[:0]
		return nil, fmt.Errorf("decode %s batch: %w", kind, err)
	}
	d.batch.Events = d.events
	return &d.batch, nil
}

// evEnvErr wraps an envelope failure: structural errors pass through unchanged so
// callers can tell truncation from a wrong shape.
func evEnvErr(what string, sentinel, err error) error {
	if errors.Is(err, ErrPayloadTruncated) || errors.Is(err, ErrPayloadInvalid) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err == nil {
		return fmt.Errorf("%s: %w", what, sentinel)
	}
	return fmt.Errorf("%s: %w: %w", what, sentinel, err)
}

func (d *Decoder) decodeArrayEnvelope(kind Publisher, r *evReader) error {
	n, err := r.readArrayHeader()
	if err != nil {
		return evEnvErr("envelope", ErrEnvelopeShape, err)
	}
	if n != 3 {
		return fmt.Errorf("envelope: %w: %d elements, want 3", ErrEnvelopeShape, n)
	}
	if err := d.decodeTS(kind, r); err != nil {
		return err
	}
	if err := d.decodeEvents(kind, r); err != nil {
		return err
	}
	return d.decodeDPRank(r)
}

// decodeMapEnvelope accepts the {ts, events, data_parallel_rank} form that one vLLM
// revision produced when EventBatch lost array_like (engine-formats §A2).
func (d *Decoder) decodeMapEnvelope(r *evReader) error {
	n, err := r.readMapHeader()
	if err != nil {
		return evEnvErr("envelope", ErrEnvelopeShape, err)
	}
	var seenTS, seenEvents, seenDP bool
	for i := 0; i < n; i++ {
		key, err := r.readStr()
		if err != nil {
			return evEnvErr("envelope key", ErrEnvelopeShape, err)
		}
		switch string(key) {
		case "ts":
			if seenTS {
				return fmt.Errorf("envelope: %w: duplicate ts", ErrEnvelopeShape)
			}
			seenTS = true
			if err := d.decodeTS(PublisherVLLM, r); err != nil {
				return err
			}
		case "events":
			if seenEvents {
				return fmt.Errorf("envelope: %w: duplicate events", ErrEnvelopeShape)
			}
			seenEvents = true
			if err := d.decodeEvents(PublisherVLLM, r); err != nil {
				return err
			}
		case "data_parallel_rank":
			if seenDP {
				return fmt.Errorf("envelope: %w: duplicate data_parallel_rank", ErrEnvelopeShape)
			}
			seenDP = true
			if err := d.decodeDPRank(r); err != nil {
				return err
			}
		default:
			if err := r.skip(); err != nil {
				return evEnvErr("envelope", ErrEnvelopeShape, err)
			}
		}
	}
	if !seenTS || !seenEvents {
		return fmt.Errorf("envelope: %w: map form needs ts and events", ErrEnvelopeShape)
	}
	return nil
}

func (d *Decoder) decodeTS(kind Publisher, r *evReader) error {
	if kind == PublisherMooncake {
		v, err := r.readInt64()
		if err != nil {
			return evEnvErr("timestamp", ErrTimestamp, err)
		}
		if v < 0 {
			return fmt.Errorf("timestamp: %w: negative", ErrTimestamp)
		}
		d.batch.TSMillis = v
		d.batch.TS = float64(v) / 1000
		return nil
	}
	f, err := r.readFloat()
	if err != nil {
		return evEnvErr("timestamp", ErrTimestamp, err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("timestamp: %w: not finite", ErrTimestamp)
	}
	d.batch.TS = f
	return nil
}

func (d *Decoder) decodeDPRank(r *evReader) error {
	if r.readNil() {
		d.batch.HasDPRank = false
		return nil
	}
	v, err := r.readInt64()
	if err != nil {
		return evEnvErr("dp_rank", ErrDPRank, err)
	}
	if v < 0 {
		return fmt.Errorf("dp_rank: %w: negative", ErrDPRank)
	}
	d.batch.DPRank, d.batch.HasDPRank = v, true
	return nil
}

func (d *Decoder) decodeEvents(kind Publisher, r *evReader) error {
	n, err := r.readArrayHeader()
	if err != nil {
		return evEnvErr("events", ErrEnvelopeShape, err)
	}
	limit := d.MaxEvents
	if limit <= 0 {
		limit = DefaultMaxEvents
	}
	if len(d.events)+n > limit {
		return fmt.Errorf("events: %w: %d > %d", ErrTooManyEvents, len(d.events)+n, limit)
	}
	for i := 0; i < n; i++ {
		idx := len(d.events)
		if idx < cap(d.events) {
			d.events = d.events[:idx+1]
			d.events[idx] = Event{}
		} else {
			d.events = append(d.events, Event{})
		}
		if err := d.decodeEvent(kind, r, idx, &d.events[idx]); err != nil {
			return fmt.Errorf("event %d: %w", idx, err)
		}
	}
	return nil
}

// evField identifies a recognised event key across all publishers; recognised-key
// sets are bitmasks over it.
type evField uint8

const (
	efType evField = iota
	efBlockHashes
	efParentBlockHash
	efTokenIDs
	efBlockSize
	efLoraID
	efMedium
	efLoraName
	efExtraKeys
	efGroupIdx
	efSpecKind
	efSlidingWindow
	efCacheSalt
	efSessionID
	efEventID
	efTimestamp
	efEventType
	efModelName
	efAdditionalSalt
	efTenantID
	efBackendID
	efDPRank
	efGroupID
	efObjectKey
	efConnectorBlockHash
	efCachePrefix
	efTPRank
	efHeadOrTPRank
	efPCPRank
	efDCPRank
	efPPRank
	efLayerID
	efSeqHashes
	efBaseBlockIdx
	efParentHash
	numEvFields
	efUnknown evField = 255
)

// evFieldNames are the wire keys, also used as EventError.Field (static strings, so
// recording an error allocates nothing).
var evFieldNames = [numEvFields]string{
	efType: "type", efBlockHashes: "block_hashes", efParentBlockHash: "parent_block_hash",
	efTokenIDs: "token_ids", efBlockSize: "block_size", efLoraID: "lora_id",
	efMedium: "medium", efLoraName: "lora_name", efExtraKeys: "extra_keys",
	efGroupIdx: "group_idx", efSpecKind: "kv_cache_spec_kind",
	efSlidingWindow: "kv_cache_spec_sliding_window", efCacheSalt: "cache_salt",
	efSessionID: "session_id", efEventID: "event_id", efTimestamp: "timestamp",
	efEventType: "event_type", efModelName: "model_name", efAdditionalSalt: "additional_salt",
	efTenantID: "tenant_id", efBackendID: "backend_id", efDPRank: "dp_rank",
	efGroupID: "group_id", efObjectKey: "object_key",
	efConnectorBlockHash: "connector_block_hash", efCachePrefix: "cache_prefix",
	efTPRank: "tp_rank", efHeadOrTPRank: "head_or_tp_rank", efPCPRank: "pcp_rank",
	efDCPRank: "dcp_rank", efPPRank: "pp_rank", efLayerID: "layer_id",
	efSeqHashes: "seq_hashes", efBaseBlockIdx: "base_block_idx", efParentHash: "parent_hash",
}

type evFieldSet uint64

func evBit(f evField) evFieldSet { return 1 << f }

// Recognised-key sets per publisher and tag (reference notes §5.2–§5.4).
const (
	vllmStoredReq = evFieldSet(1<<efType | 1<<efBlockHashes | 1<<efParentBlockHash |
		1<<efTokenIDs | 1<<efBlockSize | 1<<efLoraID | 1<<efMedium | 1<<efLoraName)
	vllmStoredAllowed  = vllmStoredReq | 1<<efExtraKeys | 1<<efGroupIdx | 1<<efSpecKind | 1<<efSlidingWindow
	vllmRemovedReq     = evFieldSet(1<<efType | 1<<efBlockHashes | 1<<efMedium)
	vllmRemovedAllowed = vllmRemovedReq | 1<<efGroupIdx

	sglStoredReq = evFieldSet(1<<efType | 1<<efBlockHashes | 1<<efParentBlockHash |
		1<<efTokenIDs | 1<<efBlockSize | 1<<efLoraID)
	sglStoredAllowed  = sglStoredReq | 1<<efMedium | 1<<efCacheSalt | 1<<efSessionID
	sglRemovedReq     = evFieldSet(1<<efType | 1<<efBlockHashes)
	sglRemovedAllowed = sglRemovedReq | 1<<efMedium

	evClearedSet = evFieldSet(1 << efType)

	mcCommonReq = evFieldSet(1<<efEventID | 1<<efTimestamp | 1<<efEventType | 1<<efModelName |
		1<<efBlockSize | 1<<efAdditionalSalt | 1<<efLoraName | 1<<efTenantID | 1<<efBackendID |
		1<<efMedium | 1<<efDPRank)
	mcCommonAllowed = mcCommonReq | 1<<efType
	mcObjectReq     = evFieldSet(1<<efGroupID | 1<<efSeqHashes | 1<<efBaseBlockIdx)
	mcObjectOpt     = evFieldSet(1<<efObjectKey | 1<<efConnectorBlockHash | 1<<efCachePrefix |
		1<<efTPRank | 1<<efHeadOrTPRank | 1<<efPCPRank | 1<<efDCPRank | 1<<efPPRank |
		1<<efLayerID | 1<<efBlockHashes)
	mcRemovedReq     = mcCommonReq | mcObjectReq
	mcRemovedAllowed = mcCommonAllowed | mcObjectReq | mcObjectOpt
	mcStoredReq      = mcRemovedReq | 1<<efParentHash | 1<<efTokenIDs
	mcStoredAllowed  = mcRemovedAllowed | 1<<efParentHash | 1<<efTokenIDs | 1<<efParentBlockHash
)

func evLookupVLLM(k []byte) evField {
	switch string(k) {
	case "type":
		return efType
	case "block_hashes":
		return efBlockHashes
	case "parent_block_hash":
		return efParentBlockHash
	case "token_ids":
		return efTokenIDs
	case "block_size":
		return efBlockSize
	case "lora_id":
		return efLoraID
	case "medium":
		return efMedium
	case "lora_name":
		return efLoraName
	case "extra_keys":
		return efExtraKeys
	case "group_idx":
		return efGroupIdx
	case "kv_cache_spec_kind":
		return efSpecKind
	case "kv_cache_spec_sliding_window":
		return efSlidingWindow
	}
	return efUnknown
}

func evLookupSGLang(k []byte) evField {
	switch string(k) {
	case "type":
		return efType
	case "block_hashes":
		return efBlockHashes
	case "parent_block_hash":
		return efParentBlockHash
	case "token_ids":
		return efTokenIDs
	case "block_size":
		return efBlockSize
	case "lora_id":
		return efLoraID
	case "medium":
		return efMedium
	case "cache_salt":
		return efCacheSalt
	case "session_id":
		return efSessionID
	}
	return efUnknown
}

func evLookupMooncake(k []byte) evField {
	switch string(k) {
	case "event_id":
		return efEventID
	case "timestamp":
		return efTimestamp
	case "event_type":
		return efEventType
	case "type":
		return efType
	case "model_name":
		return efModelName
	case "block_size":
		return efBlockSize
	case "additional_salt":
		return efAdditionalSalt
	case "lora_name":
		return efLoraName
	case "tenant_id":
		return efTenantID
	case "backend_id":
		return efBackendID
	case "medium":
		return efMedium
	case "dp_rank":
		return efDPRank
	case "group_id":
		return efGroupID
	case "object_key":
		return efObjectKey
	case "connector_block_hash":
		return efConnectorBlockHash
	case "cache_prefix":
		return efCachePrefix
	case "tp_rank":
		return efTPRank
	case "head_or_tp_rank":
		return efHeadOrTPRank
	case "pcp_rank":
		return efPCPRank
	case "dcp_rank":
		return efDCPRank
	case "pp_rank":
		return efPPRank
	case "layer_id":
		return efLayerID
	case "seq_hashes":
		return efSeqHashes
	case "block_hashes":
		return efBlockHashes
	case "base_block_idx":
		return efBaseBlockIdx
	case "parent_hash":
		return efParentHash
	case "token_ids":
		return efTokenIDs
	case "parent_block_hash":
		return efParentBlockHash
	}
	return efUnknown
}

// evState is per-event scratch that is not part of the result.
type evState struct {
	seen         evFieldSet
	tag          []byte   // type (engines) or event_type (Mooncake)
	legacyTag    []byte   // Mooncake legacy type
	legacyHashes []uint64 // Mooncake legacy block_hashes
	legacyParent NullUint // Mooncake legacy parent_block_hash
	extraKeysN   int
	hasExtraKeys bool
}

// fail records the first error of an event.
func (d *Decoder) fail(ev *Event, idx int, f evField, err error) {
	if ev.Err != nil {
		return
	}
	name := ""
	if f < numEvFields {
		name = evFieldNames[f]
	}
	d.errs = append(d.errs, EventError{Index: idx, Field: name, Err: err})
	ev.Err = &d.errs[len(d.errs)-1]
}

// decodeEvent decodes one element of the events array into ev. It returns an error
// only for structural damage (the rest of the payload cannot be located); anything
// else invalidates just this event, which is then skipped whole.
func (d *Decoder) decodeEvent(kind Publisher, r *evReader, idx int, ev *Event) error {
	hashMark, tokenMark := len(d.hashes), len(d.tokens)
	c, err := r.peek()
	if err != nil {
		return err
	}
	if !evIsMap(c) {
		if err := r.skip(); err != nil {
			return err
		}
		d.fail(ev, idx, efUnknown, ErrEventNotMap)
		*ev = Event{Err: ev.Err}
		return nil
	}
	n, err := r.readMapHeader()
	if err != nil {
		return err
	}
	var st evState
	for i := 0; i < n; i++ {
		if ev.Err != nil {
			if err := r.skip(); err != nil {
				return err
			}
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		key, err := r.readStr()
		if err != nil {
			if !errors.Is(err, ErrEventWrongType) {
				return err
			}
			if err := r.skip(); err != nil {
				return err
			}
			if err := r.skip(); err != nil {
				return err
			}
			d.fail(ev, idx, efUnknown, ErrEventKeyNotString)
			continue
		}
		var f evField
		switch kind {
		case PublisherVLLM:
			f = evLookupVLLM(key)
		case PublisherSGLang:
			f = evLookupSGLang(key)
		default:
			f = evLookupMooncake(key)
		}
		if f == efUnknown {
			if err := r.skip(); err != nil {
				return err
			}
			continue
		}
		if st.seen&evBit(f) != 0 {
			if err := r.skip(); err != nil {
				return err
			}
			d.fail(ev, idx, f, ErrEventDuplicateKey)
			continue
		}
		st.seen |= evBit(f)
		start := r.pos
		if ferr := d.decodeField(kind, r, f, ev, &st); ferr != nil {
			// Rewind and skip: a type error may stop mid-value, and skip is what
			// tells a wrong type (event-local) from a broken payload (fatal).
			r.pos = start
			if err := r.skip(); err != nil {
				return err
			}
			if errors.Is(ferr, ErrPayloadTruncated) || errors.Is(ferr, ErrPayloadInvalid) {
				// skip succeeded, so the value is intact: the reader only refused a
				// header that could not fit. Treat as a type problem.
				ferr = ErrEventWrongType
			}
			d.fail(ev, idx, f, ferr)
		}
	}
	if ev.Err == nil {
		var f evField
		var err error
		if kind == PublisherMooncake {
			f, err = d.checkMooncake(ev, &st)
		} else {
			f, err = evCheckEngine(kind, ev, &st)
		}
		if err != nil {
			d.fail(ev, idx, f, err)
		}
	}
	if ev.Err != nil {
		d.hashes = d.hashes[:hashMark]
		d.tokens = d.tokens[:tokenMark]
		*ev = Event{Err: ev.Err}
	}
	return nil
}

func evFirstField(s evFieldSet) evField {
	for f := evField(0); f < numEvFields; f++ {
		if s&evBit(f) != 0 {
			return f
		}
	}
	return efUnknown
}

func evCheckKeys(seen, req, allowed evFieldSet) (evField, error) {
	if missing := req &^ seen; missing != 0 {
		return evFirstField(missing), ErrEventMissingKey
	}
	if extra := seen &^ allowed; extra != 0 {
		return evFirstField(extra), ErrEventUnexpectedKey
	}
	return efUnknown, nil
}

func evCheckEngine(kind Publisher, ev *Event, st *evState) (evField, error) {
	if st.seen&evBit(efType) == 0 {
		return efType, ErrEventMissingKey
	}
	var req, allowed evFieldSet
	switch string(st.tag) {
	case "BlockStored":
		ev.Type = EventBlockStored
		req, allowed = vllmStoredReq, vllmStoredAllowed
		if kind == PublisherSGLang {
			req, allowed = sglStoredReq, sglStoredAllowed
		}
	case "BlockRemoved":
		ev.Type = EventBlockRemoved
		req, allowed = vllmRemovedReq, vllmRemovedAllowed
		if kind == PublisherSGLang {
			req, allowed = sglRemovedReq, sglRemovedAllowed
		}
	case "AllBlocksCleared":
		ev.Type = EventAllBlocksCleared
		req, allowed = evClearedSet, evClearedSet
	default:
		return efType, ErrEventUnknownTag
	}
	if f, err := evCheckKeys(st.seen, req, allowed); err != nil {
		return f, err
	}
	if ev.Type == EventBlockStored {
		if st.hasExtraKeys && st.extraKeysN != len(ev.BlockHashes) {
			return efExtraKeys, ErrEventMismatch
		}
		if kind == PublisherSGLang && ev.BlockSize.Int <= 0 {
			return efBlockSize, ErrEventOutOfRange
		}
	}
	return efUnknown, nil
}

func (d *Decoder) checkMooncake(ev *Event, st *evState) (evField, error) {
	if st.seen&evBit(efEventType) == 0 {
		return efEventType, ErrEventMissingKey
	}
	var req, allowed evFieldSet
	var legacy string
	switch string(st.tag) {
	case "stored":
		ev.Type, legacy = EventBlockStored, "BlockStored"
		req, allowed = mcStoredReq, mcStoredAllowed
	case "removed":
		ev.Type, legacy = EventBlockRemoved, "BlockRemoved"
		req, allowed = mcRemovedReq, mcRemovedAllowed
	case "cleared":
		ev.Type, legacy = EventAllBlocksCleared, "AllBlocksCleared"
		req, allowed = mcCommonReq, mcCommonAllowed
	default:
		return efEventType, ErrEventUnknownTag
	}
	if f, err := evCheckKeys(st.seen, req, allowed); err != nil {
		return f, err
	}
	if ev.Timestamp != d.batch.TSMillis {
		return efTimestamp, ErrEventMismatch
	}
	if st.seen&evBit(efType) != 0 && string(st.legacyTag) != legacy {
		return efType, ErrEventMismatch
	}
	if st.seen&evBit(efBlockHashes) != 0 && !slices.Equal(st.legacyHashes, ev.SeqHashes) {
		return efBlockHashes, ErrEventMismatch
	}
	if st.seen&evBit(efParentBlockHash) != 0 && st.legacyParent != ev.ParentBlockHash {
		return efParentBlockHash, ErrEventMismatch
	}
	return efUnknown, nil
}

// evHashMode says how one block hash is read.
type evHashMode uint8

const (
	evHashVLLM   evHashMode = iota // uint, or bin >= 8 bytes (last 8 bytes big-endian)
	evHashSGLang                   // int64, kept as its uint64 bit pattern
	evHashUint                     // non-negative integer (Mooncake)
)

func (r *evReader) readHash(mode evHashMode) (uint64, error) {
	switch mode {
	case evHashVLLM:
		if c, err := r.peek(); err == nil && (c == 0xc4 || c == 0xc5 || c == 0xc6) {
			b, err := r.readBin()
			if err != nil {
				return 0, err
			}
			if len(b) < 8 {
				return 0, ErrEventOutOfRange
			}
			return binary.BigEndian.Uint64(b[len(b)-8:]), nil
		}
		return r.readUint64()
	case evHashSGLang:
		// SGLang publishes signed int64; an unsigned value above MaxInt64 cannot
		// come from it and is refused, as upstream does.
		v, err := r.readInt64()
		return uint64(v), err
	default:
		return r.readUint64()
	}
}

// readHashes reads an array of hashes into the hash buffer. The array header was
// checked against the remaining bytes, so growing by n is bounded by the payload.
func (d *Decoder) readHashes(r *evReader, mode evHashMode) ([]uint64, error) {
	n, err := r.readArrayHeader()
	if err != nil {
		return nil, err
	}
	start := len(d.hashes)
	d.hashes = slices.Grow(d.hashes, n)[:start+n]
	dst := d.hashes[start : start+n : start+n]
	for i := range dst {
		h, err := r.readHash(mode)
		if err != nil {
			d.hashes = d.hashes[:start]
			return nil, err
		}
		dst[i] = h
	}
	return dst, nil
}

// readParent reads a nullable parent hash. vLLM bins of any length are accepted (the
// parent is informational); shorter than 8 bytes they are read whole.
func (r *evReader) readParent(mode evHashMode) (NullUint, error) {
	if r.readNil() {
		return NullUint{}, nil
	}
	if mode == evHashVLLM {
		if c, err := r.peek(); err == nil && (c == 0xc4 || c == 0xc5 || c == 0xc6) {
			b, err := r.readBin()
			if err != nil {
				return NullUint{}, err
			}
			if len(b) > 8 {
				b = b[len(b)-8:]
			}
			var v uint64
			for _, x := range b {
				v = v<<8 | uint64(x)
			}
			return NullUint{Uint: v, Valid: true}, nil
		}
	}
	h, err := r.readHash(mode)
	if err != nil {
		return NullUint{}, err
	}
	return NullUint{Uint: h, Valid: true}, nil
}

// readTokens reads nil or an int32 array; with pairs, elements may also be [a,b]
// SGLang bigram tuples, flattened in order.
func (d *Decoder) readTokens(r *evReader, ev *Event, pairs bool) error {
	if r.readNil() {
		return nil
	}
	n, err := r.readArrayHeader()
	if err != nil {
		return err
	}
	start := len(d.tokens)
	// n is bounded by the remaining bytes; a pair takes at least 3 bytes, so 2n
	// also covers flattened pairs.
	want := n
	if pairs {
		want = 2 * n
	}
	toks := slices.Grow(d.tokens, want)
	buf, p := r.buf, r.pos
	for i := 0; i < n; i++ {
		// Fast path: positive fixint and the unsigned widths msgspec writes for
		// vocabulary ids (uint8/16/32). Everything else goes through readInt.
		if p < len(buf) {
			c := buf[p]
			if c <= 0x7f {
				toks = append(toks, int32(c))
				p++
				continue
			}
			if c == 0xcd && p+3 <= len(buf) {
				toks = append(toks, int32(binary.BigEndian.Uint16(buf[p+1:])))
				p += 3
				continue
			}
			if c == 0xce && p+5 <= len(buf) {
				v := binary.BigEndian.Uint32(buf[p+1:])
				if v > math.MaxInt32 {
					r.pos = p
					return ErrEventOutOfRange
				}
				toks = append(toks, int32(v))
				p += 5
				continue
			}
		}
		r.pos = p
		if pairs && p < len(buf) && evIsArray(buf[p]) {
			m, err := r.readArrayHeader()
			if err != nil {
				return err
			}
			if m != 2 {
				return ErrEventWrongType
			}
			for j := 0; j < 2; j++ {
				t, err := evReadToken(r)
				if err != nil {
					return err
				}
				toks = append(toks, t)
			}
			ev.TokenPairs = true
		} else {
			t, err := evReadToken(r)
			if err != nil {
				return err
			}
			toks = append(toks, t)
		}
		p = r.pos
	}
	r.pos = p
	d.tokens = toks
	end := len(toks)
	ev.TokenIDs = toks[start:end:end]
	ev.HasTokenIDs = true
	return nil
}

func evReadToken(r *evReader) (int32, error) {
	v, err := r.readInt64()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, ErrEventOutOfRange
	}
	return int32(v), nil
}

func (r *evReader) readNullInt() (NullInt, error) {
	if r.readNil() {
		return NullInt{}, nil
	}
	v, err := r.readInt64()
	return NullInt{Int: v, Valid: err == nil}, err
}

func (r *evReader) readNullStr() (NullBytes, error) {
	if r.readNil() {
		return NullBytes{}, nil
	}
	s, err := r.readStr()
	return NullBytes{Bytes: s, Valid: err == nil}, err
}

func (r *evReader) readStrField() (NullBytes, error) {
	s, err := r.readStr()
	return NullBytes{Bytes: s, Valid: err == nil}, err
}

// readExtraKeys checks vLLM extra_keys: nil, or an array of nil-or-array entries.
func (r *evReader) readExtraKeys(ev *Event, st *evState) error {
	if r.readNil() {
		return nil
	}
	start := r.pos
	n, err := r.readArrayHeader()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := r.peek()
		if err != nil {
			return err
		}
		if c != 0xc0 && !evIsArray(c) {
			return ErrEventWrongType
		}
		if err := r.skip(); err != nil {
			return err
		}
	}
	ev.ExtraKeys = r.buf[start:r.pos:r.pos]
	st.extraKeysN, st.hasExtraKeys = n, true
	return nil
}

// decodeField decodes the value of one recognised key; an error leaves the reader
// anywhere inside the value (the caller rewinds).
func (d *Decoder) decodeField(kind Publisher, r *evReader, f evField, ev *Event, st *evState) error {
	var err error
	switch f {
	case efType:
		if kind == PublisherMooncake {
			st.legacyTag, err = r.readStr()
		} else {
			st.tag, err = r.readStr()
		}
	case efEventType:
		st.tag, err = r.readStr()
	case efBlockHashes:
		switch kind {
		case PublisherVLLM:
			ev.BlockHashes, err = d.readHashes(r, evHashVLLM)
		case PublisherSGLang:
			ev.BlockHashes, err = d.readHashes(r, evHashSGLang)
		default:
			st.legacyHashes, err = d.readHashes(r, evHashUint)
		}
	case efSeqHashes:
		ev.SeqHashes, err = d.readHashes(r, evHashUint)
	case efParentBlockHash:
		switch kind {
		case PublisherVLLM:
			ev.ParentBlockHash, err = r.readParent(evHashVLLM)
		case PublisherSGLang:
			ev.ParentBlockHash, err = r.readParent(evHashSGLang)
		default:
			st.legacyParent, err = r.readParent(evHashUint)
		}
	case efParentHash:
		ev.ParentBlockHash, err = r.readParent(evHashUint)
	case efTokenIDs:
		err = d.readTokens(r, ev, kind == PublisherSGLang)
	case efBlockSize:
		if kind == PublisherMooncake {
			ev.BlockSize, err = r.readNullInt()
		} else {
			var v int64
			v, err = r.readInt64()
			ev.BlockSize = NullInt{Int: v, Valid: err == nil}
		}
	case efLoraID:
		ev.LoraID, err = r.readNullInt()
	case efMedium:
		ev.Medium, err = r.readNullStr()
	case efLoraName:
		ev.LoraName, err = r.readNullStr()
	case efExtraKeys:
		err = r.readExtraKeys(ev, st)
	case efGroupIdx:
		ev.GroupIdx, err = r.readNullInt()
	case efSpecKind:
		ev.KVCacheSpecKind, err = r.readNullStr()
	case efSlidingWindow:
		ev.KVCacheSpecSlidingWindow, err = r.readNullInt()
	case efCacheSalt:
		ev.CacheSalt, err = r.readNullStr()
	case efSessionID:
		ev.SessionID, err = r.readNullStr()
	case efEventID:
		ev.EventID, err = r.readUint64()
	case efTimestamp:
		ev.Timestamp, err = r.readInt64()
	case efModelName:
		ev.ModelName, err = r.readNullStr()
	case efAdditionalSalt:
		ev.AdditionalSalt, err = r.readNullStr()
	case efTenantID:
		ev.TenantID, err = r.readStr()
	case efBackendID:
		ev.BackendID, err = r.readStr()
	case efDPRank:
		ev.DPRank, err = r.readInt64()
		if err == nil && ev.DPRank < 0 {
			err = ErrEventOutOfRange
		}
	case efGroupID:
		ev.GroupID, err = r.readNullStr()
	case efObjectKey:
		ev.ObjectKey, err = r.readStrField()
	case efConnectorBlockHash:
		ev.ConnectorBlockHash, err = r.readStrField()
	case efCachePrefix:
		ev.CachePrefix, err = r.readStrField()
	case efTPRank:
		ev.TPRank, err = r.readNullInt()
	case efHeadOrTPRank:
		ev.HeadOrTPRank, err = r.readNullInt()
	case efPCPRank:
		ev.PCPRank, err = r.readNullInt()
	case efDCPRank:
		ev.DCPRank, err = r.readNullInt()
	case efPPRank:
		ev.PPRank, err = r.readNullInt()
	case efLayerID:
		ev.LayerID, err = r.readNullInt()
	case efBaseBlockIdx:
		ev.BaseBlockIdx, err = r.readNullInt()
	}
	return err
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
