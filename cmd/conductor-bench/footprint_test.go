package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readResult decodes the single JSON result named mode in dir into v.
func readResult(t *testing.T, dir, mode string, v any) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, mode+"-*.json"))
	if len(files) != 1 {
		t.Fatalf("result files %v", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}

// ingestDoc is the part of an ingest result the tests check.
type ingestDoc struct {
	Mode   string `json:"conductor_mode"`
	Result struct {
		Blocks         int     `json:"blocks"`
		IndexedBlocks  uint64  `json:"indexed_blocks"`
		Batches        int     `json:"batches"`
		PacedRate      float64 `json:"paced_blocks_per_second"`
		BlocksPerSec   float64 `json:"blocks_per_second"`
		CPUPerBlockUS  float64 `json:"cpu_per_block_us"`
		RSSBefore      uint64  `json:"rss_before_bytes"`
		RSSPeak        uint64  `json:"rss_peak_bytes"`
		RSSSettled     uint64  `json:"rss_settled_bytes"`
		RSSPerBlock    float64 `json:"rss_per_block"`
		HarnessCPU     float64 `json:"harness_cpu_seconds"`
		MetricsRead    bool    `json:"metrics_read"`
		Gaps           uint64  `json:"sequence_gaps"`
		ReplaysFailed  uint64  `json:"replays_failed"`
		Stale          uint64  `json:"stale_sources"`
		EventsPerBatch int     `json:"events_per_batch"`
	} `json:"result"`
}

func (d *ingestDoc) check(t *testing.T, mode string, blocks int) {
	t.Helper()
	r := &d.Result
	if d.Mode != mode || r.Blocks != blocks || r.IndexedBlocks != uint64(blocks) || !r.MetricsRead || r.Gaps != 0 ||
		r.ReplaysFailed != 0 || r.Stale != 0 {
		t.Fatalf("%s run: %+v", mode, d)
	}
	if r.BlocksPerSec <= 0 || r.CPUPerBlockUS <= 0 || r.RSSBefore == 0 || r.RSSPeak < r.RSSBefore || r.RSSSettled == 0 ||
		r.RSSPerBlock <= 0 || r.HarnessCPU <= 0 {
		t.Fatalf("%s run: a figure is missing: %+v", mode, r)
	}
}

// TestIngestCommand: a small flat-out burst into the in-process conductor is indexed
// block for block, and its table and JSON carry every figure.
func TestIngestCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errOut strings.Builder
	code := run([]string{"ingest", "--publishers", "3", "--blocks", "2500", "--prompt-blocks", "200", "--settle", "10ms", "--warmup", "0",
		"--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"3 vLLM publishers flat out, 2500 blocks, 64 blocks/event", "indexed blocks", "2500 (published 2500)",
		"CPU harness+conductor", "RSS growth per block", "gaps / missed / replays ok, failed / duplicates / rejected / stale  0 / 0 / 0, 0 / ",
		"in process: CPU and RSS are the harness's"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	var doc ingestDoc
	readResult(t, dir, "ingest", &doc)
	doc.check(t, "in-process", 2500)
}

// TestFootprintSpawned: ingest (paced, two events a batch) and idle (dead endpoints, a
// configuration override) against a spawned conductor, then idle alternated between two
// binaries with its medians.
func TestFootprintSpawned(t *testing.T) {
	bin := conductorBinary(t)
	dir := t.TempDir()
	var out, errOut strings.Builder
	code := run([]string{"ingest", "--conductor-bin", bin, "--publishers", "2", "--blocks", "3000", "--events-per-batch", "2",
		"--paced", "100000", "--settle", "50ms", "--warmup", "100ms", "--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("ingest exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "paced at 100000 blocks/s") || !strings.Contains(out.String(), "CPU conductor") {
		t.Fatalf("ingest output:\n%s", out.String())
	}
	var doc ingestDoc
	readResult(t, dir, "ingest", &doc)
	doc.check(t, "spawned", 3000)
	// 3000 blocks: 5 prompts of 512 blocks (8 events) and one of 440 (7 events); on 2
	// publishers 8+8+8 and 8+8+7 events, 2 per batch.
	if doc.Result.Batches != 12+12 || doc.Result.EventsPerBatch != 2 || doc.Result.PacedRate != 100000 {
		t.Fatalf("ingest shape: %+v", doc.Result)
	}

	dir = t.TempDir()
	out.Reset()
	code = run([]string{"idle", "--conductor-bin", bin, "--config-set", "query_memo_populate=false", "--dead-endpoints", "10",
		"--wait", "50ms", "--window", "100ms", "--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("idle exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	var idleDoc struct {
		Mode   string         `json:"conductor_mode"`
		Config map[string]any `json:"config"`
		Result struct {
			RSSReady      uint64  `json:"rss_ready_bytes"`
			RSSRegistered uint64  `json:"rss_registered_bytes"`
			RSS           uint64  `json:"rss_bytes"`
			Dead          int     `json:"dead_endpoints"`
			Window        float64 `json:"window_seconds"`
			CPUPercent    float64 `json:"cpu_percent_of_core"`
		} `json:"result"`
	}
	readResult(t, dir, "idle", &idleDoc)
	r := &idleDoc.Result
	if idleDoc.Mode != "spawned" || idleDoc.Config["query_memo_populate"] != false || r.Dead != 10 || r.RSSReady == 0 ||
		r.RSSRegistered == 0 || r.RSS == 0 || r.Window < 0.1 || r.CPUPercent < 0 {
		t.Fatalf("idle: %+v\n%s", idleDoc, out.String())
	}

	dir = t.TempDir()
	out.Reset()
	code = run([]string{"idle", "--alternate", bin + "," + bin, "--rounds", "2", "--wait", "10ms", "--window", "50ms",
		"--results", dir}, &out, &errOut)
	if code != 0 {
		t.Fatalf("idle --alternate exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"round 1 of 2: A", "round 1 of 2: B", "round 2 of 2: B", "round 2 of 2: A",
		"idle: medians of 2 alternated runs per binary", "RSS when ready", "A = " + bin} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if i, j := strings.Index(out.String(), "round 2 of 2: B"), strings.Index(out.String(), "round 2 of 2: A"); i > j {
		t.Errorf("round 2 does not start with B:\n%s", out.String())
	}
	var alt struct {
		Runs []struct {
			Binary  string `json:"binary"`
			Round   int    `json:"round"`
			Figures []struct {
				Name  string  `json:"name"`
				Value float64 `json:"value"`
			} `json:"figures"`
		} `json:"runs"`
		Medians map[string][]struct {
			Name  string  `json:"name"`
			Value float64 `json:"value"`
		} `json:"medians"`
	}
	readResult(t, dir, "idle", &alt)
	if len(alt.Runs) != 4 || len(alt.Medians["a"]) != 3 || len(alt.Medians["b"]) != 3 {
		t.Fatalf("alternation JSON: %+v", alt)
	}
	for _, m := range alt.Medians["a"] {
		if m.Name == "RSS when ready" && m.Value <= 0 {
			t.Fatalf("median RSS %v", m.Value)
		}
	}
}
