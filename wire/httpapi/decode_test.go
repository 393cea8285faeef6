package httpapi_test

import (
	"bytes"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/conductor-go/conductor/wire/httpapi"
)

// htWant is the error a bad body must produce. msg is checked only when set; index -1
// means the error must carry none.
type htWant struct {
	reason, field string
	index         int
	msg           string
}

type htCase struct {
	name string
	body []byte
	want htWant
}

func htCheck(t *testing.T, name string, got *httpapi.RequestError, want htWant) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: accepted, want %s field=%q index=%d", name, want.reason, want.field, want.index)
		return
	}
	if got.Reason != want.reason || got.Field != want.field || got.Index != want.index {
		t.Errorf("%s: got reason=%s field=%q index=%d (%q), want reason=%s field=%q index=%d",
			name, got.Reason, got.Field, got.Index, got.Msg, want.reason, want.field, want.index)
	}
	if want.msg != "" && got.Msg != want.msg {
		t.Errorf("%s: msg %q, want %q", name, got.Msg, want.msg)
	}
	if got.Msg == "" {
		t.Errorf("%s: empty message", name)
	}
}

// Routes share the body-level rules; each is driven through the same table.
type htRoute struct {
	name   string
	valid  htMap
	decode func([]byte) *httpapi.RequestError
}

func htRoutes() []htRoute {
	return []htRoute{
		{"query", htQueryBase(), func(b []byte) *httpapi.RequestError {
			var q httpapi.QueryRequest
			return httpapi.DecodeQueryRequest(b, &q)
		}},
		{"register", htRegisterBase(), func(b []byte) *httpapi.RequestError {
			_, e := httpapi.DecodeRegisterRequest(b)
			return e
		}},
		{"unregister", htUnregisterBase(), func(b []byte) *httpapi.RequestError {
			_, e := httpapi.DecodeUnregisterRequest(b)
			return e
		}},
	}
}

func htQueryBase() htMap {
	return htMap{{"model", "deepseek"}, {"block_size", 16}, {"token_ids", []int32{101, 15, 100}}}
}

func htProfileBase() htMap {
	return htMap{{"strategy", "vllm_v1"}, {"algorithm", "sha256_cbor"}, {"python_hash_seed", "0"}, {"index_projection", "low64_be"}}
}

func htRegisterBase() htMap {
	return htMap{
		{"endpoint", "tcp://10.0.0.1:5557"}, {"replay_endpoint", "tcp://10.0.0.1:5558"},
		{"type", "vLLM"}, {"modelname", "deepseek"}, {"lora_name", "lora-a"}, {"tenant_id", "t1"},
		{"instance_id", "vllm-prefill-node1"}, {"block_size", 16}, {"dp_rank", 3},
		{"cache_group", nil}, {"hash_profile", htProfileBase()},
	}
}

func htUnregisterBase() htMap {
	return htMap{{"instance_id", "vllm-prefill-node1"}, {"tenant_id", "t1"}, {"dp_rank", 2}}
}

const (
	htMsgInvalid = "Invalid msgpack object"
	htMsgNotMap  = "request body must be a msgpack map"
	htMsgKeys    = "map keys must be strings"
)

// htDeep nests depth arrays, the shape that makes a recursive skipper dive.
func htDeep(depth int) htRaw {
	b := bytes.Repeat([]byte{0x91}, depth)
	return append(b, 0x01)
}

func TestHTTPBodyShapeErrors(t *testing.T) {
	for _, r := range htRoutes() {
		valid := htEnc(r.valid)
		invalid := htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}
		cases := []htCase{
			{"empty body", nil, invalid},
			{"never-used byte", []byte{0xc1}, invalid},
			{"truncated map", valid[:len(valid)-1], invalid},
			{"map header only", []byte{0x83}, invalid},
			{"trailing byte", append(slices.Clone(valid), 0x00), invalid},
			{"two maps", append(slices.Clone(valid), valid...), invalid},
			{"array root", htEnc([]any{1, 2}), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgNotMap}},
			{"string root", htEnc("model"), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgNotMap}},
			{"nil root", htEnc(nil), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgNotMap}},
			{"truncated array root", []byte{0x92, 0x01}, invalid},
			{"array root with trailing", []byte{0x91, 0x01, 0x01}, invalid},
			{"int key", htEnc(r.valid.plus(7, "x")), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgKeys}},
			{"bin key", htEnc(r.valid.plus([]byte("model"), "x")), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgKeys}},
			{"map key", htEnc(r.valid.plus(htMap{{"a", 1}}, "x")), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgKeys}},
			// Upstream parses the whole body first: a malformed tail beats an earlier bad key.
			{"int key then truncation", htEnc(htMap{{1, 2}, {"model", "m"}})[:6], invalid},
			{"unknown field", htEnc(r.valid.plus("bogus", 1)),
				htWant{httpapi.ReasonUnknownField, "bogus", -1, "unsupported request field: bogus"}},
			{"unknown field first", htEnc(append(htMap{{"zzz", nil}}, r.valid...)), htWant{httpapi.ReasonUnknownField, "zzz", -1, ""}},
			{"two unknown fields report the first", htEnc(r.valid.plus("b", 1).plus("a", 1)), htWant{httpapi.ReasonUnknownField, "b", -1, ""}},
			{"non-string key beats unknown", htEnc(r.valid.plus("bogus", 1).plus(1, 1)), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgKeys}},
			{"unknown beats missing", htEnc(htMap{{"bogus", 1}}), htWant{httpapi.ReasonUnknownField, "bogus", -1, ""}},
			{"malformed tail beats unknown", append(htEnc(r.valid.plus("bogus", 1)), 0xc1), invalid},
			{"deep unknown value", htEnc(r.valid.plus("bogus", htDeep(200000))), htWant{httpapi.ReasonUnknownField, "bogus", -1, ""}},
			{"deep truncated value", htEnc(r.valid.plus("bogus", htDeep(200000)[:200000])), invalid},
			{"huge declared array", htEnc(r.valid.plus("bogus", htRaw{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01})), invalid},
			{"huge declared map", append([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}, valid[1:]...), invalid},
			{"huge declared str", htEnc(r.valid.plus("bogus", htRaw{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'})), invalid},
			{"ext value is parsable", htEnc(r.valid.plus("bogus", htRaw{0xd4, 0x01, 0x02})), htWant{httpapi.ReasonUnknownField, "bogus", -1, ""}},
		}
		for _, c := range cases {
			htCheck(t, r.name+"/"+c.name, r.decode(c.body), c.want)
		}
		if e := r.decode(valid); e != nil {
			t.Errorf("%s: valid base rejected: %v", r.name, e)
		}
	}
}

func TestDecodeQueryRequestErrors(t *testing.T) {
	b := htQueryBase()
	w := func(reason, field string) htWant { return htWant{reason, field, -1, ""} }
	tok := func(reason string, index int, msg string) htWant { return htWant{reason, "token_ids", index, msg} }
	const posMsg = "block_size must be a positive integer"
	cases := []htCase{
		{"model missing", htEnc(b.without("model")), htWant{httpapi.ReasonMissing, "model", -1, "model is required"}},
		{"model int", htEnc(b.with("model", 5)), htWant{httpapi.ReasonInvalidType, "model", -1, "model must be a string"}},
		{"model nil", htEnc(b.with("model", nil)), w(httpapi.ReasonInvalidType, "model")},
		{"model bin", htEnc(b.with("model", []byte("m"))), w(httpapi.ReasonInvalidType, "model")},
		{"model empty", htEnc(b.with("model", "")), htWant{httpapi.ReasonInvalidValue, "model", -1, "model must not be empty"}},
		{"modelname is not model", htEnc(b.without("model").plus("modelname", "m")), w(httpapi.ReasonUnknownField, "modelname")},
		{"block_size missing", htEnc(b.without("block_size")), htWant{httpapi.ReasonMissing, "block_size", -1, "block_size is required"}},
		{"block_size string", htEnc(b.with("block_size", "16")), htWant{httpapi.ReasonInvalidType, "block_size", -1, "block_size must be an integer"}},
		{"block_size float", htEnc(b.with("block_size", 16.0)), w(httpapi.ReasonInvalidType, "block_size")},
		{"block_size bool", htEnc(b.with("block_size", true)), w(httpapi.ReasonInvalidType, "block_size")},
		{"block_size nil", htEnc(b.with("block_size", nil)), w(httpapi.ReasonInvalidType, "block_size")},
		{"block_size zero", htEnc(b.with("block_size", 0)), htWant{httpapi.ReasonOutOfRange, "block_size", -1, posMsg}},
		{"block_size negative", htEnc(b.with("block_size", -16)), htWant{httpapi.ReasonOutOfRange, "block_size", -1, posMsg}},
		{"block_size int64 min", htEnc(b.with("block_size", htWidth(0xd3, math.MinInt64))), w(httpapi.ReasonOutOfRange, "block_size")},
		{"block_size above int64", htEnc(b.with("block_size", uint64(math.MaxInt64)+1)), htWant{httpapi.ReasonOutOfRange, "block_size", -1, posMsg}},
		{"block_size uint64 max", htEnc(b.with("block_size", htMaxUint64)), w(httpapi.ReasonOutOfRange, "block_size")},
		{"token_ids missing", htEnc(b.without("token_ids")), htWant{httpapi.ReasonMissing, "token_ids", -1, "token_ids is required"}},
		{"token_ids string", htEnc(b.with("token_ids", "1 2 3")), tok(httpapi.ReasonInvalidType, -1, "")},
		{"token_ids nil", htEnc(b.with("token_ids", nil)), tok(httpapi.ReasonInvalidType, -1, "")},
		{"token_ids int", htEnc(b.with("token_ids", 5)), tok(httpapi.ReasonInvalidType, -1, "")},
		{"token_ids map", htEnc(b.with("token_ids", htMap{{"0", 1}})), tok(httpapi.ReasonInvalidType, -1, "")},
		{"token_ids bin len 5", htEnc(b.with("token_ids", []byte{1, 0, 0, 0, 2})), tok(httpapi.ReasonInvalidValue, -1, "token_ids binary length must be a multiple of 4")},
		{"token_ids bin len 3", htEnc(b.with("token_ids", []byte{1, 0, 0})), tok(httpapi.ReasonInvalidValue, -1, "")},
		{"token string element", htEnc(b.with("token_ids", []any{1, "x", 3})), tok(httpapi.ReasonInvalidType, 1, "token_ids element must be an integer")},
		{"token float element", htEnc(b.with("token_ids", []any{1.0})), tok(httpapi.ReasonInvalidType, 0, "")},
		{"token nil element", htEnc(b.with("token_ids", []any{1, 2, nil})), tok(httpapi.ReasonInvalidType, 2, "")},
		{"token array element", htEnc(b.with("token_ids", []any{1, []any{2}})), tok(httpapi.ReasonInvalidType, 1, "")},
		{"token above int32", htEnc(b.with("token_ids", []any{1, 2, math.MaxInt32 + 1})), tok(httpapi.ReasonOutOfRange, 2, "token_ids element is outside the int32 range")},
		{"token below int32", htEnc(b.with("token_ids", []any{math.MinInt32 - 1})), tok(httpapi.ReasonOutOfRange, 0, "")},
		{"token uint32 above int32", htEnc(b.with("token_ids", []any{htWidth(0xce, math.MaxInt32+1)})), tok(httpapi.ReasonOutOfRange, 0, "")},
		{"token uint32 above int32 mid-array", htEnc(b.with("token_ids", []any{7, htWidth(0xce, math.MaxUint32), 1, 2, 3, 4, 5, 6, 7, 8})), tok(httpapi.ReasonOutOfRange, 1, "")},
		{"token uint64 max", htEnc(b.with("token_ids", []any{7, htMaxUint64})), tok(httpapi.ReasonOutOfRange, 1, "")},
		{"token int64 min", htEnc(b.with("token_ids", []any{htWidth(0xd3, math.MinInt64)})), tok(httpapi.ReasonOutOfRange, 0, "")},
		{"first bad token wins", htEnc(b.with("token_ids", []any{1, math.MaxInt32 + 1, "x"})), tok(httpapi.ReasonOutOfRange, 1, "")},
		{"bad token then malformed tail", htEnc(b.with("token_ids", []any{"x", htRaw{0xc1}})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated token array", htEnc(b.with("token_ids", htRaw{0x93, 0x01, 0x02})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated token", htEnc(b.with("token_ids", htRaw{0x91, 0xcd, 0x01})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"token array count beyond body", htEnc(b.with("token_ids", htRaw{0xdd, 0x7f, 0xff, 0xff, 0xff, 0x01})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"truncated token bin", htEnc(b.with("token_ids", htRaw{0xc4, 0x08, 1, 0, 0, 0})), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgInvalid}},
		{"tenant_id int", htEnc(b.with("tenant_id", 1)), htWant{httpapi.ReasonInvalidType, "tenant_id", -1, "tenant_id must be a string"}},
		{"tenant_id nil", htEnc(b.with("tenant_id", nil)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"lora_name int", htEnc(b.with("lora_name", 1)), w(httpapi.ReasonInvalidType, "lora_name")},
		{"lora_name nil", htEnc(b.with("lora_name", nil)), w(httpapi.ReasonInvalidType, "lora_name")},
		{"cache_salt int", htEnc(b.with("cache_salt", 1)), htWant{httpapi.ReasonInvalidType, "cache_salt", -1, "cache_salt must be a string or nil"}},
		{"cache_salt bin", htEnc(b.with("cache_salt", []byte("s"))), w(httpapi.ReasonInvalidType, "cache_salt")},
		{"instance_id int", htEnc(b.with("instance_id", 1)), w(httpapi.ReasonInvalidType, "instance_id")},
		{"instance_id nil", htEnc(b.with("instance_id", nil)), w(httpapi.ReasonInvalidType, "instance_id")},
		// Validation order follows upstream: model, block_size, token_ids, tenant_id,
		// lora_name, cache_salt, instance_id.
		{"model before block_size", htEnc(htMap{{"block_size", 0}, {"model", ""}, {"token_ids", []any{}}}), w(httpapi.ReasonInvalidValue, "model")},
		{"block_size before token_ids", htEnc(htMap{{"token_ids", "x"}, {"model", "m"}, {"block_size", -1}}), w(httpapi.ReasonOutOfRange, "block_size")},
		{"token_ids before tenant_id", htEnc(b.with("tenant_id", 1).with("token_ids", []any{"x"})), tok(httpapi.ReasonInvalidType, 0, "")},
		{"tenant before lora", htEnc(b.with("lora_name", 1).with("tenant_id", 1)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"lora before salt", htEnc(b.with("cache_salt", 1).with("lora_name", 1)), w(httpapi.ReasonInvalidType, "lora_name")},
		{"salt before instance", htEnc(b.with("instance_id", 1).with("cache_salt", 1)), w(httpapi.ReasonInvalidType, "cache_salt")},
		{"unknown before token error", htEnc(b.with("token_ids", []any{"x"}).plus("extra", 1)), w(httpapi.ReasonUnknownField, "extra")},
		// Duplicate keys: the last value is the one validated.
		{"duplicate model, last empty", htEnc(b.plus("model", "")), w(httpapi.ReasonInvalidValue, "model")},
		{"duplicate token_ids, last bad", htEnc(b.plus("token_ids", []any{"x"})), tok(httpapi.ReasonInvalidType, 0, "")},
	}
	for _, c := range cases {
		var q httpapi.QueryRequest
		htCheck(t, c.name, httpapi.DecodeQueryRequest(c.body, &q), c.want)
	}
}

func TestDecodeQueryRequestValues(t *testing.T) {
	var q httpapi.QueryRequest
	body := htEnc(htQueryBase())
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil {
		t.Fatal(e)
	}
	want := httpapi.QueryRequest{Model: "deepseek", TenantID: "default", BlockSize: 16, Tokens: []int32{101, 15, 100}}
	if !htQueryEqual(q, want) {
		t.Fatalf("got %+v, want %+v", q, want)
	}

	body = htEnc(htQueryBase().with("lora_name", "lora-a").with("tenant_id", "t1").
		with("instance_id", "inst-1").with("cache_salt", "salty"))
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil {
		t.Fatal(e)
	}
	want = httpapi.QueryRequest{Model: "deepseek", LoraName: "lora-a", TenantID: "t1", InstanceID: "inst-1",
		HasInstanceID: true, CacheSalt: "salty", BlockSize: 16, Tokens: []int32{101, 15, 100}}
	if !htQueryEqual(q, want) {
		t.Fatalf("got %+v, want %+v", q, want)
	}
	// The strings alias the body instead of copying it.
	lo, hi := uintptr(unsafe.Pointer(&body[0])), uintptr(unsafe.Pointer(&body[len(body)-1]))
	for _, s := range []string{q.Model, q.LoraName, q.TenantID, q.InstanceID, q.CacheSalt} {
		if p := uintptr(unsafe.Pointer(unsafe.StringData(s))); p < lo || p > hi {
			t.Errorf("%q does not alias the body", s)
		}
	}

	// Defaults and the values that mean "none".
	body = htEnc(htQueryBase().with("tenant_id", "").with("cache_salt", nil).with("instance_id", "").with("lora_name", ""))
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil {
		t.Fatal(e)
	}
	want = httpapi.QueryRequest{Model: "deepseek", TenantID: "default", HasInstanceID: true, BlockSize: 16, Tokens: []int32{101, 15, 100}}
	if !htQueryEqual(q, want) {
		t.Fatalf("got %+v, want %+v", q, want)
	}
	body = htEnc(htQueryBase().with("cache_salt", ""))
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil || q.CacheSalt != "" {
		t.Fatalf("empty salt: %v %q", e, q.CacheSalt)
	}
}

func htQueryEqual(a, b httpapi.QueryRequest) bool {
	return a.Model == b.Model && a.LoraName == b.LoraName && a.TenantID == b.TenantID &&
		a.InstanceID == b.InstanceID && a.HasInstanceID == b.HasInstanceID && a.CacheSalt == b.CacheSalt &&
		a.BlockSize == b.BlockSize && slices.Equal(a.Tokens, b.Tokens)
}

func TestDecodeQueryRequestIntWidths(t *testing.T) {
	elems := []struct {
		raw  any
		want int32
	}{
		{htRaw{0x00}, 0}, {htRaw{0x7f}, 127}, {htRaw{0xe0}, -32}, {htRaw{0xff}, -1},
		{htWidth(0xcc, 255), 255}, {htWidth(0xcd, 65535), 65535}, {htWidth(0xce, math.MaxInt32), math.MaxInt32},
		{htWidth(0xcf, 7), 7}, {htWidth(0xcf, math.MaxInt32), math.MaxInt32},
		{htWidth(0xd0, -128), -128}, {htWidth(0xd0, 5), 5}, {htWidth(0xd1, -32768), -32768},
		{htWidth(0xd2, math.MinInt32), math.MinInt32}, {htWidth(0xd2, math.MaxInt32), math.MaxInt32},
		{htWidth(0xd3, math.MinInt32), math.MinInt32}, {htWidth(0xd3, 42), 42},
	}
	var arr []any
	var want []int32
	for _, e := range elems {
		arr = append(arr, e.raw)
		want = append(want, e.want)
	}
	var q httpapi.QueryRequest
	if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", arr)), &q); e != nil {
		t.Fatal(e)
	}
	if !slices.Equal(q.Tokens, want) {
		t.Fatalf("tokens %v, want %v", q.Tokens, want)
	}
	// The same values as a little-endian bin.
	if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", htLE(want...))), &q); e != nil {
		t.Fatal(e)
	}
	if !slices.Equal(q.Tokens, want) {
		t.Fatalf("bin tokens %v, want %v", q.Tokens, want)
	}
	// bin16 and bin32 headers too.
	bin16 := append([]byte{0xc5, 0x00, 0x08}, htLE(1, -2)...)
	bin32 := append([]byte{0xc6, 0, 0, 0, 0x08}, htLE(3, math.MaxInt32)...)
	for raw, w := range map[string][]int32{string(bin16): {1, -2}, string(bin32): {3, math.MaxInt32}} {
		if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", htRaw(raw))), &q); e != nil || !slices.Equal(q.Tokens, w) {
			t.Fatalf("bin header %x: %v %v", raw[0], e, q.Tokens)
		}
	}

	for _, c := range []struct {
		raw  any
		want int64
	}{
		{htRaw{0x01}, 1}, {htWidth(0xcc, 200), 200}, {htWidth(0xcd, 4096), 4096}, {htWidth(0xce, 1<<20), 1 << 20},
		{htWidth(0xcf, math.MaxInt64), math.MaxInt64}, {htWidth(0xd0, 16), 16}, {htWidth(0xd1, 300), 300},
		{htWidth(0xd2, 70000), 70000}, {htWidth(0xd3, 1<<40), 1 << 40},
	} {
		if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("block_size", c.raw)), &q); e != nil || q.BlockSize != c.want {
			t.Errorf("block_size %x: %v %d, want %d", htEnc(c.raw), e, q.BlockSize, c.want)
		}
	}
}

func TestDecodeQueryRequestTokensReuseAndDuplicates(t *testing.T) {
	var q httpapi.QueryRequest
	if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", []int32{9, 8, 7, 6})), &q); e != nil {
		t.Fatal(e)
	}
	buf := q.Tokens
	// An array is decoded into the request's own buffer, reused by the next array (also
	// after a bin, which is read in place and leaves the buffer alone).
	for _, v := range []any{htLE(1, 2), []int32{5, 4, 3}} {
		if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", v)), &q); e != nil {
			t.Fatal(e)
		}
	}
	if &q.Tokens[0] != &buf[0] || !slices.Equal(q.Tokens, []int32{5, 4, 3}) {
		t.Error("array tokens not decoded into the request's reused buffer")
	}
	// Empty token lists are valid in both forms, and leave no stale tokens behind.
	for _, v := range []any{[]any{}, []byte{}} {
		if e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", v)), &q); e != nil || len(q.Tokens) != 0 {
			t.Errorf("empty %T: %v %v", v, e, q.Tokens)
		}
	}
	// A later token_ids replaces an earlier one, whatever their forms.
	body := htEnc(htQueryBase().with("token_ids", []any{"bad"}).plus("token_ids", htLE(5, 6)))
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil || !slices.Equal(q.Tokens, []int32{5, 6}) {
		t.Errorf("duplicate token_ids: %v %v", e, q.Tokens)
	}
	body = htEnc(htQueryBase().with("token_ids", htLE(1, 2, 3)).plus("token_ids", []int32{4}).plus("model", "m2"))
	if e := httpapi.DecodeQueryRequest(body, &q); e != nil || !slices.Equal(q.Tokens, []int32{4}) || q.Model != "m2" {
		t.Errorf("duplicate keys: %v %v %q", e, q.Tokens, q.Model)
	}
}

func TestDecodeRegisterRequest(t *testing.T) {
	body := htEnc(htRegisterBase())
	req, e := httpapi.DecodeRegisterRequest(body)
	if e != nil {
		t.Fatal(e)
	}
	want := httpapi.RegisterRequest{
		Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558", Type: "vLLM",
		ModelName: "deepseek", LoraName: "lora-a", TenantID: "t1", InstanceID: "vllm-prefill-node1",
		BlockSize: 16, DPRank: 3,
		HashProfile: httpapi.HashProfileFields{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0",
			IndexProjection: "low64_be", HasSeed: true},
	}
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("got %+v\nwant %+v", req, want)
	}
	// Strings are copies: the request buffer may be reused.
	for i := range body {
		body[i] = 'X'
	}
	if !reflect.DeepEqual(req, want) {
		t.Fatal("decoded strings alias the body")
	}

	// Optional fields absent: defaults.
	minimal := htRegisterBase().without("replay_endpoint").without("lora_name").without("tenant_id").without("cache_group")
	req, e = httpapi.DecodeRegisterRequest(htEnc(minimal))
	if e != nil || req.ReplayEndpoint != "" || req.LoraName != "" || req.TenantID != "default" || req.CacheGroup != nil {
		t.Fatalf("minimal: %v %+v", e, req)
	}
	req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("tenant_id", "")))
	if e != nil || req.TenantID != "default" {
		t.Fatalf("empty tenant: %v %q", e, req.TenantID)
	}
	for _, typ := range []string{"vLLM", "SGLang", "Mooncake"} {
		if req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("type", typ))); e != nil || req.Type != typ {
			t.Errorf("type %s: %v", typ, e)
		}
	}
	// cache_group 0 in any width.
	for _, raw := range []any{0, htWidth(0xcc, 0), htWidth(0xcf, 0), htWidth(0xd3, 0)} {
		req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("cache_group", raw)))
		if e != nil || req.CacheGroup == nil || *req.CacheGroup != 0 {
			t.Errorf("cache_group %x: %v %v", htEnc(raw), e, req.CacheGroup)
		}
	}
	// dp_rank and block_size in every width, up to their limits.
	for _, c := range []struct {
		raw  any
		want int
	}{{htRaw{0}, 0}, {htWidth(0xcc, 255), 255}, {htWidth(0xcd, 1000), 1000}, {htWidth(0xce, math.MaxInt32), math.MaxInt32},
		{htWidth(0xcf, 12), 12}, {htWidth(0xd0, 1), 1}, {htWidth(0xd1, 2), 2}, {htWidth(0xd2, math.MaxInt32), math.MaxInt32}, {htWidth(0xd3, 9), 9}} {
		req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("dp_rank", c.raw)))
		if e != nil || req.DPRank != c.want {
			t.Errorf("dp_rank %x: %v %d", htEnc(c.raw), e, req.DPRank)
		}
		req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("block_size", c.raw)))
		if c.want == 0 {
			htCheck(t, "block_size 0", e, htWant{httpapi.ReasonOutOfRange, "block_size", -1, "block_size must be greater than zero"})
		} else if e != nil || req.BlockSize != int64(c.want) {
			t.Errorf("block_size %x: %v %d", htEnc(c.raw), e, req.BlockSize)
		}
	}
	req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("block_size", uint64(math.MaxInt64))))
	if e != nil || req.BlockSize != math.MaxInt64 {
		t.Errorf("block_size int64 max: %v %d", e, req.BlockSize)
	}
	// SGLang strategies may omit the seed; when sent it is kept.
	for _, strat := range []string{"sglang", "sglang_bigram"} {
		p := htMap{{"strategy", strat}, {"algorithm", "sha256_raw"}, {"index_projection", "first64_be"}}
		req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("type", "SGLang").with("hash_profile", p)))
		if e != nil || req.HashProfile.HasSeed || req.HashProfile.Strategy != strat || req.HashProfile.IndexProjection != "first64_be" {
			t.Errorf("%s without seed: %v %+v", strat, e, req.HashProfile)
		}
		req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("hash_profile", p.with("python_hash_seed", ""))))
		if e != nil || !req.HashProfile.HasSeed || req.HashProfile.PythonHashSeed != "" {
			t.Errorf("%s with empty seed: %v %+v", strat, e, req.HashProfile)
		}
	}
	// Shape only: an unknown strategy or a malformed seed is the resolver's business.
	p := htProfileBase().with("strategy", "md5").with("python_hash_seed", "not-a-number")
	if req, e = httpapi.DecodeRegisterRequest(htEnc(htRegisterBase().with("hash_profile", p))); e != nil || req.HashProfile.Strategy != "md5" {
		t.Errorf("resolution leaked into decoding: %v", e)
	}
	// Duplicates: last wins, in the nested profile too.
	dup := htRegisterBase().plus("modelname", "m2").with("hash_profile", htProfileBase().plus("algorithm", "sha256"))
	if req, e = httpapi.DecodeRegisterRequest(htEnc(dup)); e != nil || req.ModelName != "m2" || req.HashProfile.Algorithm != "sha256" {
		t.Errorf("duplicates: %v %+v", e, req)
	}
}

func TestDecodeRegisterRequestErrors(t *testing.T) {
	b := htRegisterBase()
	prof := htProfileBase()
	w := func(reason, field string) htWant { return htWant{reason, field, -1, ""} }
	hp := func(m htMap) []byte { return htEnc(b.with("hash_profile", m)) }
	var cases []htCase
	for _, f := range []string{"endpoint", "type", "modelname", "instance_id"} {
		cases = append(cases,
			htCase{f + " missing", htEnc(b.without(f)), htWant{httpapi.ReasonMissing, f, -1, f + " is required"}},
			htCase{f + " int", htEnc(b.with(f, 1)), htWant{httpapi.ReasonInvalidType, f, -1, f + " must be a string"}},
			htCase{f + " nil", htEnc(b.with(f, nil)), w(httpapi.ReasonInvalidType, f)},
			htCase{f + " empty", htEnc(b.with(f, "")), htWant{httpapi.ReasonInvalidValue, f, -1, f + " must not be empty"}})
	}
	for _, f := range []string{"replay_endpoint", "lora_name", "tenant_id"} {
		cases = append(cases,
			htCase{f + " int", htEnc(b.with(f, 1)), htWant{httpapi.ReasonInvalidType, f, -1, f + " must be a string"}},
			htCase{f + " nil", htEnc(b.with(f, nil)), w(httpapi.ReasonInvalidType, f)})
	}
	const typeMsg = "type must be vLLM, SGLang or Mooncake"
	const bsMsg = "block_size must be greater than zero"
	const rankMsg = "dp_rank must be a non-negative int"
	cases = append(cases, []htCase{
		{"type lowercase", htEnc(b.with("type", "vllm")), htWant{httpapi.ReasonInvalidValue, "type", -1, typeMsg}},
		{"type unknown", htEnc(b.with("type", "TensorRT")), htWant{httpapi.ReasonInvalidValue, "type", -1, typeMsg}},
		{"block_size missing", htEnc(b.without("block_size")), htWant{httpapi.ReasonMissing, "block_size", -1, "block_size is required"}},
		{"block_size string", htEnc(b.with("block_size", "16")), htWant{httpapi.ReasonInvalidType, "block_size", -1, "block_size must be an integer"}},
		{"block_size float", htEnc(b.with("block_size", 16.0)), w(httpapi.ReasonInvalidType, "block_size")},
		{"block_size zero", htEnc(b.with("block_size", 0)), htWant{httpapi.ReasonOutOfRange, "block_size", -1, bsMsg}},
		{"block_size negative", htEnc(b.with("block_size", htWidth(0xd0, -1))), htWant{httpapi.ReasonOutOfRange, "block_size", -1, bsMsg}},
		{"block_size above int64", htEnc(b.with("block_size", htMaxUint64)), htWant{httpapi.ReasonOutOfRange, "block_size", -1, bsMsg}},
		{"dp_rank missing", htEnc(b.without("dp_rank")), htWant{httpapi.ReasonMissing, "dp_rank", -1, "dp_rank is required"}},
		{"dp_rank string", htEnc(b.with("dp_rank", "0")), htWant{httpapi.ReasonInvalidType, "dp_rank", -1, "dp_rank must be an integer"}},
		{"dp_rank nil", htEnc(b.with("dp_rank", nil)), w(httpapi.ReasonInvalidType, "dp_rank")},
		{"dp_rank float", htEnc(b.with("dp_rank", 0.0)), w(httpapi.ReasonInvalidType, "dp_rank")},
		{"dp_rank negative", htEnc(b.with("dp_rank", -1)), htWant{httpapi.ReasonOutOfRange, "dp_rank", -1, rankMsg}},
		{"dp_rank above int32", htEnc(b.with("dp_rank", math.MaxInt32+1)), htWant{httpapi.ReasonOutOfRange, "dp_rank", -1, rankMsg}},
		{"dp_rank uint64 max", htEnc(b.with("dp_rank", htMaxUint64)), w(httpapi.ReasonOutOfRange, "dp_rank")},
		{"cache_group string", htEnc(b.with("cache_group", "0")), htWant{httpapi.ReasonInvalidType, "cache_group", -1, "cache_group must be an integer or nil"}},
		{"cache_group float", htEnc(b.with("cache_group", 0.0)), w(httpapi.ReasonInvalidType, "cache_group")},
		{"cache_group bool", htEnc(b.with("cache_group", false)), w(httpapi.ReasonInvalidType, "cache_group")},
		{"cache_group 1", htEnc(b.with("cache_group", 1)), htWant{httpapi.ReasonUnsupported, "cache_group", -1, "only cache group zero is supported"}},
		{"cache_group -1", htEnc(b.with("cache_group", -1)), w(httpapi.ReasonUnsupported, "cache_group")},
		{"cache_group uint64 max", htEnc(b.with("cache_group", htMaxUint64)), w(httpapi.ReasonUnsupported, "cache_group")},
		{"hash_profile missing", htEnc(b.without("hash_profile")), htWant{httpapi.ReasonMissing, "hash_profile", -1, "hash_profile is required"}},
		{"hash_profile string", htEnc(b.with("hash_profile", "vllm_v1")), htWant{httpapi.ReasonInvalidType, "hash_profile", -1, "hash_profile must be a map"}},
		{"hash_profile nil", htEnc(b.with("hash_profile", nil)), w(httpapi.ReasonInvalidType, "hash_profile")},
		{"hash_profile array", htEnc(b.with("hash_profile", []any{"vllm_v1"})), w(httpapi.ReasonInvalidType, "hash_profile")},
		{"root_digest rejected", hp(prof.plus("root_digest", strings.Repeat("0", 64))),
			htWant{httpapi.ReasonUnknownField, "root_digest", -1, "unsupported request field: hash_profile.root_digest"}},
		{"profile unknown key", hp(prof.plus("seed", "0")), w(httpapi.ReasonUnknownField, "seed")},
		{"profile int key", hp(prof.plus(1, "0")), htWant{httpapi.ReasonInvalidMsgpack, "", -1, htMsgKeys}},
		{"profile unknown before missing", hp(htMap{{"x", 1}}), w(httpapi.ReasonUnknownField, "x")},
		{"empty profile", hp(htMap{}), htWant{httpapi.ReasonMissing, "strategy", -1, "hash_profile.strategy is required"}},
		{"sglang seed int", hp(htMap{{"strategy", "sglang"}, {"algorithm", "sha256_raw"}, {"python_hash_seed", 0}, {"index_projection", "first64_be"}}),
			htWant{httpapi.ReasonInvalidType, "python_hash_seed", -1, "hash_profile.python_hash_seed must be a string"}},
		{"vllm seed missing", hp(prof.without("python_hash_seed")), htWant{httpapi.ReasonMissing, "python_hash_seed", -1, "hash_profile.python_hash_seed is required"}},
		{"unknown strategy seed missing", hp(prof.with("strategy", "x").without("python_hash_seed")), w(httpapi.ReasonMissing, "python_hash_seed")},
		// Order: strategy, algorithm, python_hash_seed, index_projection.
		{"strategy before algorithm", hp(prof.with("algorithm", 1).with("strategy", "")), w(httpapi.ReasonInvalidValue, "strategy")},
		{"algorithm before seed", hp(prof.with("python_hash_seed", 1).with("algorithm", "")), w(httpapi.ReasonInvalidValue, "algorithm")},
		{"seed before projection", hp(prof.without("index_projection").with("python_hash_seed", "")), w(httpapi.ReasonInvalidValue, "python_hash_seed")},
		// Root order, as upstream: required strings, block_size, optional strings,
		// cache_group, hash_profile, type value, dp_rank.
		{"endpoint first", htEnc(b.with("type", 1).with("endpoint", "")), w(httpapi.ReasonInvalidValue, "endpoint")},
		{"type before modelname", htEnc(b.without("modelname").with("type", 1)), w(httpapi.ReasonInvalidType, "type")},
		{"modelname before instance_id", htEnc(b.without("instance_id").without("modelname")), w(httpapi.ReasonMissing, "modelname")},
		{"instance_id before block_size", htEnc(b.without("block_size").with("instance_id", "")), w(httpapi.ReasonInvalidValue, "instance_id")},
		{"block_size before replay", htEnc(b.with("replay_endpoint", 1).with("block_size", 0)), w(httpapi.ReasonOutOfRange, "block_size")},
		{"replay before lora", htEnc(b.with("lora_name", 1).with("replay_endpoint", 1)), w(httpapi.ReasonInvalidType, "replay_endpoint")},
		{"lora before tenant", htEnc(b.with("tenant_id", 1).with("lora_name", 1)), w(httpapi.ReasonInvalidType, "lora_name")},
		{"tenant before cache_group", htEnc(b.with("cache_group", 2).with("tenant_id", 1)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"cache_group before hash_profile", htEnc(b.without("hash_profile").with("cache_group", 2)), w(httpapi.ReasonUnsupported, "cache_group")},
		{"hash_profile before type value", htEnc(b.with("type", "x").with("hash_profile", "x")), w(httpapi.ReasonInvalidType, "hash_profile")},
		{"type value before dp_rank", htEnc(b.with("type", "x").without("dp_rank")), w(httpapi.ReasonInvalidValue, "type")},
		{"unknown before everything", htEnc(htMap{{"npu", 1}}), w(httpapi.ReasonUnknownField, "npu")},
		{"query field rejected", htEnc(b.plus("model", "m")), w(httpapi.ReasonUnknownField, "model")},
	}...)
	for _, f := range []string{"strategy", "algorithm", "python_hash_seed", "index_projection"} {
		// The field is the bare key, as upstream; the message names the nested path.
		field, path := f, "hash_profile."+f
		cases = append(cases,
			htCase{f + " int", hp(prof.with(f, 1)), htWant{httpapi.ReasonInvalidType, field, -1, path + " must be a string"}},
			htCase{f + " nil", hp(prof.with(f, nil)), w(httpapi.ReasonInvalidType, field)},
			htCase{f + " empty", hp(prof.with(f, "")), htWant{httpapi.ReasonInvalidValue, field, -1, path + " must not be empty"}})
		if f != "python_hash_seed" {
			cases = append(cases, htCase{f + " missing", hp(prof.without(f)), htWant{httpapi.ReasonMissing, field, -1, path + " is required"}})
		}
	}
	for _, c := range cases {
		_, e := httpapi.DecodeRegisterRequest(c.body)
		htCheck(t, c.name, e, c.want)
	}
}

func TestDecodeUnregisterRequest(t *testing.T) {
	req, e := httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase()))
	if e != nil || req != (httpapi.UnregisterRequest{InstanceID: "vllm-prefill-node1", TenantID: "t1", DPRank: 2}) {
		t.Fatalf("%v %+v", e, req)
	}
	for _, m := range []htMap{htUnregisterBase().without("tenant_id"), htUnregisterBase().with("tenant_id", "")} {
		if req, e = httpapi.DecodeUnregisterRequest(htEnc(m)); e != nil || req.TenantID != "default" {
			t.Errorf("default tenant: %v %+v", e, req)
		}
	}
	for _, c := range []struct {
		raw  any
		want int
	}{{htWidth(0xcc, 0), 0}, {htWidth(0xce, math.MaxInt32), math.MaxInt32}, {htWidth(0xcf, 5), 5}, {htWidth(0xd3, 6), 6}} {
		if req, e = httpapi.DecodeUnregisterRequest(htEnc(htUnregisterBase().with("dp_rank", c.raw))); e != nil || req.DPRank != c.want {
			t.Errorf("dp_rank %x: %v %d", htEnc(c.raw), e, req.DPRank)
		}
	}

	b := htUnregisterBase()
	const rankMsg = "dp_rank must be a non-negative int"
	w := func(reason, field string) htWant { return htWant{reason, field, -1, ""} }
	cases := []htCase{
		{"instance_id missing", htEnc(b.without("instance_id")), htWant{httpapi.ReasonMissing, "instance_id", -1, "instance_id is required"}},
		{"instance_id int", htEnc(b.with("instance_id", 1)), w(httpapi.ReasonInvalidType, "instance_id")},
		{"instance_id empty", htEnc(b.with("instance_id", "")), htWant{httpapi.ReasonInvalidValue, "instance_id", -1, "instance_id must not be empty"}},
		{"tenant_id int", htEnc(b.with("tenant_id", 1)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"tenant_id nil", htEnc(b.with("tenant_id", nil)), w(httpapi.ReasonInvalidType, "tenant_id")},
		{"dp_rank missing", htEnc(b.without("dp_rank")), htWant{httpapi.ReasonMissing, "dp_rank", -1, "dp_rank is required"}},
		// Upstream's /unregister reports every bad dp_rank as invalid_value.
		{"dp_rank string", htEnc(b.with("dp_rank", "0")), htWant{httpapi.ReasonInvalidValue, "dp_rank", -1, rankMsg}},
		{"dp_rank negative", htEnc(b.with("dp_rank", -1)), htWant{httpapi.ReasonInvalidValue, "dp_rank", -1, rankMsg}},
		{"dp_rank above int32", htEnc(b.with("dp_rank", math.MaxInt32+1)), htWant{httpapi.ReasonInvalidValue, "dp_rank", -1, rankMsg}},
		{"dp_rank uint64 max", htEnc(b.with("dp_rank", htMaxUint64)), w(httpapi.ReasonInvalidValue, "dp_rank")},
		{"register field rejected", htEnc(b.plus("endpoint", "tcp://x")), w(httpapi.ReasonUnknownField, "endpoint")},
		{"instance before tenant", htEnc(b.with("tenant_id", 1).with("instance_id", "")), w(httpapi.ReasonInvalidValue, "instance_id")},
		{"tenant before dp_rank", htEnc(b.without("dp_rank").with("tenant_id", 1)), w(httpapi.ReasonInvalidType, "tenant_id")},
	}
	for _, c := range cases {
		_, e := httpapi.DecodeUnregisterRequest(c.body)
		htCheck(t, c.name, e, c.want)
	}
}

func TestDecodeQueryRequestZeroAllocs(t *testing.T) {
	tokens := make([]int32, 4096)
	for i := range tokens {
		tokens[i] = int32(i*7919%200000 - 1000) // fixints, uint16, uint32 and negatives
	}
	full := htQueryBase().with("lora_name", "l").with("tenant_id", "t").with("instance_id", "i").with("cache_salt", "s")
	bodies := map[string][]byte{
		"array":      htEnc(full.with("token_ids", tokens)),
		"bin":        htEnc(full.with("token_ids", htLE(tokens...))),
		"minimal":    htEnc(htQueryBase()),
		"nil salt":   htEnc(htQueryBase().with("cache_salt", nil)),
		"duplicates": htEnc(full.plus("token_ids", tokens).plus("model", "m2")),
		// Long arrays of real clients' shapes, decoded mostly in segments.
		"array 8K vocab":        htEnc(full.with("token_ids", htPrompt(8192))),
		"array 8K signed":       htEnc(full.with("token_ids", htSigned(htPrompt(8192)))),
		"array 8K mixed widths": htEnc(full.with("token_ids", htMixedWidths(8192))),
		"array 32K vocab32K":    htEnc(full.with("token_ids", htSmallVocab(32768))),
		"array 8K, then a bin":  htEnc(full.with("token_ids", htPrompt(8192)).plus("token_ids", htLE(tokens...))),
	}
	var q httpapi.QueryRequest
	htWantNoAllocs(t, bodies, func(body []byte) *httpapi.RequestError { return httpapi.DecodeQueryRequest(body, &q) })
}

// htWantNoAllocs checks that decode accepts each body and, decoding it again into the
// same request, allocates nothing.
func htWantNoAllocs(t *testing.T, bodies map[string][]byte, decode func([]byte) *httpapi.RequestError) {
	t.Helper()
	for name, body := range bodies {
		if e := decode(body); e != nil {
			t.Fatalf("%s: %v", name, e)
		}
		if n := testing.AllocsPerRun(100, func() { _ = decode(body) }); n != 0 {
			t.Errorf("%s: %v allocs per decode, want 0", name, n)
		}
	}
}

func TestRequestErrorError(t *testing.T) {
	e := &httpapi.RequestError{Msg: "token_ids element is outside the int32 range", Reason: httpapi.ReasonOutOfRange, Field: "token_ids", Index: 3}
	if got := e.Error(); !strings.Contains(got, e.Reason) || !strings.Contains(got, e.Msg) {
		t.Errorf("Error() = %q", got)
	}
}

func TestIsMsgpackContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/msgpack":                true,
		"application/msgpack; charset=utf-8": true,
		"application/x-msgpack":              false,
		"application/json":                   false,
		"":                                   false,
		"text/plain, application/msgpack":    true,
	} {
		if got := httpapi.IsMsgpackContentType([]byte(ct)); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}
