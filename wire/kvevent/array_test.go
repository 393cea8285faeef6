package kvevent_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/publisher"
)

// evPositional is m's values in order, tag first, as msgspec writes an array_like
// struct: the same event in the positional form.
func evPositional(m evMap) []byte {
	items := make([][]byte, len(m))
	for i, kv := range m {
		items[i] = kv.v
	}
	return evArr(items...)
}

// evVLLMStoredFull is a vLLM BlockStored with every field of the newest release, in
// declaration order (locality, ownership and session_id are not read).
func evVLLMStoredFull() evMap {
	return evVLLMStored().
		with("extra_keys", evArr(evArr(evS("salt")), evNil())).
		with("group_idx", evU(0)).
		with("kv_cache_spec_kind", evS("full_attention")).
		with("kv_cache_spec_sliding_window", evNil()).
		with("locality", evS("LOCAL")).
		with("ownership", evNil()).
		with("session_id", evS("sess")).
		with("lookahead_token_ids", evArr(evTokens(17, 19), evTokens(33, 35)))
}

// evSameEvent compares two decoded events field by field (slices by content).
func evSameEvent(t *testing.T, name string, a, b *kvevent.Event) {
	t.Helper()
	if !reflect.DeepEqual(*a, *b) {
		t.Errorf("%s: array form %+v\nmap form   %+v", name, *a, *b)
	}
}

// Every prefix of the newest field list (the fields of one release after another) is a
// valid positional event once the first releases' fields are there, and decodes like
// the map holding the same fields.
func TestDecodeArrayFormsMatchMaps(t *testing.T) {
	for _, c := range []struct {
		kind publisher.Kind
		full evMap
		min  int // entries (tag included) the first releases had
	}{
		{publisher.VLLM, evVLLMStoredFull(), 6},
		{publisher.VLLM, evVLLMRemoved().with("group_idx", evU(0)), 2},
		{publisher.SGLang, evSGLangStored().with("medium", evS("CPU_PINNED")).with("metadata", evMap{{"cache_salt", evS("s")}}.enc()), 6},
		{publisher.SGLang, evMap{{"type", evS("BlockRemoved")}, {"block_hashes", evArr(evI(-3))}, {"medium", evS("DISK")}}, 2},
		{publisher.VLLM, evCleared(), 1},
		{publisher.SGLang, evCleared(), 1},
	} {
		for n := c.min; n <= len(c.full); n++ {
			part := c.full[:n]
			for _, skip := range []bool{false, true} {
				da := kvevent.Decoder{SkipTokenIDs: skip}
				dm := kvevent.Decoder{SkipTokenIDs: skip}
				ba, err := da.Decode(c.kind, evBatch(evF64(1), evU(0), evPositional(part)))
				if err != nil {
					t.Fatal(err)
				}
				if ba.ArrayEvents != 1 || ba.MapEvents != 0 {
					t.Fatalf("%s %d fields: forms %d/%d", c.kind, n, ba.ArrayEvents, ba.MapEvents)
				}
				bm, err := dm.Decode(c.kind, evBatch(evF64(1), evU(0), part.enc()))
				if err != nil {
					t.Fatal(err)
				}
				ea, em := &ba.Events[0], &bm.Events[0]
				if ea.Err != nil {
					t.Fatalf("%s %s with %d fields: %v", c.kind, c.full[0].v, n, ea.Err)
				}
				if c.kind == publisher.SGLang && n == len(c.full) && n == 8 {
					// The metadata element has no map-form key: its salt is cache_salt.
					if string(ea.CacheSalt.Bytes) != "s" {
						t.Fatalf("metadata salt: %+v", ea)
					}
					continue
				}
				if em.Err == nil { // the map form may require fields an old array lacks
					evSameEvent(t, c.kind.String()+" "+string(c.full[0].v[1:]), ea, em)
				}
			}
		}
		// Elements past the known fields (a newer release) are skipped.
		longer := c.full.plus("future", evArr(evS("x"))).plus("future2", evU(1))
		b := evDecode(t, c.kind, evBatch(evF64(1), evU(0), evPositional(longer)))
		if b.Events[0].Err != nil {
			t.Errorf("%s: trailing unknown elements: %v", c.kind, b.Events[0].Err)
		}
	}
}

func TestDecodeArrayFormRules(t *testing.T) {
	st := evVLLMStoredFull()
	cases := []struct {
		name  string
		kind  publisher.Kind
		ev    []byte
		want  error
		field string
	}{
		{"missing lora_id", publisher.VLLM, evPositional(st[:5]), kvevent.ErrEventMissingKey, "lora_id"},
		{"removed without hashes", publisher.VLLM, evArr(evS("BlockRemoved")), kvevent.ErrEventMissingKey, "block_hashes"},
		{"medium wrong type", publisher.VLLM, evPositional(st.with("medium", evU(1))), kvevent.ErrEventWrongType, "medium"},
		{"extra_keys count", publisher.VLLM, evPositional(st.with("extra_keys", evArr(evNil()))), kvevent.ErrEventMismatch, "extra_keys"},
		{"lookahead count", publisher.VLLM, evPositional(st.with("lookahead_token_ids", evArr(evTokens(1, 3)))), kvevent.ErrEventMismatch, "lookahead_token_ids"},
		{"lookahead ragged", publisher.VLLM, evPositional(st.with("lookahead_token_ids", evArr(evTokens(1, 3), evTokens(1, 2)))), kvevent.ErrEventMismatch, "lookahead_token_ids"},
		{"lookahead not ints", publisher.VLLM, evPositional(st.with("lookahead_token_ids", evArr(evArr(evS("a")), evArr(evS("b"))))), kvevent.ErrEventWrongType, "lookahead_token_ids"},
		{"sglang metadata not a map", publisher.SGLang, evPositional(evSGLangStored().with("medium", evS("GPU")).with("metadata", evS("s1"))), kvevent.ErrEventWrongType, "metadata"},
		{"sglang metadata salt int", publisher.SGLang, evPositional(evSGLangStored().with("medium", evS("GPU")).with("metadata", evMap{{"cache_salt", evU(1)}}.enc())), kvevent.ErrEventWrongType, "metadata"},
	}
	for _, c := range cases {
		b := evDecode(t, c.kind, evBatch(evF64(1), evU(0), c.ev, evCleared().enc()))
		evWantErr(t, &b.Events[0], c.want, c.field)
		evWantValid(t, &b.Events[1], kvevent.EventAllBlocksCleared)
	}
	// Mooncake events stay maps.
	b := evDecode(t, publisher.Mooncake, evBatch(evU(evMooncakeTS), evU(0), evPositional(evMooncakeStored())))
	evWantErr(t, &b.Events[0], kvevent.ErrEventNotMap, "")
	if b.ArrayEvents != 0 {
		t.Errorf("a refused Mooncake array counted as an array event")
	}
}

func TestDecodeNewFields(t *testing.T) {
	// vLLM lookahead_token_ids, flattened per block.
	b := evDecode(t, publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStoredFull().enc()))
	e := &b.Events[0]
	evWantValid(t, e, kvevent.EventBlockStored)
	if !e.HasLookahead || e.LookaheadPerBlock != 2 || !slices.Equal(e.LookaheadTokenIDs, []int32{17, 18, 33, 34}) {
		t.Fatalf("lookahead %v %d %v", e.HasLookahead, e.LookaheadPerBlock, e.LookaheadTokenIDs)
	}
	d := kvevent.Decoder{SkipTokenIDs: true}
	bs, err := d.Decode(publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStoredFull().enc()))
	if err != nil || !bs.Events[0].HasLookahead || bs.Events[0].LookaheadPerBlock != 2 || bs.Events[0].LookaheadTokenIDs != nil {
		t.Fatalf("skip tokens: %v %+v", err, bs.Events[0])
	}
	b = evDecode(t, publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStored().with("lookahead_token_ids", evNil()).enc()))
	if e := &b.Events[0]; e.Err != nil || e.HasLookahead {
		t.Fatalf("nil lookahead: %+v", e)
	}
	// Token ids of the event and its lookahead ids both survive (one buffer).
	if e := &b.Events[0]; len(e.TokenIDs) != 32 {
		t.Fatalf("tokens %v", e.TokenIDs)
	}
	// vLLM media CPU and STORAGE are plain strings.
	for _, m := range []string{"CPU", "STORAGE"} {
		b = evDecode(t, publisher.VLLM, evBatch(evF64(1), evU(0), evVLLMStored().with("medium", evS(m)).enc(), evVLLMRemoved().with("medium", evS(m)).enc()))
		if string(b.Events[0].Medium.Bytes) != m || string(b.Events[1].Medium.Bytes) != m {
			t.Fatalf("medium %s: %+v", m, b.Events)
		}
	}
	// SGLang >= 0.5.22 lora_name.
	b = evDecode(t, publisher.SGLang, evBatch(evF64(1), evU(0), evSGLangStored().with("lora_name", evS("adapter-A")).enc()))
	if e := &b.Events[0]; e.Err != nil || string(e.LoraName.Bytes) != "adapter-A" {
		t.Fatalf("sglang lora_name: %+v", e)
	}
	// SGLang positional metadata: session_id kept, unknown keys skipped.
	meta := evMap{{"cache_salt", evS("s2")}, {"session_id", evS("x")}, {"future", evArr(evU(1))}}.enc()
	b = evDecode(t, publisher.SGLang, evBatch(evF64(1), evU(0), evPositional(evSGLangStored().with("medium", evNil()).with("metadata", meta))))
	if e := &b.Events[0]; e.Err != nil || string(e.CacheSalt.Bytes) != "s2" || string(e.SessionID.Bytes) != "x" || e.Medium.Valid {
		t.Fatalf("metadata: %+v", e)
	}
}

func TestTextExtraKeys(t *testing.T) {
	raw := func(items ...[]byte) []byte { return evArr(items...) }
	cases := []struct {
		name   string
		raw    []byte
		lora   string
		salt   string
		hasS   bool
		wantOK bool
	}{
		{"absent", nil, "", "", false, true},
		{"all nil", raw(evNil(), evNil()), "", "", false, true},
		{"salt on block 0", raw(evArr(evS("s1")), evNil()), "", "s1", true, true},
		{"lora every block", raw(evArr(evS("a")), evArr(evS("a"))), "a", "", false, true},
		{"lora then salt", raw(evArr(evS("a"), evS("s1")), evArr(evS("a"))), "a", "s1", true, true},
		{"lora block without it", raw(evArr(evS("a")), evNil()), "a", "", false, false},
		{"other lora", raw(evArr(evS("b"))), "a", "", false, false},
		{"salt past block 0", raw(evNil(), evArr(evS("s1"))), "", "", false, false},
		{"multimodal pair", raw(evArr(evArr(evS("img"), evI(-3)))), "", "", false, false},
		{"prompt embeds digest", raw(evArr(evBin(make([]byte, 32)))), "", "", false, false},
		{"two strings", raw(evArr(evS("x"), evS("y"))), "", "", false, false},
		{"not an array", evU(1), "", "", false, false},
	}
	for _, c := range cases {
		salt, hasSalt, ok := kvevent.TextExtraKeys(c.raw, []byte(c.lora))
		if ok != c.wantOK || (ok && (hasSalt != c.hasS || string(salt) != c.salt)) {
			t.Errorf("%s: salt %q %v ok %v", c.name, salt, hasSalt, ok)
		}
	}
}
