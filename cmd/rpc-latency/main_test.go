package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func smallConfig() Config {
	return Config{Instances: 3, BlockSize: 16, Prompts: []int{64, 256}, N: 20, Warmup: 2, Model: "latency-test"}
}

// TestSetupReachesFullHitAndMeasures: the bench index holds every prompt on every
// instance (checked over RPC and HTTP by Setup), and each protocol's series is sane.
func TestSetupReachesFullHitAndMeasures(t *testing.T) {
	b, err := Setup(smallConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, size := range []int{64, 256} {
		if err := b.CheckFullHit(size); err != nil {
			t.Fatalf("%d tokens: %v", size, err)
		}
		for name, measure := range map[string]func(int, int, int) (Stats, error){"rpc": b.MeasureRPC, "http": b.MeasureHTTP} {
			st, err := measure(size, 20, 2)
			if err != nil {
				t.Fatalf("%s %d: %v", name, size, err)
			}
			if st.N != 20 || st.P50 <= 0 || st.P99 < st.P50 || st.Mean <= 0 {
				t.Errorf("%s %d: stats %+v", name, size, st)
			}
		}
	}
	// The prompts are distinct chains: a prefix of the longer one is not the shorter one.
	if b.start[64] == b.start[256] {
		t.Error("prompts share their first token")
	}
}

// TestSetupAgainstRunningConductor: -rpc/-http mode registers into an existing
// conductor and removes its registrations on Close.
func TestSetupAgainstRunningConductor(t *testing.T) {
	host, err := Setup(Config{Instances: 1, BlockSize: 16, Prompts: []int{16}, Model: "host"})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	cfg := smallConfig()
	cfg.RPCAddr, cfg.HTTPAddr = host.RPCAddr, host.HTTPAddr
	b, err := Setup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(host.app.Service.Services()); n != 1+cfg.Instances {
		t.Errorf("%d services registered, want %d", n, 1+cfg.Instances)
	}
	b.Close()
	if n := len(host.app.Service.Services()); n != 1 {
		t.Errorf("%d services after Close, want 1", n)
	}
}

func TestMeasurePython(t *testing.T) {
	python, _ := filepath.Abs("../../.venv/bin/python")
	if _, err := os.Stat(python); err != nil {
		t.Skip("no project venv: ", err)
	}
	cfg := smallConfig()
	cfg.Prompts = []int{64}
	b, err := Setup(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, err := b.MeasurePython(python, 64, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if st.N != 10 || st.P50 <= 0 || st.P99 < st.P50 {
		t.Errorf("stats %+v", st)
	}
}

func TestRunPrintsTable(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"-instances", "2", "-prompts", "32", "-n", "5", "-warmup", "1"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[2], "Go rpcclient (RPC)") || !strings.Contains(lines[3], "Go fasthttp (HTTP)") ||
		!strings.HasPrefix(lines[2], "32 ") {
		t.Errorf("output:\n%s", out.String())
	}
	for _, bad := range [][]string{{"-prompts", "30"}, {"-prompts", "x"}, {"-rpc", "127.0.0.1:1"}} {
		if err := run(bad, &out); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestSummarise(t *testing.T) {
	d := make([]time.Duration, 0, 100)
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i))
	}
	// Sorted 1..100: the median is element 50, p99 element 99, the mean 5050/100.
	if st := summarise(d); st != (Stats{N: 100, P50: 51, P99: 100, Mean: 50}) {
		t.Errorf("%+v", st)
	}
}
