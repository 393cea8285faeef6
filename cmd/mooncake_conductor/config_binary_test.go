package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBinaryConfigRefusals: the binary exits 1, naming the problem, for a config file
// with a key given twice, an admin token with a control byte, and a query key memo
// larger than a quarter of the machine's memory.
func TestBinaryConfigRefusals(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"duplicate key", `{"http_server_port": 0, "admin_token": "a", "admin_token": "b"}`, `duplicate key "admin_token"`},
		{"token newline", `{"http_server_port": 0, "admin_token": "s3cret\n"}`, "admin_token must not contain control bytes"},
		{"memo", `{"http_server_port": 0, "query_memo_entries": ` + strconv.Itoa(1<<30) + `}`, "query_memo_entries"},
	} {
		if c.name == "memo" && memTotal(t) >= 80<<30 {
			t.Log("memo: this machine fits the largest memo (20 GiB) in a quarter of its memory")
			continue
		}
		path := filepath.Join(t.TempDir(), "conductor_config.json")
		if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		cd := startConductor(t, path)
		if code := cd.waitExit(20 * time.Second); code != 1 {
			t.Fatalf("%s: exit code %d, want 1\n%s", c.name, code, cd.out.String())
		}
		if out := cd.out.String(); !strings.Contains(out, c.want) {
			t.Fatalf("%s: output does not say %q:\n%s", c.name, c.want, out)
		}
	}
}

// TestBinaryRelativePathsBesideConfig: relative state_file and access_log paths land in
// the config file's directory whatever the process's working directory.
func TestBinaryRelativePathsBesideConfig(t *testing.T) {
	confDir, workDir := t.TempDir(), t.TempDir()
	port := freePort(t)
	cfg := writeJSON(t, confDir, map[string]any{"http_server_port": port, "rpc_server_port": 0,
		"http_bind_address": "127.0.0.1", "state_file": "rel-state.json", "access_log": "rel-access.log"})
	c := startConductorIn(t, workDir, cfg)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	c.waitReady(base)
	reg := mp("endpoint", "tcp://127.0.0.1:"+strconv.Itoa(freePort(t)), "type", "vLLM", "modelname", "m",
		"instance_id", "engine-r", "block_size", 16, "dp_rank", 0,
		"hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"})
	if code, resp := call(t, http.MethodPost, base+"/register", reg); code != 200 {
		t.Fatalf("register: %d %v", code, resp)
	}
	for _, name := range []string{"rel-state.json", "rel-access.log"} {
		if _, err := os.Stat(filepath.Join(confDir, name)); err != nil {
			t.Errorf("%s not beside the config: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(workDir, name)); err == nil {
			t.Errorf("%s created in the working directory", name)
		}
	}
	c.terminate()
}

// memTotal is the machine's memory (MemTotal of /proc/meminfo).
func memTotal(t *testing.T) int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Skip(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Skip("no MemTotal")
	return 0
}
