package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/conductor-go/conductor/bench/burst"
	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/target"
)

// runIngest measures a burst of KV events (bench/burst) against the conductor, or
// alternately against two binaries.
func runIngest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("ingest", stderr)
	fs := cmd.fs
	pubs := fs.Int("publishers", 8, "simulated vLLM engines, each a ZMQ publisher with a replay endpoint")
	blocks := fs.Int("blocks", 1_000_000, "distinct blocks to publish")
	perEvent := fs.Int("blocks-per-event", 64, "blocks per BlockStored event")
	perBatch := fs.Int("events-per-batch", 1, "events per published batch (ZMQ message)")
	promptBlocks := fs.Int("prompt-blocks", 512, "blocks per simulated prompt; its events chain by parent_block_hash")
	blockSize := fs.Int("block-size", 16, "tokens per KV block")
	algo := fs.String("hash-algo", "sha256_cbor", "vLLM prefix-caching hash: sha256 or sha256_cbor")
	paced := fs.Float64("paced", 0, "publish at this many blocks/s in all (shared by the publishers); 0 = flat out")
	settle := fs.Duration("settle", 10*time.Second, "read the settled RSS this long after the last block is applied")
	warmup := fs.Duration("warmup", 2*time.Second, "wait this long between registering the publishers and the burst (the conductor's catch-up and join check, 1 s after connecting by default, are then over)")
	seed := fs.Uint64("token-seed", 1, "seed of the synthetic prompts")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for name, v := range map[string]int{"--publishers": *pubs, "--blocks": *blocks, "--blocks-per-event": *perEvent,
		"--events-per-batch": *perBatch, "--prompt-blocks": *promptBlocks, "--block-size": *blockSize} {
		if v <= 0 {
			return fmt.Errorf("%s %d: must be positive", name, v)
		}
	}
	if *paced < 0 || *settle < 0 || *warmup < 0 {
		return fmt.Errorf("--paced %v, --settle %v, --warmup %v: must not be negative", *paced, *settle, *warmup)
	}
	if *warmup == 0 {
		*warmup = -1 // burst.Config: none
	}
	_, hs, err := hashSpec("vllm", *algo, "0")
	if err != nil {
		return err
	}
	if _, err := hs.Resolve(); err != nil {
		return err
	}
	cfg := burst.Config{Publishers: *pubs, Blocks: *blocks, BlocksPerEvent: *perEvent, EventsPerBatch: *perBatch,
		PromptBlocks: *promptBlocks, BlockSize: *blockSize, Hash: hs, Rate: *paced, Warmup: *warmup, Settle: *settle, Seed: *seed, Progress: stderr}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		cond, err := cf.start(stderr)
		if err != nil {
			return nil, nil, err
		}
		defer cond.Stop()
		c := cfg
		c.Addr, c.PID = cond.Addr, cond.PID
		res, err := burst.Run(ctx, c)
		if res == nil {
			return nil, nil, err
		}
		printIngest(stdout, res, cond)
		if err == nil && !res.Lossless() {
			err = fmt.Errorf("the burst was not ingested cleanly: %d of %d blocks indexed, %d gaps, %d replays, %d rejected, %d stale",
				res.IndexedBlocks, res.Blocks, res.Gaps, res.ReplaysOK+res.ReplaysFailed, res.Rejected, res.Stale)
		}
		return ingestFigures(res), map[string]any{"conductor_mode": string(cond.Mode), "binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// ingestFigures are the burst's figures compared between binaries.
func ingestFigures(r *burst.Result) []report.Figure {
	figs := []report.Figure{
		{Name: "blocks applied/s", Unit: "1/s", Value: r.BlocksPerSec},
		{Name: "publishers handed over/s", Unit: "blocks/s", Value: r.SendBlocksPerSec},
		{Name: "harness CPU", Unit: "s", Value: r.HarnessCPUSeconds},
	}
	if r.RSSSettledBytes > 0 {
		figs = append(figs,
			report.Figure{Name: "CPU per block", Unit: "us", Value: r.CPUPerBlockUS},
			report.Figure{Name: "CPU cores while applying", Unit: "cores", Value: r.CPUCores},
			report.Figure{Name: "RSS before", Unit: "MiB", Value: mib(r.RSSBeforeBytes)},
			report.Figure{Name: "RSS peak", Unit: "MiB", Value: mib(r.RSSPeakBytes)},
			report.Figure{Name: "RSS settled", Unit: "MiB", Value: mib(r.RSSSettledBytes)},
			report.Figure{Name: "RSS growth per block", Unit: "B", Value: r.RSSGrowthPerBlock},
			report.Figure{Name: "RSS per block", Unit: "B", Value: r.RSSPerBlock},
			report.Figure{Name: "CPU while settling", Unit: "s", Value: r.SettleCPUSeconds},
		)
	}
	return figs
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// processWhat names the process whose CPU and RSS a run reads.
func processWhat(cond *target.Conductor) string {
	if cond.Mode == target.ModeInProcess {
		return "harness+conductor"
	}
	return "conductor"
}

func printIngest(w io.Writer, r *burst.Result, cond *target.Conductor) {
	pace := "flat out"
	if r.PacedRate > 0 {
		pace = fmt.Sprintf("paced at %.0f blocks/s", r.PacedRate)
	}
	t := report.Table{
		Title: fmt.Sprintf("\nIngest burst (%s conductor): %d vLLM publishers %s, %d blocks, %d blocks/event, %d events/batch, %d-block prompts, block %d, %s",
			cond.Mode, r.Publishers, pace, r.Blocks, r.BlocksPerEvent, r.EventsPerBatch, r.PromptBlocks, r.BlockSize, r.HashAlgorithm),
		Header: []string{"figure", "value"}, LeftAlign: true,
	}
	t.Add("blocks applied/s", fmt.Sprintf("%.0f (%.3f s from the first batch sent to the last block applied)", r.BlocksPerSec, r.Seconds))
	t.Add("publishers handed over/s", fmt.Sprintf("%.0f blocks/s (%.3f s for every batch)", r.SendBlocksPerSec, r.SendSeconds))
	what := processWhat(cond)
	if r.RSSSettledBytes > 0 {
		t.Add("CPU "+what, fmt.Sprintf("%.3f us per block (%.3f s, %.2f cores while applying)", r.CPUPerBlockUS, r.CPUSeconds, r.CPUCores))
		t.Add("RSS before the burst", fmt.Sprintf("%.1f MiB", mib(r.RSSBeforeBytes)))
		since := ""
		if r.PeakSinceStart {
			since = " (since the process started: its peak could not be reset)"
		}
		t.Add("RSS peak", fmt.Sprintf("%.1f MiB%s", mib(r.RSSPeakBytes), since))
		t.Add("RSS settled", fmt.Sprintf("%.1f MiB, %.1f s after the last block applied (CPU meanwhile %.3f s)",
			mib(r.RSSSettledBytes), r.SettleSeconds, r.SettleCPUSeconds))
		t.Add("RSS growth per block", fmt.Sprintf("%.0f B ((settled - before) / blocks)", r.RSSGrowthPerBlock))
		t.Add("RSS per block", fmt.Sprintf("%.0f B (settled / blocks)", r.RSSPerBlock))
	}
	t.Add("harness CPU", fmt.Sprintf("%.3f s over the burst (publishers, their libzmq I/O thread, drain queries)", r.HarnessCPUSeconds))
	t.Add("indexed blocks", fmt.Sprintf("%d (published %d)", r.IndexedBlocks, r.Blocks))
	if r.MetricsRead {
		t.Add("gaps / missed / replays ok, failed / duplicates / rejected / stale",
			fmt.Sprintf("%d / %d / %d, %d / %d / %d / %d", r.Gaps, r.Missed, r.ReplaysOK, r.ReplaysFailed, r.Duplicates, r.Rejected, r.Stale))
		t.Add("catch-ups / join checks", fmt.Sprintf("%d / %d during the burst (after a %.1f s warm-up)", r.CatchUps, r.JoinChecks, r.WarmupSeconds))
	} else {
		t.Add("gaps, replays, stale", "unknown (/metrics not read)")
	}
	t.Add("batches", fmt.Sprintf("%d, %.1f MiB (encoded before the burst in %.1f s)", r.Batches, float64(r.PayloadBytes)/(1<<20), r.EncodeSeconds))
	if cond.Mode == target.ModeInProcess {
		t.Notes = append(t.Notes, "in process: CPU and RSS are the harness's and the conductor's together; use --conductor-bin for the conductor's own")
	}
	fmt.Fprintln(w)
	_ = t.Fprint(w)
}
