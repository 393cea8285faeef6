package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/conductor-go/conductor/bench/floor"
	"github.com/conductor-go/conductor/bench/target"
)

// TestMain serves "floor-server" and "keep-awake" when load --floor or --keep-awake runs
// this test binary as conductor-bench (os.Executable), as the real binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == floor.Command || os.Args[1] == target.AwakeCommand) {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the conductor binary the tests spawn, built once per test process.
var built struct {
	once      sync.Once
	dir, path string
	err       error
	out       []byte
}

// conductorBinary builds ../mooncake_conductor (once) and returns its path.
func conductorBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "conductor-bench-test-"); built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "mooncake_conductor")
		built.out, built.err = exec.Command("go", "build", "-o", built.path, "../mooncake_conductor").CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("build conductor: %v\n%s", built.err, built.out)
	}
	return built.path
}

// TestReplayCommand: a tiny replay against the in-process conductor prints both tables
// and writes a JSON result whose conductor answers were verified.
func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errOut strings.Builder
	code := run([]string{"replay", "--trace", "synthetic:60", "--instances", "3", "--dp-ranks", "2",
		"--block-size", "32", "--device-tokens", "4096", "--verify-every", "20", "--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"routing", "conductor", "round-robin", "upper bound", "query latency", "0 mismatches", "results: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "replay-*.json"))
	if len(files) != 1 {
		t.Fatalf("result files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Mode   string `json:"conductor_mode"`
		Result struct {
			Requests  int `json:"requests"`
			Policies  []struct{ Policy string }
			Conductor struct {
				Checks     int `json:"checks"`
				Mismatches int `json:"mismatches"`
			}
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Mode != "in-process" || doc.Result.Requests != 60 || len(doc.Result.Policies) != 4 || doc.Result.Conductor.Checks == 0 {
		t.Fatalf("json %+v", doc)
	}
}

// TestLoadCommand: a tiny load grid runs and reports every cell.
func TestLoadCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errOut strings.Builder
	code := run([]string{"load", "--instances", "2", "--blocks", "500", "--prompt-tokens", "512", "--shapes", "hit,miss",
		"--concurrency", "1", "--duration", "20ms", "--binary-tokens", "--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "binary tokens") || strings.Count(out.String(), "\n512 ") != 2 {
		t.Fatalf("output:\n%s", out.String())
	}
	out.Reset()
	code = run([]string{"load", "--instances", "2", "--blocks", "500", "--prompt-tokens", "512", "--shapes", "hit,miss",
		"--concurrency", "1", "--duration", "20ms", "--binary-tokens", "--by-hash", "--results", dir}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "/query_by_hash load") || !strings.Contains(out.String(), "binary block keys") ||
		strings.Count(out.String(), "\n512 ") != 2 {
		t.Fatalf("--by-hash exit %d, output:\n%s\n%s", code, out.String(), errOut.String())
	}
	out.Reset()
	code = run([]string{"load", "--instances", "2", "--blocks", "500", "--grow-to", "3000", "--prompt-tokens", "512", "--shapes", "hit",
		"--concurrency", "1", "--duration", "20ms", "--results", dir}, &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "while the index grows 512 -> 3008 blocks") ||
		!strings.Contains(out.String(), "\nidle ") || !strings.Contains(out.String(), "\ngrowing ") {
		t.Fatalf("--grow-to exit %d, output:\n%s\n%s", code, out.String(), errOut.String())
	}
}

// TestUsageErrors: bad invocations fail with a message, not a panic.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nope"},
		{"replay"},
		{"replay", "--trace", "synthetic:x"},
		{"replay", "--trace", "synthetic:5", "--policies", "best"},
		{"load", "--shapes", "full"},
		{"load", "--concurrency", "0"},
		{"load", "--blocks", "1000", "--grow-to", "500"},
		{"replay", "--trace", "synthetic:5", "--conductor", "http://x", "--conductor-bin", "y"},
		{"ingest", "--blocks", "0"},
		{"ingest", "--paced", "-1"},
		{"ingest", "--warmup", "-1s"},
		{"ingest", "--hash-algo", "md5"},
		{"ingest", "--config-set", "max_services=10"},
		{"ingest", "--config-set", "novalue"},
		{"ingest", "--alternate", "a"},
		{"ingest", "--alternate", "a,b", "--conductor-bin", "a"},
		{"ingest", "--alternate", "a,b", "--rounds", "0"},
		{"idle", "--window", "0"},
		{"idle", "--dead-endpoints", "-1"},
		{"idle", "--conductor-bin", "/nonexistent/conductor"},
	} {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code == 0 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
	}
}
