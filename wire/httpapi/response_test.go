package httpapi_test

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/wire/httpapi"
)

// htDecodeAll decodes b with msgp's generic reader, an independent check of the
// structure the appenders write, and insists on exactly one object.
func htDecodeAll(t *testing.T, b []byte) any {
	t.Helper()
	v, rest, err := msgp.ReadIntfBytes(b)
	if err != nil {
		t.Fatalf("generic decode: %v (%x)", err, b)
	}
	if len(rest) != 0 {
		t.Fatalf("%d trailing bytes", len(rest))
	}
	return htNormalize(v)
}

// htNormalize maps msgp's integer types onto int64 so expectations can be written plainly.
func htNormalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = htNormalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = htNormalize(e)
		}
		return out
	case uint64:
		return int64(x)
	case int:
		return int64(x)
	}
	return v
}

type htObj = map[string]any

func TestAppendRequestError(t *testing.T) {
	cases := []struct {
		e    httpapi.RequestError
		want htObj
	}{
		{httpapi.RequestError{Msg: "Invalid msgpack object", Reason: httpapi.ReasonInvalidMsgpack, Index: -1},
			htObj{"error": "Invalid msgpack object", "reason": "invalid_msgpack"}},
		{httpapi.RequestError{Msg: "model is required", Reason: httpapi.ReasonMissing, Field: "model", Index: -1},
			htObj{"error": "model is required", "reason": "missing", "field": "model"}},
		{httpapi.RequestError{Msg: "token_ids element is outside the int32 range", Reason: httpapi.ReasonOutOfRange, Field: "token_ids", Index: 0},
			htObj{"error": "token_ids element is outside the int32 range", "reason": "out_of_range", "field": "token_ids", "index": int64(0)}},
		{httpapi.RequestError{Msg: "x", Reason: httpapi.ReasonInvalidType, Field: "token_ids", Index: 70000},
			htObj{"error": "x", "reason": "invalid_type", "field": "token_ids", "index": int64(70000)}},
	}
	for _, c := range cases {
		prefix := []byte{0xaa}
		b := httpapi.AppendRequestError(prefix, &c.e)
		if b[0] != 0xaa {
			t.Fatal("prefix overwritten")
		}
		if got := htDecodeAll(t, b[1:]); !reflect.DeepEqual(got, any(c.want)) {
			t.Errorf("got %#v\nwant %#v", got, c.want)
		}
	}
	// What the decoders return encodes as the contract says.
	var q httpapi.QueryRequest
	e := httpapi.DecodeQueryRequest(htEnc(htQueryBase().with("token_ids", []any{1, "x"})), &q)
	got := htDecodeAll(t, httpapi.AppendRequestError(nil, e))
	want := htObj{"error": e.Msg, "reason": "invalid_type", "field": "token_ids", "index": int64(1)}
	if !reflect.DeepEqual(got, any(want)) {
		t.Errorf("decoder error: got %#v", got)
	}
}

func TestAppendStatusBodies(t *testing.T) {
	if got := htDecodeAll(t, httpapi.AppendErrorMessage(nil, "service not found: a|default|0")); !reflect.DeepEqual(got, any(htObj{"error": "service not found: a|default|0"})) {
		t.Errorf("error message: %#v", got)
	}
	if got := htDecodeAll(t, httpapi.AppendStatusRegistered(nil, "vllm-prefill-node1")); !reflect.DeepEqual(got,
		any(htObj{"status": "registered successfully", "instance_id": "vllm-prefill-node1"})) {
		t.Errorf("registered: %#v", got)
	}
	if got := htDecodeAll(t, httpapi.AppendStatusUnregistered(nil, "vllm-prefill-node1|default|0")); !reflect.DeepEqual(got,
		any(htObj{"status": "unregistered successfully", "removed_instances": []any{"vllm-prefill-node1|default|0"}})) {
		t.Errorf("unregistered: %#v", got)
	}
}

func TestAppendQueryResponse(t *testing.T) {
	// The contract's example, plus a second instance with two ranks (one of them a
	// multi-digit and one a zero-hit rank) and an instance with no ranks.
	b := httpapi.AppendQueryResponseHeader(nil, 3)
	b = httpapi.AppendInstanceHit(b, "vllm-prefill-node1", 32, 16, 16, 32, 32,
		[]httpapi.RankTiers{{Rank: 0, Device: 16, CPULocal: 16, CPUShare: 32, Disk: 32}})
	b = httpapi.AppendInstanceHit(b, "sglang-b", 1<<40, 300, 70000, 1<<33, 1<<40,
		[]httpapi.RankTiers{{Rank: 12345678, Device: 300, CPULocal: 70000, CPUShare: 1 << 33, Disk: 1 << 40}, {Rank: 7}})
	b = httpapi.AppendInstanceHit(b, "idle", 0, 0, 0, 0, 0, nil)
	want := htObj{"instances": htObj{
		"vllm-prefill-node1": htObj{
			"longest_matched": int64(32),
			"dp":              htObj{"0": int64(16)},
			"rank_matches":    htObj{"0": htObj{"device": int64(16), "cpu_local": int64(16), "cpu_share": int64(32), "disk": int64(32)}},
			"device":          int64(16), "cpu_local": int64(16), "cpu_share": int64(32), "disk": int64(32),
		},
		"sglang-b": htObj{
			"longest_matched": int64(1 << 40),
			"dp":              htObj{"12345678": int64(300), "7": int64(0)},
			"rank_matches": htObj{
				"12345678": htObj{"device": int64(300), "cpu_local": int64(70000), "cpu_share": int64(1 << 33), "disk": int64(1 << 40)},
				"7":        htObj{"device": int64(0), "cpu_local": int64(0), "cpu_share": int64(0), "disk": int64(0)},
			},
			"device": int64(300), "cpu_local": int64(70000), "cpu_share": int64(1 << 33), "disk": int64(1 << 40),
		},
		"idle": htObj{
			"longest_matched": int64(0), "dp": htObj{}, "rank_matches": htObj{},
			"device": int64(0), "cpu_local": int64(0), "cpu_share": int64(0), "disk": int64(0),
		},
	}}
	if got := htDecodeAll(t, b); !reflect.DeepEqual(got, any(want)) {
		t.Errorf("got %#v\nwant %#v", got, want)
	}
	if got := htDecodeAll(t, httpapi.AppendQueryResponseHeader(nil, 0)); !reflect.DeepEqual(got, any(htObj{"instances": htObj{}})) {
		t.Errorf("empty: %#v", got)
	}
	// Rank keys are msgpack str (not bin, not int), whatever the rank's width.
	for _, rank := range []int{0, 9, 10, 2147483647, -1} {
		b := httpapi.AppendInstanceHit(nil, "i", 0, 0, 0, 0, 0, []httpapi.RankTiers{{Rank: rank}})
		got := htDecodeAll(t, append(msgp.AppendMapHeader(nil, 1), b...)).(htObj)
		dp := got["i"].(htObj)["dp"].(htObj)
		if len(dp) != 1 {
			t.Fatalf("rank %d: dp %#v", rank, dp)
		}
		for k := range dp {
			if k != strconv.Itoa(rank) {
				t.Errorf("rank %d encoded as %q", rank, k)
			}
		}
	}
}

func TestQueryResponseZeroAllocs(t *testing.T) {
	ranks := []httpapi.RankTiers{{Rank: 0, Device: 16, CPULocal: 32, CPUShare: 48, Disk: 64}, {Rank: 1, Device: 1, CPULocal: 2, CPUShare: 3, Disk: 4}}
	buf := make([]byte, 0, 4096)
	e := &httpapi.RequestError{Msg: "m", Reason: httpapi.ReasonOutOfRange, Field: "token_ids", Index: 5}
	n := testing.AllocsPerRun(100, func() {
		b := httpapi.AppendQueryResponseHeader(buf[:0], 8)
		for i := 0; i < 8; i++ {
			b = httpapi.AppendInstanceHit(b, "vllm-prefill-node1", 64, 16, 32, 48, 64, ranks)
		}
		b = httpapi.AppendRequestError(b, e)
		b = httpapi.AppendErrorMessage(b, "service not found")
		b = httpapi.AppendStatusRegistered(b, "x")
		_ = httpapi.AppendStatusUnregistered(b, "x|default|0")
	})
	if n != 0 {
		t.Errorf("%v allocs per response, want 0", n)
	}
}
