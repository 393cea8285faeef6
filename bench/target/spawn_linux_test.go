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
)

// fakeConductorEnv makes the test binary act as a conductor: TestFakeConductorHelper.
const fakeConductorEnv = "CONDUCTOR_FAKE_HELPER"

// TestFakeConductorHelper is the process TestSpawnRemovesConfig spawns as a conductor:
// it reads the configuration at CONDUCTOR_CONFIG_PATH and answers every HTTP request on
// the configured port with 503 (an answer, to Spawn) until it is stopped.
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
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
}

// TestSpawnRemovesConfig: the temporary configuration is gone once the conductor has
// answered (a harness killed afterwards leaves no directory behind), and the conductor
// keeps running until Stop.
func TestSpawnRemovesConfig(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	// The fake conductor: this test binary, run as TestFakeConductorHelper under the
	// same pid (exec), with Spawn's environment.
	bin := filepath.Join(t.TempDir(), "fake-conductor")
	script := fmt.Sprintf("#!/bin/sh\nexec %q -test.run='^TestFakeConductorHelper$' -test.count=1\n", os.Args[0])
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeConductorEnv, "1")
	c, err := Spawn(bin, &syncWriter{b: &strings.Builder{}})
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
