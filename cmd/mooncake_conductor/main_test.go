package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/conductor-go/conductor/internal/syncbuf"
	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// binPath is the conductor binary built once for this package's tests.
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "conductor-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		binPath = filepath.Join(dir, "mooncake_conductor")
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(gobin); err != nil {
			gobin = "go"
		}
		build := exec.Command(gobin, "build", "-o", binPath, ".")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build mooncake_conductor: %v\n", err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// conductor is one running binary.
type conductor struct {
	t      *testing.T
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan struct{}
	err    error // Wait's result, valid once exited is closed
}

// startConductor runs the binary with CONDUCTOR_CONFIG_PATH=config and extra environment;
// the process is killed at cleanup if the test did not stop it.
func startConductor(t *testing.T, config string, env ...string) *conductor {
	t.Helper()
	return startBinaryIn(t, binPath, "", config, env...)
}

// startConductorIn is startConductor with the process's working directory set to dir
// ("" keeps the test's).
func startConductorIn(t *testing.T, dir, config string, env ...string) *conductor {
	t.Helper()
	return startBinaryIn(t, binPath, dir, config, env...)
}

// startBinary is startConductor with another conductor binary (an older build, to
// compare).
func startBinary(t *testing.T, bin, config string, env ...string) *conductor {
	t.Helper()
	return startBinaryIn(t, bin, "", config, env...)
}

// startBinaryIn starts conductor binary bin in working directory dir ("" keeps the
// test's).
func startBinaryIn(t *testing.T, bin, dir, config string, env ...string) *conductor {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CONDUCTOR_CONFIG_PATH="+config, "CONDUCTOR_LOG_LEVEL=")
	cmd.Env = append(cmd.Env, env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &conductor{t: t, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("conductor output:\n%s", out.String())
		}
	})
	return c
}

// exitWait bounds a wait for the process to exit: generous, since a verdict never
// depends on how long the exit took (a hang is what it catches), and a loaded machine
// may take seconds to schedule the shutdown.
const exitWait = 60 * time.Second

// waitExit waits for the process to end and returns its exit code.
func (c *conductor) waitExit(timeout time.Duration) int {
	c.t.Helper()
	select {
	case <-c.exited:
	case <-time.After(timeout):
		c.t.Fatalf("conductor still running after %v", timeout)
	}
	var ee *exec.ExitError
	if c.err != nil && !errors.As(c.err, &ee) {
		c.t.Fatalf("wait: %v", c.err)
	}
	return c.cmd.ProcessState.ExitCode()
}

// waitHTTP waits until addr accepts connections (failing if the process exits first).
func (c *conductor) waitHTTP(addr string) {
	c.t.Helper()
	c.waitFor(addr+" accepting connections", func() error {
		conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// waitReady waits until GET base/readyz answers 200: the listeners are up and the static
// services registered and subscribed (the HTTP listener accepts before that).
func (c *conductor) waitReady(base string) {
	c.t.Helper()
	c.waitFor(base+"/readyz answering 200", func() error {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// waitFor polls check every 20 ms until it returns nil, failing the test if the process
// exits first or 30 s pass (with what, the last error and the conductor's output). The
// deadline only bounds a wait for something that must happen: it is far beyond what any
// of them takes, even on a loaded machine.
func (c *conductor) waitFor(what string, check func() error) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-c.exited:
			c.t.Fatalf("conductor exited before %s: %v\n%s", what, c.err, c.out.String())
		default:
		}
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("never %s (last: %v):\n%s", what, err, c.out.String())
		}
		time.Sleep(20 * time.Millisecond) // paces the polling
	}
}

// waitLog waits until the process's output holds text (the process writes its log to a
// pipe that a goroutine of exec copies into c.out, so a line it wrote before answering a
// request may reach c.out after the answer).
func (c *conductor) waitLog(text string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("a log line with %q", text), func() error {
		if !strings.Contains(c.out.String(), text) {
			return errors.New("not logged yet")
		}
		return nil
	})
}

// terminate sends SIGTERM and requires exit code 0 (within exitWait: a hang fails).
func (c *conductor) terminate() {
	c.t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		c.t.Fatal(err)
	}
	start := time.Now()
	if code := c.waitExit(exitWait); code != 0 {
		c.t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	c.t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := target.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

func writeJSON(t *testing.T, dir string, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "conductor_config.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mp builds a msgpack map from ordered key/value pairs.
func mp(kv ...any) []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		b = msgp.AppendString(b, kv[i].(string))
		var err error
		if b, err = msgp.AppendIntf(b, kv[i+1]); err != nil {
			panic(err)
		}
	}
	return b
}

// call sends a request and decodes the msgpack map it answers.
func call(t *testing.T, method, url string, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/msgpack")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/msgpack" {
		t.Errorf("%s %s: Content-Type %q", method, url, ct)
	}
	v, rest, err := msgp.ReadIntfBytes(raw)
	m, ok := v.(map[string]any)
	if err != nil || len(rest) != 0 || !ok {
		t.Fatalf("%s %s: body %x is not a msgpack map: %v", method, url, raw, err)
	}
	return resp.StatusCode, m
}

// anys converts xs to []any, the form mp encodes as an array.
func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// tokenRun is the prompt first, first+1, ..., n tokens.
func tokenRun(first int32, n int) []int32 {
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = first + int32(i)
	}
	return tokens
}

// queryBody is the /query request of tokens for model "m", block size 16.
func queryBody(tokens []int32) []byte {
	return mp("model", "m", "block_size", 16, "token_ids", anys(tokens))
}

// waitDeviceHit waits until /query at base answers that instance holds device tokens of
// the prompt tokens on the device tier.
func (c *conductor) waitDeviceHit(base, instance string, tokens []int32, device int64) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("a %d-token device hit on %s", device, instance), func() error {
		_, resp := call(c.t, http.MethodPost, base+"/query", queryBody(tokens))
		if inst, _ := resp["instances"].(map[string]any)[instance].(map[string]any); inst == nil || num(inst["device"]) != device {
			return fmt.Errorf("answer %v", resp)
		}
		return nil
	})
}

func num(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case uint64:
		return int64(x)
	}
	return -1
}

func vllmEntry(endpoint string) map[string]any {
	return map[string]any{
		"endpoint": endpoint, "type": "vLLM", "modelname": "m", "instance_id": "engine-a",
		"block_size": 16, "dp_rank": 0, "cache_group": nil,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	}
}

// TestBinaryStaticServiceLifecycle: the real binary loads a config with one valid and one
// invalid static service, serves the valid one, indexes its events, unregisters it, and
// exits 0 on SIGTERM.
func TestBinaryStaticServiceLifecycle(t *testing.T) {
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	invalid := vllmEntry("tcp://127.0.0.1:1")
	invalid["dp_rank"] = -1
	httpPort, rpcPort := freePort(t), freePort(t)
	dir := t.TempDir()
	config := writeJSON(t, dir, map[string]any{
		"http_server_port": httpPort, "rpc_server_port": rpcPort,
		"kvevent_instance": map[string]any{"vllm-a-r0": vllmEntry(pub.Endpoint()), "broken-entry": invalid},
	})
	c := startConductor(t, config)
	addr := "127.0.0.1:" + strconv.Itoa(httpPort)
	c.waitHTTP(addr)
	c.waitHTTP("127.0.0.1:" + strconv.Itoa(rpcPort))
	base := "http://" + addr
	// The HTTP listener accepts before the static services are registered: /services
	// lists them once the conductor is ready.
	c.waitReady(base)

	code, svcs := call(t, http.MethodGet, base+"/services", nil)
	if code != http.StatusOK || num(svcs["count"]) != 1 {
		t.Fatalf("/services: %d %v", code, svcs)
	}
	svc := svcs["services"].([]any)[0].(map[string]any)
	if svc["InstanceID"] != "engine-a" || svc["Endpoint"] != pub.Endpoint() || svc["TenantID"] != "default" {
		t.Errorf("service = %v", svc)
	}
	// Logged before readiness, but it may reach c.out after the readiness answer.
	c.waitLog("broken-entry")
	if log := c.out.String(); !regexp.MustCompile(`skipped.*broken-entry|broken-entry.*skipped`).MatchString(log) {
		t.Errorf("the invalid entry was not logged as skipped:\n%s", log)
	}

	if err := pub.WaitSubscribers(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tokens := tokenRun(100, 48)
	keys := vllmKeys(t, tokens)
	if _, err := pub.Publish(vllmBatch(keys[:2])); err != nil {
		t.Fatal(err)
	}
	query := queryBody(tokens)
	c.waitFor("a hit via /query", func() error {
		code, resp := call(t, http.MethodPost, base+"/query", query)
		inst, _ := resp["instances"].(map[string]any)["engine-a"].(map[string]any)
		if code != http.StatusOK || inst == nil || num(inst["device"]) != 32 {
			return fmt.Errorf("%d %v", code, resp)
		}
		if num(inst["longest_matched"]) != 32 || num(inst["disk"]) != 32 {
			t.Errorf("hit = %v", inst)
		}
		return nil
	})

	code, resp := call(t, http.MethodPost, base+"/unregister", mp("instance_id", "engine-a", "dp_rank", 0))
	if code != http.StatusOK || resp["status"] != "unregistered successfully" {
		t.Fatalf("unregister: %d %v", code, resp)
	}
	if code, svcs := call(t, http.MethodGet, base+"/services", nil); code != http.StatusOK || num(svcs["count"]) != 0 {
		t.Errorf("/services after unregister: %d %v", code, svcs)
	}
	if code, resp := call(t, http.MethodPost, base+"/query", query); code != http.StatusOK || len(resp["instances"].(map[string]any)) != 0 {
		t.Errorf("/query after unregister: %d %v", code, resp)
	}
	c.terminate()
}

// vllmKeys computes the low64 keys vLLM publishes for the prompt (sha256_cbor, seed "0").
func vllmKeys(t *testing.T, tokens []int32) []uint64 {
	t.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	var ch hashing.Chain
	ch.Reset(&p, 16, "", "", tokens)
	keys := make([]uint64, ch.NumBlocks())
	for i := range keys {
		if keys[i], err = ch.Next(); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// vllmBatch is a vLLM KVEventBatch with one BlockStored on GPU, rank 0.
func vllmBatch(keys []uint64) []byte {
	ev := mp("type", "BlockStored", "block_hashes", anys(keys), "parent_block_hash", nil, "token_ids", nil,
		"block_size", 16, "lora_id", nil, "medium", "GPU", "lora_name", nil)
	return eventBatch(float64(time.Now().UnixNano())/1e9, ev)
}

// eventBatch wraps one encoded event as a KVEventBatch [ts, [ev], 0] (dp rank 0).
func eventBatch(ts float64, ev []byte) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, ts)
	b = msgp.AppendArrayHeader(b, 1)
	b = append(b, ev...)
	return msgp.AppendInt(b, 0)
}

// TestBinaryMalformedConfig: a config that cannot be parsed stops the process with a
// non-zero code and a message naming the file.
func TestBinaryMalformedConfig(t *testing.T) {
	dir := t.TempDir()
	for _, text := range []string{`{"http_server_port": 1,`, `[1, 2]`, `{"http_server_port": "x"}`} {
		path := filepath.Join(dir, "bad_config.json")
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		c := startConductor(t, path)
		if code := c.waitExit(exitWait); code == 0 {
			t.Errorf("%s: exit code 0", text)
		}
		if out := c.out.String(); !strings.Contains(out, path) {
			t.Errorf("%s: output does not name %s:\n%s", text, path, out)
		}
	}
}

// portFree reports whether port can be bound on every interface (as the binary binds).
func portFree(port int) bool {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// TestBinaryMissingConfig: without a config file the binary warns, naming the path, and
// serves on the default ports with no services. Skipped when those ports are taken.
func TestBinaryMissingConfig(t *testing.T) {
	if !portFree(13333) || !portFree(13334) {
		t.Skip("default ports 13333/13334 are in use")
	}
	path := filepath.Join(t.TempDir(), "absent.json")
	c := startConductor(t, path)
	c.waitHTTP("127.0.0.1:13333")
	code, svcs := call(t, http.MethodGet, "http://127.0.0.1:13333/services", nil)
	if code != http.StatusOK || num(svcs["count"]) != 0 {
		t.Errorf("/services: %d %v", code, svcs)
	}
	out := c.out.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "not found") || !strings.Contains(out, path) {
		t.Errorf("no warning naming the missing file:\n%s", out)
	}
	c.terminate()
}

// TestBinaryLogLevel: debug, warn (any case) and the empty value are accepted; anything
// else, "warning" included, warns and falls back to info.
func TestBinaryLogLevel(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		level       string
		invalid     bool
		infoVisible bool
	}{
		{"debug", false, true},
		{"DEBUG", false, true},
		{"info", false, true},
		{"warn", false, false},
		{"Warn", false, false},
		{"error", false, false},
		{"bogus", true, true},
		{"warning", true, true},
	} {
		port := freePort(t)
		config := writeJSON(t, dir, map[string]any{"http_server_port": port, "rpc_server_port": 0})
		p := startConductor(t, config, "CONDUCTOR_LOG_LEVEL="+c.level)
		p.waitHTTP("127.0.0.1:" + strconv.Itoa(port))
		p.terminate()
		out := p.out.String()
		warned := strings.Contains(out, "invalid CONDUCTOR_LOG_LEVEL")
		info := strings.Contains(out, "level=INFO")
		if warned != c.invalid || info != c.infoVisible {
			t.Errorf("CONDUCTOR_LOG_LEVEL=%s: warned %v (want %v), info lines %v (want %v):\n%s",
				c.level, warned, c.invalid, info, c.infoVisible, out)
		}
		if c.invalid && !strings.Contains(out, c.level) {
			t.Errorf("CONDUCTOR_LOG_LEVEL=%s: warning does not quote the value:\n%s", c.level, out)
		}
	}
}
