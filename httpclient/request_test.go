package httpclient

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// decodeStrict turns a msgpack body into Go values and fails on trailing bytes or on a
// map that repeats a key (ReadIntfBytes would silently keep the last one).
func decodeStrict(t *testing.T, b []byte) any {
	t.Helper()
	checkNoDuplicateKeys(t, b)
	v, rest, err := msgp.ReadIntfBytes(b)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if len(rest) != 0 {
		t.Fatalf("%d trailing bytes", len(rest))
	}
	return v
}

func checkNoDuplicateKeys(t *testing.T, b []byte) []byte {
	t.Helper()
	switch msgp.NextType(b) {
	case msgp.MapType:
		n, o, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for range n {
			var k []byte
			if k, o, err = msgp.ReadMapKeyZC(o); err != nil {
				t.Fatal(err)
			}
			if seen[string(k)] {
				t.Fatalf("duplicate key %q", k)
			}
			seen[string(k)] = true
			o = checkNoDuplicateKeys(t, o)
		}
		return o
	case msgp.ArrayType:
		n, o, err := msgp.ReadArrayHeaderBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			o = checkNoDuplicateKeys(t, o)
		}
		return o
	default:
		o, err := msgp.Skip(b)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
}

func TestAppendRegisterRequestFull(t *testing.T) {
	zero := int64(0)
	r := RegisterRequest{
		Endpoint: "tcp://10.0.0.1:5557", ReplayEndpoint: "tcp://10.0.0.1:5558",
		Type: "vLLM", ModelName: "deepseek", LoraName: "ad1", TenantID: "t1",
		InstanceID: "vllm-prefill-node1", BlockSize: 16, DPRank: 3, CacheGroup: &zero,
		HashProfile: HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor",
			PythonHashSeed: "0", IndexProjection: "low64_be", RootDigest: "must not be sent"},
	}
	got := decodeStrict(t, AppendRegisterRequest([]byte{0xff}, &r)[1:])
	want := map[string]any{
		"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558",
		"type": "vLLM", "modelname": "deepseek", "lora_name": "ad1", "tenant_id": "t1",
		"instance_id": "vllm-prefill-node1", "block_size": int64(16), "dp_rank": int64(3),
		"cache_group": int64(0),
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor",
			"python_hash_seed": "0", "index_projection": "low64_be"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %#v\nwant %#v", got, want)
	}
}

func TestAppendRegisterRequestMinimal(t *testing.T) {
	r := RegisterRequest{
		Endpoint: "tcp://h:1", Type: "SGLang", ModelName: "m", InstanceID: "i", BlockSize: 1,
		HashProfile: HashProfile{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"},
	}
	got := decodeStrict(t, AppendRegisterRequest(nil, &r))
	want := map[string]any{
		"endpoint": "tcp://h:1", "type": "SGLang", "modelname": "m", "instance_id": "i",
		"block_size": int64(1), "dp_rank": int64(0),
		"hash_profile": map[string]any{"strategy": "sglang", "algorithm": "sha256_raw",
			"index_projection": "first64_be"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %#v\nwant %#v", got, want)
	}
}

func TestAppendUnregisterRequest(t *testing.T) {
	got := decodeStrict(t, AppendUnregisterRequest(nil, &UnregisterRequest{InstanceID: "a", TenantID: "t", DPRank: 2}))
	want := map[string]any{"instance_id": "a", "tenant_id": "t", "dp_rank": int64(2)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v want %#v", got, want)
	}
	got = decodeStrict(t, AppendUnregisterRequest(nil, &UnregisterRequest{InstanceID: "a"}))
	want = map[string]any{"instance_id": "a", "dp_rank": int64(0)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v want %#v", got, want)
	}
}

func TestAppendQueryRequestArray(t *testing.T) {
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: []int32{101, -15, 1 << 30, -1 << 31, 0},
		LoraName: "l", TenantID: "t", InstanceID: "i", CacheSalt: "s"}
	got := decodeStrict(t, AppendQueryRequest(nil, &q))
	want := map[string]any{
		"model": "deepseek", "block_size": int64(16), "lora_name": "l", "tenant_id": "t",
		"instance_id": "i", "cache_salt": "s",
		"token_ids": []any{int64(101), int64(-15), int64(1 << 30), int64(-1 << 31), int64(0)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %#v\nwant %#v", got, want)
	}
	// Optional fields left empty are not sent at all.
	got = decodeStrict(t, AppendQueryRequest(nil, &QueryRequest{Model: "m", BlockSize: 4}))
	want = map[string]any{"model": "m", "block_size": int64(4), "token_ids": []any{}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v want %#v", got, want)
	}
}

func TestAppendQueryRequestBinary(t *testing.T) {
	// Sizes straddle the bin8/bin16/bin32 header boundaries.
	for _, n := range []int{0, 1, 63, 64, 16383, 16384, 70000} {
		toks := make([]int32, n)
		for i := range toks {
			toks[i] = int32(i*7919 - n)
		}
		q := QueryRequest{Model: "m", BlockSize: 16, TokenIDs: toks, BinaryTokens: true}
		got := decodeStrict(t, AppendQueryRequest(nil, &q)).(map[string]any)
		bin, ok := got["token_ids"].([]byte)
		if !ok {
			t.Fatalf("n=%d: token_ids is %T, want bin", n, got["token_ids"])
		}
		if len(bin) != 4*n {
			t.Fatalf("n=%d: bin has %d bytes", n, len(bin))
		}
		for i := range toks {
			if v := int32(binary.LittleEndian.Uint32(bin[4*i:])); v != toks[i] {
				t.Fatalf("n=%d: token %d = %d, want %d", n, i, v, toks[i])
			}
		}
	}
}

func TestAppendQueryRequestNoAllocs(t *testing.T) {
	toks := make([]int32, 4096)
	for i := range toks {
		toks[i] = int32(i * 31)
	}
	for _, bin := range []bool{false, true} {
		q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: toks, TenantID: "t", BinaryTokens: bin}
		buf := AppendQueryRequest(nil, &q)
		allocs := testing.AllocsPerRun(100, func() { buf = AppendQueryRequest(buf[:0], &q) })
		if allocs != 0 {
			t.Fatalf("binary=%v: %v allocs per encode, want 0", bin, allocs)
		}
	}
}
