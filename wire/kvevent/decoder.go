package kvevent

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/conductor-go/conductor/wire/internal/msgpack"
	"github.com/conductor-go/conductor/wire/publisher"
)

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
	// SkipTokenIDs is for consumers that never read Event.TokenIDs (the indexer applies
	// block hashes only). token_ids are then checked exactly as when they are stored, so
	// every batch and event is accepted or rejected as without the option (a non-integer
	// or out-of-int32 token, or a malformed SGLang pair, still rejects the event), but
	// nothing is copied: Event.TokenIDs stays nil while HasTokenIDs and TokenPairs report
	// what was sent.
	SkipTokenIDs bool

	// noVBMI (tests) keeps token arrays off tokenarray.DecodeVBMI, on the exact path alone.
	noVBMI bool

	batch  Batch
	events []Event
	hashes []uint64
	tokens []int32
	errs   []EventError
	// scratch takes the token ids that SkipTokenIDs checks without keeping (scanChunk
	// long once used).
	scratch []int32
}

// Decode decodes one payload (the third ZMQ frame) from a publisher of the given
// kind. A non-nil error is an envelope failure: nothing in the message may be
// applied. Otherwise event failures are reported per event in Event.Err. The
// returned batch and its slices (including sub-slices of payload) are valid until
// the next Decode and as long as payload is not modified.
func (d *Decoder) Decode(kind publisher.Kind, payload []byte) (*Batch, error) {
	if !kind.Valid() {
		return nil, fmt.Errorf("decode batch: %w: %d", ErrUnknownPublisher, int32(kind))
	}
	if len(payload) == 0 {
		return nil, fmt.Errorf("decode %s batch: %w", kind, ErrPayloadEmpty)
	}
	d.batch = Batch{}
	d.events = d.events[:0]
	d.hashes = d.hashes[:0]
	d.tokens = d.tokens[:0]
	d.errs = d.errs[:0]
	r := reader{msgpack.Reader{Buf: payload}}
	var err error
	if kind == publisher.VLLM && msgpack.IsMap(payload[0]) {
		err = d.decodeMapEnvelope(&r)
	} else {
		err = d.decodeArrayEnvelope(kind, &r)
	}
	if err == nil && r.Pos != len(payload) {
		err = fmt.Errorf("%w: %d bytes", ErrPayloadTrailing, len(payload)-r.Pos)
	}
	if err != nil {
		d.events = d.events[:0]
		return nil, fmt.Errorf("decode %s batch: %w", kind, err)
	}
	d.batch.Events = d.events
	return &d.batch, nil
}

// envErr wraps an envelope failure: structural errors pass through unchanged so
// callers can tell truncation from a wrong shape.
func envErr(what string, sentinel, err error) error {
	if errors.Is(err, ErrPayloadTruncated) || errors.Is(err, ErrPayloadInvalid) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err == nil {
		return fmt.Errorf("%s: %w", what, sentinel)
	}
	return fmt.Errorf("%s: %w: %w", what, sentinel, err)
}

func (d *Decoder) decodeArrayEnvelope(kind publisher.Kind, r *reader) error {
	n, err := r.ReadArrayHeader()
	if err != nil {
		return envErr("envelope", ErrEnvelopeShape, err)
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

// envelopeKeys are the keys of the map envelope, indexed by the env* slots.
var envelopeKeys = [...]string{envTS: "ts", envEvents: "events", envDPRank: "data_parallel_rank"}

// Slots of the map envelope's keys.
const (
	envTS = iota
	envEvents
	envDPRank
)

// decodeMapEnvelope accepts the {ts, events, data_parallel_rank} form that one vLLM
// revision produced when EventBatch lost array_like (engine-formats §A2).
func (d *Decoder) decodeMapEnvelope(r *reader) error {
	n, err := r.ReadMapHeader()
	if err != nil {
		return envErr("envelope", ErrEnvelopeShape, err)
	}
	var seen [len(envelopeKeys)]bool
	for i := 0; i < n; i++ {
		key, err := r.ReadStr()
		if err != nil {
			return envErr("envelope key", ErrEnvelopeShape, err)
		}
		slot := slices.Index(envelopeKeys[:], string(key))
		if slot < 0 {
			if err := r.Skip(); err != nil {
				return envErr("envelope", ErrEnvelopeShape, err)
			}
			continue
		}
		if seen[slot] {
			return fmt.Errorf("envelope: %w: duplicate %s", ErrEnvelopeShape, envelopeKeys[slot])
		}
		seen[slot] = true
		switch slot {
		case envTS:
			err = d.decodeTS(publisher.VLLM, r)
		case envEvents:
			err = d.decodeEvents(publisher.VLLM, r)
		default:
			err = d.decodeDPRank(r)
		}
		if err != nil {
			return err
		}
	}
	if !seen[envTS] || !seen[envEvents] {
		return fmt.Errorf("envelope: %w: map form needs ts and events", ErrEnvelopeShape)
	}
	return nil
}

func (d *Decoder) decodeTS(kind publisher.Kind, r *reader) error {
	if kind == publisher.Mooncake {
		v, err := r.ReadInt64()
		if err != nil {
			return envErr("timestamp", ErrTimestamp, err)
		}
		if v < 0 {
			return fmt.Errorf("timestamp: %w: negative", ErrTimestamp)
		}
		d.batch.TSMillis = v
		d.batch.TS = float64(v) / 1000
		return nil
	}
	f, err := r.ReadFloat()
	if err != nil {
		return envErr("timestamp", ErrTimestamp, err)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("timestamp: %w: not finite", ErrTimestamp)
	}
	d.batch.TS = f
	return nil
}

func (d *Decoder) decodeDPRank(r *reader) error {
	if r.ReadNil() {
		d.batch.HasDPRank = false
		return nil
	}
	v, err := r.ReadInt64()
	if err != nil {
		return envErr("dp_rank", ErrDPRank, err)
	}
	if v < 0 {
		return fmt.Errorf("dp_rank: %w: negative", ErrDPRank)
	}
	d.batch.DPRank, d.batch.HasDPRank = v, true
	return nil
}

func (d *Decoder) decodeEvents(kind publisher.Kind, r *reader) error {
	n, err := r.ReadArrayHeader()
	if err != nil {
		return envErr("events", ErrEnvelopeShape, err)
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

// eventState is per-event scratch that is not part of the result.
type eventState struct {
	seen         fieldSet
	tag          []byte   // type (engines) or event_type (Mooncake)
	legacyTag    []byte   // Mooncake legacy type
	legacyHashes []uint64 // Mooncake legacy block_hashes
	legacyParent NullUint // Mooncake legacy parent_block_hash
	extraKeysN   int
	hasExtraKeys bool
	lookaheadN   int  // entries of lookahead_token_ids (one per block hash)
	array        bool // the event is a positional (array-encoded) one
}

// fail records the first error of an event.
func (d *Decoder) fail(ev *Event, idx int, f field, err error) {
	if ev.Err != nil {
		return
	}
	name := ""
	if f < numFields {
		name = fieldNames[f]
	}
	d.errs = append(d.errs, EventError{Index: idx, Field: name, Err: err})
	ev.Err = &d.errs[len(d.errs)-1]
}

// decodeEvent decodes one element of the events array into ev: a tagged map, or for
// the engines a tagged positional array (decodeArrayEvent). It returns an error only
// for structural damage (the rest of the payload cannot be located); anything else
// invalidates just this event, which is then skipped whole.
func (d *Decoder) decodeEvent(kind publisher.Kind, r *reader, idx int, ev *Event) error {
	hashMark, tokenMark := len(d.hashes), len(d.tokens)
	c, err := r.Peek()
	if err != nil {
		return err
	}
	var st eventState
	switch {
	case msgpack.IsMap(c):
		d.batch.MapEvents++
		if err := d.decodeMapEvent(kind, r, idx, ev, &st); err != nil {
			return err
		}
	case msgpack.IsArray(c) && kind != publisher.Mooncake:
		d.batch.ArrayEvents++
		if err := d.decodeArrayEvent(kind, r, idx, ev, &st); err != nil {
			return err
		}
	default:
		if err := r.Skip(); err != nil {
			return err
		}
		d.fail(ev, idx, efUnknown, ErrEventNotMap)
		*ev = Event{Err: ev.Err}
		return nil
	}
	if ev.Err == nil {
		var f field
		var err error
		if kind == publisher.Mooncake {
			f, err = d.checkMooncake(ev, &st)
		} else {
			f, err = checkEngine(kind, ev, &st)
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

// decodeMapEvent reads a tagged map event's keys into ev.
func (d *Decoder) decodeMapEvent(kind publisher.Kind, r *reader, idx int, ev *Event, st *eventState) error {
	n, err := r.ReadMapHeader()
	if err != nil {
		return err
	}
	keys := mapKeys(kind)
	for i := 0; i < n; i++ {
		if ev.Err != nil {
			if err := r.SkipN(2); err != nil {
				return err
			}
			continue
		}
		key, err := r.ReadStr()
		if err != nil {
			if !errors.Is(err, ErrEventWrongType) {
				return err
			}
			if err := r.SkipN(2); err != nil {
				return err
			}
			d.fail(ev, idx, efUnknown, ErrEventKeyNotString)
			continue
		}
		f := lookupField(keys, key)
		if f == efUnknown {
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		if st.seen&bit(f) != 0 {
			if err := r.Skip(); err != nil {
				return err
			}
			d.fail(ev, idx, f, ErrEventDuplicateKey)
			continue
		}
		if err := d.decodeValue(kind, r, f, idx, ev, st); err != nil {
			return err
		}
	}
	return nil
}

// decodeArrayEvent reads a tagged positional event, [tag, field1, field2, ...], the
// form of msgspec's array_like structs (vLLM up to 0.23, SGLang up to 0.5.19). Fields are
// in declaration order (arrayFields); an older engine sends fewer, a newer one more:
// missing trailing fields are absent, elements past the known ones are skipped.
func (d *Decoder) decodeArrayEvent(kind publisher.Kind, r *reader, idx int, ev *Event, st *eventState) error {
	n, err := r.ReadArrayHeader()
	if err != nil {
		return err
	}
	st.array = true
	if n == 0 {
		d.fail(ev, idx, efType, ErrEventMissingKey)
		return nil
	}
	if err := d.decodeValue(kind, r, efType, idx, ev, st); err != nil {
		return err
	}
	pos := arrayFields(kind, st.tag)
	for i := 1; i < n; i++ {
		f := efUnknown
		if i-1 < len(pos) {
			f = pos[i-1]
		}
		if ev.Err != nil || f == efUnknown {
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		if err := d.decodeValue(kind, r, f, idx, ev, st); err != nil {
			return err
		}
	}
	return nil
}

// decodeValue decodes the value of recognised field f into ev, marking it seen; a
// value of the wrong shape fails the event (and is skipped whole), a broken payload is
// returned.
func (d *Decoder) decodeValue(kind publisher.Kind, r *reader, f field, idx int, ev *Event, st *eventState) error {
	st.seen |= bit(f)
	start := r.Pos
	ferr := d.decodeField(kind, r, f, ev, st)
	if ferr == nil {
		return nil
	}
	// Rewind and skip: a type error may stop mid-value, and skip is what tells a wrong
	// type (event-local) from a broken payload (fatal).
	r.Pos = start
	if err := r.Skip(); err != nil {
		return err
	}
	if errors.Is(ferr, ErrPayloadTruncated) || errors.Is(ferr, ErrPayloadInvalid) {
		// skip succeeded, so the value is intact: the reader only refused a header that
		// could not fit. Treat as a type problem.
		ferr = ErrEventWrongType
	}
	d.fail(ev, idx, f, ferr)
	return nil
}

func firstField(s fieldSet) field {
	for f := field(0); f < numFields; f++ {
		if s&bit(f) != 0 {
			return f
		}
	}
	return efUnknown
}

func checkKeys(seen, req, allowed fieldSet) (field, error) {
	if missing := req &^ seen; missing != 0 {
		return firstField(missing), ErrEventMissingKey
	}
	if extra := seen &^ allowed; extra != 0 {
		return firstField(extra), ErrEventUnexpectedKey
	}
	return efUnknown, nil
}

func checkEngine(kind publisher.Kind, ev *Event, st *eventState) (field, error) {
	if st.seen&bit(efType) == 0 {
		return efType, ErrEventMissingKey
	}
	var req, allowed fieldSet
	switch string(st.tag) {
	case "BlockStored":
		ev.Type = EventBlockStored
		req, allowed = vllmStoredReq, vllmStoredAllowed
		if kind == publisher.SGLang {
			req, allowed = sglStoredReq, sglStoredAllowed
		}
		if st.array {
			// The fields every release's positional form has: later ones were appended.
			req = storedArrayReq
		}
	case "BlockRemoved":
		ev.Type = EventBlockRemoved
		req, allowed = vllmRemovedReq, vllmRemovedAllowed
		if kind == publisher.SGLang {
			req, allowed = sglRemovedReq, sglRemovedAllowed
		}
		if st.array {
			req = removedArrayReq
		}
	case "AllBlocksCleared":
		ev.Type = EventAllBlocksCleared
		req, allowed = clearedSet, clearedSet
	default:
		return efType, ErrEventUnknownTag
	}
	if f, err := checkKeys(st.seen, req, allowed); err != nil {
		return f, err
	}
	if ev.Type == EventBlockStored {
		if st.hasExtraKeys && st.extraKeysN != len(ev.BlockHashes) {
			return efExtraKeys, ErrEventMismatch
		}
		if ev.HasLookahead && st.lookaheadN != len(ev.BlockHashes) {
			return efLookahead, ErrEventMismatch
		}
		if kind == publisher.SGLang && ev.BlockSize.Int <= 0 {
			return efBlockSize, ErrEventOutOfRange
		}
	}
	return efUnknown, nil
}

func (d *Decoder) checkMooncake(ev *Event, st *eventState) (field, error) {
	if st.seen&bit(efEventType) == 0 {
		return efEventType, ErrEventMissingKey
	}
	var req, allowed fieldSet
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
	if f, err := checkKeys(st.seen, req, allowed); err != nil {
		return f, err
	}
	if ev.Timestamp != d.batch.TSMillis {
		return efTimestamp, ErrEventMismatch
	}
	if st.seen&bit(efType) != 0 && string(st.legacyTag) != legacy {
		return efType, ErrEventMismatch
	}
	if st.seen&bit(efBlockHashes) != 0 && !slices.Equal(st.legacyHashes, ev.SeqHashes) {
		return efBlockHashes, ErrEventMismatch
	}
	if st.seen&bit(efParentBlockHash) != 0 && st.legacyParent != ev.ParentBlockHash {
		return efParentBlockHash, ErrEventMismatch
	}
	return efUnknown, nil
}
