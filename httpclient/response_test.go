package httpclient

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

func mustAppendIntf(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgp.AppendIntf(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// contractQueryBody is the /query example of the contract plus a second, two-rank
// instance with no match.
func contractQueryBody() map[string]any {
	return map[string]any{"instances": map[string]any{
		"vllm-prefill-node1": map[string]any{
			"longest_matched": 32,
			"dp":              map[string]any{"0": 16},
			"rank_matches": map[string]any{
				"0": map[string]any{"device": 16, "cpu_local": 16, "cpu_share": 32, "disk": 32},
			},
			"device": 16, "cpu_local": 16, "cpu_share": 32, "disk": 32,
		},
		"node2": map[string]any{
			"longest_matched": 0,
			"dp":              map[string]any{"1": 0, "0": 0},
			"rank_matches": map[string]any{
				"1": map[string]any{"device": 0, "cpu_local": 0, "cpu_share": 0, "disk": 0},
				"0": map[string]any{"device": 0, "cpu_local": 0, "cpu_share": 0, "disk": 0},
			},
			"device": 0, "cpu_local": 0, "cpu_share": 0, "disk": 0,
		},
	}}
}

func TestDecodeQueryResultContract(t *testing.T) {
	var res QueryResult
	if err := DecodeQueryResult(&res, mustAppendIntf(t, contractQueryBody())); err != nil {
		t.Fatal(err)
	}
	if len(res.Instances) != 2 {
		t.Fatalf("%d instances", len(res.Instances))
	}
	h := res.Instance("vllm-prefill-node1")
	if h == nil {
		t.Fatal("missing vllm-prefill-node1")
	}
	want := InstanceHit{InstanceID: "vllm-prefill-node1", LongestMatched: 32,
		TierCounts: TierCounts{16, 16, 32, 32},
		Ranks:      []RankHit{{Rank: 0, DP: 16, TierCounts: TierCounts{16, 16, 32, 32}, inDP: true, inRankMatches: true}}}
	if !reflect.DeepEqual(*h, want) {
		t.Fatalf("got  %+v\nwant %+v", *h, want)
	}
	n2 := res.Instance("node2")
	if n2 == nil || len(n2.Ranks) != 2 || n2.Ranks[0].Rank != 0 || n2.Ranks[1].Rank != 1 {
		t.Fatalf("node2 ranks not merged and sorted: %+v", n2)
	}
	if res.Instance("nope") != nil || h.Rank(7) != nil || h.Rank(0) == nil {
		t.Fatal("lookup helpers wrong")
	}

	// JSON output has the contract's shape and values.
	js, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got, exp any
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("invalid JSON %s: %v", js, err)
	}
	expJSON, _ := json.Marshal(contractQueryBody())
	_ = json.Unmarshal(expJSON, &exp)
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("JSON\n got  %s\n want %s", js, expJSON)
	}
}

func TestDecodeQueryResultLenient(t *testing.T) {
	// Unsigned ints, an integer rank key, the upstream "npu" tier name, nil values and
	// an unknown key must all be understood.
	var b []byte
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "extra")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendString(b, "ignored")
	b = msgp.AppendString(b, "instances")
	b = msgp.AppendMapHeader(b, 1)
	b = msgp.AppendString(b, "a")
	b = msgp.AppendMapHeader(b, 5)
	b = msgp.AppendString(b, "longest_matched")
	b = msgp.AppendUint64(b, 300)
	b = msgp.AppendString(b, "npu")
	b = msgp.AppendUint8(b, 200)
	b = msgp.AppendString(b, "disk")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "future")
	b = msgp.AppendMapHeader(b, 0)
	b = msgp.AppendString(b, "dp")
	b = msgp.AppendMapHeader(b, 1)
	b = msgp.AppendInt(b, 4)
	b = msgp.AppendInt(b, 7)
	var res QueryResult
	if err := DecodeQueryResult(&res, b); err != nil {
		t.Fatal(err)
	}
	h := res.Instance("a")
	if h == nil || h.LongestMatched != 300 || h.Device != 200 || h.Disk != 0 || len(h.Ranks) != 1 ||
		h.Ranks[0].Rank != 4 || h.Ranks[0].DP != 7 {
		t.Fatalf("got %+v", h)
	}
}

func TestDecodeQueryResultThreeTierNames(t *testing.T) {
	// The three-tier upstream server (bench/upstream) names its tiers gpu, cpu (Mooncake
	// Store's shared pool) and disk, per instance and per rank.
	tiers := func(gpu, cpu, disk int) map[string]any {
		return map[string]any{"gpu": gpu, "cpu": cpu, "disk": disk}
	}
	inst := tiers(48, 32, 16)
	inst["longest_matched"] = 48
	inst["dp"] = map[string]any{"0": 48, "1": 16}
	inst["rank_matches"] = map[string]any{"0": tiers(48, 32, 0), "1": tiers(16, 0, 16)}
	var res QueryResult
	if err := DecodeQueryResult(&res, mustAppendIntf(t, map[string]any{"instances": map[string]any{"a": inst}})); err != nil {
		t.Fatal(err)
	}
	h := res.Instance("a")
	want := InstanceHit{InstanceID: "a", LongestMatched: 48, TierCounts: TierCounts{Device: 48, CPUShare: 32, Disk: 16},
		Ranks: []RankHit{{Rank: 0, DP: 48, TierCounts: TierCounts{Device: 48, CPUShare: 32}}, {Rank: 1, DP: 16, TierCounts: TierCounts{Device: 16, Disk: 16}}}}
	if h == nil || h.LongestMatched != want.LongestMatched || h.TierCounts != want.TierCounts || len(h.Ranks) != 2 ||
		h.Ranks[0].Rank != 0 || h.Ranks[0].DP != 48 || h.Ranks[0].TierCounts != want.Ranks[0].TierCounts ||
		h.Ranks[1].Rank != 1 || h.Ranks[1].DP != 16 || h.Ranks[1].TierCounts != want.Ranks[1].TierCounts {
		t.Fatalf("got %+v, want %+v", h, want)
	}
}

func TestDecodeQueryResultEmptyAndErrors(t *testing.T) {
	var res QueryResult
	if err := DecodeQueryResult(&res, mustAppendIntf(t, contractQueryBody())); err != nil {
		t.Fatal(err)
	}
	if err := DecodeQueryResult(&res, mustAppendIntf(t, map[string]any{"instances": map[string]any{}})); err != nil {
		t.Fatal(err)
	}
	if len(res.Instances) != 0 {
		t.Fatalf("empty result kept %d instances", len(res.Instances))
	}
	full := mustAppendIntf(t, contractQueryBody())
	bad := map[string][]byte{
		"missing instances": mustAppendIntf(t, map[string]any{"x": 1}),
		"not a map":         mustAppendIntf(t, []any{1}),
		"bad rank key":      mustAppendIntf(t, map[string]any{"instances": map[string]any{"a": map[string]any{"dp": map[string]any{"zero": 1}}}}),
		"string count":      mustAppendIntf(t, map[string]any{"instances": map[string]any{"a": map[string]any{"device": "16"}}}),
		"truncated":         full[:len(full)-3],
	}
	for name, body := range bad {
		if err := DecodeQueryResult(&res, body); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestDecodeQueryResultReuseNoAllocs(t *testing.T) {
	body := mustAppendIntf(t, contractQueryBody())
	var res QueryResult
	if err := DecodeQueryResult(&res, body); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := DecodeQueryResult(&res, body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per decode, want 0", allocs)
	}
	if h := res.Instance("vllm-prefill-node1"); h == nil || h.CPUShare != 32 || len(h.Ranks) != 1 {
		t.Fatalf("reused decode wrong: %+v", h)
	}
}

func TestDecodeServiceList(t *testing.T) {
	body := mustAppendIntf(t, map[string]any{
		"count": uint64(2),
		"services": []any{
			map[string]any{
				"Endpoint": "tcp://10.0.0.1:5557", "ReplayEndpoint": "tcp://10.0.0.1:5558",
				"Type": "vLLM", "ModelName": "deepseek", "LoraName": "", "TenantID": "default",
				"InstanceID": "vllm-prefill-node1", "BlockSize": 16, "DPRank": 0, "CacheGroup": nil,
				"HashProfile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor",
					"python_hash_seed": "0", "root_digest": strings.Repeat("ab", 32), "index_projection": "low64_be"},
			},
			map[string]any{"Endpoint": "tcp://h:2", "Type": "Mooncake", "DPRank": 1, "CacheGroup": 0, "NewField": true},
		},
	})
	l, err := DecodeServiceList(body)
	if err != nil {
		t.Fatal(err)
	}
	if l.Count != 2 || len(l.Services) != 2 {
		t.Fatalf("got %+v", l)
	}
	s := l.Services[0]
	if s.Endpoint != "tcp://10.0.0.1:5557" || s.ReplayEndpoint != "tcp://10.0.0.1:5558" || s.Type != "vLLM" ||
		s.ModelName != "deepseek" || s.TenantID != "default" || s.InstanceID != "vllm-prefill-node1" ||
		s.BlockSize != 16 || s.CacheGroup != nil || s.HashProfile.RootDigest != strings.Repeat("ab", 32) ||
		s.HashProfile.PythonHashSeed != "0" || s.HashProfile.IndexProjection != "low64_be" {
		t.Fatalf("service 0: %+v", s)
	}
	if g := l.Services[1].CacheGroup; g == nil || *g != 0 || l.Services[1].DPRank != 1 {
		t.Fatalf("service 1: %+v", l.Services[1])
	}
	js, _ := json.Marshal(l)
	if !strings.Contains(string(js), `"CacheGroup":null`) || !strings.Contains(string(js), `"InstanceID":"vllm-prefill-node1"`) {
		t.Fatalf("JSON keys are not the server's: %s", js)
	}
	if _, err := DecodeServiceList(mustAppendIntf(t, map[string]any{"services": []any{map[string]any{"BlockSize": "x"}}})); err == nil ||
		!strings.Contains(err.Error(), "BlockSize") {
		t.Fatalf("bad BlockSize: err %v", err)
	}
}

func TestDecodeGlobalView(t *testing.T) {
	body := mustAppendIntf(t, map[string]any{
		"context_count": 1,
		"contexts": []any{map[string]any{
			"model_name": "deepseek", "lora_name": "", "block_size": 16, "tenant_id": "default",
			"prefix_count": 42,
			"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor",
				"python_hash_seed": "0", "root_digest": strings.Repeat("0", 64), "index_projection": "low64_be"},
			"instances": map[string]any{"vllm-prefill-node1": []any{0, 1}, "b": []any{}},
		}},
	})
	g, err := DecodeGlobalView(body)
	if err != nil {
		t.Fatal(err)
	}
	want := GlobalView{ContextCount: 1, Contexts: []ContextView{{
		ModelName: "deepseek", BlockSize: 16, TenantID: "default", PrefixCount: 42,
		HashProfile: HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0",
			RootDigest: strings.Repeat("0", 64), IndexProjection: "low64_be"},
		Instances: map[string][]int64{"vllm-prefill-node1": {0, 1}, "b": {}},
	}}}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("got  %+v\nwant %+v", g, want)
	}
}

func TestDecodeRegisterAndUnregister(t *testing.T) {
	r, err := DecodeRegisterResult(mustAppendIntf(t, map[string]any{"status": "registered successfully", "instance_id": "x"}))
	if err != nil || r != (RegisterResult{"registered successfully", "x"}) {
		t.Fatalf("register: %+v %v", r, err)
	}
	u, err := DecodeUnregisterResult(mustAppendIntf(t, map[string]any{"status": "unregistered successfully",
		"removed_instances": []any{"x|default|0"}}))
	if err != nil || u.Status != "unregistered successfully" || !reflect.DeepEqual(u.RemovedInstances, []string{"x|default|0"}) {
		t.Fatalf("unregister: %+v %v", u, err)
	}
	if _, err := DecodeRegisterResult([]byte{0xc1}); err == nil {
		t.Fatal("invalid msgpack accepted")
	}
}

func TestDecodeError(t *testing.T) {
	cases := []struct {
		status int
		body   []byte
		want   string
	}{
		{400, mustAppendIntf(t, map[string]any{"error": "block_size must be positive", "reason": "invalid_value", "field": "block_size"}),
			"block_size must be positive (reason: invalid_value, field: block_size)"},
		{400, mustAppendIntf(t, map[string]any{"error": "token out of range", "reason": "out_of_range", "field": "token_ids", "index": 3}),
			"token out of range (reason: out_of_range, field: token_ids, index: 3)"},
		{400, mustAppendIntf(t, map[string]any{"error": "bad", "index": 0}), "bad (index: 0)"},
		{404, mustAppendIntf(t, map[string]any{"error": "service not found: a|default|0"}), "service not found: a|default|0"},
		{502, []byte("<html>Bad Gateway</html>\n"), "<html>Bad Gateway</html>"},
		{503, nil, "HTTP 503 Service Unavailable"},
	}
	for _, c := range cases {
		e := DecodeError(c.status, c.body)
		if e.Status != c.status || e.Error() != c.want {
			t.Errorf("status %d: got %d %q, want %q", c.status, e.Status, e.Error(), c.want)
		}
	}
}

// TestReadIntMatchesMsgp: the inline integer decoder agrees with msgp's on every integer
// encoding at its boundaries, on nil, and fails like msgp on truncated input, an
// out-of-range uint64 and non-integers.
func TestReadIntMatchesMsgp(t *testing.T) {
	var bodies [][]byte
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64} {
		bodies = append(bodies, msgp.AppendInt64(nil, v))
	}
	for _, v := range []uint64{0, 200, 60000, 4e9, math.MaxInt64} {
		bodies = append(bodies, msgp.AppendUint64(nil, v))
	}
	// Wide encodings of small values, which msgp's writer never emits but others may.
	bodies = append(bodies, []byte{0xcc, 5}, []byte{0xcd, 0, 5}, []byte{0xce, 0, 0, 0, 5},
		[]byte{0xcf, 0, 0, 0, 0, 0, 0, 0, 5}, []byte{0xd0, 5}, []byte{0xd1, 0xff, 0xfb},
		[]byte{0xd2, 0, 0, 0, 5}, []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfb})
	for _, b := range bodies {
		b = append(b, 0x01) // a following value must be left in place
		want, wrest, werr := msgp.ReadInt64Bytes(b)
		got, rest, err := readInt(b)
		if err != nil || werr != nil || got != want || len(rest) != len(wrest) || rest[0] != 0x01 {
			t.Errorf("% x: got %d (%d left, %v), msgp %d (%d left, %v)", b, got, len(rest), err, want, len(wrest), werr)
		}
	}
	if v, rest, err := readInt([]byte{0xc0, 0x01}); v != 0 || err != nil || len(rest) != 1 {
		t.Errorf("nil: %d %v %d left", v, err, len(rest))
	}
	for _, bad := range [][]byte{nil, {0xcc}, {0xcd, 1}, {0xce, 1, 2, 3}, {0xd0}, {0xd1, 1}, {0xd2, 1, 2, 3},
		{0xd3, 1, 2, 3, 4, 5, 6, 7}, msgp.AppendUint64(nil, math.MaxUint64), msgp.AppendString(nil, "7"),
		msgp.AppendFloat64(nil, 1)} {
		if _, _, err := readInt(bad); err == nil {
			t.Errorf("% x: no error", bad)
		}
	}
}

// TestViewDecodersLenience pins what views.go promises of the generated decoders: unknown
// keys are skipped, integers may be unsigned, nil reads as empty for pointer, slice and
// map fields, and an empty rank list or removed list decodes as [] (prints as [], not null).
func TestViewDecodersLenience(t *testing.T) {
	b := msgp.AppendMapHeader(nil, 3)
	b = msgp.AppendString(b, "from_a_newer_server")
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendMapHeader(b, 0)
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "count")
	b = msgp.AppendUint64(b, 1)
	b = msgp.AppendString(b, "services")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, 3)
	b = msgp.AppendString(b, "BlockSize")
	b = msgp.AppendUint8(b, 16)
	b = msgp.AppendString(b, "CacheGroup")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "Unknown")
	b = msgp.AppendFloat64(b, 1.5)
	l, err := DecodeServiceList(b)
	if err != nil || l.Count != 1 || len(l.Services) != 1 || l.Services[0].BlockSize != 16 || l.Services[0].CacheGroup != nil {
		t.Fatalf("services: %+v %v", l, err)
	}

	// No services, no contexts: empty lists, which print as [] in JSON (not null).
	for _, body := range []map[string]any{{"count": 0, "services": []any{}}, {"count": 0}} {
		l, err := DecodeServiceList(mustAppendIntf(t, body))
		if js, _ := json.Marshal(l); err != nil || !strings.Contains(string(js), `"services":[]`) {
			t.Fatalf("no services %v: %s %v", body, js, err)
		}
	}
	for _, body := range []map[string]any{{"context_count": 0, "contexts": []any{}}, {"context_count": 0}} {
		g, err := DecodeGlobalView(mustAppendIntf(t, body))
		if js, _ := json.Marshal(g); err != nil || !strings.Contains(string(js), `"contexts":[]`) {
			t.Fatalf("no contexts %v: %s %v", body, js, err)
		}
	}

	g, err := DecodeGlobalView(mustAppendIntf(t, map[string]any{"contexts": []any{map[string]any{
		"instances": map[string]any{"a": []any{}}}}}))
	if err != nil || len(g.Contexts) != 1 || g.Contexts[0].Instances["a"] == nil || len(g.Contexts[0].Instances["a"]) != 0 {
		t.Fatalf("global view: %+v %v", g, err)
	}
	u, err := DecodeUnregisterResult(mustAppendIntf(t, map[string]any{"status": "ok", "removed_instances": []any{}}))
	if err != nil || u.RemovedInstances == nil || len(u.RemovedInstances) != 0 {
		t.Fatalf("unregister: %+v %v", u, err)
	}
	// The error body: an index is optional, and 0 is an index.
	if e := DecodeError(400, mustAppendIntf(t, map[string]any{"error": "x", "index": uint64(0)})); !e.HasIndex || e.Index != 0 {
		t.Fatalf("error index: %+v", e)
	}
	if e := DecodeError(400, mustAppendIntf(t, map[string]any{"error": "x"})); e.HasIndex || e.Message != "x" {
		t.Fatalf("error without index: %+v", e)
	}
}
