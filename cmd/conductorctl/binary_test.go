package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// startRealConductor builds and runs mooncake_conductor on a free loopback port
// (target.Spawn: it returns once the conductor answers) and returns its HTTP address; it
// is stopped (SIGTERM) at cleanup.
func startRealConductor(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mooncake_conductor")
	build := exec.Command("go", "build", "-o", bin, "../mooncake_conductor")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build conductor: %v\n%s", err, out)
	}
	var log bytes.Buffer
	c, err := target.SpawnWith(bin, &log, target.SpawnOptions{Config: map[string]any{"admin_token": realConductorToken}})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(c.Stop)
	return "http://" + c.Addr
}

func ctl(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// realConductorToken is the real conductor's admin_token (a snapshot load needs one);
// the commands read it from CONDUCTOR_ADMIN_TOKEN.
const realConductorToken = "t0ken"

// TestCLIAgainstRealConductor drives every command against the real binary.
func TestCLIAgainstRealConductor(t *testing.T) {
	t.Setenv("CONDUCTOR_ADMIN_TOKEN", realConductorToken)
	addr := startRealConductor(t)
	pub, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()

	code, out, errOut := ctl(t, "--addr", addr, "register", "--endpoint", pub.Endpoint(), "--type", "vLLM",
		"--model", "m", "--instance", "engine-c", "--block-size", "16", "--algorithm", "sha256", "--seed", "0")
	if code != 0 || !strings.Contains(out, "engine-c") {
		t.Fatalf("register: %d %q %q", code, out, errOut)
	}
	// A file registration in the HTTP field names (a second rank).
	svcFile := filepath.Join(t.TempDir(), "svc.json")
	pub2, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub2.Close()
	raw, _ := json.Marshal(map[string]any{"endpoint": pub2.Endpoint(), "type": "vLLM", "modelname": "m",
		"instance_id": "engine-c", "block_size": 16, "dp_rank": 1,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "0", "index_projection": "low64_be"}})
	os.WriteFile(svcFile, raw, 0o600)
	if code, out, errOut := ctl(t, "--addr", addr, "register", "--file", svcFile); code != 0 {
		t.Fatalf("register --file: %d %q %q", code, out, errOut)
	}

	code, out, _ = ctl(t, "--addr", addr, "--json", "services")
	var svcs map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &svcs) != nil || svcs["count"].(float64) != 2 {
		t.Fatalf("services --json: %d %q", code, out)
	}
	if code, out, _ = ctl(t, "--addr", addr, "services"); code != 0 || strings.Count(out, "engine-c") != 2 {
		t.Errorf("services table: %d %q", code, out)
	}

	// Publish rank 0 events so a query hits.
	tokens := make([]int32, 48)
	strs := make([]string, len(tokens))
	for i := range tokens {
		tokens[i] = int32(500 + i)
		strs[i] = strconv.Itoa(int(tokens[i]))
	}
	p, _ := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	var ch hashing.Chain
	ch.Reset(&p, 16, "", "", tokens)
	var hs []any
	for i := 0; i < 2; i++ {
		k, _ := ch.Next()
		hs = append(hs, k)
	}
	if err := pub.WaitSubscribers(1, time.Minute); err != nil {
		t.Fatal(err)
	}
	ev := msgp.AppendMapHeader(nil, 8)
	for _, kv := range [][2]any{{"type", "BlockStored"}, {"block_hashes", hs}, {"parent_block_hash", nil}, {"token_ids", nil},
		{"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil}} {
		ev = msgp.AppendString(ev, kv[0].(string))
		ev, _ = msgp.AppendIntf(ev, kv[1])
	}
	batch := msgp.AppendArrayHeader(nil, 3)
	batch = msgp.AppendFloat64(batch, 1.5)
	batch = msgp.AppendArrayHeader(batch, 1)
	batch = msgp.AppendInt(append(batch, ev...), 0)
	if _, err := pub.Publish(batch); err != nil {
		t.Fatal(err)
	}
	tokList := strings.Join(strs, ",")
	var q map[string]any
	// The conductor applies the batch on its own time: ask until the query hits. The
	// sleep only paces the asking, and the deadline only ends a run that would hang.
	for deadline := time.Now().Add(30 * time.Second); ; {
		code, out, _ = ctl(t, "--addr", addr, "--json", "query", "--model", "m", "--block-size", "16", "--tokens", tokList)
		if code == 0 && json.Unmarshal([]byte(out), &q) == nil {
			if inst, ok := q["instances"].(map[string]any)["engine-c"].(map[string]any); ok && inst["device"].(float64) == 32 {
				if dp := inst["dp"].(map[string]any); dp["0"].(float64) != 32 || dp["1"].(float64) != 0 {
					t.Errorf("dp = %v", dp)
				}
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("query never hit: %d %q", code, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Tokens from a file and from stdin (binary encoding), human table output.
	tokFile := filepath.Join(t.TempDir(), "tokens.json")
	os.WriteFile(tokFile, []byte("["+tokList+"]"), 0o600)
	if code, out, _ = ctl(t, "--addr", addr, "query", "--model", "m", "--block-size", "16", "--tokens-file", tokFile, "--binary"); code != 0 || !strings.Contains(out, "32") {
		t.Errorf("query --tokens-file table: %d %q", code, out)
	}
	if code, out, _ = ctl(t, "--addr", addr, "--json", "view"); code != 0 || !strings.Contains(out, `"prefix_count": 2`) {
		t.Errorf("view: %d %q", code, out)
	}
	if code, out, _ = ctl(t, "--addr", addr, "watch", "--count", "1", "--interval", "10ms", "--model", "m", "--block-size", "16", "--tokens-file", tokFile); code != 0 || !strings.Contains(out, "engine-c") {
		t.Errorf("watch: %d %q", code, out)
	}
	// Server errors come back with their reason: a conflicting profile for the context.
	code, _, errOut = ctl(t, "--addr", addr, "register", "--endpoint", "tcp://127.0.0.1:1", "--type", "vLLM",
		"--model", "m", "--instance", "engine-x", "--block-size", "16", "--algorithm", "sha256_cbor", "--seed", "0")
	if code != 1 || !strings.Contains(errOut, "invalid_registration") {
		t.Errorf("conflicting register: %d %q", code, errOut)
	}
	if code, _, errOut = ctl(t, "--addr", addr, "unregister", "--instance", "engine-c", "--dp-rank", "1"); code != 0 {
		t.Errorf("unregister: %d %q", code, errOut)
	}
	code, _, errOut = ctl(t, "--addr", addr, "unregister", "--instance", "engine-c", "--dp-rank", "1")
	if code != 1 || !strings.Contains(errOut, "not found") {
		t.Errorf("second unregister: %d %q", code, errOut)
	}

	// snapshot save, then unregister and register rank 0 again (its blocks are retracted),
	// then snapshot load: the query hits again.
	snap := filepath.Join(t.TempDir(), "index.snap")
	if code, _, errOut = ctl(t, "--addr", addr, "snapshot", "save", "--file", snap); code != 0 || !strings.Contains(errOut, "1 contexts, 2 block entries") {
		t.Fatalf("snapshot save: %d %q", code, errOut)
	}
	if code, _, errOut = ctl(t, "--addr", addr, "unregister", "--instance", "engine-c", "--dp-rank", "0"); code != 0 {
		t.Fatalf("unregister rank 0: %d %q", code, errOut)
	}
	if code, _, errOut = ctl(t, "--addr", addr, "register", "--endpoint", pub.Endpoint(), "--type", "vLLM",
		"--model", "m", "--instance", "engine-c", "--block-size", "16", "--algorithm", "sha256", "--seed", "0"); code != 0 {
		t.Fatalf("register again: %d %q", code, errOut)
	}
	device := func() float64 {
		_, out, _ := ctl(t, "--addr", addr, "--json", "query", "--model", "m", "--block-size", "16", "--tokens", tokList)
		var q map[string]any
		if json.Unmarshal([]byte(out), &q) != nil {
			t.Fatalf("query: %q", out)
		}
		return q["instances"].(map[string]any)["engine-c"].(map[string]any)["device"].(float64)
	}
	if d := device(); d != 0 {
		t.Fatalf("before load device = %v", d)
	}
	bad := filepath.Join(t.TempDir(), "bad.snap")
	raw, _ = os.ReadFile(snap)
	raw[len(raw)-40] ^= 1 // in the end frame: the checksum fails (the signature is the conductor's to check)
	os.WriteFile(bad, raw, 0o600)
	if code, _, errOut = ctl(t, "--addr", addr, "snapshot", "load", "--file", bad); code != 2 || !strings.Contains(errOut, "checksum") {
		t.Fatalf("damaged load: %d %q", code, errOut)
	}
	// Without --json, a table; with it, the conductor's answer as JSON.
	if code, out, errOut = ctl(t, "--addr", addr, "snapshot", "load", "--file", snap); code != 0 ||
		!hasRow(tableRows(out), "status", "loaded") || !hasRow(tableRows(out), "applied", "2") ||
		!hasRow(tableRows(out), "contexts", "1") || strings.Contains(out, "{") {
		t.Fatalf("snapshot load: %d %q %q", code, out, errOut)
	}
	if d := device(); d != 32 {
		t.Fatalf("after load device = %v, want 32", d)
	}
	// A second load into an index that holds data is refused unless it replaces it.
	if code, _, errOut = ctl(t, "--addr", addr, "snapshot", "load", "--file", snap); code == 0 || !strings.Contains(errOut, "409") {
		t.Fatalf("second load without --replace: %d %q", code, errOut)
	}
	code, out, errOut = ctl(t, "--addr", addr, "--json", "snapshot", "load", "--replace", "--file", snap)
	if got, _ := jsonOf(t, out).(map[string]any); code != 0 || got["applied"] != 2.0 || got["entries"] != 2.0 || got["skipped"] != 0.0 {
		t.Fatalf("snapshot load --json: %d %q %q", code, out, errOut)
	}
}
