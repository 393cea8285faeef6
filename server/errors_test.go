package server

import (
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// wantRequestError checks a 400 validation body: reason, field ("" = absent) and index
// (-1 = absent), and that no other keys are present.
func wantRequestError(t *testing.T, what string, code int, resp map[string]any, reason, field string, index int) {
	t.Helper()
	if code != http.StatusBadRequest {
		t.Errorf("%s: status %d, want 400 (%v)", what, code, resp)
		return
	}
	if msg, _ := resp["error"].(string); msg == "" {
		t.Errorf("%s: no error message in %v", what, resp)
	}
	if resp["reason"] != reason {
		t.Errorf("%s: reason %v, want %s (%v)", what, resp["reason"], reason, resp)
	}
	keys := 2
	if field == "" {
		if _, ok := resp["field"]; ok {
			t.Errorf("%s: unexpected field in %v", what, resp)
		}
	} else {
		keys++
		if resp["field"] != field {
			t.Errorf("%s: field %v, want %s (%v)", what, resp["field"], field, resp)
		}
	}
	if index < 0 {
		if _, ok := resp["index"]; ok {
			t.Errorf("%s: unexpected index in %v", what, resp)
		}
	} else {
		keys++
		if v, ok := resp["index"]; !ok || asInt(t, v) != int64(index) {
			t.Errorf("%s: index %v, want %d (%v)", what, resp["index"], index, resp)
		}
	}
	if len(resp) != keys {
		t.Errorf("%s: %d keys, want %d: %v", what, len(resp), keys, resp)
	}
}

// wantPlainError checks a service-level failure body {"error": msg} with its status.
func wantPlainError(t *testing.T, what string, code int, resp map[string]any, status int, msgPart string) {
	t.Helper()
	if code != status {
		t.Errorf("%s: status %d, want %d (%v)", what, code, status, resp)
		return
	}
	msg, _ := resp["error"].(string)
	if len(resp) != 1 || !strings.Contains(msg, msgPart) {
		t.Errorf("%s: body %v, want only error containing %q", what, resp, msgPart)
	}
}

// nonStringKeyMap is {1: "x"}.
func nonStringKeyMap() []byte {
	b := msgp.AppendMapHeader(nil, 1)
	b = msgp.AppendInt(b, 1)
	return msgp.AppendString(b, "x")
}

// without returns body pairs with key removed (for "missing" cases).
func withoutField(fields []any, key string) []any {
	out := make([]any, 0, len(fields))
	for i := 0; i < len(fields); i += 2 {
		if fields[i] != key {
			out = append(out, fields[i], fields[i+1])
		}
	}
	return out
}

func regFields(endpoint string) []any {
	return []any{
		"endpoint", endpoint, "type", "vLLM", "modelname", "m", "instance_id", "e",
		"block_size", 16, "dp_rank", 0, "hash_profile", vllmProfile(),
	}
}

type errCase struct {
	name   string
	ctype  string // "" = application/msgpack
	body   []byte
	reason string
	field  string
	index  int
}

func runErrCases(t *testing.T, app *App, path string, cases []errCase) {
	t.Helper()
	for _, c := range cases {
		ctype := c.ctype
		if ctype == "" {
			ctype = "application/msgpack"
		}
		code, resp := doHTTP(t, app, http.MethodPost, path, ctype, c.body)
		wantRequestError(t, path+" "+c.name, code, resp, c.reason, c.field, c.index)
	}
}

// commonBodyCases are the body-level failures every POST route shares.
func commonBodyCases(valid []byte) []errCase {
	return []errCase{
		{name: "json content type", ctype: "application/json", body: valid, reason: "unsupported_content_type", index: -1},
		{name: "no content type", ctype: "text/plain", body: valid, reason: "unsupported_content_type", index: -1},
		{name: "garbage", body: []byte{0xc1, 0xff, 0x00}, reason: "invalid_msgpack", index: -1},
		{name: "truncated", body: valid[:len(valid)-1], reason: "invalid_msgpack", index: -1},
		{name: "empty body", body: nil, reason: "invalid_msgpack", index: -1},
		{name: "array root", body: msgp.AppendArrayHeader(msgp.AppendArrayHeader(nil, 1), 0), reason: "invalid_msgpack", index: -1},
		{name: "string root", body: msgp.AppendString(nil, "x"), reason: "invalid_msgpack", index: -1},
		{name: "non-string key", body: nonStringKeyMap(), reason: "invalid_msgpack", index: -1},
		{name: "trailing bytes", body: append(append([]byte(nil), valid...), 0x01), reason: "invalid_msgpack", index: -1},
	}
}

// TestRegisterErrors: every validation reason of POST /register, with its field, and
// that none of them leaves anything registered.
func TestRegisterErrors(t *testing.T) {
	app := startApp(t, false)
	ep := "tcp://127.0.0.1:1"
	valid := mp(regFields(ep)...)
	with := func(kv ...any) []byte {
		f := regFields(ep)
		for i := 0; i < len(kv); i += 2 {
			found := false
			for j := 0; j < len(f); j += 2 {
				if f[j] == kv[i] {
					f[j+1], found = kv[i+1], true
				}
			}
			if !found {
				f = append(f, kv[i], kv[i+1])
			}
		}
		return mp(f...)
	}
	missing := func(key string) []byte { return mp(withoutField(regFields(ep), key)...) }
	profile := func(kv ...any) map[string]any {
		p := vllmProfile()
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(p, kv[i].(string))
			} else {
				p[kv[i].(string)] = kv[i+1]
			}
		}
		return p
	}
	cases := commonBodyCases(valid)
	cases = append(cases, []errCase{
		{name: "unknown field", body: with("bogus", 1), reason: "unknown_field", field: "bogus", index: -1},
		{name: "model instead of modelname", body: with("model", "m"), reason: "unknown_field", field: "model", index: -1},
		{name: "root_digest", body: with("hash_profile", profile("root_digest", strings.Repeat("0", 64))),
			reason: "unknown_field", field: "root_digest", index: -1},
		{name: "hash_profile non-string key", body: func() []byte {
			b := msgp.AppendMapHeader(nil, 7)
			for i, kv := 0, regFields(ep); i < len(kv)-2; i += 2 {
				b = msgp.AppendString(b, kv[i].(string))
				b, _ = msgp.AppendIntf(b, kv[i+1])
			}
			b = msgp.AppendString(b, "hash_profile")
			return append(b, nonStringKeyMap()...)
		}(), reason: "invalid_msgpack", index: -1},

		{name: "missing endpoint", body: missing("endpoint"), reason: "missing", field: "endpoint", index: -1},
		{name: "missing type", body: missing("type"), reason: "missing", field: "type", index: -1},
		{name: "missing modelname", body: missing("modelname"), reason: "missing", field: "modelname", index: -1},
		{name: "missing instance_id", body: missing("instance_id"), reason: "missing", field: "instance_id", index: -1},
		{name: "missing block_size", body: missing("block_size"), reason: "missing", field: "block_size", index: -1},
		{name: "missing dp_rank", body: missing("dp_rank"), reason: "missing", field: "dp_rank", index: -1},
		{name: "missing hash_profile", body: missing("hash_profile"), reason: "missing", field: "hash_profile", index: -1},
		{name: "missing strategy", body: with("hash_profile", profile("strategy", nil)), reason: "missing", field: "strategy", index: -1},
		{name: "missing seed for vllm", body: with("hash_profile", profile("python_hash_seed", nil)), reason: "missing", field: "python_hash_seed", index: -1},
		{name: "missing projection", body: with("hash_profile", profile("index_projection", nil)), reason: "missing", field: "index_projection", index: -1},

		{name: "endpoint int", body: with("endpoint", 5), reason: "invalid_type", field: "endpoint", index: -1},
		{name: "type nil", body: with("type", nil), reason: "invalid_type", field: "type", index: -1},
		{name: "block_size string", body: with("block_size", "16"), reason: "invalid_type", field: "block_size", index: -1},
		{name: "block_size float", body: with("block_size", 16.0), reason: "invalid_type", field: "block_size", index: -1},
		{name: "dp_rank string", body: with("dp_rank", "0"), reason: "invalid_type", field: "dp_rank", index: -1},
		{name: "lora_name int", body: with("lora_name", 1), reason: "invalid_type", field: "lora_name", index: -1},
		{name: "tenant_id nil", body: with("tenant_id", nil), reason: "invalid_type", field: "tenant_id", index: -1},
		{name: "replay_endpoint int", body: with("replay_endpoint", 1), reason: "invalid_type", field: "replay_endpoint", index: -1},
		{name: "cache_group string", body: with("cache_group", "0"), reason: "invalid_type", field: "cache_group", index: -1},
		{name: "hash_profile string", body: with("hash_profile", "vllm_v1"), reason: "invalid_type", field: "hash_profile", index: -1},
		{name: "seed int", body: with("hash_profile", profile("python_hash_seed", 0)), reason: "invalid_type", field: "python_hash_seed", index: -1},

		{name: "empty endpoint", body: with("endpoint", ""), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "NUL in endpoint", body: with("endpoint", "tcp://127.0.0.1:1\x00A"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "newline in endpoint", body: with("endpoint", "tcp://127.0.0.1:1\n"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "DEL in endpoint", body: with("endpoint", "ipc:///tmp/x\x7f"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "inproc endpoint", body: with("endpoint", "inproc://x"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "udp endpoint", body: with("endpoint", "udp://127.0.0.1:5"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "scheme only", body: with("endpoint", "tcp://"), reason: "invalid_value", field: "endpoint", index: -1},
		{name: "NUL in replay_endpoint", body: with("replay_endpoint", "tcp://127.0.0.1:2\x00"), reason: "invalid_value", field: "replay_endpoint", index: -1},
		{name: "inproc replay_endpoint", body: with("replay_endpoint", "inproc://r"), reason: "invalid_value", field: "replay_endpoint", index: -1},
		{name: "invalid UTF-8 modelname", body: with("modelname", "m\xff"), reason: "invalid_value", field: "modelname", index: -1},
		{name: "invalid UTF-8 instance_id", body: with("instance_id", "\xc3("), reason: "invalid_value", field: "instance_id", index: -1},
		{name: "empty modelname", body: with("modelname", ""), reason: "invalid_value", field: "modelname", index: -1},
		{name: "empty instance_id", body: with("instance_id", ""), reason: "invalid_value", field: "instance_id", index: -1},
		{name: "lowercase type", body: with("type", "vllm"), reason: "invalid_value", field: "type", index: -1},
		{name: "unknown strategy", body: with("hash_profile", profile("strategy", "vllm_v2")), reason: "invalid_value", field: "strategy", index: -1},
		{name: "unknown algorithm", body: with("hash_profile", profile("algorithm", "md5")), reason: "invalid_value", field: "algorithm", index: -1},
		{name: "unknown projection", body: with("hash_profile", profile("index_projection", "high64_be")), reason: "invalid_value", field: "index_projection", index: -1},
		{name: "signed seed", body: with("hash_profile", profile("python_hash_seed", "+1")), reason: "invalid_value", field: "python_hash_seed", index: -1},
		{name: "seed too big", body: with("hash_profile", profile("python_hash_seed", "4294967296")), reason: "invalid_value", field: "python_hash_seed", index: -1},

		{name: "block_size zero", body: with("block_size", 0), reason: "out_of_range", field: "block_size", index: -1},
		{name: "block_size negative", body: with("block_size", -16), reason: "out_of_range", field: "block_size", index: -1},
		{name: "block_size above int64", body: with("block_size", uint64(math.MaxUint64)), reason: "out_of_range", field: "block_size", index: -1},
		{name: "dp_rank negative", body: with("dp_rank", -1), reason: "out_of_range", field: "dp_rank", index: -1},
		{name: "dp_rank above int32", body: with("dp_rank", int64(math.MaxInt32)+1), reason: "out_of_range", field: "dp_rank", index: -1},

		{name: "cache_group 1", body: with("cache_group", 1), reason: "unsupported", field: "cache_group", index: -1},
		{name: "cache_group -1", body: with("cache_group", -1), reason: "unsupported", field: "cache_group", index: -1},
	}...)
	runErrCases(t, app, "/register", cases)

	if code, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); code != http.StatusOK || asInt(t, svcs["count"]) != 0 {
		t.Errorf("rejected registrations left services: %d %v", code, svcs)
	}
	if _, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil); asInt(t, view["context_count"]) != 0 {
		t.Errorf("rejected registrations left contexts: %v", view)
	}
	// The valid body really is valid, and cache_group 0 / nil are accepted.
	mustRegister(t, app, "", with("cache_group", nil))
	mustRegister(t, app, "", with("cache_group", 0, "instance_id", "e2", "endpoint", "tcp://127.0.0.1:2"))
}

// TestUnregisterErrors: the validation reasons of POST /unregister and 404 for an unknown
// service key.
func TestUnregisterErrors(t *testing.T) {
	app := startApp(t, false)
	valid := mp("instance_id", "e", "tenant_id", "t", "dp_rank", 0)
	cases := commonBodyCases(valid)
	cases = append(cases, []errCase{
		{name: "unknown field", body: mp("instance_id", "e", "dp_rank", 0, "endpoint", "tcp://x:1"), reason: "unknown_field", field: "endpoint", index: -1},
		{name: "missing instance_id", body: mp("dp_rank", 0), reason: "missing", field: "instance_id", index: -1},
		{name: "missing dp_rank", body: mp("instance_id", "e"), reason: "missing", field: "dp_rank", index: -1},
		{name: "instance_id int", body: mp("instance_id", 3, "dp_rank", 0), reason: "invalid_type", field: "instance_id", index: -1},
		{name: "tenant_id int", body: mp("instance_id", "e", "tenant_id", 3, "dp_rank", 0), reason: "invalid_type", field: "tenant_id", index: -1},
		{name: "empty instance_id", body: mp("instance_id", "", "dp_rank", 0), reason: "invalid_value", field: "instance_id", index: -1},
		// Upstream reports every bad dp_rank on /unregister as invalid_value.
		{name: "dp_rank string", body: mp("instance_id", "e", "dp_rank", "0"), reason: "invalid_value", field: "dp_rank", index: -1},
		{name: "dp_rank negative", body: mp("instance_id", "e", "dp_rank", -1), reason: "invalid_value", field: "dp_rank", index: -1},
		{name: "dp_rank above int32", body: mp("instance_id", "e", "dp_rank", int64(math.MaxInt32)+1), reason: "invalid_value", field: "dp_rank", index: -1},
	}...)
	runErrCases(t, app, "/unregister", cases)

	code, resp := msgpackPost(t, app, "/unregister", valid)
	wantPlainError(t, "unknown service", code, resp, http.StatusNotFound, "e|t|0")

	// A registered key is found under its normalized tenant only.
	mustRegister(t, app, "", registerBody("tcp://127.0.0.1:3", "e", 0))
	code, resp = msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 1))
	wantPlainError(t, "other rank", code, resp, http.StatusNotFound, "e|default|1")
	code, resp = msgpackPost(t, app, "/unregister", mp("instance_id", "e", "tenant_id", "t", "dp_rank", 0))
	wantPlainError(t, "other tenant", code, resp, http.StatusNotFound, "e|t|0")
	if code, resp := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "tenant_id", "", "dp_rank", 0)); code != http.StatusOK {
		t.Fatalf("unregister with empty tenant: %d %v", code, resp)
	}
}

// TestQueryErrors: the validation reasons of POST /query, token indexes included, and the
// context-level out_of_range of a token the context's strategy cannot hash.
func TestQueryErrors(t *testing.T) {
	app := startApp(t, false)
	valid := queryBody("m", 16, []int32{1, 2, 3})
	tokens := func(vals ...any) []byte { return mp("model", "m", "block_size", 16, "token_ids", vals) }
	cases := commonBodyCases(valid)
	cases = append(cases, []errCase{
		{name: "modelname", body: mp("modelname", "m", "block_size", 16, "token_ids", []any{}), reason: "unknown_field", field: "modelname", index: -1},
		{name: "dp_rank", body: mp("model", "m", "block_size", 16, "token_ids", []any{}, "dp_rank", 0), reason: "unknown_field", field: "dp_rank", index: -1},
		{name: "missing model", body: mp("block_size", 16, "token_ids", []any{}), reason: "missing", field: "model", index: -1},
		{name: "missing block_size", body: mp("model", "m", "token_ids", []any{}), reason: "missing", field: "block_size", index: -1},
		{name: "missing token_ids", body: mp("model", "m", "block_size", 16), reason: "missing", field: "token_ids", index: -1},
		{name: "model int", body: mp("model", 1, "block_size", 16, "token_ids", []any{}), reason: "invalid_type", field: "model", index: -1},
		{name: "block_size string", body: mp("model", "m", "block_size", "16", "token_ids", []any{}), reason: "invalid_type", field: "block_size", index: -1},
		{name: "token_ids string", body: mp("model", "m", "block_size", 16, "token_ids", "1 2 3"), reason: "invalid_type", field: "token_ids", index: -1},
		{name: "token string element", body: tokens(1, 2, "3", 4), reason: "invalid_type", field: "token_ids", index: 2},
		{name: "token float element", body: tokens(1.5), reason: "invalid_type", field: "token_ids", index: 0},
		{name: "tenant_id int", body: mp("model", "m", "block_size", 16, "token_ids", []any{}, "tenant_id", 1), reason: "invalid_type", field: "tenant_id", index: -1},
		{name: "lora_name nil", body: mp("model", "m", "block_size", 16, "token_ids", []any{}, "lora_name", nil), reason: "invalid_type", field: "lora_name", index: -1},
		{name: "cache_salt int", body: mp("model", "m", "block_size", 16, "token_ids", []any{}, "cache_salt", 1), reason: "invalid_type", field: "cache_salt", index: -1},
		{name: "instance_id int", body: mp("model", "m", "block_size", 16, "token_ids", []any{}, "instance_id", 1), reason: "invalid_type", field: "instance_id", index: -1},
		{name: "empty model", body: mp("model", "", "block_size", 16, "token_ids", []any{}), reason: "invalid_value", field: "model", index: -1},
		{name: "bin length", body: mp("model", "m", "block_size", 16, "token_ids", []byte{1, 0, 0, 0, 2}), reason: "invalid_value", field: "token_ids", index: -1},
		{name: "block_size zero", body: mp("model", "m", "block_size", 0, "token_ids", []any{}), reason: "out_of_range", field: "block_size", index: -1},
		{name: "block_size negative", body: mp("model", "m", "block_size", -1, "token_ids", []any{}), reason: "out_of_range", field: "block_size", index: -1},
		{name: "block_size above int64", body: mp("model", "m", "block_size", uint64(math.MaxUint64), "token_ids", []any{}), reason: "out_of_range", field: "block_size", index: -1},
		{name: "token above int32", body: tokens(1, 2, int64(math.MaxInt32)+1), reason: "out_of_range", field: "token_ids", index: 2},
		{name: "token below int32", body: tokens(int64(math.MinInt32)-1, 1), reason: "out_of_range", field: "token_ids", index: 0},
		{name: "token uint64", body: tokens(0, uint64(math.MaxUint64)), reason: "out_of_range", field: "token_ids", index: 1},
	}...)
	runErrCases(t, app, "/query", cases)

	// The int32 bounds themselves are valid, in both encodings, on an empty index.
	for _, body := range [][]byte{
		tokens(int64(math.MinInt32), int64(math.MaxInt32)),
		mp("model", "m", "block_size", 16, "token_ids", []byte{}),
		mp("model", "m", "block_size", 16, "token_ids", []byte{1, 0, 0, 0, 0, 0, 0, 0x80}),
	} {
		code, resp := msgpackPost(t, app, "/query", body)
		if code != http.StatusOK || len(hits(t, resp)) != 0 {
			t.Errorf("valid query: %d %v", code, resp)
		}
	}

	// SGLang hashes tokens as uint32: a negative token is valid msgpack and int32, but the
	// context cannot hash it, reported with its index.
	sgl := registerBody("tcp://127.0.0.1:4", "s", 0, "type", "SGLang", "modelname", "sg", "block_size", 4,
		"hash_profile", profileMap("sglang", "sha256_raw", "", "first64_be"))
	mustRegister(t, app, "", sgl)
	code, resp := msgpackPost(t, app, "/query", queryBody("sg", 4, []int32{-7, 1, 2, 3}))
	wantRequestError(t, "sglang negative token", code, resp, "out_of_range", "token_ids", 0)
	code, resp = msgpackPost(t, app, "/query", queryBody("sg", 4, []int32{7, 1, 2, 3}))
	if code != http.StatusOK || tierOf(t, hits(t, resp), "s", "disk") != 0 {
		t.Errorf("sglang valid query: %d %v", code, resp)
	}
}

// TestInvalidRegistration: conflicting configuration for a key, an endpoint used by
// another service, and a hash-profile conflict in a context are rejected with
// invalid_registration and change nothing.
func TestInvalidRegistration(t *testing.T) {
	app := startApp(t, false)
	epA, epB := "tcp://127.0.0.1:11", "tcp://127.0.0.1:12"
	code, resp := msgpackPost(t, app, "/register", registerBody(epA, "a", 0))
	if code != http.StatusOK {
		t.Fatalf("register a: %d %v", code, resp)
	}
	_, servicesBefore := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	_, viewBefore := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)

	sha256Pickle := profileMap("vllm_v1", "sha256", "0", "low64_be")
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"same key, other endpoint", registerBody(epB, "a", 0)},
		{"same key, other block size", registerBody(epA, "a", 0, "block_size", 32)},
		{"same key, other seed", registerBody(epA, "a", 0, "hash_profile", profileMap("vllm_v1", "sha256_cbor", "00", "low64_be"))},
		{"same key, replay endpoint added", registerBody(epA, "a", 0, "replay_endpoint", "tcp://127.0.0.1:13")},
		{"same key, cache_group 0 vs nil", registerBody(epA, "a", 0, "cache_group", 0)},
		{"endpoint of another service", registerBody(epA, "b", 0)},
		{"endpoint of another service (Mooncake)", registerBody(epA, "mc", 0, "type", "Mooncake")},
		{"profile conflict sha256 vs sha256_cbor", registerBody(epB, "b", 0, "hash_profile", sha256Pickle)},
		{"profile conflict other seed", registerBody(epB, "b", 0, "hash_profile", profileMap("vllm_v1", "sha256_cbor", "random", "low64_be"))},
		{"profile conflict sglang", registerBody(epB, "b", 0, "type", "SGLang", "hash_profile", profileMap("sglang", "sha256_raw", "", "first64_be"))},
		{"Mooncake profile conflict", registerBody(epB, "mc", 0, "type", "Mooncake", "hash_profile", sha256Pickle)},
	} {
		code, resp := msgpackPost(t, app, "/register", c.body)
		wantRequestError(t, c.name, code, resp, "invalid_registration", "", -1)
	}

	_, servicesAfter := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	_, viewAfter := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	if !equalValues(servicesBefore, servicesAfter) {
		t.Errorf("services changed:\n%v\n%v", servicesBefore, servicesAfter)
	}
	if !equalValues(viewBefore, viewAfter) {
		t.Errorf("global view changed:\n%v\n%v", viewBefore, viewAfter)
	}
	ctx := viewAfter["contexts"].([]any)[0].(map[string]any)
	if hp := ctx["hash_profile"].(map[string]any); hp["algorithm"] != "sha256_cbor" {
		t.Errorf("context profile = %v", hp)
	}

	// The same profile in another context (other model) is independent of the first one.
	code, resp = msgpackPost(t, app, "/register", registerBody(epB, "b", 0, "modelname", "m2", "hash_profile", sha256Pickle))
	if code != http.StatusOK {
		t.Fatalf("other context with sha256: %d %v", code, resp)
	}
	// After unregistering, a's endpoint is free for another key.
	if code, resp := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "dp_rank", 0)); code != http.StatusOK {
		t.Fatalf("unregister a: %d %v", code, resp)
	}
	mustRegister(t, app, "", registerBody(epA, "c", 0))
}

// TestIdempotentRegistration: an identical registration succeeds again without a second
// service, and the empty tenant is the same as "default".
func TestIdempotentRegistration(t *testing.T) {
	app := startApp(t, false)
	pub := newPublisher(t, false)
	body := registerBody(pub.Endpoint(), "a", 0)
	for i, b := range [][]byte{body, body, registerBody(pub.Endpoint(), "a", 0, "tenant_id", "default"), registerBody(pub.Endpoint(), "a", 0, "tenant_id", "")} {
		code, resp := msgpackPost(t, app, "/register", b)
		if code != http.StatusOK || resp["status"] != "registered successfully" || resp["instance_id"] != "a" {
			t.Fatalf("registration %d: %d %v", i, code, resp)
		}
	}
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 1 {
		t.Errorf("services after identical registrations: %v", svcs)
	}
	// One subscriber only: the publisher sees exactly one, and events apply once.
	waitSub(t, pub, 1)
	tokens := seqTokens(32, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, stored(keys, "gpu")))
	waitDevice(t, app, tokens, "a", 32)
	if stats := app.Service.Stats(); len(stats) != 1 {
		t.Errorf("stats for %d services, want 1", len(stats))
	}
}

// TestMooncakeIsNotQueryInstance: a Mooncake registration never appears as a query
// instance or in the global view, before or after an engine registers the context.
func TestMooncakeIsNotQueryInstance(t *testing.T) {
	app := startApp(t, false)
	code, resp := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:21", "master", 0, "type", "Mooncake"))
	if code != http.StatusOK || resp["instance_id"] != "master" {
		t.Fatalf("register mooncake: %d %v", code, resp)
	}
	tokens := seqTokens(32, 1)
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if len(hits(t, r)) != 0 {
		t.Errorf("Mooncake alone answers %v", r)
	}
	if _, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil); asInt(t, view["context_count"]) != 0 {
		t.Errorf("Mooncake alone created a context: %v", view)
	}
	mustRegister(t, app, "", registerBody("tcp://127.0.0.1:22", "engine", 0))
	_, r = msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	inst := hits(t, r)
	if len(inst) != 1 || tierOf(t, inst, "engine", "disk") != 0 {
		t.Errorf("instances = %v, want only engine with zeros", inst)
	}
	_, r = msgpackPost(t, app, "/query", queryBody("m", 16, tokens, "instance_id", "master"))
	if len(hits(t, r)) != 0 {
		t.Errorf("filter on the Mooncake instance answers %v", r)
	}
	_, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	insts := view["contexts"].([]any)[0].(map[string]any)["instances"].(map[string]any)
	if _, ok := insts["master"]; ok || len(insts) != 1 {
		t.Errorf("global view instances = %v", insts)
	}
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 2 {
		t.Errorf("services = %v", svcs)
	}
	// Unregistering the master leaves the engine alone.
	if code, resp := msgpackPost(t, app, "/unregister", mp("instance_id", "master", "dp_rank", 0)); code != http.StatusOK {
		t.Fatalf("unregister master: %d %v", code, resp)
	}
	_, r = msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if inst := hits(t, r); len(inst) != 1 {
		t.Errorf("after master unregistered: %v", inst)
	}
}

// TestMethodNotAllowedAndNotFound: every route answers 405 to the wrong methods; an
// unknown route is 404.
func TestMethodNotAllowedAndNotFound(t *testing.T) {
	app := startApp(t, false)
	for _, c := range []struct {
		path    string
		methods []string
	}{
		{"/query", []string{http.MethodGet, http.MethodPut, http.MethodDelete}},
		{"/register", []string{http.MethodGet, http.MethodPut, http.MethodPatch}},
		{"/unregister", []string{http.MethodGet, http.MethodDelete}},
		{"/global_view", []string{http.MethodPost, http.MethodPut}},
		{"/services", []string{http.MethodPost, http.MethodDelete}},
	} {
		for _, m := range c.methods {
			code, resp := doHTTP(t, app, m, c.path, "application/msgpack", mp("instance_id", "x", "dp_rank", 0))
			wantPlainError(t, m+" "+c.path, code, resp, http.StatusMethodNotAllowed, "Method not allowed")
		}
	}
	for _, p := range []string{"/", "/v2/query", "/query/", "/metricsx"} {
		code, _ := doHTTP(t, app, http.MethodGet, p, "", nil)
		if code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	// Nothing was registered by the rejected POST to /unregister-shaped bodies.
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 0 {
		t.Errorf("services = %v", svcs)
	}
}

// TestUnavailableWhileStopping: once the service begins stopping, every route answers
// 503 and registers nothing.
func TestUnavailableWhileStopping(t *testing.T) {
	app := startApp(t, false)
	mustRegister(t, app, "", registerBody("tcp://127.0.0.1:31", "a", 0))
	app.Service.BeginStop()
	for _, c := range []struct {
		path string
		body []byte
	}{
		{"/register", registerBody("tcp://127.0.0.1:32", "b", 0)},
		{"/unregister", mp("instance_id", "a", "dp_rank", 0)},
		{"/query", queryBody("m", 16, seqTokens(16, 1))},
	} {
		code, resp := msgpackPost(t, app, c.path, c.body)
		wantPlainError(t, c.path, code, resp, http.StatusServiceUnavailable, "stopping")
	}
	for _, p := range []string{"/global_view", "/services"} {
		code, resp := doHTTP(t, app, http.MethodGet, p, "", nil)
		wantPlainError(t, p, code, resp, http.StatusServiceUnavailable, "stopping")
	}
	if got := app.Service.Services(); len(got) != 1 || got[0].InstanceID != "a" {
		t.Errorf("services while stopping = %v", got)
	}
}

// unsubscribable is a well-formed endpoint that libzmq refuses at connect: an ipc path
// longer than a socket address holds (ENAMETOOLONG).
var unsubscribable = "ipc:///tmp/" + strings.Repeat("x", 200)

// TestSubscribeFailureRollsBack: a registration whose subscriber cannot start answers
// 500 and leaves nothing behind, not even a context that would pin its hash profile.
func TestSubscribeFailureRollsBack(t *testing.T) {
	app := startApp(t, false)
	for _, typ := range []string{"vLLM", "SGLang", "Mooncake"} {
		prof := vllmProfile()
		if typ == "SGLang" {
			prof = profileMap("sglang", "sha256_raw", "", "first64_be")
		}
		code, resp := msgpackPost(t, app, "/register", registerBody(unsubscribable, "bad", 0, "type", typ, "hash_profile", prof))
		wantPlainError(t, typ, code, resp, http.StatusInternalServerError, "Failed to subscribe")
		if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 0 {
			t.Errorf("%s: services after failed subscribe = %v", typ, svcs)
		}
		if _, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil); asInt(t, view["context_count"]) != 0 {
			t.Errorf("%s: global view after failed subscribe = %v", typ, view)
		}
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(16, 1)))
		if len(hits(t, r)) != 0 {
			t.Errorf("%s: query after failed subscribe = %v", typ, r)
		}
	}
	// Nothing is pinned: the same key, and the same context with another profile, register.
	code, resp := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:41", "bad", 0,
		"hash_profile", profileMap("vllm_v1", "sha256", "0", "low64_be")))
	if code != http.StatusOK {
		t.Fatalf("register after rollback: %d %v", code, resp)
	}

	// A failure in a context that already exists keeps that context and its other slots.
	code, resp = msgpackPost(t, app, "/register", registerBody(unsubscribable, "bad2", 0,
		"hash_profile", profileMap("vllm_v1", "sha256", "0", "low64_be")))
	wantPlainError(t, "existing context", code, resp, http.StatusInternalServerError, "Failed to subscribe")
	_, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	insts := view["contexts"].([]any)[0].(map[string]any)["instances"].(map[string]any)
	if _, ok := insts["bad"]; !ok || len(insts) != 1 {
		t.Errorf("instances after failure in existing context = %v", insts)
	}
}

// equalValues compares decoded msgpack values structurally.
func equalValues(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if !equalValues(v, y[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalValues(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return a == b
}
