package target

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/internal/syncbuf"
	"golang.org/x/sys/unix"
)

// TestReadProc: the harness reads its own RSS and a CPU time that grows with work.
func TestReadProc(t *testing.T) {
	s0, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s0.RSSBytes < 1<<20 {
		t.Fatalf("RSS %d bytes is implausibly small", s0.RSSBytes)
	}
	x := 0
	for start := time.Now(); time.Since(start) < 60*time.Millisecond; {
		x++
	}
	s1, err := ReadProc(os.Getpid())
	if err != nil || s1.CPU <= s0.CPU {
		t.Fatalf("cpu %v -> %v (%v), spun %d", s0.CPU, s1.CPU, err, x)
	}
	if _, err := ReadProc(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}

// TestInProcessAndExternal: an in-process conductor answers, samples the harness
// process, and an External handle to it talks to the same server.
func TestInProcessAndExternal(t *testing.T) {
	c := StartInProcess(t)
	if c.Mode != ModeInProcess || c.PID != os.Getpid() {
		t.Fatalf("conductor %+v", c)
	}
	if _, err := c.Sample(); err != nil {
		t.Fatal(err)
	}
	ext, err := External("http://"+c.Addr+"/", 0)
	if err != nil || ext.Addr != c.Addr || ext.Mode != ModeExternal {
		t.Fatalf("external %+v, %v", ext, err)
	}
	if _, err := External("ftp://"+c.Addr, 0); err == nil {
		t.Fatal("External accepted a non-HTTP address")
	}
	if _, err := ext.Sample(); err == nil {
		t.Fatal("sample without pid succeeded")
	}
	cl, err := httpclient.New(ext.Addr, httpclient.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var res httpclient.QueryResult
	if err := cl.Query(&httpclient.QueryRequest{Model: "none", BlockSize: 16, TokenIDs: []int32{1, 2}}, &res); err != nil || len(res.Instances) != 0 {
		t.Fatalf("query on empty conductor: %v, %d instances", err, len(res.Instances))
	}
	ext.Stop() // leaves the server running
	if err := cl.Query(&httpclient.QueryRequest{Model: "none", BlockSize: 16, TokenIDs: []int32{1}}, &res); err != nil {
		t.Fatalf("external Stop stopped the server: %v", err)
	}
}

// TestSpawnFailure: a binary that exits before answering is reported, not waited on.
func TestSpawnFailure(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fake-conductor")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho failing >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Spawn(bin, &syncbuf.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "exited before answering") {
		t.Fatalf("spawn error %v", err)
	}
	if _, err := Spawn(filepath.Join(t.TempDir(), "missing"), nil); err == nil {
		t.Fatal("missing binary spawned")
	}
}

// TestPeakRSS: the peak RSS keeps a touched and unmapped region counted until
// ResetPeakRSS restarts it from the current RSS.
func TestPeakRSS(t *testing.T) {
	const size = 64 << 20
	region, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < size; i += 4096 {
		region[i] = 1
	}
	touched, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(region); err != nil {
		t.Fatal(err)
	}
	before, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The kernel folds its per-thread RSS counters in lazily, so the peak may trail the
	// RSS read while touched by a few pages: it must hold most of the region.
	if before.RSSBytes+size/2 > before.PeakRSSBytes {
		t.Fatalf("after unmapping: RSS %d, peak %d; RSS while touched %d", before.RSSBytes, before.PeakRSSBytes, touched.RSSBytes)
	}
	if err := ResetPeakRSS(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	after, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after.PeakRSSBytes+size/2 > before.PeakRSSBytes || after.PeakRSSBytes < after.RSSBytes {
		t.Fatalf("after reset: RSS %d, peak %d (peak before %d)", after.RSSBytes, after.PeakRSSBytes, before.PeakRSSBytes)
	}
	if err := ResetPeakRSS(-1); err == nil {
		t.Fatal("no error for pid -1")
	}
}

// TestParseMetrics: series keep their labels, Sum adds the samples of a name whose labels
// match, and a value that is not a number is an error.
func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics([]byte(`# HELP conductor_service_replays_total Replay recoveries.
# TYPE conductor_service_replays_total counter
conductor_service_replays_total{service="a b",type="vLLM",result="ok"} 2
conductor_service_replays_total{service="c",type="vLLM",result="ok"} 3
conductor_service_replays_total{service="c",type="vLLM",result="failed"} 1
conductor_service_replays_totalx{result="ok"} 100
conductor_service_stale{service="c",xresult="ok"} 1
conductor_ready 1
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
		found  bool
	}{
		{"conductor_service_replays_total", nil, 6, true},
		{"conductor_service_replays_total", []string{`result="ok"`}, 5, true},
		{"conductor_service_replays_total", []string{`result="failed"`, `service="c"`}, 1, true},
		{"conductor_service_stale", []string{`result="ok"`}, 0, false},
		{"conductor_ready", nil, 1, true},
		{"conductor_absent", nil, 0, false},
	} {
		if got, found := m.Sum(c.name, c.labels...); got != c.want || found != c.found {
			t.Errorf("Sum(%s, %v) = %v, %v; want %v, %v", c.name, c.labels, got, found, c.want, c.found)
		}
	}
	for _, bad := range []string{"conductor_ready one\n", "conductor_ready\n"} {
		if _, err := ParseMetrics([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
