package target

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/conductor-go/conductor/internal/syncbuf"
)

// fakeConductorEnv makes the test binary act as a conductor: TestFakeConductorHelper.
const fakeConductorEnv = "CONDUCTOR_FAKE_HELPER"

// TestFakeConductorHelper is the process TestSpawnRemovesConfig spawns as a conductor:
// it reads the configuration at CONDUCTOR_CONFIG_PATH and answers GET /config with it and
// every other HTTP request on the configured port with 503 (an answer, to Spawn) until it
// is stopped.
func TestFakeConductorHelper(t *testing.T) {
	if os.Getenv(fakeConductorEnv) == "" {
		t.Skip("helper process only")
	}
	raw, err := os.ReadFile(os.Getenv("CONDUCTOR_CONFIG_PATH"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Port int `json:"http_server_port"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", cfg.Port))
	if err != nil {
		t.Fatal(err)
	}
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/config" {
			_, _ = w.Write(raw)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
}

// TestSpawnRemovesConfig: the temporary configuration is gone once the conductor has
// answered (a harness killed afterwards leaves no directory behind), and the conductor
// keeps running until Stop.
func TestSpawnRemovesConfig(t *testing.T) {
	bin := fakeConductor(t)
	c, err := Spawn(bin, &syncbuf.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", c.PID))
	if err != nil {
		t.Fatal(err)
	}
	var path string
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if v, ok := strings.CutPrefix(string(kv), "CONDUCTOR_CONFIG_PATH="); ok {
			path = v
		}
	}
	if !strings.Contains(path, "conductor-bench-") {
		t.Fatalf("conductor's config path %q", path)
	}
	if _, err := os.Stat(filepath.Dir(path)); !os.IsNotExist(err) {
		t.Fatalf("configuration directory %s still there after the conductor answered: %v", filepath.Dir(path), err)
	}
	if err := syscall.Kill(c.PID, 0); err != nil {
		t.Fatalf("conductor not running after Spawn: %v", err)
	}
}

// fakeConductor returns a script that runs this test binary as TestFakeConductorHelper
// under the same pid (exec), with Spawn's environment.
func fakeConductor(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	bin := filepath.Join(t.TempDir(), "fake-conductor")
	script := fmt.Sprintf("#!/bin/sh\nexec %q -test.run='^TestFakeConductorHelper$' -test.count=1\n", os.Args[0])
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeConductorEnv, "1")
	return bin
}

// TestSpawnWithConfig: SpawnWith's overrides reach the conductor's configuration beside
// the harness's own keys, and an override of a key the harness decides is refused before
// anything starts.
func TestSpawnWithConfig(t *testing.T) {
	bin := fakeConductor(t)
	opts := SpawnOptions{Config: map[string]any{}}
	for _, kv := range []string{"query_memo_populate=false", "max_services=2000", `access_log=/tmp/x log`, `limits={"a":1}`} {
		k, v, err := ParseConfigSet(kv)
		if err != nil {
			t.Fatal(err)
		}
		opts.Config[k] = v
	}
	c, err := SpawnWith(bin, &syncbuf.Buffer{}, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	code, raw, err := httpGet(t.Context(), c.Addr, "/config")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /config: %d, %v", code, err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"query_memo_populate": false, "max_services": 2000.0, "access_log": "/tmp/x log",
		"limits": map[string]any{"a": 1.0}, "rpc_server_port": 0.0, "state_file": ""}
	for k, v := range want {
		if fmt.Sprint(got[k]) != fmt.Sprint(v) {
			t.Errorf("config %s = %#v, want %#v (config %s)", k, got[k], v, raw)
		}
	}
	if port, _ := got["http_server_port"].(float64); !strings.HasSuffix(c.Addr, fmt.Sprintf(":%d", int(port))) {
		t.Errorf("http_server_port %v, conductor at %s", got["http_server_port"], c.Addr)
	}
	if _, err := SpawnWith(bin, nil, SpawnOptions{Config: map[string]any{"http_server_port": 1}}); err == nil ||
		!strings.Contains(err.Error(), "set by the harness") {
		t.Fatalf("override of http_server_port: %v", err)
	}
	if _, _, err := ParseConfigSet("novalue"); err == nil {
		t.Fatal("ParseConfigSet accepted a pair without =")
	}
}
