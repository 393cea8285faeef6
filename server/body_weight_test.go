package server

import (
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/wire/cororpc"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// fixintBody is a query-shaped body whose list field holds n one-byte elements: the most
// decoded memory per body byte a client can send.
func fixintBody(listKey string, n int) []byte {
	b := msgp.AppendMapHeader(nil, 3)
	b = msgp.AppendString(b, "model")
	b = msgp.AppendString(b, "m")
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, 16)
	b = msgp.AppendString(b, listKey)
	b = msgp.AppendArrayHeader(b, uint32(n))
	for i := 0; i < n; i++ {
		b = append(b, byte(i%128))
	}
	return b
}

// TestQueryBodyWeightsCoverDecodedSize: what a query body holds while it is served (its
// bytes plus the tokens or keys decoded from them) never exceeds what the in-flight
// budget charged for it, for the densest encoding (positive fixints).
func TestQueryBodyWeightsCoverDecodedSize(t *testing.T) {
	const n = 1 << 16
	body := fixintBody("token_ids", n)
	var q httpapi.QueryRequest
	if rerr := httpapi.DecodeQueryRequest(body, &q); rerr != nil {
		t.Fatal(rerr)
	}
	if held, charged := len(body)+4*cap(q.Tokens), queryBodyWeight*len(body); held > charged {
		t.Errorf("/query: %d bytes held, %d charged", held, charged)
	}
	body = fixintBody("block_hashes", n)
	var h httpapi.QueryByHashRequest
	if rerr := httpapi.DecodeQueryByHashRequest(body, &h); rerr != nil {
		t.Fatal(rerr)
	}
	if held, charged := len(body)+8*cap(h.BlockHashes), queryByHashBodyWeight*len(body); held > charged {
		t.Errorf("/query_by_hash: %d bytes held, %d charged", held, charged)
	}
}

// TestLargeBodiesCountsBufferSize: the large-body counter (which triggers returning heap
// to the OS with a full collection) counts bodies whose buffer is too large for the pool,
// not bodies whose budget charge (a multiple of their size) passes SmallBodyBytes.
func TestLargeBodiesCountsBufferSize(t *testing.T) {
	app := startLimited(t, Limits{}, "")
	small := binQuery(make([]int32, SmallBodyBytes/4/queryBodyWeight*2)) // charged above, sized below SmallBodyBytes
	if int64(len(small))*queryBodyWeight <= SmallBodyBytes || len(small) > SmallBodyBytes {
		t.Fatalf("bad fixture: %d bytes", len(small))
	}
	if code, r := msgpackPost(t, app, "/query", small); code != 200 {
		t.Fatalf("small: %d %v", code, r)
	}
	if n := app.Counters.LargeBodies.Load(); n != 0 {
		t.Fatalf("after a %d-byte body: LargeBodies = %d, want 0", len(small), n)
	}
	if code, r := msgpackPost(t, app, "/query", binQuery(make([]int32, SmallBodyBytes/4+1))); code != 200 {
		t.Fatalf("large: %d %v", code, r)
	}
	if n := app.Counters.LargeBodies.Load(); n != 1 {
		t.Fatalf("after a body above SmallBodyBytes: LargeBodies = %d, want 1", n)
	}
}

// TestRPCConnDropsLargeTokenBuffer: between frames an RPC connection keeps a token buffer
// of at most maxConnTokens (so idle connections cannot each pin a multi-MiB prompt for
// rpc_idle_timeout_ms), while a small prompt's buffer is kept for reuse.
func TestRPCConnDropsLargeTokenBuffer(t *testing.T) {
	app := startLimited(t, Limits{}, "")
	conn := &rpcConn{s: app.RPC}
	query := func(n int) {
		t.Helper()
		body := cororpc.AppendQueryRequest(nil, &cororpc.QueryRequest{
			Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: make([]int32, n)})
		hdr := cororpc.RequestHeader{SeqNum: 1, FunctionID: cororpc.FuncQuery, Length: uint32(len(body))}
		if err := conn.dispatch(hdr, body); err != nil {
			t.Fatal(err)
		}
	}
	query(1000)
	if cap(conn.qreq.Tokens) < 1000 {
		t.Fatalf("small prompt: token buffer of cap %d not kept", cap(conn.qreq.Tokens))
	}
	query(maxConnTokens + 1)
	if c := cap(conn.qreq.Tokens); c > maxConnTokens {
		t.Fatalf("after a %d-token prompt the connection keeps %d tokens", maxConnTokens+1, c)
	}
}
