package httpclient

import (
	"bytes"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/conductor-go/conductor/wire/httpapi"
)

// TestAppendQueryByHashRequest: both forms decode, with the server's own strict decoder,
// to the keys and fields that were encoded; sizes straddle the bin and array header
// boundaries and keys cover every integer width.
func TestAppendQueryByHashRequest(t *testing.T) {
	for _, n := range []int{0, 1, 31, 32, 8191, 8192, 70000} {
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = uint64(i) * 0x9e3779b97f4a7c15 >> (uint(i) % 64)
		}
		if n > 1 {
			keys[0], keys[1] = 0, math.MaxUint64
		}
		for _, bin := range []bool{false, true} {
			q := QueryByHashRequest{Model: "m", BlockSize: 16, BlockHashes: keys, LoraName: "l", TenantID: "t",
				InstanceID: "i", CacheSalt: "s", BinaryHashes: bin}
			body := AppendQueryByHashRequest(nil, &q)
			decodeStrict(t, body)
			var got httpapi.QueryByHashRequest
			if rerr := httpapi.DecodeQueryByHashRequest(body, &got); rerr != nil {
				t.Fatalf("n=%d bin=%v: %v", n, bin, rerr)
			}
			if !slices.Equal(got.BlockHashes, keys) || got.Model != "m" || got.BlockSize != 16 || got.LoraName != "l" ||
				got.TenantID != "t" || got.InstanceID != "i" || got.CacheSalt != "s" {
				t.Fatalf("n=%d bin=%v: decoded %+v", n, bin, got.QueryRequest)
			}
			if wantLead := byte(0xc4); bin && n > 0 && body[bytes.Index(body, []byte("block_hashes"))+12]&0xfc != wantLead {
				t.Fatalf("n=%d: block_hashes is not a bin", n)
			}
		}
	}
	// Optional fields left empty are not sent.
	got := decodeStrict(t, AppendQueryByHashRequest(nil, &QueryByHashRequest{Model: "m", BlockSize: 4}))
	want := map[string]any{"model": "m", "block_size": int64(4), "block_hashes": []any{}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v want %#v", got, want)
	}
}

func TestAppendQueryByHashRequestNoAllocs(t *testing.T) {
	keys := make([]uint64, 2048)
	for i := range keys {
		keys[i] = uint64(i) << 40
	}
	for _, bin := range []bool{false, true} {
		q := QueryByHashRequest{Model: "m", BlockSize: 16, BlockHashes: keys, BinaryHashes: bin}
		buf := AppendQueryByHashRequest(nil, &q)
		if n := testing.AllocsPerRun(100, func() { buf = AppendQueryByHashRequest(buf[:0], &q) }); n != 0 {
			t.Fatalf("bin=%v: %v allocs per encode", bin, n)
		}
	}
}

// TestClientQueryByHash: the Client and a by-hash Session post to /query_by_hash with the
// encoded body and decode the answer like Query's.
func TestClientQueryByHash(t *testing.T) {
	answer := mustAppendIntf(t, contractQueryBody())
	rec, c := newFake(t, map[string]reply{"POST /query_by_hash": {200, answer}, "POST /query": {500, nil}})
	var want QueryResult
	if err := DecodeQueryResult(&want, answer); err != nil {
		t.Fatal(err)
	}
	q := QueryByHashRequest{Model: "m", BlockSize: 16, BlockHashes: []uint64{1, math.MaxUint64}, TenantID: "t", BinaryHashes: true}
	var res QueryResult
	if err := c.QueryByHash(&q, &res); err != nil {
		t.Fatal(err)
	}
	got := rec.last(t)
	if got.method != "POST" || got.path != "/query_by_hash" || got.contentType != contentType ||
		!bytes.Equal(got.body, AppendQueryByHashRequest(nil, &q)) || !reflect.DeepEqual(res, want) {
		t.Fatalf("Client.QueryByHash: %s %s % x -> %+v", got.method, got.path, got.body, res)
	}
	s := c.NewByHashSession()
	defer s.Close()
	q.BinaryHashes = false
	var res2 QueryResult
	if err := s.QueryByHash(&q, &res2); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(t); got.path != "/query_by_hash" || !bytes.Equal(got.body, AppendQueryByHashRequest(nil, &q)) || !reflect.DeepEqual(res2, want) {
		t.Fatalf("Session.QueryByHash: %s % x", got.path, got.body)
	}
	enc := AppendQueryByHashRequest(nil, &q)
	if raw, err := s.QueryRaw(enc); err != nil || !bytes.Equal(raw, answer) || rec.last(t).path != "/query_by_hash" {
		t.Fatalf("QueryRaw: %v % x", err, raw)
	}
	// An error reply surfaces as *Error.
	q.Model = ""
	rec.mu.Lock()
	rec.replies["POST /query_by_hash"] = reply{400, mustAppendIntf(t, map[string]any{"error": "model is required", "reason": "missing", "field": "model"})}
	rec.mu.Unlock()
	err := c.QueryByHash(&q, &res)
	if e, ok := err.(*Error); !ok || e.Status != 400 || e.Reason != "missing" {
		t.Fatalf("error reply: %#v", err)
	}
}
