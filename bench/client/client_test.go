package client

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"
)

// decodeMap decodes a msgpack map body generically (the test's independent reader).
func decodeMap(t testing.TB, b []byte) map[string]any {
	t.Helper()
	v, rest, err := msgp.ReadIntfBytes(b)
	if err != nil || len(rest) != 0 {
		t.Fatalf("decode body: %v (%d trailing)", err, len(rest))
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("body is %T, want map", v)
	}
	return m
}

// queryAnswer is a canned /query answer in the contract's shape.
func queryAnswer() []byte {
	b := msgp.AppendMapHeader(nil, 1)
	b = msgp.AppendString(b, "instances")
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "a")
	b = msgp.AppendMapHeader(b, 7)
	b = msgp.AppendString(b, "longest_matched")
	b = msgp.AppendInt64(b, 48)
	b = msgp.AppendString(b, "dp")
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "0")
	b = msgp.AppendInt64(b, 16)
	b = msgp.AppendString(b, "1")
	b = msgp.AppendInt64(b, 0)
	b = msgp.AppendString(b, "rank_matches")
	b = msgp.AppendMapHeader(b, 2)
	for _, r := range []struct {
		k string
		v [4]uint64
	}{{"0", [4]uint64{16, 16, 32, 48}}, {"1", [4]uint64{0, 300, 300, 300}}} {
		b = msgp.AppendString(b, r.k)
		b = msgp.AppendMapHeader(b, 4)
		for i, name := range []string{"device", "cpu_local", "cpu_share", "disk"} {
			b = msgp.AppendString(b, name)
			b = msgp.AppendUint64(b, r.v[i])
		}
	}
	for _, kv := range []struct {
		k string
		v int64
	}{{"device", 16}, {"cpu_local", 300}, {"cpu_share", 300}, {"disk", 300}} {
		b = msgp.AppendString(b, kv.k)
		b = msgp.AppendInt64(b, kv.v)
	}
	b = msgp.AppendString(b, "zz")
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "longest_matched")
	b = msgp.AppendInt64(b, 0)
	b = msgp.AppendString(b, "device")
	b = msgp.AppendInt64(b, 0)
	return b
}

type fakeConductor struct {
	mu       sync.Mutex
	addr     string
	lastBody []byte
	stop     func()
}

func (f *fakeConductor) body() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.lastBody...)
}

func startFake(t testing.TB) *fakeConductor {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeConductor{addr: ln.Addr().String()}
	answer := queryAnswer()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		path := string(ctx.Path())
		ctx.SetContentType("application/msgpack")
		if len(ctx.PostBody()) > 0 {
			f.mu.Lock()
			f.lastBody = append(f.lastBody[:0], ctx.PostBody()...)
			f.mu.Unlock()
		}
		switch path {
		case "/query":
			ctx.SetBody(answer)
		case "/register", "/unregister":
			if string(ctx.Request.Header.ContentType()) != "application/msgpack" {
				ctx.SetStatusCode(400)
				return
			}
			b := msgp.AppendMapHeader(nil, 1)
			b = msgp.AppendString(b, "status")
			ctx.SetBody(msgp.AppendString(b, "ok"))
		case "/global_view":
			b := msgp.AppendMapHeader(nil, 2)
			b = msgp.AppendString(b, "context_count")
			b = msgp.AppendInt(b, 2)
			b = msgp.AppendString(b, "contexts")
			b = msgp.AppendArrayHeader(b, 2)
			for i, model := range []string{"other", "m"} {
				b = msgp.AppendMapHeader(b, 6)
				b = msgp.AppendString(b, "model_name")
				b = msgp.AppendString(b, model)
				b = msgp.AppendString(b, "lora_name")
				b = msgp.AppendString(b, "")
				b = msgp.AppendString(b, "block_size")
				b = msgp.AppendInt(b, 16)
				b = msgp.AppendString(b, "tenant_id")
				b = msgp.AppendString(b, "default")
				b = msgp.AppendString(b, "prefix_count")
				b = msgp.AppendInt(b, 1000+i)
				b = msgp.AppendString(b, "instances")
				b = msgp.AppendMapHeader(b, 0)
			}
			ctx.SetBody(b)
		default:
			ctx.SetStatusCode(404)
			b := msgp.AppendMapHeader(nil, 1)
			b = msgp.AppendString(b, "error")
			ctx.SetBody(msgp.AppendString(b, "no such service"))
		}
	}}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	f.stop = func() { _ = srv.Shutdown(); <-done }
	t.Cleanup(f.stop)
	return f
}

// TestQueryRoundTrip: the query body is what the contract asks for (array or binary
// tokens, optional fields only when set) and the answer decodes per instance and rank.
func TestQueryRoundTrip(t *testing.T) {
	f := startFake(t)
	c := New("http://"+f.addr, 0)
	defer c.Close()
	var res Result
	res.SetInstances([]string{"zz", "a", "absent"})
	toks := []int32{1, 300, 70000, 0}
	q := &Query{Model: "m", BlockSize: 16, Tokens: toks, Tenant: "t1"}
	if err := c.Query(q, &res); err != nil {
		t.Fatal(err)
	}
	body := decodeMap(t, f.body())
	if len(body) != 4 || body["model"] != "m" || body["tenant_id"] != "t1" {
		t.Fatalf("query body %v", body)
	}
	arr, ok := body["token_ids"].([]any)
	if !ok || len(arr) != 4 {
		t.Fatalf("token_ids %T %v", body["token_ids"], body["token_ids"])
	}
	a := res.Known[1]
	if !a.Present || a.LongestMatched != 48 || a.Device != 16 || a.CPULocal != 300 || a.Disk != 300 {
		t.Fatalf("instance a %+v", a)
	}
	if len(a.Ranks) != 2 || !a.RankSeen[0] || !a.RankSeen[1] || a.Ranks[0] != (Tiers{16, 16, 32, 48}) || a.Ranks[1] != (Tiers{0, 300, 300, 300}) {
		t.Fatalf("ranks %+v %v", a.Ranks, a.RankSeen)
	}
	if !res.Known[0].Present || res.Known[2].Present || res.Count() != 2 {
		t.Fatalf("presence %+v count %d", res.Known, res.Count())
	}

	q.BinaryTokens, q.Tenant, q.InstanceID = true, "", "a"
	if err := c.Query(q, &res); err != nil {
		t.Fatal(err)
	}
	body = decodeMap(t, f.body())
	bin, ok := body["token_ids"].([]byte)
	if !ok || len(bin) != 16 || int32(binary.LittleEndian.Uint32(bin[8:])) != 70000 || body["instance_id"] != "a" {
		t.Fatalf("binary body %v", body)
	}
	if _, has := body["tenant_id"]; has {
		t.Fatal("empty tenant_id was sent")
	}

	// Unknown instances are kept by id.
	var res2 Result
	if err := c.Query(q, &res2); err != nil {
		t.Fatal(err)
	}
	if res2.Other["a"] == nil || res2.Other["a"].LongestMatched != 48 || res2.Count() != 2 {
		t.Fatalf("other %+v", res2.Other)
	}
}

// TestRegisterAndViews: register, unregister and /global_view speak the contract.
func TestRegisterAndViews(t *testing.T) {
	f := startFake(t)
	c := New(f.addr, 0)
	defer c.Close()
	reg := &Registration{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:2", Type: "vLLM",
		Model: "m", InstanceID: "i", BlockSize: 16, DPRank: 3, Strategy: "vllm_v1", Algorithm: "sha256",
		PythonHashSeed: "0", IndexProjection: "low64_be"}
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	body := decodeMap(t, f.body())
	hp, _ := body["hash_profile"].(map[string]any)
	if len(body) != 10 || body["modelname"] != "m" || body["tenant_id"] != "default" || body["dp_rank"] != int64(3) ||
		len(hp) != 4 || hp["python_hash_seed"] != "0" {
		t.Fatalf("register body %v", body)
	}
	if err := c.Unregister("i", "", 3); err != nil {
		t.Fatal(err)
	}
	body = decodeMap(t, f.body())
	if len(body) != 3 || body["instance_id"] != "i" || body["dp_rank"] != int64(3) {
		t.Fatalf("unregister body %v", body)
	}
	n, err := c.PrefixCount("m", "", "", 16)
	if err != nil || n != 1001 {
		t.Fatalf("prefix count %d %v", n, err)
	}
	if _, err := c.PrefixCount("m", "", "", 32); !errors.Is(err, ErrNoContext) {
		t.Fatalf("missing context: %v", err)
	}
	_, err = c.do("GET", "/nope", nil)
	var se *StatusError
	if !errors.As(err, &se) || se.Status != 404 || se.Message != "no such service" {
		t.Fatalf("error answer: %v", err)
	}
}

// TestQueryAllocs: a warmed-up client sends a query and decodes the answer without
// allocating.
func TestQueryAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	f := startFake(t)
	c := New(f.addr, 0)
	defer c.Close()
	var res Result
	res.SetInstances([]string{"a", "zz"})
	q := &Query{Model: "m", BlockSize: 16, Tokens: make([]int32, 4096)}
	run := func() {
		if err := c.Query(q, &res); err != nil {
			t.Fatal(err)
		}
	}
	run()
	if a := testing.AllocsPerRun(100, run); a != 0 {
		t.Errorf("Query: %v allocs per call, want 0", a)
	}
	body := AppendQuery(nil, q)
	if a := testing.AllocsPerRun(100, func() {
		if err := c.QueryRaw(body, &res); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("QueryRaw: %v allocs per call, want 0", a)
	}
}
