package httpapi_test

import (
	"math"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/httpapi"
)

func hhBase() htMap {
	return htMap{{"model", "deepseek"}, {"block_size", 16}, {"block_hashes", []any{uint64(1), uint64(math.MaxUint64), 7}}}
}

// hhLE encodes keys as the bin form: little-endian uint64 words.
func hhLE(keys ...uint64) []byte { return htLittleEndian(keys) }

func hhAny(keys []uint64) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}

func TestDecodeQueryByHashRequestValues(t *testing.T) {
	keys := []uint64{0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64}
	forms := map[string]any{
		"array (shortest widths)": hhAny(keys),
		"bin":                     hhLE(keys...),
	}
	// Every integer width a msgpack encoder may choose decodes to the same key.
	wide := []any{htWidth(0xcc, 7), htWidth(0xcd, 7), htWidth(0xce, 7), htWidth(0xcf, 7), htWidth(0xd0, 7), htWidth(0xd1, 7), htWidth(0xd2, 7), htWidth(0xd3, 7)}
	for name, v := range forms {
		var q httpapi.QueryByHashRequest
		body := htEnc(hhBase().with("block_hashes", v).with("tenant_id", "t1").with("lora_name", "l").
			with("instance_id", "i").with("cache_salt", "s"))
		if e := httpapi.DecodeQueryByHashRequest(body, &q); e != nil {
			t.Fatalf("%s: %v", name, e)
		}
		if !slices.Equal(q.BlockHashes, keys) {
			t.Errorf("%s: keys %v, want %v", name, q.BlockHashes, keys)
		}
		want := httpapi.QueryRequest{Model: "deepseek", LoraName: "l", TenantID: "t1", InstanceID: "i", HasInstanceID: true, CacheSalt: "s", BlockSize: 16}
		if !htQueryEqual(q.QueryRequest, want) {
			t.Errorf("%s: got %+v, want %+v", name, q.QueryRequest, want)
		}
	}
	var q httpapi.QueryByHashRequest
	if e := httpapi.DecodeQueryByHashRequest(htEnc(hhBase().with("block_hashes", wide)), &q); e != nil {
		t.Fatal(e)
	}
	if !slices.Equal(q.BlockHashes, []uint64{7, 7, 7, 7, 7, 7, 7, 7}) || q.TenantID != "default" {
		t.Errorf("widths: %v tenant %q", q.BlockHashes, q.TenantID)
	}
	// Empty list and empty bin are valid (no blocks).
	for _, v := range []any{[]any{}, []byte{}} {
		if e := httpapi.DecodeQueryByHashRequest(htEnc(hhBase().with("block_hashes", v)), &q); e != nil || len(q.BlockHashes) != 0 {
			t.Errorf("empty %T: %v %v", v, e, q.BlockHashes)
		}
	}
	// A buffer is reused and a duplicate key replaces the earlier value.
	if e := httpapi.DecodeQueryByHashRequest(htEnc(hhBase().plus("block_hashes", []any{9})), &q); e != nil || !slices.Equal(q.BlockHashes, []uint64{9}) {
		t.Errorf("duplicate: %v %v", e, q.BlockHashes)
	}
}

// The /query_by_hash errors are /query's, field block_hashes instead of token_ids.
func TestDecodeQueryByHashRequestErrors(t *testing.T) {
	b := hhBase()
	w := func(reason, field string) htWant { return htWant{reason, field, -1, ""} }
	hh := func(reason string, index int, msg string) htWant { return htWant{reason, "block_hashes", index, msg} }
	cases := []htCase{
		{"not a map", htEnc([]any{1}), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgNotMap}},
		{"malformed", []byte{0x81, 0xa1}, htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"token_ids is unknown here", htEnc(b.plus("token_ids", []any{1})), w(httpapi.ReasonUnknownField, "token_ids")},
		{"model missing", htEnc(b.without("model")), htWant{httpapi.ReasonMissing, "model", -1, "model is required"}},
		{"model empty", htEnc(b.with("model", "")), w(httpapi.ReasonInvalidValue, "model")},
		{"block_size zero", htEnc(b.with("block_size", 0)), w(httpapi.ReasonOutOfRange, "block_size")},
		{"block_size string", htEnc(b.with("block_size", "16")), w(httpapi.ReasonInvalidType, "block_size")},
		{"block_hashes missing", htEnc(b.without("block_hashes")), htWant{httpapi.ReasonMissing, "block_hashes", -1, "block_hashes is required"}},
		{"block_hashes string", htEnc(b.with("block_hashes", "1")), hh(httpapi.ReasonInvalidType, -1, "block_hashes must be an array of unsigned integers or a binary of little-endian uint64")},
		{"block_hashes nil", htEnc(b.with("block_hashes", nil)), hh(httpapi.ReasonInvalidType, -1, "")},
		{"block_hashes int", htEnc(b.with("block_hashes", 5)), hh(httpapi.ReasonInvalidType, -1, "")},
		{"bin len 12", htEnc(b.with("block_hashes", make([]byte, 12))), hh(httpapi.ReasonInvalidValue, -1, "block_hashes binary length must be a multiple of 8")},
		{"bin len 4", htEnc(b.with("block_hashes", make([]byte, 4))), hh(httpapi.ReasonInvalidValue, -1, "")},
		{"string element", htEnc(b.with("block_hashes", []any{1, "x"})), hh(httpapi.ReasonInvalidType, 1, "block_hashes element must be an integer")},
		{"float element", htEnc(b.with("block_hashes", []any{1.0})), hh(httpapi.ReasonInvalidType, 0, "")},
		{"negative element", htEnc(b.with("block_hashes", []any{1, 2, -1})), hh(httpapi.ReasonOutOfRange, 2, "block_hashes element is outside the uint64 range")},
		{"int64 min element", htEnc(b.with("block_hashes", []any{htWidth(0xd3, math.MinInt64)})), hh(httpapi.ReasonOutOfRange, 0, "")},
		{"first bad wins", htEnc(b.with("block_hashes", []any{1, -1, "x"})), hh(httpapi.ReasonOutOfRange, 1, "")},
		{"bad element then malformed tail", htEnc(b.with("block_hashes", []any{"x", htRaw{0xc1}})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated array", htEnc(b.with("block_hashes", htRaw{0x93, 0x01, 0x02})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated uint64", htEnc(b.with("block_hashes", htRaw{0x91, 0xcf, 0x01, 0x02})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"count beyond body", htEnc(b.with("block_hashes", htRaw{0xdd, 0x7f, 0xff, 0xff, 0xff, 0x01})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated bin", htEnc(b.with("block_hashes", htRaw{0xc4, 0x10, 1, 0, 0, 0})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"tenant_id int", htEnc(b.with("tenant_id", 1)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"cache_salt int", htEnc(b.with("cache_salt", 1)), w(httpapi.ReasonInvalidType, "cache_salt")},
		{"instance_id nil", htEnc(b.with("instance_id", nil)), w(httpapi.ReasonInvalidType, "instance_id")},
		{"block_size before block_hashes", htEnc(htMap{{"block_hashes", "x"}, {"model", "m"}, {"block_size", -1}}), w(httpapi.ReasonOutOfRange, "block_size")},
		{"block_hashes before tenant_id", htEnc(b.with("tenant_id", 1).with("block_hashes", []any{"x"})), hh(httpapi.ReasonInvalidType, 0, "")},
		{"unknown before element error", htEnc(b.with("block_hashes", []any{"x"}).plus("extra", 1)), w(httpapi.ReasonUnknownField, "extra")},
	}
	for _, c := range cases {
		var q httpapi.QueryByHashRequest
		htCheck(t, c.name, httpapi.DecodeQueryByHashRequest(c.body, &q), c.want)
	}
	// /query keeps calling block_hashes an unknown field.
	var q httpapi.QueryRequest
	htCheck(t, "query with block_hashes", httpapi.DecodeQueryRequest(htEnc(htQueryBase().plus("block_hashes", []any{1})), &q),
		htWant{httpapi.ReasonUnknownField, "block_hashes", -1, ""})
}

func TestDecodeQueryByHashRequestZeroAllocs(t *testing.T) {
	keys := make([]uint64, 2048)
	for i := range keys {
		keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	full := hhBase().with("lora_name", "l").with("tenant_id", "t").with("instance_id", "i").with("cache_salt", "s")
	bodies := map[string][]byte{
		"array": htEnc(full.with("block_hashes", hhAny(keys))),
		"bin":   htEnc(full.with("block_hashes", hhLE(keys...))),
	}
	var q httpapi.QueryByHashRequest
	htWantNoAllocs(t, bodies, func(body []byte) *httpapi.RequestError { return httpapi.DecodeQueryByHashRequest(body, &q) })
}
