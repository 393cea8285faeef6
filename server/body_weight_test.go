package server

import (
	"fmt"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/server/httpserver"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// fixintBody is a query-shaped body whose list field holds n one-byte elements: the most
// decoded memory per body byte a client can send.
func fixintBody(listKey string, n int) []byte {
	b := msgp.AppendArrayHeader(queryHead(listKey), uint32(n))
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
	if held, charged := len(body)+4*cap(q.Tokens), httpserver.QueryBodyWeight*len(body); held > charged {
		t.Errorf("/query: %d bytes held, %d charged", held, charged)
	}
	body = fixintBody("block_hashes", n)
	var h httpapi.QueryByHashRequest
	if rerr := httpapi.DecodeQueryByHashRequest(body, &h); rerr != nil {
		t.Fatal(rerr)
	}
	if held, charged := len(body)+8*cap(h.BlockHashes), httpserver.QueryByHashBodyWeight*len(body); held > charged {
		t.Errorf("/query_by_hash: %d bytes held, %d charged", held, charged)
	}
}

// TestLargeBodiesCountsBufferSize: the large-body counter (which triggers returning heap
// to the OS with a full collection) counts bodies whose buffer is too large for the pool,
// not bodies whose budget charge (a multiple of their size) passes limits.SmallBodyBytes,
// and each asks for the memory release.
func TestLargeBodiesCountsBufferSize(t *testing.T) {
	app := startLimited(t, Limits{}, "")
	small := binQuery(make([]int32, limits.SmallBodyBytes/4/httpserver.QueryBodyWeight*2)) // charged above, sized below limits.SmallBodyBytes
	if int64(len(small))*httpserver.QueryBodyWeight <= limits.SmallBodyBytes || len(small) > limits.SmallBodyBytes {
		t.Fatalf("bad fixture: %d bytes", len(small))
	}
	if code, r := msgpackPost(t, app, "/query", small); code != 200 {
		t.Fatalf("small: %d %v", code, r)
	}
	if n := app.Counters.LargeBodies.Load(); n != 0 {
		t.Fatalf("after a %d-byte body: LargeBodies = %d, want 0", len(small), n)
	}
	if code, r := msgpackPost(t, app, "/query", binQuery(make([]int32, limits.SmallBodyBytes/4+1))); code != 200 {
		t.Fatalf("large: %d %v", code, r)
	}
	if n := app.Counters.LargeBodies.Load(); n != 1 {
		t.Fatalf("after a body above limits.SmallBodyBytes: LargeBodies = %d, want 1", n)
	}
	// It asked for the memory release, which runs memoryReleasePeriod later (only then:
	// no ticker looks for large bodies while none is served).
	eventually(t, "memory released after the large body", func() error {
		if n := app.release.Runs(); n != 1 {
			return fmt.Errorf("%d releases", n)
		}
		return nil
	})
}
