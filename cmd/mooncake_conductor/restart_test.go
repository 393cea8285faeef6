package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// TestBinaryKill9RestartKeepsServices: a service registered over HTTP survives kill -9 of
// the process; the restarted binary re-registers it from the state file, re-subscribes,
// and catches up on what the publisher buffered while it was down.
func TestBinaryKill9RestartKeepsServices(t *testing.T) {
	dir := t.TempDir()
	pub, err := zmqtest.NewPublisher(zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	port := freePort(t)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	config := writeJSON(t, dir, map[string]any{"http_server_port": port, "rpc_server_port": 0, "kvevent_instance": map[string]any{}})

	first := startConductor(t, config)
	first.waitHTTP("127.0.0.1:" + strconv.Itoa(port))
	reg := mp("endpoint", pub.Endpoint(), "replay_endpoint", pub.ReplayEndpoint(), "type", "vLLM", "modelname", "m",
		"instance_id", "engine-k", "block_size", 16, "dp_rank", 0,
		"hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"})
	if code, resp := call(t, http.MethodPost, base+"/register", reg); code != 200 {
		t.Fatalf("register: %d %v", code, resp)
	}
	if _, err := os.Stat(filepath.Join(dir, "conductor_state.json")); err != nil {
		t.Fatalf("state file not written beside the config: %v", err)
	}
	if err := first.cmd.Process.Kill(); err != nil { // SIGKILL: no shutdown path runs
		t.Fatal(err)
	}
	first.waitExit(exitWait)

	// While the conductor is down the engine caches a prompt.
	tokens := tokenRun(100, 32)
	if _, err := pub.Publish(vllmBatch(vllmKeys(t, tokens))); err != nil {
		t.Fatal(err)
	}

	second := startConductor(t, config)
	second.waitHTTP("127.0.0.1:" + strconv.Itoa(port))
	// The listener accepts before the state file's services are registered again.
	second.waitReady(base)
	code, svcs := call(t, http.MethodGet, base+"/services", nil)
	if code != 200 || num(svcs["count"]) != 1 {
		t.Fatalf("services after restart: %d %v", code, svcs)
	}
	if id := svcs["services"].([]any)[0].(map[string]any)["InstanceID"]; id != "engine-k" {
		t.Fatalf("restored service = %v", id)
	}
	second.waitDeviceHit(base, "engine-k", tokens, 32)
	// The listeners serve (and restored services apply events) before the startup
	// summary is logged: wait for it.
	second.waitLog("conductor started")
	if !strings.Contains(second.out.String(), "restored_services=1") {
		t.Errorf("startup summary does not report the restored service:\n%s", second.out.String())
	}
	second.terminate()
}
