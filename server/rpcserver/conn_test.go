package rpcserver

import (
	"log/slog"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// newTestServer is an RPC server over a service with an empty engine, served without a
// listener (through rpcConn.dispatch).
func newTestServer(t *testing.T) *Server {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	eng := engine.New(engine.Config{Logger: log})
	t.Cleanup(eng.Close)
	svc := service.New(service.Options{Engine: eng, Logger: log})
	t.Cleanup(svc.Stop)
	return New(Options{Service: svc, Logger: log})
}

// TestRPCConnDropsLargeTokenBuffer: between frames an RPC connection keeps a token buffer
// of at most maxConnTokens (so idle connections cannot each pin a multi-MiB prompt for
// rpc_idle_timeout_ms), while a small prompt's buffer is kept for reuse.
func TestRPCConnDropsLargeTokenBuffer(t *testing.T) {
	conn := &rpcConn{s: newTestServer(t)}
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
