package rpcclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-go/conductor/wire/cororpc"
)

func hx(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Golden bodies from reference-notes.md §2.3 (requests the client must send, responses
// the fake server plays back).
const (
	goldenQueryArgs = "1c1a00f9 07 64656661756c74 01 6d 00 1000000000000000 03 01000000 02000000 03000000 00 00"
	goldenQueryResp = "ccd2d5ad0101016530000000000000000100000000000000002000000000000000010000" +
		"000000000000200000000000000020000000000000003000000000000000300000000000" +
		"00002000000000000000200000000000000030000000000000003000000000000000"
	goldenRegArgs    = "102aa7f2147463703a2f2f3132372e302e302e313a353535370000000000016d000764656661756c7401651000000000000000000000000007766c6c6d5f76310b7368613235365f63626f72013000086c6f7736345f6265"
	goldenRegResp    = "a80190d8 01 01 65 01"
	goldenUnregArgs  = "1aca8199 01 65 07 64656661756c74 00000000"
	goldenUnregResp  = "5c3854f3 00 2ff8ffff"
	goldenViewResp   = "58de0b3a01000000010764656661756c74016d00100000000000000007766c6c6d5f76310b7368613235365f63626f7201304034653131393564663032306465353965306436356133336134323739663131383365376165346535643938306533303966386235356164666632653631633365086c6f7736345f626501016502000000000000000001000000000000002a00000000000000"
	goldenListResp   = "f8427866 00"
	goldenQueryError = "ccd2d5ad 00 30f8ffff" // CONDUCTOR_UNAVAILABLE
)

// fakeServer answers each request with handle's frame (nil: never answer). It records
// the request bodies it saw per function id.
type fakeServer struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[uint32][][]byte
	conns  []net.Conn
	handle func(h cororpc.RequestHeader, body []byte) []byte
}

func startFake(t *testing.T, handle func(h cororpc.RequestHeader, body []byte) []byte) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{ln: ln, seen: map[uint32][][]byte{}, handle: handle}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, conn)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(conn)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *fakeServer) serve(conn net.Conn) {
	br := bufio.NewReader(conn)
	for {
		h, body, err := cororpc.ReadRequest(br, nil, 0)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.seen[h.FunctionID] = append(s.seen[h.FunctionID], body)
		s.mu.Unlock()
		if out := s.handle(h, body); out != nil {
			if _, err := conn.Write(out); err != nil {
				return
			}
		}
	}
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

// goldenHandler answers every method with its golden response.
func goldenHandler(t *testing.T) func(cororpc.RequestHeader, []byte) []byte {
	resp := map[uint32][]byte{
		cororpc.FuncQuery:         hx(t, goldenQueryResp),
		cororpc.FuncRegister:      hx(t, goldenRegResp),
		cororpc.FuncUnregister:    hx(t, goldenUnregResp),
		cororpc.FuncGetGlobalView: hx(t, goldenViewResp),
		cororpc.FuncListServices:  hx(t, goldenListResp),
	}
	return func(h cororpc.RequestHeader, _ []byte) []byte {
		body, ok := resp[h.FunctionID]
		if !ok {
			return cororpc.AppendFrameworkError(nil, h.SeqNum, cororpc.ErrcFunctionNotRegistered, "function not registered")
		}
		return cororpc.AppendResponse(nil, h.SeqNum, 0, body)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, addr string) *Client {
	t.Helper()
	c, err := Dial(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestClientAgainstGoldenServer(t *testing.T) {
	srv := startFake(t, goldenHandler(t))
	c := dial(t, srv.addr())
	ctx := ctxTimeout(t, 5*time.Second)

	var res cororpc.QueryResult
	q := cororpc.QueryRequest{Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: []int32{1, 2, 3}}
	ec, err := c.Query(ctx, &q, &res)
	if err != nil || ec != cororpc.CodeOK {
		t.Fatalf("Query: %v %v", ec, err)
	}
	if len(res.Instances) != 1 || res.Instances[0].InstanceID != "e" || res.Instances[0].Hit.LongestMatchTokens != 48 ||
		res.Instances[0].Hit.RankMatches[0] != (cororpc.RankTiers{Rank: 0, Device: 32, CPULocal: 32, CPUShare: 48, Disk: 48}) {
		t.Fatalf("Query result %+v", res)
	}

	cfg := cororpc.ServiceConfig{Endpoint: "tcp://127.0.0.1:5557", ModelName: "m", TenantID: "default", InstanceID: "e",
		BlockSize: 16, HashProfile: cororpc.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}}
	rr, ec, err := c.Register(ctx, &cfg)
	if err != nil || ec != cororpc.CodeOK || rr != (cororpc.RegisterResult{InstanceID: "e", IsNew: true}) {
		t.Fatalf("Register: %+v %v %v", rr, ec, err)
	}

	ur, ec, err := c.Unregister(ctx, "e", "default", 0)
	if err != nil || ec != cororpc.CodeServiceNotFound || ur.RemovedKey != "" {
		t.Fatalf("Unregister: %+v %v %v", ur, ec, err)
	}

	gv, err := c.GetGlobalView(ctx)
	if err != nil || gv.ContextCount != 1 || len(gv.Contexts) != 1 || gv.Contexts[0].PrefixCount != 42 ||
		len(gv.Contexts[0].InstanceRanks) != 1 || fmt.Sprint(gv.Contexts[0].InstanceRanks[0].Ranks) != "[0 1]" {
		t.Fatalf("GetGlobalView: %+v %v", gv, err)
	}

	list, err := c.ListServices(ctx)
	if err != nil || len(list) != 0 {
		t.Fatalf("ListServices: %v %v", list, err)
	}

	// The client sent exactly the golden argument bodies, and empty bodies for the
	// methods without parameters.
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for fn, want := range map[uint32][]byte{
		cororpc.FuncQuery: hx(t, goldenQueryArgs), cororpc.FuncRegister: hx(t, goldenRegArgs),
		cororpc.FuncUnregister: hx(t, goldenUnregArgs), cororpc.FuncGetGlobalView: {}, cororpc.FuncListServices: {},
	} {
		got := srv.seen[fn]
		if len(got) != 1 || !bytes.Equal(got[0], want) {
			t.Errorf("%s request body %x, want %x", cororpc.FunctionName(fn), got, want)
		}
	}
}

func TestClientBusinessAndFrameworkErrors(t *testing.T) {
	var calls int
	srv := startFake(t, func(h cororpc.RequestHeader, _ []byte) []byte {
		calls++
		if calls == 1 {
			return cororpc.AppendFrameworkError(nil, h.SeqNum, cororpc.ErrcInvalidArguments, "invalid rpc arg")
		}
		return cororpc.AppendResponse(nil, h.SeqNum, 0, hx(t, goldenQueryError))
	})
	c := dial(t, srv.addr())
	ctx := ctxTimeout(t, 5*time.Second)
	var res cororpc.QueryResult
	q := cororpc.QueryRequest{Context: cororpc.ContextKey{ModelName: "m", BlockSize: 16}}

	_, err := c.Query(ctx, &q, &res)
	var fe *cororpc.FrameworkError
	if !errors.As(err, &fe) || fe.Code != cororpc.ErrcInvalidArguments || fe.Msg != "invalid rpc arg" || Code(err) != cororpc.CodeRPCFail {
		t.Fatalf("framework error: %v", err)
	}
	// A framework error keeps the connection usable.
	ec, err := c.Query(ctx, &q, &res)
	if err != nil || ec != cororpc.CodeConductorUnavailable || len(res.Instances) != 0 {
		t.Fatalf("business error: %v %v", ec, err)
	}
}

func TestClientTimeoutWhenServerNeverAnswers(t *testing.T) {
	srv := startFake(t, func(cororpc.RequestHeader, []byte) []byte { return nil })
	c := dial(t, srv.addr())
	var res cororpc.QueryResult
	q := cororpc.QueryRequest{Context: cororpc.ContextKey{ModelName: "m", BlockSize: 16}, Tokens: []int32{1}}

	start := time.Now()
	_, err := c.Query(ctxTimeout(t, 150*time.Millisecond), &q, &res)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrTimeout) || Code(err) != cororpc.CodeRPCTimeout {
		t.Fatalf("got %v (code %v), want a timeout", err, Code(err))
	}
	if elapsed < 100*time.Millisecond || elapsed > 3*time.Second {
		t.Fatalf("timed out after %v", elapsed)
	}
	// The stream may still carry the late answer: the connection is dropped.
	_, err = c.ListServices(ctxTimeout(t, time.Second))
	if !errors.Is(err, ErrClosed) || Code(err) != cororpc.CodeRPCFail {
		t.Fatalf("after timeout: %v", err)
	}
}

func TestClientCancel(t *testing.T) {
	srv := startFake(t, func(cororpc.RequestHeader, []byte) []byte { return nil })
	c := dial(t, srv.addr())
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := c.GetGlobalView(ctx)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("cancel: %v", err)
	}
	if _, err := c.GetGlobalView(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("already cancelled: %v", err)
	}
}

func TestClientRejectsWrongSequence(t *testing.T) {
	srv := startFake(t, func(h cororpc.RequestHeader, _ []byte) []byte {
		return cororpc.AppendResponse(nil, h.SeqNum+7, 0, hx(t, goldenListResp))
	})
	c := dial(t, srv.addr())
	if _, err := c.ListServices(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("wrong seq: %v", err)
	}
	if _, err := c.ListServices(ctxTimeout(t, 5*time.Second)); !errors.Is(err, ErrClosed) {
		t.Fatalf("after protocol error: %v", err)
	}
}

func TestClientConcurrentCallsMatchSequence(t *testing.T) {
	// The server answers each query with one instance named after the filter it got,
	// so a mixed-up response would be visible.
	srv := startFake(t, func(h cororpc.RequestHeader, body []byte) []byte {
		var q cororpc.QueryRequest
		if err := cororpc.DecodeQueryRequest(body, &q); err != nil {
			return cororpc.AppendFrameworkError(nil, h.SeqNum, cororpc.ErrcInvalidArguments, err.Error())
		}
		res := cororpc.QueryResult{Instances: []cororpc.InstanceHit{{InstanceID: q.InstanceFilter,
			Hit: cororpc.CacheHitResult{LongestMatchTokens: int64(len(q.Tokens))}}}}
		out, start := cororpc.BeginResponse(nil, h.SeqNum, 0)
		out, _ = cororpc.AppendQueryResult(out, &res)
		_ = cororpc.FinishResponse(out, start)
		return out
	})
	c := dial(t, srv.addr())
	ctx := ctxTimeout(t, 20*time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var res cororpc.QueryResult
			for i := range 50 {
				id := fmt.Sprintf("g%d-%d", g, i)
				q := cororpc.QueryRequest{Context: cororpc.ContextKey{ModelName: "m", BlockSize: 16},
					Tokens: make([]int32, g*10+i), InstanceFilter: id, HasInstanceFilter: true}
				ec, err := c.Query(ctx, &q, &res)
				if err != nil || ec != cororpc.CodeOK {
					t.Errorf("%s: %v %v", id, ec, err)
					return
				}
				if len(res.Instances) != 1 || res.Instances[0].InstanceID != id || res.Instances[0].Hit.LongestMatchTokens != int64(g*10+i) {
					t.Errorf("%s: got %+v", id, res.Instances)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestDialFailureAndClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if _, err := Dial(addr, 500*time.Millisecond); err == nil || Code(err) != cororpc.CodeRPCFail {
		t.Fatalf("dial closed port: %v", err)
	}

	srv := startFake(t, goldenHandler(t))
	c := dial(t, srv.addr())
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := c.ListServices(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
	if Code(nil) != cororpc.CodeOK {
		t.Fatal("Code(nil) is not OK")
	}
}
