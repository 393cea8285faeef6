package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// testLogger logs only warnings and errors unless -v is given with CONDUCTOR_TEST_LOG=1.
func testLogger() *slog.Logger {
	level := slog.LevelError
	if os.Getenv("CONDUCTOR_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// startApp starts an in-process conductor on free loopback ports and stops it at cleanup.
func startApp(t testing.TB, rpc bool) *App {
	t.Helper()
	cfg := AppConfig{RPCPort: -1}
	if rpc {
		cfg.RPCPort = 0
	}
	return startWith(t, cfg)
}

// startWith starts an in-process conductor with cfg (port 0: a free one; RPCPort -1: no
// RPC), bound to 127.0.0.1 and logging to testLogger unless cfg says otherwise, and
// stops it at cleanup.
func startWith(t testing.TB, cfg AppConfig) *App {
	t.Helper()
	if cfg.BindAddress == "" {
		cfg.BindAddress = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	app, err := Start(cfg)
	if err != nil {
		t.Fatalf("start app: %v", err)
	}
	t.Cleanup(app.Stop)
	return app
}

// msgpackPost sends a msgpack body and decodes the msgpack response into a generic value.
func msgpackPost(t testing.TB, app *App, path string, body []byte) (int, map[string]any) {
	t.Helper()
	return doHTTP(t, app, http.MethodPost, path, "application/msgpack", body)
}

// doHTTP sends body with Content-Type ctype (none if empty) and decodes the msgpack
// response into a generic value (nil for an empty body).
func doHTTP(t testing.TB, app *App, method, path, ctype string, body []byte) (int, map[string]any) {
	t.Helper()
	return doHTTPAuth(t, app, method, path, ctype, "", body)
}

// doHTTPAuth is doHTTP with an Authorization header (none if auth is empty).
func doHTTPAuth(t testing.TB, app *App, method, path, ctype, auth string, body []byte) (int, map[string]any) {
	t.Helper()
	code, _, raw := httpRaw(t, app, method, path, body, "Content-Type", ctype, "Authorization", auth)
	if len(raw) == 0 {
		return code, nil
	}
	v, rest, err := msgp.ReadIntfBytes(raw)
	if err != nil || len(rest) != 0 {
		t.Fatalf("%s %s: response is not one msgpack value: %v (%x)", method, path, err, raw)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s %s: response is %T, want map", method, path, v)
	}
	return code, m
}

// httpRaw sends a request to the app with headers given as name, value pairs (a pair
// with an empty value is not sent) and returns the response's status, header and body.
func httpRaw(t testing.TB, app *App, method, path string, body []byte, headers ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+app.HTTPAddr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] != "" {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, raw
}

// setPost makes ctx a msgpack POST of body to path, for calling a handler in-process.
func setPost(ctx *fasthttp.RequestCtx, path string, body []byte) {
	ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	ctx.Request.SetRequestURI(path)
	ctx.Request.Header.SetContentType("application/msgpack")
	ctx.Request.SetBody(body)
}

// serveOK calls handler h in-process with ctx and fails unless it answers 200; it returns
// the response body, which the next call with ctx overwrites.
func serveOK(tb testing.TB, h fasthttp.RequestHandler, ctx *fasthttp.RequestCtx) []byte {
	tb.Helper()
	h(ctx)
	if c := ctx.Response.StatusCode(); c != http.StatusOK {
		tb.Fatalf("%s: status %d: %s", ctx.Request.URI().Path(), c, ctx.Response.Body())
	}
	return ctx.Response.Body()
}

// httpGet fetches path from the app and returns the status and body.
func httpGet(t testing.TB, app *App, path string) (int, string) {
	t.Helper()
	code, _, raw := httpRaw(t, app, http.MethodGet, path, nil)
	return code, string(raw)
}

// mustRegister posts body to /register, with the admin token unless it is empty, and
// fails unless the registration is accepted.
func mustRegister(t testing.TB, app *App, token string, body []byte) {
	t.Helper()
	code, resp := doHTTPAuth(t, app, http.MethodPost, "/register", "application/msgpack", bearer(token), body)
	if code != http.StatusOK {
		t.Fatalf("register: %d %v", code, resp)
	}
}

// bearer is the Authorization value for token ("" for none, so that httpRaw sends none).
func bearer(token string) string {
	if token == "" {
		return ""
	}
	return "Bearer " + token
}

// mp builds msgpack maps from ordered key/value pairs for requests.
func mp(kv ...any) []byte {
	var b []byte
	b = msgp.AppendMapHeader(b, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		b = msgp.AppendString(b, kv[i].(string))
		var err error
		b, err = msgp.AppendIntf(b, kv[i+1])
		if err != nil {
			panic(err)
		}
	}
	return b
}

func profileMap(strategy, algorithm, seed, projection string) map[string]any {
	m := map[string]any{"strategy": strategy, "algorithm": algorithm, "index_projection": projection}
	if seed != "" {
		m["python_hash_seed"] = seed
	}
	return m
}

func vllmProfile() map[string]any { return profileMap("vllm_v1", "sha256_cbor", "0", "low64_be") }

// registerBody is a valid vLLM registration; extra pairs override or add fields.
func registerBody(endpoint, instance string, dp int, extra ...any) []byte {
	fields := []any{
		"endpoint", endpoint, "type", "vLLM", "modelname", "m", "instance_id", instance,
		"block_size", 16, "dp_rank", dp, "hash_profile", vllmProfile(),
	}
	for i := 0; i < len(extra); i += 2 {
		replaced := false
		for j := 0; j < len(fields); j += 2 {
			if fields[j] == extra[i] {
				fields[j+1] = extra[i+1]
				replaced = true
			}
		}
		if !replaced {
			fields = append(fields, extra[i], extra[i+1])
		}
	}
	return mp(fields...)
}

// blockKeys computes the projected keys of the prompt's blocks with the conductor's own
// hashing, the way the engine computes the hashes it publishes (checked against the shared
// vectors in package hashing).
func blockKeys(t testing.TB, strategy, algorithm, seed, projection string, bs int, lora, salt string, tokens []int32) []uint64 {
	t.Helper()
	return specKeys(t, hashing.Spec{Strategy: strategy, Algorithm: algorithm, PythonHashSeed: seed, IndexProjection: projection},
		bs, lora, salt, tokens)
}

// specKeys is blockKeys for a profile with the fields of issue 25.
func specKeys(t testing.TB, s hashing.Spec, bs int, lora, salt string, tokens []int32) []uint64 {
	t.Helper()
	p, err := hashing.ResolveSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	var c hashing.Chain
	c.Reset(&p, bs, lora, salt, tokens)
	keys := make([]uint64, 0, c.NumBlocks())
	for range c.NumBlocks() {
		k, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

func seqTokens(n int, start int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = start + int32(i)
	}
	return out
}

// vllmBatch encodes a vLLM KVEventBatch [ts, [events], dp_rank] with map events.
func vllmBatch(dp int, events ...[]byte) []byte {
	var b []byte
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendFloat64(b, float64(time.Now().UnixNano())/1e9)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, e := range events {
		b = append(b, e...)
	}
	return msgp.AppendInt(b, dp)
}

// stored is a vLLM BlockStored map event of hashes in medium.
func stored(hashes []uint64, medium string) []byte {
	return mp("type", "BlockStored", "block_hashes", anys(hashes), "parent_block_hash", nil, "token_ids", nil,
		"block_size", 16, "lora_id", nil, "medium", medium, "lora_name", nil)
}

// removed is a vLLM BlockRemoved map event of hashes in medium.
func removed(hashes []uint64, medium string) []byte {
	return mp("type", "BlockRemoved", "block_hashes", anys(hashes), "medium", medium)
}

// anys copies xs into a []any, as mp encodes msgpack arrays.
func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

func newPublisher(t testing.TB, replay bool) *zmqtest.Publisher {
	t.Helper()
	cfg := zmqtest.Config{}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
	}
	p, err := zmqtest.NewPublisher(cfg)
	if errors.Is(err, zmqtest.ErrNoCgo) {
		t.Skip(err) // a build without cgo: TestNoCgoRegistrationFailsClearly covers it
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// waitSub waits for the n-th subscription the publisher has seen (they count cumulatively).
func waitSub(t testing.TB, p *zmqtest.Publisher, n int) {
	t.Helper()
	if err := p.WaitSubscribers(n, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// mustPublish publishes one batch and returns its sequence number.
func mustPublish(t testing.TB, p *zmqtest.Publisher, batch []byte) uint64 {
	t.Helper()
	seq, err := p.Publish(batch)
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: %v", what, err)
}

// queryBody builds a /query body with token ids as an array.
func queryBody(model string, bs int, tokens []int32, extra ...any) []byte {
	return mp(append([]any{"model", model, "block_size", bs, "token_ids", anys(tokens)}, extra...)...)
}

// hits extracts the instance map of a query response.
func hits(t testing.TB, resp map[string]any) map[string]any {
	t.Helper()
	inst, ok := resp["instances"].(map[string]any)
	if !ok {
		t.Fatalf("response has no instances map: %v", resp)
	}
	return inst
}

// waitDevice waits until a /query of tokens (model m, block size 16) answers want device
// tokens for instance id.
func waitDevice(t testing.TB, app *App, tokens []int32, id string, want int64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%s holds %d device tokens", id, want), func() error {
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
		if got := tierOf(t, hits(t, r), id, "device"); got != want {
			return errf("device = %d, want %d (%v)", got, want, r)
		}
		return nil
	})
}

// tierOf returns instance id's figure for tier in a query response's instance map.
func tierOf(t testing.TB, inst map[string]any, id, tier string) int64 {
	t.Helper()
	m, ok := inst[id].(map[string]any)
	if !ok {
		t.Fatalf("instance %q missing in %v", id, inst)
	}
	return asInt(t, m[tier])
}

func asInt(t testing.TB, v any) int64 {
	t.Helper()
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	}
	t.Fatalf("not an integer: %T %v", v, v)
	return 0
}

func errf(format string, a ...any) error { return fmt.Errorf(format, a...) }

// isTimeout reports a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
