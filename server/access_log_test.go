package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// readAccessLines parses every line of the access log file as one JSON object.
func readAccessLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		t.Errorf("log does not end with a newline")
	}
	return out
}

// postWithTrace posts a msgpack body with the trace header (none if trace is empty).
func postWithTrace(t *testing.T, app *App, path, trace string, body []byte) int {
	t.Helper()
	code, _, _ := httpRaw(t, app, http.MethodPost, path, body, "Content-Type", "application/msgpack", "X-Request-Trace", trace)
	return code
}

// TestAccessLogLines: with the log on, each contract route request gives one JSON line
// with the documented fields; the trace id comes from the configured header, escaped.
func TestAccessLogLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	app := startWith(t, AppConfig{RPCPort: -1,
		AccessLog: accesslog.Config{Path: path, TraceHeader: "X-Request-Trace", FlushInterval: time.Hour}})
	full := seqTokens(64, 1)
	fillInstances(t, app, 2, full)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", full)
	weird := "a\"b\\c\xffd" + strings.Repeat("é", 100)
	if c := postWithTrace(t, app, "/query", "trace-1", binQuery(append(append([]int32(nil), full[:40]...), 999999))); c != 200 {
		t.Fatal(c)
	}
	if c := postWithTrace(t, app, "/query_by_hash", weird, mp("model", "m", "block_size", 16, "block_hashes", anys(keys[:3]))); c != 200 {
		t.Fatal(c)
	}
	if c := postWithTrace(t, app, "/query", "", mp("model", "", "block_size", 16, "token_ids", []any{1})); c != 400 {
		t.Fatal(c)
	}
	if c, _ := doHTTP(t, app, http.MethodGet, "/services", "", nil); c != 200 {
		t.Fatal(c)
	}
	if resp, err := http.Get("http://" + app.HTTPAddr + "/metrics"); err != nil || resp.StatusCode != 200 { // not a contract route: not logged
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	app.AccessLog.Flush()
	lines := readAccessLines(t, path)
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4: %v", len(lines), lines)
	}
	q := lines[0]
	if q["route"] != "/query" || q["model"] != "m" || q["tokens"] != 41.0 || q["blocks_hashed"] != 2.0 ||
		q["matched"] != 32.0 || q["status"] != 200.0 || q["trace_id"] != "trace-1" {
		t.Errorf("/query line = %v", q)
	}
	if ts, err := time.Parse(time.RFC3339Nano, q["time"].(string)); err != nil || time.Since(ts) > time.Minute {
		t.Errorf("time %v: %v", q["time"], err)
	}
	if lat, ok := q["latency_us"].(float64); !ok || lat <= 0 {
		t.Errorf("latency_us = %v", q["latency_us"])
	}
	h := lines[1]
	// Escaped, invalid UTF-8 replaced, cut at 128 bytes of input on a character boundary.
	wantTrace := "a\"b\\c\ufffdd" + strings.Repeat("é", (128-6)/2) // the first 128 bytes
	if h["route"] != "/query_by_hash" || h["tokens"] != 48.0 || h["blocks_hashed"] != 0.0 || h["matched"] != 48.0 ||
		h["trace_id"] != wantTrace {
		t.Errorf("/query_by_hash line = %v", h)
	}
	if e := lines[2]; e["route"] != "/query" || e["status"] != 400.0 || e["model"] != nil || e["trace_id"] != nil {
		t.Errorf("error line = %v", e)
	}
	if s := lines[3]; s["route"] != "/services" || s["status"] != 200.0 || s["tokens"] != nil {
		t.Errorf("/services line = %v", s)
	}
}

// TestAccessLogZeroAllocs: a /query with the access log on allocates nothing.
func TestAccessLogZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	app := startWith(t, AppConfig{RPCPort: -1,
		AccessLog: accesslog.Config{Path: filepath.Join(t.TempDir(), "a.log"), FlushInterval: time.Millisecond}})
	full := seqTokens(2048, 1)
	fillInstances(t, app, 4, full)
	h := app.HTTP.Handler()
	var ctx fasthttp.RequestCtx
	setPost(&ctx, "/query", binQuery(full))
	ctx.Request.Header.Set("x-trace-id", "0af7651916cd43dd8448eb211c80319c")
	run := func() { serveOK(t, h, &ctx) }
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("%v allocs per /query with the access log on", n)
	}
}

func TestAccessLogConfigKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadConfigFile(write(`{"access_log": "/tmp/a.log", "access_log_trace_header": "traceparent", "access_log_buffer_bytes": 65536, "access_log_flush_interval_ms": 250}`))
	if err != nil {
		t.Fatal(err)
	}
	want := accesslog.Config{Path: "/tmp/a.log", TraceHeader: "traceparent", BufferBytes: 65536, FlushInterval: 250 * time.Millisecond}
	if cfg.AccessLog != want || cfg.AppConfig().AccessLog != want {
		t.Errorf("parsed %+v, want %+v", cfg.AccessLog, want)
	}
	if cfg, err := LoadConfigFile(write(`{}`)); err != nil || cfg.AccessLog.Path != "" {
		t.Errorf("default: %+v %v (the access log must be off by default)", cfg.AccessLog, err)
	}
	for _, bad := range []string{`{"access_log": 1}`, `{"access_log_trace_header": null}`, `{"access_log_buffer_bytes": 10}`,
		`{"access_log_buffer_bytes": "1"}`, `{"access_log_flush_interval_ms": 0}`} {
		if _, err := LoadConfigFile(write(bad)); err == nil || !strings.Contains(err.Error(), "access_log") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(),
		AccessLog: accesslog.Config{Path: filepath.Join(dir, "missing", "a.log")}}); err == nil || !strings.Contains(err.Error(), "access_log") {
		t.Errorf("unwritable access_log path: %v", err)
	}
}

// TestAccessLogRPCQuery: an RPC Query call gets a line with "function" and the RPC code as
// status (0 = OK; the error code otherwise, without the query fields).
func TestAccessLogRPCQuery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	app := startWith(t, AppConfig{RPCPort: 0,
		AccessLog: accesslog.Config{Path: path, FlushInterval: time.Hour}})
	full := seqTokens(64, 1)
	fillInstances(t, app, 2, full)
	rc, ctx := dialRPC(t, app, 20*time.Second)
	var res cororpc.QueryResult
	q := cororpc.QueryRequest{Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: full[:48]}
	if code, err := rc.Query(ctx, &q, &res); err != nil || code != cororpc.CodeOK {
		t.Fatal(code, err)
	}
	q.Context.BlockSize = 0
	if code, _ := rc.Query(ctx, &q, &res); code != cororpc.CodeInvalidParams {
		t.Fatalf("block_size 0: code %v", code)
	}
	app.AccessLog.Flush()
	lines := readAccessLines(t, path)
	if len(lines) != 2 {
		t.Fatalf("%d lines: %v", len(lines), lines)
	}
	if l := lines[0]; l["function"] != "Query" || l["route"] != nil || l["model"] != "m" || l["tokens"] != 48.0 ||
		l["blocks_hashed"] != 3.0 || l["matched"] != 48.0 || l["status"] != 0.0 {
		t.Errorf("ok line = %v", l)
	}
	if l := lines[1]; l["function"] != "Query" || l["status"] != float64(cororpc.CodeInvalidParams) || l["model"] != nil {
		t.Errorf("error line = %v", l)
	}
}

// TestAccessLogRPCZeroAllocs: an RPC Query dispatch with the access log on allocates nothing.
func TestAccessLogRPCZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	app := startWith(t, AppConfig{RPCPort: 0,
		AccessLog: accesslog.Config{Path: filepath.Join(t.TempDir(), "a.log"), FlushInterval: time.Millisecond}})
	full := seqTokens(2048, 1)
	fillInstances(t, app, 4, full)
	body := cororpc.AppendQueryRequest(nil, &cororpc.QueryRequest{
		Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: full})
	conn := app.RPC.Dispatcher()
	hdr := cororpc.RequestHeader{SeqNum: 1, FunctionID: cororpc.FuncQuery, Length: uint32(len(body))}
	dispatch := func() {
		if _, err := conn.Dispatch(hdr, body); err != nil {
			t.Fatal(err)
		}
	}
	dispatch()
	if n := testing.AllocsPerRun(100, dispatch); n != 0 {
		t.Errorf("%v allocs per RPC Query with the access log on", n)
	}
}

// TestAccessLogModelAfterBodyRelease: the access line's model aliases the request body,
// so the body must not go back to its pool (where the next request overwrites it) before
// the line is written. Released buffers are zeroed here, so a use after release logs a
// wrong model every time instead of in a rare race.
func TestAccessLogModelAfterBodyRelease(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	app := startWith(t, AppConfig{RPCPort: -1,
		AccessLog: accesslog.Config{Path: path, FlushInterval: time.Hour}, PoisonReleasedBodies: true})
	full := seqTokens(64, 1)
	fillInstances(t, app, 1, full)
	h := app.HTTP.Handler()
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", full)
	for _, r := range []struct {
		path string
		body []byte
	}{
		{"/query", binQuery(full)},
		{"/query", mp("model", "model-with-a-longer-name", "block_size", 16, "token_ids", []any{1, 2})},
		{"/query_by_hash", mp("model", "m", "block_size", 16, "block_hashes", anys(keys))},
	} {
		var ctx fasthttp.RequestCtx
		setPost(&ctx, r.path, r.body)
		serveOK(t, h, &ctx)
	}
	app.AccessLog.Flush()
	lines := readAccessLines(t, path)
	want := []string{"m", "model-with-a-longer-name", "m"}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %v", len(lines), len(want), lines)
	}
	for i, l := range lines {
		if l["model"] != want[i] {
			t.Errorf("line %d: model %q, want %q (%v)", i, l["model"], want[i], l)
		}
	}
}

// TestAccessLogRPCQueryLargePrompt: a prompt too large for the connection to keep its
// token buffer is still logged with its length.
func TestAccessLogRPCQueryLargePrompt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	app := startWith(t, AppConfig{RPCPort: 0,
		AccessLog: accesslog.Config{Path: path, FlushInterval: time.Hour}})
	n := 1 << 20 // far above what a connection keeps between frames (64 KiB of tokens)
	body := cororpc.AppendQueryRequest(nil, &cororpc.QueryRequest{
		Context: cororpc.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: make([]int32, n)})
	hdr := cororpc.RequestHeader{SeqNum: 1, FunctionID: cororpc.FuncQuery, Length: uint32(len(body))}
	if _, err := app.RPC.Dispatcher().Dispatch(hdr, body); err != nil {
		t.Fatal(err)
	}
	app.AccessLog.Flush()
	lines := readAccessLines(t, path)
	if len(lines) != 1 || lines[0]["tokens"] != float64(n) {
		t.Fatalf("lines = %v, want one with tokens %d", lines, n)
	}
}
