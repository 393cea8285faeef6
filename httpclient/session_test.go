package httpclient

import (
	"bytes"
	"errors"
	"reflect"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"
)

// TestSessionQueryForms: the three ways a Session sends /query put the right bytes on the
// wire, decode (or return) the server's answer, and can be mixed on one Session without
// one call's body leaking into the next or into the caller's buffer.
func TestSessionQueryForms(t *testing.T) {
	answer := mustAppendIntf(t, contractQueryBody())
	rec, c := newFake(t, map[string]reply{"POST /query": {200, answer}})
	s := c.NewSession()
	defer s.Close()

	q := QueryRequest{Model: "m", BlockSize: 16, TokenIDs: []int32{1, 2, 3}, TenantID: "t"}
	var res QueryResult
	if err := s.Query(&q, &res); err != nil {
		t.Fatal(err)
	}
	got := rec.last(t)
	if got.method != "POST" || got.path != "/query" || got.contentType != contentType ||
		!bytes.Equal(got.body, AppendQueryRequest(nil, &q)) {
		t.Fatalf("Query request: %s %s %q % x", got.method, got.path, got.contentType, got.body)
	}
	var want QueryResult
	if err := DecodeQueryResult(&want, answer); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res, want) || res.Instance("vllm-prefill-node1") == nil {
		t.Fatalf("Query result %+v, want %+v", res, want)
	}

	// A pre-encoded body, here in the binary token form, goes out byte for byte.
	enc := AppendQueryRequest(nil, &QueryRequest{Model: "m", BlockSize: 16, TokenIDs: []int32{7, 70000}, BinaryTokens: true})
	keep := bytes.Clone(enc)
	var res2 QueryResult
	if err := s.QueryEncoded(enc, &res2); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(t); !bytes.Equal(got.body, keep) || got.contentType != contentType {
		t.Fatalf("QueryEncoded sent % x, want % x", got.body, keep)
	}
	if !reflect.DeepEqual(res2, want) {
		t.Fatalf("QueryEncoded result %+v", res2)
	}

	raw, err := s.QueryRaw(enc)
	if err != nil || !bytes.Equal(raw, answer) {
		t.Fatalf("QueryRaw: %v, % x", err, raw)
	}

	// Encoding again after a raw body must not write into the caller's bytes.
	q.TokenIDs = []int32{9, 9, 9, 9, 9, 9, 9, 9}
	if err := s.Query(&q, &res); err != nil {
		t.Fatal(err)
	}
	if got := rec.last(t); !bytes.Equal(got.body, AppendQueryRequest(nil, &q)) {
		t.Fatalf("Query after QueryRaw sent % x", got.body)
	}
	if !bytes.Equal(enc, keep) {
		t.Fatal("the caller's pre-encoded body was modified")
	}
	s.Close()
	s.Close() // a second Close is harmless
}

// TestSessionErrors: replies and transport failures surface as the Client's error types,
// and a Session keeps working after an error reply.
func TestSessionErrors(t *testing.T) {
	_, c := newFake(t, map[string]reply{
		"POST /query": {400, mustAppendIntf(t, map[string]any{"error": "model is required", "reason": "missing", "field": "model"})},
	})
	s := c.NewSession()
	defer s.Close()
	var res QueryResult
	var se *Error
	for range 2 {
		err := s.Query(&QueryRequest{BlockSize: 16}, &res)
		if !errors.As(err, &se) || se.Status != 400 || se.Field != "model" || se.Reason != "missing" {
			t.Fatalf("Query error: %#v", err)
		}
	}
	if _, err := s.QueryRaw(AppendQueryRequest(nil, &QueryRequest{BlockSize: 16})); !errors.As(err, &se) || se.Status != 400 {
		t.Fatalf("QueryRaw error: %#v", err)
	}

	down, addr := refusedClient(t)
	ds := down.NewSession()
	defer ds.Close()
	var ce *ConnError
	if err := ds.QueryEncoded(AppendQueryRequest(nil, &QueryRequest{Model: "m", BlockSize: 1}), &res); !errors.As(err, &ce) || ce.Addr != "http://"+addr {
		t.Fatalf("refused: %v", err)
	}
}

// TestSessionsConcurrent: Sessions of one Client run in parallel goroutines, each
// getting the answer to its own request (the fake echoes the model back as the instance).
func TestSessionsConcurrent(t *testing.T) {
	addr := fasthttpServer(t, func(ctx *fasthttp.RequestCtx) {
		req, _, _ := msgp.ReadIntfBytes(ctx.PostBody())
		fields, _ := req.(map[string]any)
		model, _ := fields["model"].(string)
		ctx.SetBody(mustAppendIntf(t, map[string]any{"instances": map[string]any{model: map[string]any{"longest_matched": 16}}}))
	})
	c, err := New(addr, Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			s := c.NewSession()
			defer s.Close()
			model := string(rune('a' + g))
			body := AppendQueryRequest(nil, &QueryRequest{Model: model, BlockSize: 16, TokenIDs: []int32{1}})
			var res QueryResult
			for range 50 {
				if err := s.QueryEncoded(body, &res); err != nil {
					t.Error(err)
					return
				}
				if len(res.Instances) != 1 || res.Instances[0].InstanceID != model || res.Instances[0].LongestMatched != 16 {
					t.Errorf("session %s got another session's answer: %+v", model, res.Instances)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestSessionNoAllocs: a warmed-up Session sends and decodes without allocating, in all
// three forms, over loopback TCP against a fasthttp server (AllocsPerRun counts every
// goroutine, the server's included).
func TestSessionNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	c := cannedClient(t, mustAppendIntf(t, contractQueryBody()))
	s := c.NewSession()
	defer s.Close()
	q := QueryRequest{Model: "deepseek", BlockSize: 16, TokenIDs: benchTokens(4096)}
	body := AppendQueryRequest(nil, &q)
	var res QueryResult
	forms := []struct {
		name string
		call func() error
	}{
		{"Query", func() error { return s.Query(&q, &res) }},
		{"QueryEncoded", func() error { return s.QueryEncoded(body, &res) }},
		{"QueryRaw", func() error { _, err := s.QueryRaw(body); return err }},
	}
	for _, f := range forms {
		for range 10 { // warm the pools and the connection
			if err := f.call(); err != nil {
				t.Fatal(err)
			}
		}
		allocs := testing.AllocsPerRun(200, func() {
			if err := f.call(); err != nil {
				t.Fatal(err)
			}
		})
		// As in TestClientQueryNoAllocs, the server side may allocate now and then.
		t.Logf("%s: %v allocs per round trip", f.name, allocs)
		if allocs > 0.5 {
			t.Errorf("%s: %v allocs per round trip", f.name, allocs)
		}
	}
	if h := res.Instance("vllm-prefill-node1"); h == nil || h.Disk != 32 {
		t.Fatalf("result %+v", res)
	}
}

// TestHost: Host is the dialled host:port whatever form the address took.
func TestHost(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:13333/":  "127.0.0.1:13333",
		"127.0.0.1:9":              "127.0.0.1:9",
		"conductor-host":           "conductor-host:13333",
		"https://example.com/api/": "example.com:443",
		"http://[::1]:5/p":         "[::1]:5",
	} {
		c, err := New(in, Options{})
		if err != nil {
			t.Errorf("%q: %v", in, err)
		} else if c.Host() != want {
			t.Errorf("%q: host %q, want %q", in, c.Host(), want)
		}
	}
}
