package burst

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

func inProcess(t *testing.T) *target.Conductor {
	t.Helper()
	c := target.StartInProcess(t)
	return c
}

// TestBurstFlatOut: a small flat-out burst is indexed block for block, in the batches its
// shape implies, with every figure measured.
func TestBurstFlatOut(t *testing.T) {
	c := inProcess(t)
	var log strings.Builder
	res, err := Run(context.Background(), Config{Addr: c.Addr, PID: c.PID, Publishers: 4, Blocks: 4096,
		BlocksPerEvent: 64, PromptBlocks: 256, Warmup: -1, Progress: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if res.IndexedBlocks != 4096 || !res.Lossless() || !res.MetricsRead {
		t.Fatalf("result %+v", res)
	}
	// 16 prompts of 256 blocks, 4 events of 64 each, one event per batch.
	if res.Batches != 64 || res.PayloadBytes <= 0 || res.PacedRate != 0 {
		t.Fatalf("batches %d, payload %d bytes, paced %v", res.Batches, res.PayloadBytes, res.PacedRate)
	}
	for name, v := range map[string]float64{"seconds": res.Seconds, "blocks/s": res.BlocksPerSec, "send s": res.SendSeconds,
		"send blocks/s": res.SendBlocksPerSec, "cpu": res.CPUSeconds, "cpu/block": res.CPUPerBlockUS, "cores": res.CPUCores,
		"rss before": float64(res.RSSBeforeBytes), "rss peak": float64(res.RSSPeakBytes), "rss settled": float64(res.RSSSettledBytes),
		"rss/block": res.RSSPerBlock, "harness cpu": res.HarnessCPUSeconds} {
		if v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	if res.RSSPeakBytes < res.RSSSettledBytes || res.RSSPeakBytes < res.RSSBeforeBytes || res.PeakSinceStart {
		t.Errorf("peak %d, before %d, settled %d (since start %v)", res.RSSPeakBytes, res.RSSBeforeBytes, res.RSSSettledBytes, res.PeakSinceStart)
	}
	if !strings.Contains(log.String(), "applied 4096 blocks") {
		t.Errorf("progress:\n%s", log.String())
	}
}

// TestBurstPacedUneven: a paced burst whose blocks do not divide into whole prompts,
// events or batches still publishes exactly the blocks asked for; without a pid it has no
// process figures.
func TestBurstPacedUneven(t *testing.T) {
	c := inProcess(t)
	res, err := Run(context.Background(), Config{Addr: c.Addr, Publishers: 3, Blocks: 3001, BlocksPerEvent: 64,
		EventsPerBatch: 2, PromptBlocks: 100, Rate: 200_000, Warmup: 10 * time.Millisecond, Settle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// 31 prompts (30 of 100 blocks, one of 1) on 3 publishers: 11, 10, 10 prompts of two
	// events each (64 + 36) but the last prompt (one event): 21, 20, 20 events; 2 per
	// batch: 11 + 10 + 10 batches.
	if res.IndexedBlocks != 3001 || !res.Lossless() || res.Batches != 31 || res.PacedRate != 200_000 || res.WarmupSeconds != 0.01 {
		t.Fatalf("result %+v", res)
	}
	if res.CPUSeconds != 0 || res.RSSSettledBytes != 0 || res.RSSGrowthPerBlock != 0 {
		t.Fatalf("process figures without a pid: %+v", res)
	}
}

// TestBurstRefusals: engines the burst does not simulate and negative rates are refused.
func TestBurstRefusals(t *testing.T) {
	if _, err := Run(context.Background(), Config{Addr: "127.0.0.1:1", Hash: sim.SGLangHash()}); err == nil {
		t.Fatal("SGLang profile accepted")
	}
	if _, err := Run(context.Background(), Config{Addr: "127.0.0.1:1", Rate: -1}); err == nil {
		t.Fatal("negative rate accepted")
	}
}

// TestDrainGivesUpOnStale: once the conductor's /metrics shows a stale source, the drain
// ends with errStale instead of waiting for a marker that will never be applied.
func TestDrainGivesUpOnStale(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprintln(w, `conductor_service_stale{service="burst-0|default|0",type="vLLM"} 1`)
		case "/query":
			// {"instances": {}}: the marker is nowhere (yet).
			b := msgp.AppendMapHeader(nil, 1)
			b = msgp.AppendString(b, "instances")
			_, _ = w.Write(msgp.AppendMapHeader(b, 0))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	cl, err := httpclient.New(addr, httpclient.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	f, err := sim.NewFleet(sim.FleetConfig{Instances: 1, DPRanks: 1, Kind: publisher.VLLM, Hash: sim.VLLMHash("sha256", "0"),
		Model: "burst", BlockSize: 16, Cache: sim.CacheConfig{Device: 1}, Publish: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := drain(context.Background(), f, cl, addr); !errors.Is(err, errStale) {
		t.Fatalf("drain: %v, want errStale", err)
	}
}
