package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/bench/target"
)

// fakeConductor is an in-test stand-in for the conductor's HTTP API (net/http + msgp):
// it checks the transport rules of the contract, records every request decoded, and
// answers each route through a handler the test sets.
type fakeConductor struct {
	t        *testing.T
	srv      *httptest.Server
	mu       sync.Mutex
	reqs     []fakeRequest
	handlers map[string]fakeHandler // "POST /query", "GET /services", ...
}

type fakeRequest struct {
	route string
	body  any // decoded msgpack, nil for GET
	raw   []byte
}

// fakeHandler answers the n-th call (from 1) of a route with a status and a value that is
// encoded as msgpack.
type fakeHandler func(n int, body any) (int, any)

func newFakeConductor(t *testing.T) *fakeConductor {
	t.Helper()
	f := &fakeConductor{t: t, handlers: map[string]fakeHandler{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve)) // binds 127.0.0.1:0
	t.Cleanup(f.srv.Close)
	return f
}

// reply makes a handler that always answers status and body.
func reply(status int, body any) fakeHandler {
	return func(int, any) (int, any) { return status, body }
}

func (f *fakeConductor) on(route string, h fakeHandler) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.handlers[route] = h
}

func (f *fakeConductor) serve(w http.ResponseWriter, r *http.Request) {
	route := r.Method + " " + r.URL.Path
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		f.t.Errorf("%s: read body: %v", route, err)
	}
	var body any
	switch r.Method {
	case http.MethodPost:
		if ct := r.Header.Get("Content-Type"); !strings.Contains(ct, "application/msgpack") {
			f.t.Errorf("%s: Content-Type %q", route, ct)
		}
		body = decodeRequest(f.t, route, raw)
	case http.MethodGet:
		if len(raw) != 0 {
			f.t.Errorf("%s: GET with a %d-byte body", route, len(raw))
		}
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, fakeRequest{route, body, raw})
	n := 0
	for _, q := range f.reqs {
		if q.route == route {
			n++
		}
	}
	h := f.handlers[route]
	f.mu.Unlock()
	status, resp := http.StatusNotFound, any(map[string]any{"error": "no route " + route})
	if h != nil {
		status, resp = h(n, body)
	}
	out, err := msgp.AppendIntf(nil, resp)
	if err != nil {
		f.t.Errorf("%s: encode reply: %v", route, err)
	}
	w.Header().Set("Content-Type", "application/msgpack")
	w.WriteHeader(status)
	_, _ = w.Write(out)
}

// decodeRequest decodes a request body, failing the test on anything a strict server
// would refuse: trailing bytes, repeated keys, non-string keys.
func decodeRequest(t *testing.T, route string, raw []byte) any {
	if rest, ok := checkStrict(t, route, raw); ok && len(rest) != 0 {
		t.Errorf("%s: %d trailing bytes", route, len(rest))
	}
	v, _, err := msgp.ReadIntfBytes(raw)
	if err != nil {
		t.Errorf("%s: invalid msgpack: %v", route, err)
	}
	return v
}

func checkStrict(t *testing.T, route string, b []byte) ([]byte, bool) {
	switch msgp.NextType(b) {
	case msgp.MapType:
		n, o, err := msgp.ReadMapHeaderBytes(b)
		if err != nil {
			t.Errorf("%s: %v", route, err)
			return nil, false
		}
		seen := map[string]bool{}
		for range n {
			k, rest, err := msgp.ReadStringZC(o)
			if err != nil {
				t.Errorf("%s: map key: %v", route, err)
				return nil, false
			}
			if seen[string(k)] {
				t.Errorf("%s: key %q sent twice", route, k)
			}
			seen[string(k)] = true
			var ok bool
			if o, ok = checkStrict(t, route, rest); !ok {
				return nil, false
			}
		}
		return o, true
	default:
		o, err := msgp.Skip(b)
		if err != nil {
			t.Errorf("%s: %v", route, err)
			return nil, false
		}
		return o, true
	}
}

// requests returns the recorded requests of one route.
func (f *fakeConductor) requests(route string) []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeRequest
	for _, r := range f.reqs {
		if r.route == route {
			out = append(out, r)
		}
	}
	return out
}

func (f *fakeConductor) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

// result is one CLI run.
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs conductorctl against f (unless args name --addr themselves) with stdin.
func (f *fakeConductor) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runWith(t, context.Background(), stdin, append([]string{"--addr", f.srv.URL}, args...)...)
}

func runWith(t *testing.T, ctx context.Context, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	c := &cli{ctx: ctx, stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb}
	code := c.run(args)
	return result{code, out.String(), errb.String()}
}

// deadAddr returns a 127.0.0.1 address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	port, err := target.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}
