package server

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// dialConn connects to addr, closed at cleanup, and writes first there (nothing if nil).
func dialConn(t testing.TB, addr string, first []byte) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if len(first) == 0 {
		return c
	}
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitInflight waits until the in-flight body budget holds want bytes.
func waitInflight(t *testing.T, app *App, want int64, what string) {
	t.Helper()
	eventually(t, what, func() error {
		if n := app.Counters.InflightBody.Load(); n != want {
			return errf("in flight = %d, want %d", n, want)
		}
		return nil
	})
}

// TestServiceKeysAreStructured: instance "a|b" in tenant "c" and instance "a" in tenant
// "b|c" print the same upstream key "a|b|c|0" but are two services: both register, and
// unregistering one (from the other tenant) leaves the other in place. /metrics keeps
// them apart too.
func TestServiceKeysAreStructured(t *testing.T) {
	app := startApp(t, false)
	for _, r := range []struct{ ep, inst, tenant string }{
		{"tcp://127.0.0.1:51", "a|b", "c"},
		{"tcp://127.0.0.1:52", "a", "b|c"},
	} {
		code, resp := msgpackPost(t, app, "/register", registerBody(r.ep, r.inst, 0, "tenant_id", r.tenant))
		if code != http.StatusOK {
			t.Fatalf("register %s/%s: %d %v", r.inst, r.tenant, code, resp)
		}
	}
	if n := len(app.Service.Services()); n != 2 {
		t.Fatalf("services = %d, want 2", n)
	}
	if code, body := httpGet(t, app, "/metrics"); code != http.StatusOK ||
		!strings.Contains(body, `service="a\\|b|c|0"`) || !strings.Contains(body, `service="a|b\\|c|0"`) {
		t.Fatalf("/metrics: %d, labels missing:\n%.2000s", code, body)
	}
	code, out := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "tenant_id", "b|c", "dp_rank", 0))
	if code != http.StatusOK {
		t.Fatalf("unregister: %d %v", code, out)
	}
	// removed_key stays the upstream text.
	if got := out["removed_instances"].([]any)[0]; got != "a|b|c|0" {
		t.Errorf("removed key = %v", got)
	}
	svcs := app.Service.Services()
	if len(svcs) != 1 || svcs[0].InstanceID != "a|b" || svcs[0].TenantID != "c" {
		t.Fatalf("left = %+v, want only a|b in tenant c", svcs)
	}
	// The same request again finds nothing: it never reaches the other tenant's service.
	if code, out := msgpackPost(t, app, "/unregister", mp("instance_id", "a", "tenant_id", "b|c", "dp_rank", 0)); code != http.StatusNotFound {
		t.Fatalf("second unregister: %d %v", code, out)
	}
	if n := len(app.Service.Services()); n != 1 {
		t.Fatalf("services = %d, want 1", n)
	}
}

// startLimited starts an in-process conductor with the given limits (and RPC).
func startLimited(t testing.TB, lim Limits, token string) *App {
	t.Helper()
	return startWith(t, AppConfig{RPCPort: 0, Limits: lim, AdminToken: token})
}

// rawHTTP sends head (and body) on a fresh connection and returns the status line and
// headers of the answer, read without sending anything more.
func rawHTTP(t testing.TB, addr, head string, body []byte) (*http.Response, net.Conn) {
	t.Helper()
	c := dialConn(t, addr, nil)
	// The server may answer and close before it has read all we send (that is what the
	// limits are for), so the write runs beside the read and its error only matters
	// when no response came.
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(append([]byte(head), body...))
		wrote <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		select {
		case werr := <-wrote:
			t.Fatalf("read response: %v (write: %v)", err, werr)
		default:
			t.Fatalf("read response: %v", err)
		}
	}
	resp.Body.Close()
	return resp, c
}

func postHead(path, ctype string, length int) string {
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", path, ctype, length)
}

// TestHTTPBodyTooLarge: a /query declaring more than max_query_body_bytes is answered
// 413 once its first 8 KiB arrived (fasthttp's prefetch), without reading the rest; a chunked body is cut off once it
// passes the bound; admin routes have their own smaller bound.
func TestHTTPBodyTooLarge(t *testing.T) {
	app := startLimited(t, Limits{MaxQueryBodyBytes: 1 << 20, MaxAdminBodyBytes: 4 << 10}, "")
	resp, _ := rawHTTP(t, app.HTTPAddr, postHead("/query", "application/msgpack", 250<<20), make([]byte, 16<<10))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
		t.Fatalf("declared 250 MB: %d close=%v", resp.StatusCode, resp.Close)
	}
	chunk := bytes.Repeat([]byte{0x90}, 64<<10)
	var chunked bytes.Buffer
	for i := 0; i < 20; i++ { // 1.25 MiB in 64 KiB chunks
		fmt.Fprintf(&chunked, "%x\r\n%s\r\n", len(chunk), chunk)
	}
	chunked.WriteString("0\r\n\r\n")
	resp, _ = rawHTTP(t, app.HTTPAddr, "POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/msgpack\r\nTransfer-Encoding: chunked\r\n\r\n", chunked.Bytes())
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked 1.25 MiB: %d", resp.StatusCode)
	}
	resp, _ = rawHTTP(t, app.HTTPAddr, postHead("/register", "application/msgpack", 8<<10), make([]byte, 8<<10))
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("register 8 KiB: %d", resp.StatusCode)
	}
	if n := app.Counters.BodyTooLarge.Load(); n != 3 {
		t.Errorf("413 counter = %d, want 3", n)
	}
	// Within the bound, a query still works.
	if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(64, 1))); code != http.StatusOK {
		t.Fatalf("small query: %d", code)
	}
}

// TestHTTPReadBufferBytes: http_read_buffer_bytes reaches the server (its read buffer
// also bounds a request's header): a 12 KiB header is refused with the 4 KiB default and
// served with a 16 KiB buffer, and a query larger than the buffer works with both.
func TestHTTPReadBufferBytes(t *testing.T) {
	head := func() string {
		return "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 12<<10) + "\r\n\r\n"
	}
	def := startLimited(t, Limits{}, "")
	if resp, _ := rawHTTP(t, def.HTTPAddr, head(), nil); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("12 KiB header, default buffer: %d, want 431", resp.StatusCode)
	}
	big := startLimited(t, Limits{HTTPReadBufferBytes: 16 << 10}, "")
	if resp, _ := rawHTTP(t, big.HTTPAddr, head(), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("12 KiB header, 16 KiB buffer: %d", resp.StatusCode)
	}
	for _, app := range []*App{def, big} {
		if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(8192, 1))); code != http.StatusOK {
			t.Fatalf("32 KiB query: %d", code)
		}
	}
}

// TestHTTPInflightBodyBudget: while big bodies hold the in-flight budget, another big
// body is answered 503 with Retry-After before being read, small queries still pass
// (big bodies cannot take the last eighth), and the budget is returned afterwards.
func TestHTTPInflightBodyBudget(t *testing.T) {
	app := startLimited(t, Limits{MaxQueryBodyBytes: 4 << 20, MaxInflightBodyBytes: 8 << 20}, "")
	// A: declares 1 MiB, sends 16 KiB and stalls: 5 MiB are reserved (a /query body
	// counts five times: its bytes and up to 4 bytes of tokens per byte).
	a := dialConn(t, app.HTTPAddr, append([]byte(postHead("/query", "application/msgpack", 1<<20)), make([]byte, 16<<10)...))
	waitInflight(t, app, 5<<20, "A's body reserved")
	// B: 512 KiB would need 2.5 MiB more; big bodies may use only 7 of the 8 MiB.
	resp, _ := rawHTTP(t, app.HTTPAddr, postHead("/query", "application/msgpack", 1<<19), make([]byte, 16<<10))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("B while A holds the budget: %d %v", resp.StatusCode, resp.Header)
	}
	if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(64, 1))); code != http.StatusOK {
		t.Fatalf("small query while A holds the budget: %d", code)
	}
	a.Close()
	waitInflight(t, app, 0, "budget returned")
	if app.Counters.BodyBudgetFull.Load() != 1 {
		t.Errorf("budget counter = %d", app.Counters.BodyBudgetFull.Load())
	}
}

// TestMultipartNeverParsed: a multipart body (which fasthttp would pre-parse and spill
// to temporary files) is refused on its content type before it is read; no file appears.
func TestMultipartNeverParsed(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	app := startLimited(t, Limits{}, "")
	part := "--XX\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
	body := append([]byte(part), make([]byte, 20<<20)...)
	body = append(body, "\r\n--XX--\r\n"...)
	resp, _ := rawHTTP(t, app.HTTPAddr, postHead("/query", "multipart/form-data; boundary=XX", len(body)), body[:1<<20])
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("multipart: %d", resp.StatusCode)
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Fatalf("temporary files created: %v", ents)
	}
}

// TestAdminToken: with admin_token set, /register and /unregister need the bearer token
// (401 otherwise); /query and the read-only routes stay open.
func TestAdminToken(t *testing.T) {
	app := startLimited(t, Limits{}, "s3cret")
	send := func(path, auth string, body []byte) int {
		code, h, _ := httpRaw(t, app, http.MethodPost, path, body, "Content-Type", "application/msgpack", "Authorization", auth)
		if code == http.StatusUnauthorized && h.Get("WWW-Authenticate") == "" {
			t.Errorf("401 without WWW-Authenticate")
		}
		return code
	}
	reg := registerBody("tcp://127.0.0.1:61", "e", 0)
	unreg := mp("instance_id", "e", "dp_rank", 0)
	for _, auth := range []string{"", "Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret2"} {
		if code := send("/register", auth, reg); code != http.StatusUnauthorized {
			t.Errorf("register with %q: %d", auth, code)
		}
		if code := send("/unregister", auth, unreg); code != http.StatusUnauthorized {
			t.Errorf("unregister with %q: %d", auth, code)
		}
	}
	if n := len(app.Service.Services()); n != 0 {
		t.Fatalf("unauthorized register took effect: %d services", n)
	}
	if code := send("/register", "Bearer s3cret", reg); code != http.StatusOK {
		t.Fatalf("register with token: %d", code)
	}
	if code := send("/query", "", queryBody("m", 16, seqTokens(16, 1))); code != http.StatusOK {
		t.Errorf("query without token: %d", code)
	}
	for _, p := range []string{"/services", "/global_view", "/healthz", "/metrics"} {
		if code, _ := httpGet(t, app, p); code != http.StatusOK {
			t.Errorf("GET %s without token: %d", p, code)
		}
	}
	if code := send("/unregister", "Bearer s3cret", unreg); code != http.StatusOK {
		t.Fatalf("unregister with token: %d", code)
	}
	if n := app.Counters.Unauthorized.Load(); n != 10 {
		t.Errorf("401 counter = %d, want 10", n)
	}
}

// TestRPCDeadlinesAndConnectionCap: an idle RPC connection and one that stops mid-frame
// are closed by the idle and read deadlines; beyond rpc_max_connections a connection is
// closed at accept, and once one leaves a new one is served.
func TestRPCDeadlinesAndConnectionCap(t *testing.T) {
	app := startLimited(t, Limits{RPCIdleTimeout: 300 * time.Millisecond, RPCReadTimeout: 300 * time.Millisecond, RPCMaxConnections: 2}, "")
	closed := func(c net.Conn) error {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			return fmt.Errorf("connection not closed by the server: %v", err)
		}
		return nil
	}
	idle := dialConn(t, app.RPCAddr, nil)
	half := dialConn(t, app.RPCAddr, []byte{0x21, 0x01}) // two bytes of a header
	if err := closed(idle); err != nil {
		t.Fatalf("idle: %v", err)
	}
	if err := closed(half); err != nil {
		t.Fatalf("half frame: %v", err)
	}
	eventually(t, "timeouts counted", func() error {
		if n := app.Counters.RPCTimeouts.Load(); n != 2 {
			return errf("timeouts = %d", n)
		}
		if n := app.Counters.RPCConns.Load(); n != 0 {
			return errf("open = %d", n)
		}
		return nil
	})
	// Cap, on a server whose idle timeout cannot close anything during the test: the
	// third connection is closed at accept, and once one leaves a new one is served.
	app2 := startLimited(t, Limits{RPCMaxConnections: 2}, "")
	var conns []net.Conn
	for i := 0; i < 2; i++ {
		c := dialConn(t, app2.RPCAddr, nil)
		conns = append(conns, c)
	}
	open := func(want int64) func() error {
		return func() error {
			if n := app2.Counters.RPCConns.Load(); n != want {
				return errf("open = %d, want %d", n, want)
			}
			return nil
		}
	}
	eventually(t, "two served", open(2))
	third := dialConn(t, app2.RPCAddr, nil)
	if err := closed(third); err != nil {
		t.Fatalf("third: %v", err)
	}
	if n := app2.Counters.RPCConnsRefused.Load(); n != 1 {
		t.Errorf("refused = %d", n)
	}
	conns[0].Close()
	eventually(t, "one left", open(1))
	dialConn(t, app2.RPCAddr, nil) // a fourth, in the freed place
	eventually(t, "new one served", open(2))
	if n := app2.Counters.RPCConnsRefused.Load(); n != 1 {
		t.Errorf("refused after one left = %d", n)
	}
}

// TestRegistrationLimits: max_services caps registrations (an identical re-registration
// still answers 200), and string fields longer than max_registration_field_bytes are
// invalid_value with the field.
func TestRegistrationLimits(t *testing.T) {
	app := startLimited(t, Limits{MaxServices: 2, MaxFieldBytes: 64}, "")
	for i := 0; i < 2; i++ {
		mustRegister(t, app, "", registerBody(fmt.Sprintf("tcp://127.0.0.1:%d", 71+i), fmt.Sprint("e", i), 0))
	}
	mustRegister(t, app, "", registerBody("tcp://127.0.0.1:71", "e0", 0))
	code, r := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:73", "e2", 0))
	if code != 400 || r["reason"] != "invalid_registration" || !strings.Contains(r["error"].(string), "max_services") {
		t.Fatalf("third service: %d %v", code, r)
	}
	if n := app.Service.RefusedServices(); n != 1 {
		t.Errorf("refused = %d", n)
	}
	for _, f := range []string{"modelname", "instance_id", "endpoint", "lora_name", "tenant_id"} {
		v := strings.Repeat("x", 65)
		if f == "endpoint" {
			v = "tcp://" + strings.Repeat("1", 59)
		}
		code, r := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:74", "e3", 0, f, v))
		if code != 400 || r["reason"] != "invalid_value" || r["field"] != f {
			t.Errorf("%s of 65 bytes: %d %v", f, code, r)
		}
	}
}

// failingStore fails Put or Delete on demand.
type failingStore struct {
	failPut, failDelete bool
	puts, deletes       int
}

func (f *failingStore) Put(*service.Config) error {
	if f.failPut {
		return errors.New("disk full")
	}
	f.puts++
	return nil
}

func (f *failingStore) Delete(service.ID) error {
	if f.failDelete {
		return errors.New("disk full")
	}
	f.deletes++
	return nil
}

// TestRegistrationNotDurableIsRolledBack: when the registration cannot be stored it is
// answered 500 and nothing stays (no service, no context, no slot, the endpoint free);
// an unregistration that cannot be stored is answered 500 and the service stays.
func TestRegistrationNotDurableIsRolledBack(t *testing.T) {
	app := startApp(t, false)
	st := &failingStore{failPut: true}
	app.Service.SetStore(st)
	code, r := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:81", "e", 0))
	if code != 500 || !strings.Contains(r["error"].(string), "Failed to persist") {
		t.Fatalf("register with failing store: %d %v", code, r)
	}
	if n := len(app.Service.Services()); n != 0 {
		t.Fatalf("services = %d", n)
	}
	if _, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil); asInt(t, view["context_count"]) != 0 {
		t.Fatalf("context left: %v", view)
	}
	st.failPut = false
	mustRegister(t, app, "", registerBody("tcp://127.0.0.1:81", "e", 0))
	st.failDelete = true
	if code, r := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0)); code != 500 {
		t.Fatalf("unregister with failing store: %d %v", code, r)
	}
	if n := len(app.Service.Services()); n != 1 {
		t.Fatalf("services after failed unregister = %d", n)
	}
	st.failDelete = false
	if code, _ := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0)); code != 200 || st.deletes != 1 {
		t.Fatalf("unregister: %d deletes=%d", code, st.deletes)
	}
}

// TestStateFileNotWritable: a state path that cannot be written (its parent is a file)
// makes registrations over HTTP fail with 500 instead of answering 200 and losing them.
func TestStateFileNotWritable(t *testing.T) {
	parent := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(parent, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	app := startWithState(t, filepath.Join(parent, service.StateFileName))
	defer app.Stop()
	code, r := msgpackPost(t, app, "/register", registerBody("tcp://127.0.0.1:82", "e", 0))
	if code != 500 || len(app.Service.Services()) != 0 {
		t.Fatalf("register with unwritable state: %d %v, %d services", code, r, len(app.Service.Services()))
	}
}

// TestAdminTokenHTTPClient: the Go client (and conductorctl, which uses it) sends the
// admin token on register and unregister; without it the server's 401 comes back as
// an *httpclient.Error.
func TestAdminTokenHTTPClient(t *testing.T) {
	app := startLimited(t, Limits{}, "s3cret")
	reg := &httpclient.RegisterRequest{Endpoint: "tcp://127.0.0.1:62", Type: "vLLM", ModelName: "m", InstanceID: "e", BlockSize: 16,
		HashProfile: httpclient.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be"}}
	anon, err := httpclient.New(app.HTTPAddr, httpclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	var he *httpclient.Error
	if _, err := anon.Register(reg); !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Fatalf("register without token: %v", err)
	}
	admin, err := httpclient.New(app.HTTPAddr, httpclient.Options{AdminToken: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Register(reg); err != nil {
		t.Fatalf("register with token: %v", err)
	}
	if _, err := admin.Unregister(&httpclient.UnregisterRequest{InstanceID: "e"}); err != nil {
		t.Fatalf("unregister with token: %v", err)
	}
}

// TestRPCBodiesShareTheInflightBudget: an RPC frame's body is reserved (twice: raw and
// decoded) in the budget HTTP uses, before it is read, so RPC and HTTP big bodies
// together stay within max_inflight_body_bytes; the reservation ends with the frame.
func TestRPCBodiesShareTheInflightBudget(t *testing.T) {
	app := startLimited(t, Limits{MaxInflightBodyBytes: 8 << 20, RPCReadTimeout: time.Minute}, "")
	frame, start := cororpc.BeginRequest(nil, 1, cororpc.FuncQuery)
	frame = append(frame, make([]byte, 3<<20)...)
	if err := cororpc.FinishRequest(frame, start); err != nil {
		t.Fatal(err)
	}
	a := dialConn(t, app.RPCAddr, frame[:cororpc.RequestHeaderSize+100])
	waitInflight(t, app, 6<<20, "RPC body reserved")
	resp, _ := rawHTTP(t, app.HTTPAddr, postHead("/query", "application/msgpack", 3<<19), make([]byte, 16<<10))
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("HTTP body while RPC holds the budget: %d", resp.StatusCode)
	}
	a.Close()
	waitInflight(t, app, 0, "budget returned")
}

// TestRPCCloseInterruptsBudgetWait: a frame waiting for the body budget (held here by
// other requests) does not hold shutdown until its read deadline: Close ends the wait.
func TestRPCCloseInterruptsBudgetWait(t *testing.T) {
	app := startLimited(t, Limits{MaxInflightBodyBytes: 8 << 20, RPCReadTimeout: time.Hour, RPCIdleTimeout: time.Hour}, "")
	app.Counters.InflightBody.Add(7 << 20) // other requests hold the big-body share
	defer app.Counters.InflightBody.Add(-(7 << 20))
	frame, _ := cororpc.BeginRequest(nil, 1, cororpc.FuncQuery)
	binary.LittleEndian.PutUint32(frame[12:], 1<<20)
	dialConn(t, app.RPCAddr, frame)
	eventually(t, "connection served", func() error {
		if n := app.Counters.RPCConns.Load(); n != 1 {
			return errf("open = %d", n)
		}
		return nil
	})
	closed := make(chan struct{})
	go func() {
		app.RPC.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("RPC Close still waiting for a frame blocked on the body budget")
	}
	if n := app.Counters.InflightBody.Load(); n != 7<<20 {
		t.Errorf("in flight after close = %d, want only the 7 MiB held by others", n)
	}
}
