package kvevent_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"runtime"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/objectkey"
	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// Payloads copied from testdata/vectors/hash_vectors.json `event_examples`
// (produced by msgspec with the upstream struct definitions).
const (
	evVecVLLMInt = "93cb41da305498100000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf6896072ae8b31325cf7d92dcbb5b559e31b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf6896072ae8b31325a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"

	evVecVLLMBytes = "93cb41da305498100000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392c420bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325c4202744667f6645310ff670b0c5d7c64987ffa5940de5a549f17d92dcbb5b559e31b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325a66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400"

	evVecVLLMLegacy = "93cb41da305498100000939cab426c6f636b53746f72656492cf6896072ae8b31325cf7d92dcbb5b559e31c0dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2010c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b52656d6f76656491cf6896072ae8b31325a34750550091b0416c6c426c6f636b73436c656172656400"

	evVecVLLMOmitDefaults = "88a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739101b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739101aa626c6f636b5f73697a6501a76c6f72615f6964c0a66d656469756dc0a96c6f72615f6e616d65c0"

	evVecSGLangLegacy = "93cb41da3054981000009297ab426c6f636b53746f72656491cf77d735ce838418aac0dc00100102030405060708090a0b0c0d0e0f1010c0a347505597ab426c6f636b53746f72656491cf1170426cf2449cebcf77d735ce838418aadc00101112131415161718191a1b1c1d1e1f2010c0a347505500"

	evVecSGLangSalted = "93cb41da3054981000009198ab426c6f636b53746f72656491cf1f1abb543a5663f2c0dc00100102030405060708090a0b0c0d0e0f1010c0a347505581aa63616368655f73616c74a2733100"
)

const (
	evVecHash0 = uint64(7536218907325174565) // sha256/bs16 block 0 event_u64
	evVecHash1 = uint64(9048537298590080561) // block 1
)

func evDecode(t *testing.T, kind publisher.Kind, payload []byte) *kvevent.Batch {
	t.Helper()
	var d kvevent.Decoder
	b, err := d.Decode(kind, payload)
	if err != nil {
		t.Fatalf("Decode(%s): %v", kind, err)
	}
	evCheckSkipTokens(t, kind, payload, b, nil)
	return b
}

func evWantErr(t *testing.T, ev *kvevent.Event, sentinel error, field string) {
	t.Helper()
	if ev.Err == nil {
		t.Fatalf("event valid (%+v), want %v on %q", ev.Type, sentinel, field)
	}
	if !errors.Is(ev.Err, sentinel) {
		t.Fatalf("event error %v, want %v", ev.Err, sentinel)
	}
	var ee *kvevent.EventError
	if !errors.As(ev.Err, &ee) {
		t.Fatalf("event error %T is not *EventError", ev.Err)
	}
	if ee.Field != field {
		t.Fatalf("event error field %q (%v), want %q", ee.Field, ev.Err, field)
	}
	if ev.Type != kvevent.EventInvalid || ev.BlockHashes != nil || ev.TokenIDs != nil ||
		ev.Medium.Valid || ev.BlockSize.Valid || ev.ObjectKey.Valid || ev.TenantID != nil {
		t.Fatalf("invalid event keeps fields: %+v", ev)
	}
}

// evWantRule checks the outcome of a field-rule case: ev is valid when want is nil, and
// otherwise fails with want on field (see evWantErr).
func evWantRule(t *testing.T, ev *kvevent.Event, want error, field string) {
	t.Helper()
	if want == nil {
		if ev.Err != nil {
			t.Fatalf("invalid: %v", ev.Err)
		}
		return
	}
	evWantErr(t, ev, want, field)
}

func evWantValid(t *testing.T, ev *kvevent.Event, typ kvevent.EventType) {
	t.Helper()
	if ev.Err != nil {
		t.Fatalf("event invalid: %v", ev.Err)
	}
	if ev.Type != typ {
		t.Fatalf("event type %v, want %v", ev.Type, typ)
	}
}

func evCheckVLLMVector(t *testing.T, b *kvevent.Batch) {
	t.Helper()
	if b.TS != evTS || !b.HasDPRank || b.DPRank != 0 || b.TSMillis != 0 {
		t.Fatalf("envelope: ts=%v dp=%v/%v ms=%v", b.TS, b.DPRank, b.HasDPRank, b.TSMillis)
	}
	if len(b.Events) != 3 {
		t.Fatalf("got %d events", len(b.Events))
	}
	st := &b.Events[0]
	evWantValid(t, st, kvevent.EventBlockStored)
	if !slices.Equal(st.BlockHashes, []uint64{evVecHash0, evVecHash1}) {
		t.Fatalf("hashes %v", st.BlockHashes)
	}
	if st.ParentBlockHash.Valid || !st.HasTokenIDs || len(st.TokenIDs) != 32 ||
		st.TokenIDs[0] != 1 || st.TokenIDs[31] != 32 {
		t.Fatalf("parent/tokens: %+v %v", st.ParentBlockHash, st.TokenIDs)
	}
	if st.BlockSize != (kvevent.NullInt{Int: 16, Valid: true}) || st.LoraID.Valid || st.LoraName.Valid {
		t.Fatalf("bs/lora: %+v %+v %+v", st.BlockSize, st.LoraID, st.LoraName)
	}
	if !st.Medium.Valid || string(st.Medium.Bytes) != "GPU" || !kvevent.MediumIs(st.Medium.Bytes, "gpu") {
		t.Fatalf("medium %+v", st.Medium)
	}
	if st.GroupIdx != (kvevent.NullInt{Int: 0, Valid: true}) ||
		string(st.KVCacheSpecKind.Bytes) != "full_attention" || !kvevent.SupportedSpecKind(st.KVCacheSpecKind) ||
		st.KVCacheSpecSlidingWindow.Valid {
		t.Fatalf("group/spec: %+v %+v", st.GroupIdx, st.KVCacheSpecKind)
	}
	if string(st.ExtraKeys) != "\x92\xc0\xc0" {
		t.Fatalf("extra_keys raw %x", st.ExtraKeys)
	}
	rm := &b.Events[1]
	evWantValid(t, rm, kvevent.EventBlockRemoved)
	if !slices.Equal(rm.BlockHashes, []uint64{evVecHash0}) || string(rm.Medium.Bytes) != "GPU" ||
		rm.GroupIdx != (kvevent.NullInt{Valid: true}) || rm.HasTokenIDs {
		t.Fatalf("removed %+v", rm)
	}
	evWantValid(t, &b.Events[2], kvevent.EventAllBlocksCleared)
}

func TestDecodeVLLMVectors(t *testing.T) {
	t.Run("int hashes", func(t *testing.T) {
		evCheckVLLMVector(t, evDecode(t, publisher.VLLM, evHex(t, evVecVLLMInt)))
	})
	t.Run("bytes hashes use last 8 bytes big-endian", func(t *testing.T) {
		evCheckVLLMVector(t, evDecode(t, publisher.VLLM, evHex(t, evVecVLLMBytes)))
	})
	t.Run("legacy array events decode like the map form", func(t *testing.T) {
		b := evDecode(t, publisher.VLLM, evHex(t, evVecVLLMLegacy))
		evCheckVLLMVector(t, b)
		if b.ArrayEvents != 3 || b.MapEvents != 0 {
			t.Fatalf("forms: %d array, %d map", b.ArrayEvents, b.MapEvents)
		}
		if b = evDecode(t, publisher.VLLM, evHex(t, evVecVLLMInt)); b.ArrayEvents != 0 || b.MapEvents != 3 {
			t.Fatalf("map forms: %d array, %d map", b.ArrayEvents, b.MapEvents)
		}
	})
	t.Run("omit defaults example", func(t *testing.T) {
		ev := evHex(t, evVecVLLMOmitDefaults)
		b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evNil(), ev))
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if b.HasDPRank || !slices.Equal(e.BlockHashes, []uint64{1}) || e.BlockSize.Int != 1 ||
			e.Medium.Valid || e.GroupIdx.Valid || e.KVCacheSpecKind.Valid || e.ExtraKeys != nil {
			t.Fatalf("decoded %+v", e)
		}
	})
}

func TestDecodeSGLangVectors(t *testing.T) {
	t.Run("legacy array batch", func(t *testing.T) {
		b := evDecode(t, publisher.SGLang, evHex(t, evVecSGLangLegacy))
		if len(b.Events) != 2 || b.TS != evTS || b.DPRank != 0 || !b.HasDPRank || b.ArrayEvents != 2 {
			t.Fatalf("envelope %+v", b)
		}
		for i, e := range b.Events {
			evWantValid(t, &e, kvevent.EventBlockStored)
			if len(e.BlockHashes) != 1 || len(e.TokenIDs) != 16 || e.TokenIDs[0] != int32(1+16*i) ||
				e.BlockSize.Int != 16 || e.LoraID.Valid || string(e.Medium.Bytes) != "GPU" || e.CacheSalt.Valid {
				t.Fatalf("event %d: %+v", i, e)
			}
		}
		if p := b.Events[1].ParentBlockHash; !p.Valid || p.Uint != b.Events[0].BlockHashes[0] || b.Events[0].ParentBlockHash.Valid {
			t.Fatalf("parents %+v %+v", b.Events[0].ParentBlockHash, p)
		}
	})
	t.Run("legacy array salted (metadata element)", func(t *testing.T) {
		b := evDecode(t, publisher.SGLang, evHex(t, evVecSGLangSalted))
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if !slices.Equal(e.BlockHashes, []uint64{2241309735000630258}) || string(e.CacheSalt.Bytes) != "s1" ||
			len(e.TokenIDs) != 16 || e.BlockSize.Int != 16 {
			t.Fatalf("decoded %+v", e)
		}
	})
	t.Run("salted map form", func(t *testing.T) {
		// The salted vector re-encoded as SGLang's current tagged map.
		ev := evMap{
			{"type", evS("BlockStored")},
			{"block_hashes", evUints(2241309735000630258)},
			{"parent_block_hash", evNil()},
			{"token_ids", evTokens(1, 17)},
			{"block_size", evU(16)},
			{"lora_id", evNil()},
			{"medium", evS("GPU")},
			{"cache_salt", evS("s1")},
		}
		b := evDecode(t, publisher.SGLang, evBatch(evF64(evTS), evU(0), ev.enc()))
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if !slices.Equal(e.BlockHashes, []uint64{2241309735000630258}) || string(e.CacheSalt.Bytes) != "s1" ||
			len(e.TokenIDs) != 16 || e.TokenPairs || e.BlockSize.Int != 16 || e.SessionID.Valid {
			t.Fatalf("decoded %+v", e)
		}
	})
	t.Run("upstream signed oracle keeps bit patterns", func(t *testing.T) {
		signed := []int64{-685567553150498463, -2177363047410903004, 8175329908256277695, -7918518717108636741}
		var evs [][]byte
		var parent []byte = evNil()
		for i, h := range signed {
			evs = append(evs, evSGLangStored().
				with("block_hashes", evArr(evI(h))).
				with("parent_block_hash", parent).
				with("token_ids", evTokens(11+10*i, 15+10*i)).enc())
			parent = evI(h)
		}
		b := evDecode(t, publisher.SGLang, evBatch(evF32(1.5), evNil(), evs...))
		if b.TS != 1.5 || b.HasDPRank {
			t.Fatalf("envelope %+v", b)
		}
		for i, h := range signed {
			e := &b.Events[i]
			evWantValid(t, e, kvevent.EventBlockStored)
			if e.BlockHashes[0] != uint64(h) {
				t.Fatalf("event %d hash %x want %x", i, e.BlockHashes[0], uint64(h))
			}
			if i > 0 && e.ParentBlockHash != (kvevent.NullUint{Uint: uint64(signed[i-1]), Valid: true}) {
				t.Fatalf("event %d parent %+v", i, e.ParentBlockHash)
			}
		}
	})
}

// TestDecodeSharedVectors re-reads the repository's vector file
// (testdata/vectors/README.md), so a regenerated file is checked too.
func TestDecodeSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vectors/hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		EventExamples map[string]json.RawMessage `json:"event_examples"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	payload := func(name string) []byte {
		var ex struct {
			PayloadHex string `json:"payload_hex"`
		}
		if err := json.Unmarshal(v.EventExamples[name], &ex); err != nil || ex.PayloadHex == "" {
			t.Fatalf("%s: %v", name, err)
		}
		return evHex(t, ex.PayloadHex)
	}
	evCheckVLLMVector(t, evDecode(t, publisher.VLLM, payload("vllm_current_map_events_int_hashes")))
	evCheckVLLMVector(t, evDecode(t, publisher.VLLM, payload("vllm_current_map_events_bytes_hashes")))
	for _, c := range []struct {
		name string
		kind publisher.Kind
	}{
		{"vllm_legacy_array_events_int_hashes", publisher.VLLM},
		{"sglang_legacy_array_batch", publisher.SGLang},
		{"sglang_legacy_array_salted", publisher.SGLang},
	} {
		b := evDecode(t, c.kind, payload(c.name))
		for i := range b.Events {
			if b.Events[i].Err != nil {
				t.Errorf("%s event %d: %v", c.name, i, b.Events[i].Err)
			}
		}
	}
}

func TestDecodeVLLMMapEnvelope(t *testing.T) {
	events := evArr(evVLLMStored().enc(), evCleared().enc())
	full := evMap{{"ts", evF64(2.5)}, {"events", events}, {"data_parallel_rank", evU(3)}, {"future", evArr(evS("x"))}}
	b := evDecode(t, publisher.VLLM, full.enc())
	if b.TS != 2.5 || b.DPRank != 3 || !b.HasDPRank || len(b.Events) != 2 {
		t.Fatalf("batch %+v", b)
	}
	evWantValid(t, &b.Events[0], kvevent.EventBlockStored)
	evWantValid(t, &b.Events[1], kvevent.EventAllBlocksCleared)

	// Events first, rank omitted (msgspec omit_defaults drops a nil rank).
	b = evDecode(t, publisher.VLLM, evMap{{"events", events}, {"ts", evF64(2.5)}}.enc())
	if b.HasDPRank || len(b.Events) != 2 {
		t.Fatalf("batch %+v", b)
	}

	var d kvevent.Decoder
	for name, p := range map[string][]byte{
		"missing events":  evMap{{"ts", evF64(1)}}.enc(),
		"missing ts":      evMap{{"events", events}}.enc(),
		"duplicate ts":    evMap{{"ts", evF64(1)}, {"events", events}, {"ts", evF64(1)}}.enc(),
		"duplicate evs":   evMap{{"ts", evF64(1)}, {"events", events}, {"events", events}}.enc(),
		"int ts":          evMap{{"ts", evU(1)}, {"events", events}}.enc(),
		"non-string key":  append(msgp.AppendInt64(msgp.AppendMapHeader(nil, 1), 1), evF64(1)...),
		"bad rank":        evMap{{"ts", evF64(1)}, {"events", events}, {"data_parallel_rank", evI(-1)}}.enc(),
		"events not list": evMap{{"ts", evF64(1)}, {"events", evNil()}}.enc(),
	} {
		if _, err := d.Decode(publisher.VLLM, p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Only vLLM ever produced the map form.
	if _, err := d.Decode(publisher.SGLang, full.enc()); !errors.Is(err, kvevent.ErrEnvelopeShape) {
		t.Fatalf("SGLang map envelope: %v", err)
	}
}

func TestDecodeEnvelopeErrors(t *testing.T) {
	ev := evVLLMStored().enc()
	valid := evBatch(evF64(1), evU(0), ev)
	mc := evBatch(evU(evMooncakeTS), evU(0), evMooncakeStored().enc())
	cases := []struct {
		name string
		kind publisher.Kind
		p    []byte
		want error
	}{
		{"empty", publisher.VLLM, nil, kvevent.ErrPayloadEmpty},
		{"empty mooncake", publisher.Mooncake, []byte{}, kvevent.ErrPayloadEmpty},
		{"reserved byte", publisher.VLLM, []byte{0xc1}, kvevent.ErrEnvelopeShape},
		{"garbage text", publisher.SGLang, []byte("hello world"), kvevent.ErrEnvelopeShape},
		{"trailing byte", publisher.VLLM, append(slices.Clone(valid), 0), kvevent.ErrPayloadTrailing},
		{"trailing value", publisher.Mooncake, append(slices.Clone(mc), valid...), kvevent.ErrPayloadTrailing},
		{"two elements", publisher.VLLM, slices.Concat(msgp.AppendArrayHeader(nil, 2), evF64(1), evArr(ev)), kvevent.ErrEnvelopeShape},
		{"four elements", publisher.SGLang, slices.Concat(msgp.AppendArrayHeader(nil, 4), evF64(1), evArr(), evNil(), evNil()), kvevent.ErrEnvelopeShape},
		{"not an array", publisher.SGLang, evU(5), kvevent.ErrEnvelopeShape},
		{"vLLM int ts", publisher.VLLM, evBatch(evU(1757500000), evU(0), ev), kvevent.ErrTimestamp},
		{"SGLang integer ms ts (Mooncake batch)", publisher.SGLang, evBatch(evU(evMooncakeTS), evU(0)), kvevent.ErrTimestamp},
		{"string ts", publisher.VLLM, evBatch(evS("1.0"), evU(0)), kvevent.ErrTimestamp},
		{"nil ts", publisher.VLLM, evBatch(evNil(), evU(0)), kvevent.ErrTimestamp},
		{"NaN ts", publisher.VLLM, evBatch(evF64(math.NaN()), evU(0)), kvevent.ErrTimestamp},
		{"+Inf ts", publisher.SGLang, evBatch(evF64(math.Inf(1)), evU(0)), kvevent.ErrTimestamp},
		{"float32 -Inf ts", publisher.VLLM, evBatch(evF32(float32(math.Inf(-1))), evU(0)), kvevent.ErrTimestamp},
		{"Mooncake float ts", publisher.Mooncake, evBatch(evF64(1), evU(0)), kvevent.ErrTimestamp},
		{"Mooncake negative ts", publisher.Mooncake, evBatch(evI(-1), evU(0)), kvevent.ErrTimestamp},
		{"Mooncake ts above int64", publisher.Mooncake, evBatch(evU(math.MaxUint64), evU(0)), kvevent.ErrTimestamp},
		{"events is a map", publisher.VLLM, slices.Concat(msgp.AppendArrayHeader(nil, 3), evF64(1), ev, evNil()), kvevent.ErrEnvelopeShape},
		{"events nil", publisher.Mooncake, slices.Concat(msgp.AppendArrayHeader(nil, 3), evU(1), evNil(), evNil()), kvevent.ErrEnvelopeShape},
		{"negative dp_rank", publisher.VLLM, evBatch(evF64(1), evI(-1)), kvevent.ErrDPRank},
		{"string dp_rank", publisher.SGLang, evBatch(evF64(1), evS("0")), kvevent.ErrDPRank},
		{"float dp_rank", publisher.Mooncake, evBatch(evU(1), evF64(0)), kvevent.ErrDPRank},
		{"bool dp_rank", publisher.VLLM, evBatch(evF64(1), evBool(false)), kvevent.ErrDPRank},
		{"truncated event", publisher.VLLM, valid[:len(valid)-5], kvevent.ErrPayloadTruncated},
		{"unknown publisher", publisher.Kind(9), valid, kvevent.ErrUnknownPublisher},
		{"publisher negative", publisher.Kind(-1), valid, kvevent.ErrUnknownPublisher},
	}
	var d kvevent.Decoder
	for _, c := range cases {
		b, err := d.Decode(c.kind, c.p)
		if err == nil {
			t.Errorf("%s: accepted (%d events)", c.name, len(b.Events))
			continue
		}
		if b != nil {
			t.Errorf("%s: batch returned with error", c.name)
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
	// The decoder is still good afterwards.
	if _, err := d.Decode(publisher.VLLM, valid); err != nil {
		t.Fatal(err)
	}
}

// TestDecodeEveryPrefixFails: msgpack is prefix-free, so every proper prefix of a
// valid payload must be rejected, never half-applied.
func TestDecodeEveryPrefixFails(t *testing.T) {
	payloads := map[publisher.Kind][]byte{
		publisher.VLLM:     evHex(t, evVecVLLMBytes),
		publisher.SGLang:   evBatch(evF64(1), evU(2), evSGLangStored().enc(), evCleared().enc()),
		publisher.Mooncake: evBatch(evU(evMooncakeTS), evNil(), evMooncakeStored().enc(), evMooncakeRemoved().enc()),
	}
	var d kvevent.Decoder
	for kind, p := range payloads {
		if _, err := d.Decode(kind, p); err != nil {
			t.Fatalf("%s full payload: %v", kind, err)
		}
		for n := 0; n < len(p); n++ {
			if _, err := d.Decode(kind, p[:n]); err == nil {
				t.Fatalf("%s: prefix of %d/%d bytes accepted", kind, n, len(p))
			}
		}
	}
}

func TestDecodeEventIsolation(t *testing.T) {
	stored := evVLLMStored()
	cases := []struct {
		name  string
		bad   []byte
		want  error
		field string
	}{
		{"wrong type", stored.with("block_size", evS("16")).enc(), kvevent.ErrEventWrongType, "block_size"},
		{"duplicate key", stored.plus("medium", evS("GPU")).enc(), kvevent.ErrEventDuplicateKey, "medium"},
		{"short array event", evArr(evS("BlockStored"), evUints(1)), kvevent.ErrEventMissingKey, "parent_block_hash"},
		{"array event wrong type", evArr(evS("BlockStored"), evUints(1), evS("x"), evTokens(1, 3), evU(2), evNil()), kvevent.ErrEventWrongType, "parent_block_hash"},
		{"array event without tag", evArr(), kvevent.ErrEventMissingKey, "type"},
		{"array event tag not a string", evArr(evU(1), evUints(1)), kvevent.ErrEventWrongType, "type"},
		{"array event unknown tag", evArr(evS("BlockMoved"), evUints(1)), kvevent.ErrEventUnknownTag, "type"},
		{"integer event", evU(7), kvevent.ErrEventNotMap, ""},
		{"nil event", evNil(), kvevent.ErrEventNotMap, ""},
		{"unknown tag", stored.with("type", evS("BlockMoved")).enc(), kvevent.ErrEventUnknownTag, "type"},
		{"empty map", evMap{}.enc(), kvevent.ErrEventMissingKey, "type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			first := stored.with("block_hashes", evUints(1, 2, 3)).enc()
			after := evVLLMRemoved().with("block_hashes", evUints(9)).enc()
			// Malformed in the middle.
			b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evU(0), first, c.bad, after))
			if len(b.Events) != 3 {
				t.Fatalf("%d events", len(b.Events))
			}
			evWantValid(t, &b.Events[0], kvevent.EventBlockStored)
			if !slices.Equal(b.Events[0].BlockHashes, []uint64{1, 2, 3}) || len(b.Events[0].TokenIDs) != 32 {
				t.Fatalf("first event %+v", b.Events[0])
			}
			evWantErr(t, &b.Events[1], c.want, c.field)
			var ee *kvevent.EventError
			if errors.As(b.Events[1].Err, &ee); ee.Index != 1 {
				t.Fatalf("error index %d", ee.Index)
			}
			evWantValid(t, &b.Events[2], kvevent.EventBlockRemoved)
			if !slices.Equal(b.Events[2].BlockHashes, []uint64{9}) {
				t.Fatalf("last event %+v", b.Events[2])
			}
			// Malformed final event.
			b = evDecode(t, publisher.VLLM, evBatch(evF64(1), evU(0), first, after, c.bad))
			evWantValid(t, &b.Events[0], kvevent.EventBlockStored)
			evWantValid(t, &b.Events[1], kvevent.EventBlockRemoved)
			if !slices.Equal(b.Events[0].BlockHashes, []uint64{1, 2, 3}) || !slices.Equal(b.Events[1].BlockHashes, []uint64{9}) {
				t.Fatalf("hashes %v %v", b.Events[0].BlockHashes, b.Events[1].BlockHashes)
			}
			evWantErr(t, &b.Events[2], c.want, c.field)
		})
	}
}

func TestDecodeVLLMFieldRules(t *testing.T) {
	st, rm, cl := evVLLMStored(), evVLLMRemoved(), evCleared()
	type tc struct {
		name  string
		ev    evMap
		want  error // nil: valid
		field string
	}
	cases := []tc{
		{"stored minimal", st, nil, ""},
		{"unknown keys ignored", st.with("locality", evMap{{"x", evArr(evArr(evNil()))}}.enc()).with("session_id", evU(1)), nil, ""},
		{"unknown key repeated ignored", st.plus("zzz", evU(1)).plus("zzz", evS("a")), nil, ""},
		{"optional keys", st.with("extra_keys", evArr(evNil(), evArr(evS("lora-a"), evArr(evS("img0"), evI(-2))))).
			with("group_idx", evNil()).with("kv_cache_spec_kind", evNil()).with("kv_cache_spec_sliding_window", evNil()), nil, ""},
		{"extra_keys nil", st.with("extra_keys", evNil()), nil, ""},
		{"token_ids nil", st.with("token_ids", evNil()), nil, ""},
		{"token_ids empty", st.with("token_ids", evArr()), nil, ""},
		{"negative token in int32", st.with("token_ids", evArr(evI(-5), evI(math.MinInt32), evI(math.MaxInt32))), nil, ""},
		{"parent uint", st.with("parent_block_hash", evU(math.MaxUint64)), nil, ""},
		{"parent bin", st.with("parent_block_hash", evBin(make([]byte, 32))), nil, ""},
		{"parent short bin", st.with("parent_block_hash", evBin([]byte{1, 2})), nil, ""},
		{"non-string key", st, nil, ""}, // encoding replaced below
		{"missing type", st.without("type"), kvevent.ErrEventMissingKey, "type"},
		{"type not str", st.with("type", evU(1)), kvevent.ErrEventWrongType, "type"},
		{"tag is case sensitive", st.with("type", evS("blockstored")), kvevent.ErrEventUnknownTag, "type"},
		{"hash negative", st.with("block_hashes", evArr(evI(-1))), kvevent.ErrEventOutOfRange, "block_hashes"},
		{"hash string", st.with("block_hashes", evArr(evS("ab"))), kvevent.ErrEventWrongType, "block_hashes"},
		{"hash short bin", st.with("block_hashes", evArr(evBin(make([]byte, 7)))), kvevent.ErrEventOutOfRange, "block_hashes"},
		{"hashes not array", st.with("block_hashes", evU(1)), kvevent.ErrEventWrongType, "block_hashes"},
		{"hashes nil", st.with("block_hashes", evNil()), kvevent.ErrEventWrongType, "block_hashes"},
		{"parent string", st.with("parent_block_hash", evS("x")), kvevent.ErrEventWrongType, "parent_block_hash"},
		{"parent negative", st.with("parent_block_hash", evI(-3)), kvevent.ErrEventOutOfRange, "parent_block_hash"},
		{"token above int32", st.with("token_ids", evArr(evU(1), evU(math.MaxInt32+1))), kvevent.ErrEventOutOfRange, "token_ids"},
		{"token below int32", st.with("token_ids", evArr(evI(math.MinInt32-1))), kvevent.ErrEventOutOfRange, "token_ids"},
		{"token float", st.with("token_ids", evArr(evF64(1))), kvevent.ErrEventWrongType, "token_ids"},
		{"vLLM token pairs", st.with("token_ids", evArr(evArr(evU(1), evU(2)))), kvevent.ErrEventWrongType, "token_ids"},
		{"block_size nil", st.with("block_size", evNil()), kvevent.ErrEventWrongType, "block_size"},
		{"block_size float", st.with("block_size", evF64(16)), kvevent.ErrEventWrongType, "block_size"},
		{"block_size huge", st.with("block_size", evU(math.MaxUint64)), kvevent.ErrEventOutOfRange, "block_size"},
		{"lora_id string", st.with("lora_id", evS("1")), kvevent.ErrEventWrongType, "lora_id"},
		{"medium int", st.with("medium", evU(1)), kvevent.ErrEventWrongType, "medium"},
		{"medium bin", st.with("medium", evBin([]byte("GPU"))), kvevent.ErrEventWrongType, "medium"},
		{"lora_name int", st.with("lora_name", evU(1)), kvevent.ErrEventWrongType, "lora_name"},
		{"extra_keys map", st.with("extra_keys", evMap{}.enc()), kvevent.ErrEventWrongType, "extra_keys"},
		{"extra_keys entry str", st.with("extra_keys", evArr(evNil(), evS("a"))), kvevent.ErrEventWrongType, "extra_keys"},
		{"extra_keys length", st.with("extra_keys", evArr(evNil())), kvevent.ErrEventMismatch, "extra_keys"},
		{"group_idx str", st.with("group_idx", evS("0")), kvevent.ErrEventWrongType, "group_idx"},
		{"spec kind int", st.with("kv_cache_spec_kind", evU(0)), kvevent.ErrEventWrongType, "kv_cache_spec_kind"},
		{"sliding window str", st.with("kv_cache_spec_sliding_window", evS("4")), kvevent.ErrEventWrongType, "kv_cache_spec_sliding_window"},
		{"duplicate type", st.plus("type", evS("BlockStored")), kvevent.ErrEventDuplicateKey, "type"},
		{"duplicate hashes", st.plus("block_hashes", evUints(1)), kvevent.ErrEventDuplicateKey, "block_hashes"},
		{"removed minimal", rm, nil, ""},
		{"removed with group_idx", rm.with("group_idx", evU(0)), nil, ""},
		{"removed medium nil", rm.with("medium", evNil()), nil, ""},
		{"removed missing medium", rm.without("medium"), kvevent.ErrEventMissingKey, "medium"},
		{"removed missing hashes", rm.without("block_hashes"), kvevent.ErrEventMissingKey, "block_hashes"},
		{"cleared", cl, nil, ""},
		{"cleared unknown key", cl.with("extra", evU(1)), nil, ""},
		{"cleared with medium", cl.with("medium", evS("GPU")), kvevent.ErrEventUnexpectedKey, "medium"},
		{"cleared with group_idx", cl.with("group_idx", evNil()), kvevent.ErrEventUnexpectedKey, "group_idx"},
	}
	for _, k := range []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"} {
		cases = append(cases, tc{"stored missing " + k, st.without(k), kvevent.ErrEventMissingKey, k})
	}
	for k, v := range map[string][]byte{
		"parent_block_hash": evNil(), "token_ids": evNil(), "block_size": evU(16), "lora_id": evNil(),
		"lora_name": evNil(), "extra_keys": evNil(), "kv_cache_spec_kind": evNil(), "kv_cache_spec_sliding_window": evNil(),
	} {
		cases = append(cases, tc{"removed with " + k, rm.with(k, v), kvevent.ErrEventUnexpectedKey, k})
	}
	var d kvevent.Decoder
	for _, c := range cases {
		enc := c.ev.enc()
		if c.name == "non-string key" {
			// An integer key: the event is invalid even though the value is fine.
			enc = msgp.AppendMapHeader(nil, uint32(len(st)+1))
			for _, kv := range st {
				enc = append(msgp.AppendString(enc, kv.k), kv.v...)
			}
			enc = append(msgp.AppendInt64(enc, 5), evU(1)...)
			c.want, c.field = kvevent.ErrEventKeyNotString, ""
		}
		payload := evBatch(evF64(1), evU(0), enc, cl.enc())
		b, err := d.Decode(publisher.VLLM, payload)
		if err != nil {
			t.Errorf("%s: envelope error %v", c.name, err)
			continue
		}
		evCheckSkipTokens(t, publisher.VLLM, payload, b, nil)
		t.Run(c.name, func(t *testing.T) {
			evWantRule(t, &b.Events[0], c.want, c.field)
			evWantValid(t, &b.Events[1], kvevent.EventAllBlocksCleared)
		})
	}
}

func TestDecodeVLLMValues(t *testing.T) {
	h32 := make([]byte, 32)
	for i := range h32 {
		h32[i] = byte(i)
	}
	ev := evVLLMStored().
		with("block_hashes", evArr(evU(5), evBin(h32), evBin(h32[:8]), evU(math.MaxUint64))).
		with("parent_block_hash", evBin(h32[:3])).
		with("lora_id", evU(3)).with("lora_name", evS("lora-a")).with("medium", evS("gpu")).
		with("group_idx", evU(2)).with("kv_cache_spec_kind", evS("sliding_window")).
		with("kv_cache_spec_sliding_window", evU(128)).with("token_ids", evArr(evU(70000), evU(300), evU(200), evI(-7)))
	b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evNil(), ev.enc()))
	e := &b.Events[0]
	evWantValid(t, e, kvevent.EventBlockStored)
	want := []uint64{5, binary.BigEndian.Uint64(h32[24:]), binary.BigEndian.Uint64(h32[:8]), math.MaxUint64}
	if !slices.Equal(e.BlockHashes, want) {
		t.Fatalf("hashes %x want %x", e.BlockHashes, want)
	}
	if e.ParentBlockHash != (kvevent.NullUint{Uint: 0x000102, Valid: true}) {
		t.Fatalf("parent %+v", e.ParentBlockHash)
	}
	if e.LoraID != (kvevent.NullInt{Int: 3, Valid: true}) || string(e.LoraName.Bytes) != "lora-a" ||
		e.GroupIdx.Int != 2 || kvevent.SupportedSpecKind(e.KVCacheSpecKind) ||
		e.KVCacheSpecSlidingWindow != (kvevent.NullInt{Int: 128, Valid: true}) {
		t.Fatalf("fields %+v", e)
	}
	if !slices.Equal(e.TokenIDs, []int32{70000, 300, 200, -7}) {
		t.Fatalf("tokens %v", e.TokenIDs)
	}
	// The slices must not let the handler append into the decoder's buffers.
	if cap(e.BlockHashes) != len(e.BlockHashes) || cap(e.TokenIDs) != len(e.TokenIDs) {
		t.Fatalf("slices not capped: %d/%d %d/%d", len(e.BlockHashes), cap(e.BlockHashes), len(e.TokenIDs), cap(e.TokenIDs))
	}
	// Empty-but-present medium string is distinct from nil.
	b = evDecode(t, publisher.VLLM, evBatch(evF64(1), evNil(), evVLLMStored().with("medium", evS("")).enc()))
	if m := b.Events[0].Medium; !m.Valid || len(m.Bytes) != 0 {
		t.Fatalf("empty medium %+v", m)
	}
}

func TestDecodeIntWidths(t *testing.T) {
	var hashes, tokens [][]byte
	for _, w := range evWidths(5) {
		hashes = append(hashes, w)
		tokens = append(tokens, w)
	}
	var d kvevent.Decoder
	for _, w := range evWidths(16) {
		ev := evVLLMStored().with("block_hashes", evArr(hashes...)).with("token_ids", evArr(tokens...)).
			with("block_size", w).with("lora_id", w)
		b, err := d.Decode(publisher.VLLM, evBatch(evF64(1), w, ev.enc()))
		if err != nil {
			t.Fatalf("width %x: %v", w[0], err)
		}
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if b.DPRank != 16 || e.BlockSize.Int != 16 || e.LoraID.Int != 16 || len(e.BlockHashes) != 9 || len(e.TokenIDs) != 9 {
			t.Fatalf("width %x: %+v", w[0], e)
		}
		for i := range e.BlockHashes {
			if e.BlockHashes[i] != 5 || e.TokenIDs[i] != 5 {
				t.Fatalf("width %x: hash/token %d = %d/%d", w[0], i, e.BlockHashes[i], e.TokenIDs[i])
			}
		}
		// Mooncake: every integer field in this width too.
		mc := evMooncakeStored().with("event_id", w).with("block_size", w).with("dp_rank", w).
			with("seq_hashes", evArr(w)).with("tp_rank", w).with("parent_hash", w).with("token_ids", evArr(tokens...))
		b, err = d.Decode(publisher.Mooncake, evBatch(evU(evMooncakeTS), w, mc.enc()))
		if err != nil {
			t.Fatalf("mooncake width %x: %v", w[0], err)
		}
		e = &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if e.EventID != 16 || e.BlockSize.Int != 16 || e.DPRank != 16 || e.SeqHashes[0] != 16 ||
			e.TPRank.Int != 16 || e.ParentBlockHash.Uint != 16 || b.DPRank != 16 {
			t.Fatalf("mooncake width %x: %+v", w[0], e)
		}
	}
	// Every str width for keys and values.
	long := string(make([]byte, 300))
	ev := evVLLMStored().with("lora_name", evS(long)).with("medium", []byte{0xd9, 3, 'G', 'P', 'U'})
	b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evNil(), ev.enc()))
	if e := &b.Events[0]; e.Err != nil || len(e.LoraName.Bytes) != 300 || string(e.Medium.Bytes) != "GPU" {
		t.Fatalf("str widths: %+v", e)
	}
}

func TestDecodeSGLangFieldRules(t *testing.T) {
	st := evSGLangStored()
	rm := evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evArr(evI(-1), evU(7))}}
	cases := []struct {
		name  string
		ev    evMap
		want  error
		field string
	}{
		{"stored minimal", st, nil, ""},
		{"stored all optional", st.with("medium", evS("CPU_PINNED")).with("cache_salt", evS("s")).with("session_id", evS("sess")), nil, ""},
		{"nil optionals", st.with("medium", evNil()).with("cache_salt", evNil()).with("session_id", evNil()), nil, ""},
		{"unknown keys", st.with("extra_keys", evU(1)).with("group_idx", evS("x")), nil, ""},
		{"max int64 hash", st.with("block_hashes", evArr(evU(math.MaxInt64))), nil, ""},
		{"uint64 above int64", st.with("block_hashes", evArr(evU(math.MaxInt64+1))), kvevent.ErrEventOutOfRange, "block_hashes"},
		{"bin hash", st.with("block_hashes", evArr(evBin(make([]byte, 32)))), kvevent.ErrEventWrongType, "block_hashes"},
		{"parent above int64", st.with("parent_block_hash", evU(math.MaxUint64)), kvevent.ErrEventOutOfRange, "parent_block_hash"},
		{"pair of three", st.with("token_ids", evArr(evArr(evU(1), evU(2), evU(3)))), kvevent.ErrEventWrongType, "token_ids"},
		{"pair with str", st.with("token_ids", evArr(evArr(evU(1), evS("2")))), kvevent.ErrEventWrongType, "token_ids"},
		{"pair out of range", st.with("token_ids", evArr(evArr(evU(1), evU(1<<31)))), kvevent.ErrEventOutOfRange, "token_ids"},
		{"block_size zero", st.with("block_size", evU(0)), kvevent.ErrEventOutOfRange, "block_size"},
		{"block_size negative", st.with("block_size", evI(-4)), kvevent.ErrEventOutOfRange, "block_size"},
		{"lora_id str", st.with("lora_id", evS("x")), kvevent.ErrEventWrongType, "lora_id"},
		{"session_id int", st.with("session_id", evU(1)), kvevent.ErrEventWrongType, "session_id"},
		{"cache_salt int", st.with("cache_salt", evU(1)), kvevent.ErrEventWrongType, "cache_salt"},
		{"missing lora_id", st.without("lora_id"), kvevent.ErrEventMissingKey, "lora_id"},
		{"missing token_ids", st.without("token_ids"), kvevent.ErrEventMissingKey, "token_ids"},
		{"missing parent", st.without("parent_block_hash"), kvevent.ErrEventMissingKey, "parent_block_hash"},
		{"removed", rm, nil, ""},
		{"removed with medium", rm.with("medium", evS("DISK")), nil, ""},
		{"removed with tokens", rm.with("token_ids", evNil()), kvevent.ErrEventUnexpectedKey, "token_ids"},
		{"removed with cache_salt", rm.with("cache_salt", evS("s")), kvevent.ErrEventUnexpectedKey, "cache_salt"},
		{"removed missing hashes", rm.without("block_hashes"), kvevent.ErrEventMissingKey, "block_hashes"},
		{"cleared", evCleared(), nil, ""},
		{"cleared with medium", evCleared().with("medium", evS("GPU")), kvevent.ErrEventUnexpectedKey, "medium"},
		{"duplicate", st.plus("block_size", evU(4)), kvevent.ErrEventDuplicateKey, "block_size"},
	}
	var d kvevent.Decoder
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			payload := evBatch(evF64(1), evU(1), c.ev.enc())
			b, err := d.Decode(publisher.SGLang, payload)
			if err != nil {
				t.Fatal(err)
			}
			evCheckSkipTokens(t, publisher.SGLang, payload, b, nil)
			evWantRule(t, &b.Events[0], c.want, c.field)
		})
	}
	t.Run("bigram pairs flattened", func(t *testing.T) {
		ev := st.with("token_ids", evArr(evArr(evU(10), evU(20)), evArr(evU(20), evU(30)), evArr(evU(30), evU(40))))
		b := evDecode(t, publisher.SGLang, evBatch(evF64(1), evNil(), ev.enc()))
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockStored)
		if !e.TokenPairs || !slices.Equal(e.TokenIDs, []int32{10, 20, 20, 30, 30, 40}) {
			t.Fatalf("tokens %v pairs %v", e.TokenIDs, e.TokenPairs)
		}
	})
	t.Run("removed values", func(t *testing.T) {
		b := evDecode(t, publisher.SGLang, evBatch(evF64(1), evNil(), rm.enc()))
		e := &b.Events[0]
		evWantValid(t, e, kvevent.EventBlockRemoved)
		if !slices.Equal(e.BlockHashes, []uint64{math.MaxUint64, 7}) || e.Medium.Valid {
			t.Fatalf("removed %+v", e)
		}
	})
}

func TestDecodeMooncakeValues(t *testing.T) {
	st := evMooncakeStored().
		with("model_name", evS("Qwen3-8B")).with("lora_name", evS("lora-a")).
		with("additional_salt", evS("salt")).with("group_id", evS("0")).
		with("seq_hashes", evUints(evVecHash0)).with("base_block_idx", evU(4)).
		with("connector_block_hash", evS("0xBEA72B7D33DE03C1AA715EFBB492D0E0D3801F00C1F985756896072AE8B31325")).
		with("cache_prefix", evS("deployA")).with("tp_rank", evU(1)).with("head_or_tp_rank", evNil()).
		with("pcp_rank", evU(2)).with("dcp_rank", evU(3)).with("pp_rank", evU(4)).with("layer_id", evU(5)).
		with("parent_hash", evU(99)).with("token_ids", evTokens(1, 17)).
		with("type", evS("BlockStored")).with("block_hashes", evUints(evVecHash0)).with("parent_block_hash", evU(99)).
		with("replicas", evArr(evS("ignored")))
	rm := evMooncakeRemoved().with("medium", evS("disk")).with("dp_rank", evU(3))
	cl := evMooncakeCommon("cleared").with("event_id", evU(9)).with("medium", evNil())
	b := evDecode(t, publisher.Mooncake, evBatch(evU(evMooncakeTS), evU(3), st.enc(), rm.enc(), cl.enc()))
	if b.TSMillis != evMooncakeTS || b.TS != float64(evMooncakeTS)/1000 || b.DPRank != 3 || !b.HasDPRank {
		t.Fatalf("envelope %+v", b)
	}
	e := &b.Events[0]
	evWantValid(t, e, kvevent.EventBlockStored)
	if e.EventID != 7 || e.Timestamp != evMooncakeTS || string(e.ModelName.Bytes) != "Qwen3-8B" ||
		string(e.LoraName.Bytes) != "lora-a" || string(e.AdditionalSalt.Bytes) != "salt" ||
		e.BlockSize.Int != 16 || string(e.TenantID) != "tenant-a" || string(e.BackendID) != "pool-a" ||
		string(e.Medium.Bytes) != "cpu" || e.DPRank != 0 || string(e.GroupID.Bytes) != "0" ||
		!slices.Equal(e.SeqHashes, []uint64{evVecHash0}) || e.BaseBlockIdx.Int != 4 ||
		string(e.ObjectKey.Bytes) != evVLLMKey || string(e.CachePrefix.Bytes) != "deployA" ||
		e.TPRank.Int != 1 || e.HeadOrTPRank.Valid || e.PCPRank.Int != 2 || e.DCPRank.Int != 3 ||
		e.PPRank.Int != 4 || e.LayerID.Int != 5 || e.ParentBlockHash.Uint != 99 || len(e.TokenIDs) != 16 ||
		e.BlockHashes != nil {
		t.Fatalf("stored %+v", e)
	}
	ch, err := objectkey.ParseConnectorBlockHash(e.ConnectorBlockHash.Bytes)
	if err != nil || ch.Low64 != evVecHash0 {
		t.Fatalf("connector hash %v %x", err, ch.Low64)
	}
	kh, err := objectkey.ParseVLLM(e.ObjectKey.Bytes)
	if err != nil || kh != ch.Low64 || len(e.SeqHashes) != 1 || e.SeqHashes[0] != kh {
		t.Fatalf("key hash %x %v", kh, err)
	}
	e = &b.Events[1]
	evWantValid(t, e, kvevent.EventBlockRemoved)
	if e.DPRank != 3 || string(e.Medium.Bytes) != "disk" || len(e.SeqHashes) != 0 || e.GroupID.Valid || e.HasTokenIDs {
		t.Fatalf("removed %+v", e)
	}
	e = &b.Events[2]
	evWantValid(t, e, kvevent.EventAllBlocksCleared)
	if e.EventID != 9 || e.Medium.Valid || string(e.TenantID) != "tenant-a" || e.ObjectKey.Valid {
		t.Fatalf("cleared %+v", e)
	}
}

func TestDecodeMooncakeFieldRules(t *testing.T) {
	st, rm, cl := evMooncakeStored(), evMooncakeRemoved(), evMooncakeCommon("cleared")
	type tc struct {
		name  string
		ev    evMap
		want  error
		field string
	}
	cases := []tc{
		{"stored", st, nil, ""},
		{"removed", rm, nil, ""},
		{"cleared", cl, nil, ""},
		{"nil batch-irrelevant fields", st.with("model_name", evNil()).with("block_size", evNil()).with("medium", evNil()), nil, ""},
		{"legacy type matches", st.with("type", evS("BlockStored")), nil, ""},
		{"legacy type removed", rm.with("type", evS("BlockRemoved")), nil, ""},
		{"legacy type cleared", cl.with("type", evS("AllBlocksCleared")), nil, ""},
		{"legacy hashes equal", st.with("seq_hashes", evUints(4, 5)).with("block_hashes", evUints(4, 5)), nil, ""},
		{"legacy parent equal nil", st.with("parent_block_hash", evNil()), nil, ""},
		{"legacy parent equal", st.with("parent_hash", evU(8)).with("parent_block_hash", evU(8)), nil, ""},
		{"unknown keys", st.with("replicas", evArr()).with("addr_list", evNil()), nil, ""},
		{"unknown tag", st.with("event_type", evS("evicted")), kvevent.ErrEventUnknownTag, "event_type"},
		{"missing event_type", st.without("event_type"), kvevent.ErrEventMissingKey, "event_type"},
		{"event_type int", st.with("event_type", evU(1)), kvevent.ErrEventWrongType, "event_type"},
		{"timestamp mismatch", st.with("timestamp", evU(evMooncakeTS+1)), kvevent.ErrEventMismatch, "timestamp"},
		{"timestamp nil", st.with("timestamp", evNil()), kvevent.ErrEventWrongType, "timestamp"},
		{"timestamp float", st.with("timestamp", evF64(evMooncakeTS)), kvevent.ErrEventWrongType, "timestamp"},
		{"event_id negative", st.with("event_id", evI(-1)), kvevent.ErrEventOutOfRange, "event_id"},
		{"event_id str", st.with("event_id", evS("7")), kvevent.ErrEventWrongType, "event_id"},
		{"dp_rank nil", st.with("dp_rank", evNil()), kvevent.ErrEventWrongType, "dp_rank"},
		{"dp_rank negative", st.with("dp_rank", evI(-1)), kvevent.ErrEventOutOfRange, "dp_rank"},
		{"tenant nil", st.with("tenant_id", evNil()), kvevent.ErrEventWrongType, "tenant_id"},
		{"backend nil", st.with("backend_id", evNil()), kvevent.ErrEventWrongType, "backend_id"},
		{"model int", st.with("model_name", evU(1)), kvevent.ErrEventWrongType, "model_name"},
		{"block_size str", st.with("block_size", evS("16")), kvevent.ErrEventWrongType, "block_size"},
		{"salt int", st.with("additional_salt", evU(1)), kvevent.ErrEventWrongType, "additional_salt"},
		{"lora int", st.with("lora_name", evU(1)), kvevent.ErrEventWrongType, "lora_name"},
		{"medium int", st.with("medium", evU(1)), kvevent.ErrEventWrongType, "medium"},
		{"legacy type mismatch", st.with("type", evS("BlockRemoved")), kvevent.ErrEventMismatch, "type"},
		{"legacy type int", st.with("type", evU(0)), kvevent.ErrEventWrongType, "type"},
		{"group_id int", st.with("group_id", evU(0)), kvevent.ErrEventWrongType, "group_id"},
		{"seq_hashes nil", st.with("seq_hashes", evNil()), kvevent.ErrEventWrongType, "seq_hashes"},
		{"seq_hashes negative", st.with("seq_hashes", evArr(evI(-1))), kvevent.ErrEventOutOfRange, "seq_hashes"},
		{"seq_hashes bin", st.with("seq_hashes", evArr(evBin(make([]byte, 8)))), kvevent.ErrEventWrongType, "seq_hashes"},
		{"base_block_idx str", st.with("base_block_idx", evS("0")), kvevent.ErrEventWrongType, "base_block_idx"},
		{"object_key nil", st.with("object_key", evNil()), kvevent.ErrEventWrongType, "object_key"},
		{"connector nil", st.with("connector_block_hash", evNil()), kvevent.ErrEventWrongType, "connector_block_hash"},
		{"cache_prefix int", st.with("cache_prefix", evU(0)), kvevent.ErrEventWrongType, "cache_prefix"},
		{"parent_hash negative", st.with("parent_hash", evI(-1)), kvevent.ErrEventOutOfRange, "parent_hash"},
		{"parent_hash str", st.with("parent_hash", evS("1")), kvevent.ErrEventWrongType, "parent_hash"},
		{"token pairs refused", st.with("token_ids", evArr(evArr(evU(1), evU(2)))), kvevent.ErrEventWrongType, "token_ids"},
		{"token out of range", st.with("token_ids", evArr(evU(1<<31))), kvevent.ErrEventOutOfRange, "token_ids"},
		{"legacy hashes differ", st.with("seq_hashes", evUints(4)).with("block_hashes", evUints(5)), kvevent.ErrEventMismatch, "block_hashes"},
		{"legacy hashes longer", st.with("block_hashes", evUints(0)), kvevent.ErrEventMismatch, "block_hashes"},
		{"legacy parent differs", st.with("parent_block_hash", evU(1)), kvevent.ErrEventMismatch, "parent_block_hash"},
		{"legacy parent nil vs set", st.with("parent_hash", evU(1)).with("parent_block_hash", evNil()), kvevent.ErrEventMismatch, "parent_block_hash"},
		{"duplicate", st.plus("tenant_id", evS("t")), kvevent.ErrEventDuplicateKey, "tenant_id"},
	}
	for _, k := range []string{"tp_rank", "head_or_tp_rank", "pcp_rank", "dcp_rank", "pp_rank", "layer_id"} {
		cases = append(cases,
			tc{k + " nil", st.with(k, evNil()), nil, ""},
			tc{k + " str", st.with(k, evS("0")), kvevent.ErrEventWrongType, k})
	}
	common := []string{"event_id", "timestamp", "model_name", "block_size", "additional_salt",
		"lora_name", "tenant_id", "backend_id", "medium", "dp_rank"}
	for _, base := range []struct {
		name string
		m    evMap
	}{{"stored", st}, {"removed", rm}, {"cleared", cl}} {
		for _, k := range common {
			cases = append(cases, tc{base.name + " missing " + k, base.m.without(k), kvevent.ErrEventMissingKey, k})
		}
	}
	for _, k := range []string{"group_id", "seq_hashes", "base_block_idx"} {
		cases = append(cases,
			tc{"stored missing " + k, st.without(k), kvevent.ErrEventMissingKey, k},
			tc{"removed missing " + k, rm.without(k), kvevent.ErrEventMissingKey, k})
	}
	for _, k := range []string{"parent_hash", "token_ids"} {
		cases = append(cases, tc{"stored missing " + k, st.without(k), kvevent.ErrEventMissingKey, k})
	}
	for k, v := range map[string][]byte{"parent_hash": evNil(), "token_ids": evNil(), "parent_block_hash": evNil()} {
		cases = append(cases, tc{"removed with " + k, rm.with(k, v), kvevent.ErrEventUnexpectedKey, k})
	}
	for k, v := range map[string][]byte{
		"group_id": evNil(), "object_key": evS("k"), "connector_block_hash": evS("00"), "cache_prefix": evS("p"),
		"tp_rank": evNil(), "head_or_tp_rank": evNil(), "pcp_rank": evNil(), "dcp_rank": evNil(),
		"pp_rank": evNil(), "layer_id": evNil(), "seq_hashes": evUints(), "block_hashes": evUints(),
		"base_block_idx": evNil(), "parent_hash": evNil(), "token_ids": evNil(), "parent_block_hash": evNil(),
	} {
		cases = append(cases, tc{"cleared with " + k, cl.with(k, v), kvevent.ErrEventUnexpectedKey, k})
	}
	// Optional object fields may be absent.
	for _, k := range []string{"object_key"} {
		cases = append(cases, tc{"stored without " + k, st.without(k), nil, ""})
	}
	var d kvevent.Decoder
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			payload := evBatch(evU(evMooncakeTS), evNil(), c.ev.enc(), cl.enc())
			b, err := d.Decode(publisher.Mooncake, payload)
			if err != nil {
				t.Fatal(err)
			}
			evCheckSkipTokens(t, publisher.Mooncake, payload, b, nil)
			evWantRule(t, &b.Events[0], c.want, c.field)
			evWantValid(t, &b.Events[1], kvevent.EventAllBlocksCleared)
		})
	}
}

// TestDecodeHostileLengths: container headers claiming billions of elements must fail
// fast without sizing anything from the claim.
func TestDecodeHostileLengths(t *testing.T) {
	huge32 := []byte{0xdd, 0xff, 0xff, 0xff, 0xff}
	hugeMap := []byte{0xdf, 0xff, 0xff, 0xff, 0xff}
	hugeStr := []byte{0xdb, 0xff, 0xff, 0xff, 0xff}
	hugeBin := []byte{0xc6, 0xff, 0xff, 0xff, 0xff}
	hugeExt := []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0x01}
	withEvents := func(raw []byte) []byte {
		return append(append(append(msgp.AppendArrayHeader(nil, 3), evF64(1)...), raw...), 0xc0)
	}
	st := evVLLMStored()
	cases := map[string][]byte{
		"envelope array":     append(huge32, 1, 2, 3),
		"events array":       withEvents(append(huge32, 0x80)),
		"events array16":     withEvents([]byte{0xdc, 0xff, 0xff, 0x80}),
		"event map":          withEvents(append([]byte{0x91}, append(hugeMap, 0xa1, 'a', 1)...)),
		"hash array":         evBatch(evF64(1), evNil(), st.with("block_hashes", append(huge32, 1)).enc()),
		"token array":        evBatch(evF64(1), evNil(), st.with("token_ids", append(huge32, 1, 2)).enc()),
		"unknown key array":  evBatch(evF64(1), evNil(), st.with("zz", append(huge32, 1, 2)).enc()),
		"unknown key map":    evBatch(evF64(1), evNil(), st.with("zz", append(hugeMap, 1, 2)).enc()),
		"unknown key str":    evBatch(evF64(1), evNil(), st.with("zz", append(hugeStr, 'x')).enc()),
		"unknown key bin":    evBatch(evF64(1), evNil(), st.with("zz", append(hugeBin, 'x')).enc()),
		"unknown key ext":    evBatch(evF64(1), evNil(), st.with("zz", append(hugeExt, 'x')).enc()),
		"key str":            withEvents(append([]byte{0x91, 0x81}, append(hugeStr, 'a')...)),
		"medium str":         evBatch(evF64(1), evNil(), st.with("medium", append(hugeStr, 'G')).enc()),
		"hash bin":           evBatch(evF64(1), evNil(), st.with("block_hashes", append([]byte{0x91}, append(hugeBin, 1)...)).enc()),
		"nested arrays":      evBatch(evF64(1), evNil(), st.with("zz", slices.Repeat([]byte{0x91}, 100000)).enc()),
		"extra_keys entries": evBatch(evF64(1), evNil(), st.with("extra_keys", append(huge32, 0xc0)).enc()),
	}
	var d kvevent.Decoder
	for name, p := range cases {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b, err := d.Decode(publisher.VLLM, p)
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Errorf("%s: accepted %+v", name, b)
			continue
		}
		if !errors.Is(err, kvevent.ErrPayloadTruncated) {
			t.Errorf("%s: error %v, want truncated", name, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("%s: allocated %d bytes for a %d-byte payload", name, grew, len(p))
		}
	}
}

func TestDecodeMaxEvents(t *testing.T) {
	d := kvevent.Decoder{MaxEvents: 2}
	ev := evCleared().enc()
	if b, err := d.Decode(publisher.VLLM, evBatch(evF64(1), evNil(), ev, ev)); err != nil || len(b.Events) != 2 {
		t.Fatalf("two events: %v", err)
	}
	if _, err := d.Decode(publisher.VLLM, evBatch(evF64(1), evNil(), ev, ev, ev)); !errors.Is(err, kvevent.ErrTooManyEvents) {
		t.Fatalf("three events: %v", err)
	}
	// Default cap: one-byte events beyond DefaultMaxEvents are refused.
	var big kvevent.Decoder
	p := append(append(msgp.AppendArrayHeader(nil, 3), evF64(1)...), msgp.AppendArrayHeader(nil, kvevent.DefaultMaxEvents+1)...)
	p = append(p, slices.Repeat([]byte{0xc0}, kvevent.DefaultMaxEvents+1)...)
	p = append(p, 0xc0)
	if _, err := big.Decode(publisher.VLLM, p); !errors.Is(err, kvevent.ErrTooManyEvents) {
		t.Fatalf("default cap: %v", err)
	}
}

// TestDecoderReuse: a second, smaller batch must not see anything of the first.
func TestDecoderReuse(t *testing.T) {
	var d kvevent.Decoder
	first := evVLLMStored().with("lora_id", evU(1)).with("lora_name", evS("x")).with("group_idx", evU(0)).
		with("extra_keys", evArr(evNil(), evNil())).with("token_ids", evTokens(0, 500))
	b, err := d.Decode(publisher.VLLM, evBatch(evF64(1), evU(4), first.enc(), first.enc(), first.enc()))
	if err != nil || len(b.Events) != 3 || !b.HasDPRank {
		t.Fatalf("first: %v", err)
	}
	second := evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evUints(77)}, {"medium", evNil()}}
	b, err = d.Decode(publisher.VLLM, evBatch(evF64(2), evNil(), second.enc()))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.HasDPRank || b.DPRank != 0 || b.TS != 2 {
		t.Fatalf("second batch %+v", b)
	}
	e := &b.Events[0]
	evWantValid(t, e, kvevent.EventBlockRemoved)
	if e.LoraID.Valid || e.LoraName.Valid || e.GroupIdx.Valid || e.ExtraKeys != nil || e.HasTokenIDs ||
		e.TokenIDs != nil || e.BlockSize.Valid || e.Medium.Valid || !slices.Equal(e.BlockHashes, []uint64{77}) {
		t.Fatalf("stale fields: %+v", e)
	}
	// A Mooncake batch after an engine batch: no engine fields leak.
	b, err = d.Decode(publisher.Mooncake, evBatch(evU(evMooncakeTS), evNil(), evMooncakeRemoved().enc()))
	if err != nil || b.Events[0].BlockHashes != nil || b.Events[0].Err != nil {
		t.Fatalf("mooncake after vLLM: %v %+v", err, b.Events[0])
	}
}

func TestEventErrorText(t *testing.T) {
	b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evNil(), evCleared().enc(), evVLLMStored().with("medium", evU(1)).enc(), evU(1)))
	if got := b.Events[1].Err.Error(); got != "event 1: medium: wrong msgpack type" {
		t.Fatalf("text %q", got)
	}
	if got := b.Events[2].Err.Error(); got != "event 2: event is not a map" {
		t.Fatalf("text %q", got)
	}
	if publisher.SGLang.String() != "SGLang" || kvevent.EventBlockRemoved.String() != "BlockRemoved" {
		t.Fatal("String")
	}
}

func TestMediumIs(t *testing.T) {
	for _, c := range []struct {
		m, want string
		ok      bool
	}{
		{"GPU", "gpu", true}, {"gpu", "gpu", true}, {"Cpu_Pinned", "cpu_pinned", true}, {"DISK", "disk", true},
		{"GPU ", "gpu", false}, {"", "gpu", false}, {"GP", "gpu", false}, {"EXTERNAL", "disk", false},
		{"[", "{", false}, // 0x5b vs 0x7b differ by 0x20 but are not letters
	} {
		if got := kvevent.MediumIs([]byte(c.m), c.want); got != c.ok {
			t.Errorf("MediumIs(%q,%q)=%v", c.m, c.want, got)
		}
	}
	for _, c := range []struct {
		k  kvevent.NullBytes
		ok bool
	}{
		{kvevent.NullBytes{}, true},
		{kvevent.NullBytes{Bytes: []byte("full_attention"), Valid: true}, true},
		{kvevent.NullBytes{Bytes: []byte("mla_attention"), Valid: true}, true},
		{kvevent.NullBytes{Bytes: []byte("sink_full_attention"), Valid: true}, true},
		{kvevent.NullBytes{Bytes: []byte("sliding_window"), Valid: true}, false},
		{kvevent.NullBytes{Bytes: []byte(""), Valid: true}, false},
	} {
		if got := kvevent.SupportedSpecKind(c.k); got != c.ok {
			t.Errorf("SupportedSpecKind(%q)=%v", c.k.Bytes, got)
		}
	}
}

func TestDecodeZeroAllocs(t *testing.T) {
	payloads := []struct {
		kind publisher.Kind
		p    []byte
	}{
		{publisher.VLLM, evBatch(evF64(1), evU(0),
			evVLLMStored().with("extra_keys", evArr(evNil(), evNil())).enc(),
			evVLLMStored().with("block_size", evS("bad")).enc(), // invalid events record errors
			evVLLMRemoved().enc(), evU(3), evCleared().enc())},
		{publisher.VLLM, evHex(t, evVecVLLMBytes)},
		{publisher.VLLM, evHex(t, evVecVLLMLegacy)},
		{publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStoredFull().enc(), evPositional(evVLLMStoredFull()))},
		{publisher.SGLang, evHex(t, evVecSGLangSalted)},
		{publisher.VLLM, evMap{{"ts", evF64(1)}, {"events", evArr(evVLLMStored().enc())}}.enc()},
		{publisher.SGLang, evBatch(evF64(1), evNil(),
			evSGLangStored().with("token_ids", evArr(evArr(evU(1), evU(2)))).enc(),
			evSGLangStored().with("lora_id", evS("x")).enc(), evCleared().enc())},
		{publisher.Mooncake, evBatch(evU(evMooncakeTS), evU(1),
			evMooncakeStored().with("seq_hashes", evUints(1)).with("block_hashes", evUints(1)).enc(),
			evMooncakeStored().with("timestamp", evU(1)).enc(),
			evMooncakeRemoved().enc(), evMooncakeCommon("cleared").enc())},
	}
	for _, c := range payloads {
		for _, skip := range []bool{false, true} {
			k, p := c.kind, c.p
			d := kvevent.Decoder{SkipTokenIDs: skip}
			if _, err := d.Decode(k, p); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := d.Decode(k, p); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%s (SkipTokenIDs %v): %v allocs per Decode", k, skip, allocs)
			}
		}
	}
}

// evIntEncodings encodes v in every msgpack integer form that holds it (fixints
// included), so the skipping decoder's width table is checked at each boundary.
func evIntEncodings(v int64) [][]byte {
	var out [][]byte
	be := func(lead byte, n int, u uint64) []byte {
		b := []byte{lead}
		for i := n - 1; i >= 0; i-- {
			b = append(b, byte(u>>(8*i)))
		}
		return b
	}
	if v >= 0 && v <= 0x7f {
		out = append(out, []byte{byte(v)})
	}
	if v >= -32 && v < 0 {
		out = append(out, []byte{byte(v)})
	}
	if v >= 0 {
		u := uint64(v)
		if u <= math.MaxUint8 {
			out = append(out, be(0xcc, 1, u))
		}
		if u <= math.MaxUint16 {
			out = append(out, be(0xcd, 2, u))
		}
		if u <= math.MaxUint32 {
			out = append(out, be(0xce, 4, u))
		}
		out = append(out, be(0xcf, 8, u))
	}
	if v >= math.MinInt8 && v <= math.MaxInt8 {
		out = append(out, be(0xd0, 1, uint64(v)))
	}
	if v >= math.MinInt16 && v <= math.MaxInt16 {
		out = append(out, be(0xd1, 2, uint64(v)))
	}
	if v >= math.MinInt32 && v <= math.MaxInt32 {
		out = append(out, be(0xd2, 4, uint64(v)))
	}
	return append(out, be(0xd3, 8, uint64(v)))
}

// TestSkipTokenIDsBoundaries: for token ids at every width boundary, in every encoding,
// alone, after a valid token and as SGLang pairs, and for every truncation of the
// token array, the skipping decoder accepts and rejects exactly what the full one does.
func TestSkipTokenIDsBoundaries(t *testing.T) {
	values := []int64{0, 1, 127, 128, 255, 256, math.MaxUint16, math.MaxUint16 + 1,
		math.MaxInt32, math.MaxInt32 + 1, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, math.MinInt8, math.MinInt8 - 1, math.MinInt16, math.MinInt16 - 1,
		math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	var d kvevent.Decoder
	check := func(kind publisher.Kind, payload []byte) {
		t.Helper()
		b, err := d.Decode(kind, payload)
		evCheckSkipTokens(t, kind, payload, b, err)
	}
	accepted, rejected := 0, 0
	for _, v := range values {
		for _, enc := range evIntEncodings(v) {
			for _, toks := range [][]byte{evArr(enc), evArr(evU(7), enc, evU(9))} {
				payload := evBatch(evF64(1), evU(0), evVLLMStored().with("token_ids", toks).enc())
				check(publisher.VLLM, payload)
				if b, _ := d.Decode(publisher.VLLM, payload); b.Events[0].Err == nil {
					accepted++
				} else {
					rejected++
				}
				check(publisher.SGLang, evBatch(evF64(1), evU(0), evSGLangStored().with("token_ids", toks).enc()))
				check(publisher.SGLang, evBatch(evF64(1), evU(0),
					evSGLangStored().with("token_ids", evArr(evArr(evU(3), enc), evArr(enc, enc))).enc()))
				for n := 1; n < len(toks); n++ { // the array cut short, then the event's other keys
					check(publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStored().with("token_ids", toks[:n]).enc()))
				}
			}
		}
	}
	if accepted == 0 || rejected == 0 {
		t.Fatalf("accepted %d, rejected %d: the table must exercise both", accepted, rejected)
	}
}
