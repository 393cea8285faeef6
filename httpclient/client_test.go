package httpclient

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// recorder is a fake conductor: it records each request and answers with the canned
// status and msgpack body for its route.
type recorder struct {
	mu      sync.Mutex
	reqs    []recorded
	replies map[string]reply
}

type recorded struct {
	method, path, contentType string
	body                      []byte
}

type reply struct {
	status int
	body   []byte
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, recorded{req.Method, req.URL.Path, req.Header.Get("Content-Type"), body})
	rep, ok := r.replies[req.Method+" "+req.URL.Path]
	r.mu.Unlock()
	if !ok {
		rep = reply{404, nil}
	}
	w.Header().Set("Content-Type", "application/msgpack")
	w.WriteHeader(rep.status)
	_, _ = w.Write(rep.body)
}

func (r *recorder) last(t *testing.T) recorded {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("no request reached the server")
	}
	return r.reqs[len(r.reqs)-1]
}

func newFake(t *testing.T, replies map[string]reply) (*recorder, *Client) {
	t.Helper()
	rec := &recorder{replies: replies}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return rec, c
}

func TestClientRoutes(t *testing.T) {
	rec, c := newFake(t, map[string]reply{
		"POST /register":   {200, mustAppendIntf(t, map[string]any{"status": "registered successfully", "instance_id": "i1"})},
		"POST /unregister": {200, mustAppendIntf(t, map[string]any{"status": "unregistered successfully", "removed_instances": []any{"i1|default|0"}})},
		"POST /query":      {200, mustAppendIntf(t, contractQueryBody())},
		"GET /services":    {200, mustAppendIntf(t, map[string]any{"count": 0, "services": []any{}})},
		"GET /global_view": {200, mustAppendIntf(t, map[string]any{"context_count": 0, "contexts": []any{}})},
	})

	reg := RegisterRequest{Endpoint: "tcp://h:1", Type: "vLLM", ModelName: "m", InstanceID: "i1", BlockSize: 16,
		HashProfile: HashProfile{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "random", IndexProjection: "low64_be"}}
	rr, err := c.Register(&reg)
	if err != nil || rr.InstanceID != "i1" {
		t.Fatalf("register: %+v %v", rr, err)
	}
	got := rec.last(t)
	if got.method != "POST" || got.path != "/register" || !strings.Contains(got.contentType, "application/msgpack") {
		t.Fatalf("register request: %s %s %q", got.method, got.path, got.contentType)
	}
	if !reflect.DeepEqual(decodeStrict(t, got.body), decodeStrict(t, AppendRegisterRequest(nil, &reg))) {
		t.Fatal("register body differs from AppendRegisterRequest")
	}

	ur, err := c.Unregister(&UnregisterRequest{InstanceID: "i1"})
	if err != nil || !reflect.DeepEqual(ur.RemovedInstances, []string{"i1|default|0"}) {
		t.Fatalf("unregister: %+v %v", ur, err)
	}
	if got := rec.last(t); got.path != "/unregister" ||
		!reflect.DeepEqual(decodeStrict(t, got.body), map[string]any{"instance_id": "i1", "dp_rank": int64(0)}) {
		t.Fatalf("unregister request: %s %v", got.path, decodeStrict(t, got.body))
	}

	var res QueryResult
	q := QueryRequest{Model: "m", BlockSize: 16, TokenIDs: []int32{1, 2, 3}}
	if err := c.Query(&q, &res); err != nil || res.Instance("vllm-prefill-node1") == nil {
		t.Fatalf("query: %+v %v", res, err)
	}
	if got := rec.last(t); got.path != "/query" ||
		!reflect.DeepEqual(decodeStrict(t, got.body), decodeStrict(t, AppendQueryRequest(nil, &q))) {
		t.Fatalf("query request: %s", got.path)
	}

	if l, err := c.Services(); err != nil || l.Count != 0 || len(l.Services) != 0 {
		t.Fatalf("services: %+v %v", l, err)
	}
	if got := rec.last(t); got.method != "GET" || got.path != "/services" || len(got.body) != 0 {
		t.Fatalf("services request: %+v", got)
	}
	if g, err := c.GlobalView(); err != nil || g.ContextCount != 0 {
		t.Fatalf("global view: %+v %v", g, err)
	}
	if got := rec.last(t); got.method != "GET" || got.path != "/global_view" {
		t.Fatalf("global view request: %+v", got)
	}
}

func TestClientPathPrefix(t *testing.T) {
	rec := &recorder{replies: map[string]reply{
		"GET /conductor/services": {200, mustAppendIntf(t, map[string]any{"count": 0, "services": []any{}})},
	}}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	c, err := New(srv.URL+"/conductor/", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Services(); err != nil {
		t.Fatal(err)
	}
	if c.Addr() != srv.URL+"/conductor" {
		t.Fatalf("Addr %q", c.Addr())
	}
}

func TestClientErrorReplies(t *testing.T) {
	_, c := newFake(t, map[string]reply{
		"POST /query": {400, mustAppendIntf(t, map[string]any{"error": "token_ids[2] out of int32 range",
			"reason": "out_of_range", "field": "token_ids", "index": 2})},
		"POST /unregister": {404, mustAppendIntf(t, map[string]any{"error": "service not found: x|default|0"})},
		"GET /services":    {200, []byte{0x93}}, // a truncated array: a broken 2xx body
	})
	var res QueryResult
	err := c.Query(&QueryRequest{Model: "m", BlockSize: 1}, &res)
	var se *Error
	if !errors.As(err, &se) || se.Status != 400 || se.Field != "token_ids" || !se.HasIndex || se.Index != 2 ||
		se.Reason != "out_of_range" {
		t.Fatalf("query error: %#v", err)
	}
	_, err = c.Unregister(&UnregisterRequest{InstanceID: "x"})
	if !errors.As(err, &se) || se.Status != 404 || se.Error() != "service not found: x|default|0" {
		t.Fatalf("unregister error: %v", err)
	}
	_, err = c.Services()
	if err == nil || errors.As(err, &se) || !strings.Contains(err.Error(), "decode /services") {
		t.Fatalf("broken body: %v", err)
	}
}

func TestClientConnectionRefused(t *testing.T) {
	c, addr := refusedClient(t)
	_, err := c.GlobalView()
	var ce *ConnError
	if !errors.As(err, &ce) || ce.Addr != "http://"+addr || !strings.Contains(err.Error(), "http://"+addr) {
		t.Fatalf("got %v", err)
	}
}

func TestClientTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release) // runs before srv.Close, which waits for the handler
	c, err := New(srv.URL, Options{Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	var res QueryResult
	err = c.Query(&QueryRequest{Model: "m", BlockSize: 1}, &res)
	var ce *ConnError
	if !errors.As(err, &ce) || !errors.Is(err, fasthttp.ErrTimeout) || !strings.Contains(err.Error(), "no response within 50ms") {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("timeout took %v", d)
	}
}

func TestNewAddresses(t *testing.T) {
	cases := map[string]string{
		"http://127.0.0.1:13333":  "http://127.0.0.1:13333",
		"127.0.0.1:9":             "http://127.0.0.1:9",
		"conductor-host":          "http://conductor-host:13333",
		"https://example.com":     "https://example.com:443",
		"http://example.com/":     "http://example.com:80",
		"http://[::1]:5/p/":       "http://[::1]:5/p",
		" http://127.0.0.1:1234 ": "http://127.0.0.1:1234",
	}
	for in, want := range cases {
		c, err := New(in, Options{})
		if err != nil || c.Addr() != want {
			t.Errorf("%q: got %v %v, want %q", in, c, err, want)
		}
	}
	for _, bad := range []string{"ftp://h:1", "http://", "http://u:p@h:1", "http://h:1/?x=1", "http://h:1/%zz"} {
		if _, err := New(bad, Options{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// fasthttpServer serves handler from a fasthttp server on a free loopback port and
// returns its address; the server stops when the test or benchmark ends.
func fasthttpServer(tb testing.TB, handler fasthttp.RequestHandler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: handler}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	tb.Cleanup(func() { _ = srv.Shutdown(); <-done })
	return ln.Addr().String()
}

// cannedServer serves body as the msgpack answer to every request (see fasthttpServer).
func cannedServer(tb testing.TB, body []byte) string {
	tb.Helper()
	return fasthttpServer(tb, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/msgpack")
		ctx.SetBody(body)
	})
}

// cannedClient is a Client of a cannedServer serving body, closed when the test or
// benchmark ends.
func cannedClient(tb testing.TB, body []byte) *Client {
	tb.Helper()
	c, err := New(cannedServer(tb, body), Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// refusedClient returns a Client of a loopback address that was free a moment ago, so
// that connecting is refused, and that address; the client is closed when the test ends.
func refusedClient(t *testing.T) (*Client, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // on return, before the test dials: New does not connect
	addr := ln.Addr().String()
	c, err := New(addr, Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, addr
}

// TestClientQueryNoAllocs runs the whole round trip, against a fasthttp server whose
// handler writes a prepared body, and asserts that neither side allocates in steady
// state: AllocsPerRun counts every goroutine.
func TestClientQueryNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	c := cannedClient(t, mustAppendIntf(t, contractQueryBody()))
	toks := make([]int32, 2048)
	for i := range toks {
		toks[i] = int32(i)
	}
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: toks}
	var res QueryResult
	for range 10 { // warm pools and connection
		if err := c.Query(&q, &res); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(200, func() {
		if err := c.Query(&q, &res); err != nil {
			t.Fatal(err)
		}
	})
	// fasthttp's server side occasionally allocates a little (timers, pools refilled
	// after a GC); the client's own path is zero, as the encode/decode tests show.
	t.Logf("allocs per round trip: %v", allocs)
	if allocs > 0.5 {
		t.Fatalf("%v allocs per query round trip", allocs)
	}
	if h := res.Instance("vllm-prefill-node1"); h == nil || h.Disk != 32 {
		t.Fatalf("result %+v", res)
	}
}

// writeCounter is a connection that counts the writes made on it.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (w writeCounter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

// TestQueryLeavesInOneWrite: a /query request up to the write buffer's size is one write
// on the connection (a conductor woken by a first part would wait again for the rest),
// and a request larger than the buffer is not (so the count does see the split).
func TestQueryLeavesInOneWrite(t *testing.T) {
	srv := cannedServer(t, mustAppendIntf(t, contractQueryBody()))
	toks := make([]int32, 8192)
	for i := range toks {
		toks[i] = int32(70000 + i) // 5 bytes each as a msgpack int: a ~40 KB body
	}
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: toks}
	size := len(AppendQueryRequest(nil, &q))
	for _, tc := range []struct {
		name       string
		bufferSize int
		oneWrite   bool
	}{
		{"default", 0, true}, // an 8K-token prompt leaves in one write by default
		{"fits", size + 1024, true},
		{"4KiB", 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(srv, Options{WriteBufferSize: tc.bufferSize})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var writes atomic.Int64
			c.hc.Dial = func(addr string) (net.Conn, error) {
				conn, err := fasthttp.Dial(addr)
				if err != nil {
					return nil, err
				}
				return writeCounter{conn, &writes}, nil
			}
			var res QueryResult
			for i := range 3 {
				before := writes.Load()
				if err := c.Query(&q, &res); err != nil {
					t.Fatal(err)
				}
				n := writes.Load() - before
				if tc.oneWrite && n != 1 || !tc.oneWrite && n < 2 {
					t.Fatalf("query %d of %d bytes took %d writes with a %d-byte buffer", i, size, n, tc.bufferSize)
				}
			}
			if res.Instance("vllm-prefill-node1") == nil {
				t.Fatalf("result %+v", res)
			}
		})
	}
}
