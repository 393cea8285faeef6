package objectkey_test

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/objectkey"
)

// From hash_vectors.json: vllm_v1 sha256/bs16 block 0 (event_u64 7536218907325174565)
// and the SGLang page-0 hash of tokens 1..16, page 16 (event 8635429971592222890).
const (
	okVecVLLMHash   = "bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325"
	okVecSGLangHash = "77d735ce838418aa151bd96b5b1e78ee63860892e0a95c00fe34178442be9b07"
	okVecSGLangID   = uint64(8635429971592222890)
)

func TestParseVLLMObjectKeyVectors(t *testing.T) {
	for _, key := range []string{
		"Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + okVecVLLMHash,
		"deployA@Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + okVecVLLMHash,
		"Qwen3-8B@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + okVecVLLMHash,
	} {
		h, err := objectkey.ParseVLLM([]byte(key))
		if err != nil || h != vecHash0 {
			t.Errorf("%s: %d %v, want %d", key, h, err, vecHash0)
		}
	}
}

func TestParseVLLMObjectKeyLayouts(t *testing.T) {
	const h = okVecVLLMHash
	const low = vecHash0
	ok := []struct {
		key  string
		want uint64
	}{
		// vLLM MooncakeStoreConnector, old and new forms.
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h, low},
		{"m@tp_rank:12@pcp3@dcp4@pp_rank:7@group:2@cache_role:kv@cache_family:c1@" + h, low},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@cache_family:mixed@" + h, low},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@cache_role:state@" + h, low},
		{"a@b@c@model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + h, low},
		{"@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h, low}, // empty model field is upstream-tolerated
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@0x" + h, low},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@0X" + strings.ToUpper(h), low},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@00000000000000000000000000000001", 1},
		{"m@tp_rank:0@pcp0@dcp0@pp_rank:0@ffffffffffffffff", ^uint64(0)},
		// A cache_prefix with more '@' fields than the parser keeps in its window.
		{strings.Repeat("p@", 40) + "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@cache_role:kv@cache_family:default@" + h, low},
		// vLLM-Ascend.
		{"m@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@" + h, low},
		{"m@pcp0@dcp0@head_or_tp_rank:3@pp_rank:1@group:0@cache_role:kv@cache_family:default@layer_id:5@" + h, low},
		{"m@pcp0@dcp0@head_or_tp_rank:3@layer_id:17@" + h, low},
		{"m@pcp0@dcp0@head_or_tp_rank:3@pp_rank:0@" + h + "@12", low}, // historical hash@layer
		{strings.Repeat("x@", 30) + "m@pcp1@dcp1@head_or_tp_rank:1@pp_rank:1@group:1@cache_role:kv@cache_family:c2@" + h + "@3", low},
		// Compact Ascend layerwise.
		{"m@" + h + "@0", low},
		{"m@3@" + h + "@15", low},
		{"m@0x" + h + "@1", low},
	}
	for _, c := range ok {
		got, err := objectkey.ParseVLLM([]byte(c.key))
		if err != nil || got != c.want {
			t.Errorf("%s: %x %v, want %x", c.key, got, err, c.want)
		}
	}
	bad := []string{
		"", h, "m@" + h, "m@" + h + "@x", "@" + h + "@0", "m@g@" + h + "@0", "m@1@" + h + "@-1",
		"m@tp_rank:0@" + h,                   // too few fields
		"m@pcp0@dcp0@head_or_tp_rank:0@" + h, // labelled layouts need six fields
		"m@tp_rank:0@pcp0@dcp0@" + h,
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h[:15],                                    // too short
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h[:17],                                    // odd length
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h[:62] + "zz",                             // not hex
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@0x",                                           // prefix only
		"m@tp_rank:x@pcp0@dcp0@pp_rank:0@" + h,                                         // rank not decimal
		"m@tp_rank:-1@pcp0@dcp0@pp_rank:0@" + h,                                        // signed
		"m@tp_rank:99999999999999999999@pcp0@dcp0@pp_rank:0@" + h,                      // overflows uint64
		"m@tp_rank:0@pcp@dcp0@pp_rank:0@" + h,                                          // empty pcp rank
		"m@tp_rank:0@dcp0@pcp0@pp_rank:0@" + h,                                         // order
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:x@" + h,                                 // group not decimal
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@cache_family:a@cache_role:b@" + h,             // label order
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@group:1@" + h,                         // repeated label
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@cache_role:@" + h,                             // empty label value
		"m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + h + "@tail",                               // hash not last
		"tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + h,                                   // no model field
		"m@pcp0@dcp0@head_or_tp_rank:0@layer_id:1@pp_rank:0@" + h,                      // Ascend order
		"m@pcp0@dcp0@head_or_tp_rank:0@" + h + "@x",                                    // historical layer not decimal
		"m@pcp0@dcp0@head_or_tp_rank:0@pp_rank:0@group:0@cache_role:kv@cache_family:d", // no hash
	}
	for _, key := range bad {
		if got, err := objectkey.ParseVLLM([]byte(key)); !errors.Is(err, objectkey.ErrUnrecognized) {
			t.Errorf("%q accepted: %x %v", key, got, err)
		}
	}
}

func TestParseSGLangObjectKey(t *testing.T) {
	const h = okVecSGLangHash
	ok := []struct {
		key, logical string
	}{
		{h + "_0_k", h},
		{h + "_0_v", h},
		{h + "_1_2_k", h},
		{h + "__k", h},
		{h + "_2_k", h},
		{h, h},
		{"tagA_Qwen-Qwen3-8B_" + h + "_0_k", "tagA_Qwen-Qwen3-8B_" + h},
		{"Qwen-Qwen3-8B_" + h + "_0_draft_k", "Qwen-Qwen3-8B_" + h},
		{"ab_" + h + "_conv_0", "ab_" + h},                                    // 'ab' is hex but not 64 long
		{"cafe_" + strings.ToUpper(h) + "_0_k", "cafe_" + strings.ToUpper(h)}, // upper case
	}
	for _, c := range ok {
		got, n, err := objectkey.ParseSGLang([]byte(c.key))
		if err != nil || got != okVecSGLangID || c.key[:n] != c.logical {
			t.Errorf("%s: %x %q %v", c.key, got, c.key[:n], err)
		}
	}
	bad := []struct {
		key  string
		want error
	}{
		{"", objectkey.ErrSGLangKeyNoHash},
		{h[:63] + "_0_k", objectkey.ErrSGLangKeyNoHash},
		{h + "a_0_k", objectkey.ErrSGLangKeyNoHash},          // 65-hex run is not isolated
		{"a" + h + "_0_k", objectkey.ErrSGLangKeyNoHash},     // neither
		{"x-" + h + "_0_k", objectkey.ErrSGLangKeyPrefix},    // namespace separator must be '_'
		{h + "-0-k", objectkey.ErrSGLangKeySuffix},           // component separator must be '_'
		{"x:" + h + "_k_" + h, objectkey.ErrSGLangKeyPrefix}, // the first isolated run decides
	}
	for _, c := range bad {
		if got, n, err := objectkey.ParseSGLang([]byte(c.key)); !errors.Is(err, c.want) {
			t.Errorf("%q: %x %d %v, want %v", c.key, got, n, err, c.want)
		}
	}
}

func TestParseConnectorBlockHash(t *testing.T) {
	ok := []struct {
		in           string
		low, first64 uint64
	}{
		{okVecVLLMHash, vecHash0, 0xbea72b7d33de03c1},
		{"0x" + okVecVLLMHash, vecHash0, 0xbea72b7d33de03c1},
		{"0X" + strings.ToUpper(okVecSGLangHash), 0xfe34178442be9b07, okVecSGLangID},
		{"0123456789abcdef", 0x0123456789abcdef, 0x0123456789abcdef},
		{"0123456789abcdef000000000000002a", 0x2a, 0x0123456789abcdef},
	}
	for _, c := range ok {
		h, err := objectkey.ParseConnectorBlockHash([]byte(c.in))
		if err != nil || h.Low64 != c.low || h.First64 != c.first64 || !objectkey.HexEqualFold(h.Hex, []byte(strings.TrimPrefix(strings.TrimPrefix(c.in, "0x"), "0X"))) {
			t.Errorf("%s: %+v %v", c.in, h, err)
		}
	}
	for _, in := range []string{"", "0x", "0123456789abcde", "0123456789abcdef0", "0x0123456789abcdeg", "x0123456789abcdef", " 0123456789abcdef", "00x123456789abcdef"} {
		if h, err := objectkey.ParseConnectorBlockHash([]byte(in)); !errors.Is(err, objectkey.ErrConnectorBlockHash) {
			t.Errorf("%q accepted: %+v", in, h)
		}
	}
	if !objectkey.HexEqualFold([]byte("ABcd"), []byte("abCD")) || objectkey.HexEqualFold([]byte("ab"), []byte("abc")) ||
		objectkey.HexEqualFold([]byte("ab"), []byte("ac")) {
		t.Fatal("HexEqualFold")
	}
	// The SGLang rule: connector hash must equal the key's full 64-hex hash.
	key := []byte("ns_" + okVecSGLangHash + "_0_k")
	_, n, _ := objectkey.ParseSGLang(key)
	ch, _ := objectkey.ParseConnectorBlockHash([]byte("0x" + strings.ToUpper(okVecSGLangHash)))
	if !objectkey.HexEqualFold(ch.Hex, key[n-64:n]) {
		t.Fatal("connector hash does not match key hash")
	}
}

func TestObjectKeySharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../../testdata/vectors/hash_vectors.json") // testdata/vectors/README.md
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Mooncake map[string]string `json:"mooncake_store_key_examples"`
		SGLang   struct {
			Keys map[string]json.RawMessage `json:"hicache_mooncake_key_examples"`
		} `json:"sglang"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, key := range v.Mooncake {
		if !strings.HasPrefix(name, "vllm") {
			continue
		}
		if h, err := objectkey.ParseVLLM([]byte(key)); err != nil || h != vecHash0 {
			t.Errorf("%s: %x %v", name, h, err)
		}
		n++
	}
	var page0 string
	if err := json.Unmarshal(v.SGLang.Keys["page0_hash_hex"], &page0); err != nil {
		t.Fatal(err)
	}
	want, _ := objectkey.ParseConnectorBlockHash([]byte(page0))
	for name, rawKeys := range v.SGLang.Keys {
		var keys []string
		if json.Unmarshal(rawKeys, &keys) != nil {
			continue
		}
		for _, key := range keys {
			h, l, err := objectkey.ParseSGLang([]byte(key))
			if err != nil || h != want.First64 || h != okVecSGLangID || !strings.HasSuffix(key[:l], page0) {
				t.Errorf("%s %s: %x %d %v", name, key, h, l, err)
			}
			n++
		}
	}
	if n < 10 {
		t.Fatalf("only %d keys checked", n)
	}
}

func TestObjectKeyZeroAllocs(t *testing.T) {
	vk := []byte(strings.Repeat("p@", 20) + "m@pcp0@dcp0@head_or_tp_rank:3@pp_rank:0@" + okVecVLLMHash + "@12")
	sk := []byte("tagA_Qwen-Qwen3-8B_" + okVecSGLangHash + "_0_k")
	ch := []byte("0x" + okVecVLLMHash)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := objectkey.ParseVLLM(vk); err != nil {
			t.Fatal(err)
		}
		if _, _, err := objectkey.ParseSGLang(sk); err != nil {
			t.Fatal(err)
		}
		if _, err := objectkey.ParseConnectorBlockHash(ch); err != nil {
			t.Fatal(err)
		}
		if _, err := objectkey.ParseVLLM(sk); err == nil {
			t.Fatal("SGLang key parsed as vLLM")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs", allocs)
	}
}
