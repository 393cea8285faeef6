package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/conductor-go/conductor/bench/floor"
	"github.com/conductor-go/conductor/bench/loadgen"
	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/target"
)

// runLoad measures /query load (bench/loadgen) against the conductor, or alternately
// against two binaries (--alternate: each figure's median per binary).
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := newMeasuredCommand("load", stderr)
	fs := cmd.fs
	var hf hashFlags
	hf.register(fs)
	instances := fs.Int("instances", 8, "engine instances holding the index")
	blocks := fs.Int("blocks", 1_000_000, "distinct blocks to index")
	blockSize := fs.Int("block-size", 16, "tokens per KV block")
	lens := fs.String("prompt-tokens", "2048,8192,32768", "query prompt lengths")
	shapes := fs.String("shapes", "hit,half,miss", "prompt shapes: hit, half, miss")
	conc := fs.String("concurrency", "1,4", "concurrent clients")
	dur := fs.Duration("duration", time.Second, "time per cell")
	binary := fs.Bool("binary-tokens", false, "send token_ids as an int32 bin instead of an array (block_hashes as a uint64 bin with --by-hash)")
	writeBuffer := fs.Int("write-buffer", 0, "the measuring clients' write buffer in bytes (0: httpclient's default, a request of up to 128 KiB in one write; 4096: an 8K prompt in two writes, as before)")
	byHash := fs.Bool("by-hash", false, "send POST /query_by_hash with the prompts' block keys instead of /query")
	mixed := fs.Bool("mixed-widths", false, "token ids whose array encodings mix widths element by element (20% fixint, 50% uint16, 30% uint32; default: uniform under 100000, 65% uint16, 35% uint32)")
	memo := fs.String("memo", "warm", "query key memo modes: warm (prompts repeat), cold (each prompt once), extend (each prompt once, after its first ~91%)")
	coldPrompts := fs.Int("cold-prompts", 64, "prompts per cold or extend cell (each asked once; capped by the indexed prompts)")
	coldWarmup := fs.Int("cold-warmup", 0, "indexed prompts asked once, unmeasured, before the cells and kept out of cold cells: a memo that grows with use then has grown")
	tokenSeed := fs.Uint64("token-seed", 1, "seed of the synthetic prompts")
	growTo := fs.Int("grow-to", 0, "after the grid, measure the first cell idle and again while a publisher grows the index to this many blocks (0 = no growth phase)")
	keepAwake := fs.Bool("keep-awake", false, "while measuring, run one busy thread per CPU at the SCHED_IDLE policy in a process of its own, so that idle CPUs never halt and a VM's wake-ups stay out of the figures (see bench/README.md)")
	withFloor := fs.Bool("floor", false, "after each cell, measure its floor: the server CPU of the same requests answered by a bare server with the conductor's connection layer that only reads them (needs --conductor-bin or --pid)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The floor is compared with the conductor's own CPU time: a spawned conductor, or an
	// external one with its pid (in process the harness's CPU would be counted too).
	if *withFloor && cmd.alt.bins == "" && cmd.cf.bin == "" && (cmd.cf.url == "" || cmd.cf.pid <= 0) {
		return errors.New("--floor needs the conductor's own CPU time: --conductor-bin, or --conductor with --pid")
	}
	if *keepAwake && cmd.alt.bins == "" && cmd.cf.bin == "" && cmd.cf.url == "" {
		return errors.New("--keep-awake needs a conductor outside this process: --conductor-bin, or --conductor")
	}
	if *growTo != 0 && *growTo <= *blocks {
		return fmt.Errorf("--grow-to %d: want more than --blocks %d", *growTo, *blocks)
	}
	_, hs, err := hf.spec()
	if err != nil {
		return err
	}
	L, err := intList(*lens)
	if err != nil {
		return fmt.Errorf("--prompt-tokens %w", err)
	}
	C, err := intList(*conc)
	if err != nil {
		return fmt.Errorf("--concurrency %w", err)
	}
	S, err := parseList(*shapes, loadgen.ParseShape)
	if err != nil {
		return err
	}
	M, err := parseList(*memo, loadgen.ParseMemo)
	if err != nil {
		return err
	}
	base := loadgen.Config{Memo: M, ColdPrompts: *coldPrompts, ColdWarmup: *coldWarmup,
		Instances: *instances, IndexedBlocks: *blocks, BlockSize: *blockSize, Hash: hs,
		PromptTokens: L, Shapes: S, Concurrency: C, Duration: *dur, BinaryTokens: *binary, WriteBufferSize: *writeBuffer, ByHash: *byHash, MixedWidths: *mixed, KeepAwake: *keepAwake, Seed: *tokenSeed,
		Progress: stderr, GrowTo: *growTo,
	}
	measure := func(ctx context.Context, cf *conductorFlags) ([]report.Figure, any, error) {
		cond, err := cf.start(stderr)
		if err != nil {
			return nil, nil, err
		}
		defer cond.Stop()
		if *keepAwake {
			ap, err := spawnAwake(stderr)
			if err != nil {
				return nil, nil, err
			}
			defer ap.Stop()
		}
		cfg := base
		cfg.Addr = cond.Addr
		if s := sampler(cond); s != nil {
			cfg.Sample = loadgen.Sampler(s)
		}
		if *withFloor {
			fp, err := spawnFloor(stderr)
			if err != nil {
				return nil, nil, err
			}
			defer fp.Stop()
			cfg.Floor = &loadgen.Floor{Addr: fp.Addr, Sample: func() (uint64, time.Duration, error) {
				s, err := target.ReadProc(fp.PID)
				return s.RSSBytes, s.CPU, err
			}}
		}
		res, err := loadgen.Run(ctx, cfg)
		if res == nil {
			return nil, nil, err
		}
		printLoad(stdout, res, cond, cfg)
		cells := res.Cells
		if g := res.Growth; g != nil {
			cells = append(cells, g.Idle, g.During)
		}
		for _, c := range cells {
			if c.Wrong > 0 && err == nil {
				err = fmt.Errorf("%d tokens %s x%d: %d answers did not match the indexed prompts", c.PromptTokens, c.Shape, c.Concurrency, c.Wrong)
			}
		}
		return loadFigures(res), map[string]any{"conductor_mode": string(cond.Mode), "binary": cf.bin, "config": cf.config, "result": res}, err
	}
	return cmd.run(ctx, measure, stdout)
}

// spawnAwake starts the --keep-awake process: one busy SCHED_IDLE thread per CPU.
func spawnAwake(stderr io.Writer) (*target.Child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--keep-awake: %w", err)
	}
	return target.SpawnAwake(self, runtime.NumCPU(), stderr)
}

// spawnFloor starts the --floor server (bench/floor) in a process of its own.
func spawnFloor(stderr io.Writer) (*floor.Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--floor: %w", err)
	}
	return floor.Spawn(self, stderr)
}

// loadFigures are a load run's figures compared between binaries: each cell's server CPU
// per query, its floor's, its queries/s and p50, and the index's build.
func loadFigures(r *loadgen.Result) []report.Figure {
	var figs []report.Figure
	for _, c := range r.Cells {
		cell := fmt.Sprintf("%d %s %s x%d", c.PromptTokens, c.Shape, c.Memo, c.Concurrency)
		if c.CPUPerQueryUS > 0 {
			figs = append(figs, report.Figure{Name: cell + " CPU/q", Unit: "us", Value: c.CPUPerQueryUS})
		}
		if c.FloorCPUPerQueryUS > 0 {
			figs = append(figs, report.Figure{Name: cell + " floor CPU/q", Unit: "us", Value: c.FloorCPUPerQueryUS})
		}
		figs = append(figs,
			report.Figure{Name: cell + " queries/s", Unit: "1/s", Value: c.QPS},
			report.Figure{Name: cell + " p50", Unit: "us", Value: c.Latency.P50US})
	}
	if r.PopulateCPUPerBlockUS > 0 {
		figs = append(figs, report.Figure{Name: "CPU per block indexed", Unit: "us", Value: r.PopulateCPUPerBlockUS})
	}
	if r.RSSBytes > 0 {
		figs = append(figs, report.Figure{Name: "RSS after indexing", Unit: "MiB", Value: mib(r.RSSBytes)})
	}
	return figs
}

// writeBufferNote names a client write buffer other than httpclient's default.
func writeBufferNote(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(", client write buffer %d bytes", n)
}

// printLoad prints a load run's cells (and its growth phase) as tables.
func printLoad(stdout io.Writer, res *loadgen.Result, cond *target.Conductor, cfg loadgen.Config) {
	cpuWhat := "server CPU/q"
	if cond.Mode == target.ModeInProcess {
		cpuWhat = "process CPU/q"
	}
	t := report.Table{
		Title: fmt.Sprintf("%s load (%s conductor): %d instances, %d indexed blocks, block %d, %s %s%s%s",
			map[bool]string{true: "/query_by_hash", false: "/query"}[res.ByHash], cond.Mode, res.Instances, res.IndexedBlocks, res.BlockSize,
			map[bool]string{true: "binary", false: "array"}[res.BinaryTokens], map[bool]string{true: "block keys", false: "tokens"}[res.ByHash],
			map[bool]string{true: ", CPUs kept awake", false: ""}[cfg.KeepAwake], writeBufferNote(cfg.WriteBufferSize)),
		Header: []string{"tokens", "shape", "memo", "clients", "queries", "queries/s", "p50 us", "p99 us", cpuWhat + " us", "req bytes", "wrong"},
	}
	if cfg.Floor != nil {
		t.Header = append(t.Header, "floor CPU/q us", "above floor us")
	}
	for _, c := range res.Cells {
		cpu := "-"
		if c.CPUPerQueryUS > 0 {
			cpu = fmt.Sprintf("%.1f", c.CPUPerQueryUS)
		}
		row := []any{c.PromptTokens, c.Shape, c.Memo, c.Concurrency, c.Queries, fmt.Sprintf("%.0f", c.QPS), fmt.Sprintf("%.1f", c.Latency.P50US),
			fmt.Sprintf("%.1f", c.Latency.P99US), cpu, fmt.Sprintf("%.0f", c.RequestBytes), c.Wrong}
		if cfg.Floor != nil {
			row = append(row, fmt.Sprintf("%.1f", c.FloorCPUPerQueryUS), fmt.Sprintf("%.1f", c.CPUPerQueryUS-c.FloorCPUPerQueryUS))
		}
		t.Add(row...)
	}
	if cfg.Floor != nil {
		t.Notes = append(t.Notes, "floor: the same requests, clients and duration answered (with the conductor's answer) by a bare fasthttp server on the conductor's connection layer that only reads them (bench/floor), right after each cell")
	}
	t.Notes = append(t.Notes, fmt.Sprintf("index built in %.1fs (%.0f blocks/s applied)", res.PopulateSeconds, res.PopulateBlocksSec))
	if res.PopulateCPUPerBlockUS > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("conductor CPU while indexing: %.3f us per block", res.PopulateCPUPerBlockUS))
	}
	if res.RSSBytes > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("RSS after indexing: %.1f MiB (start %.1f MiB, %.0f bytes per indexed block)",
			float64(res.RSSBytes)/(1<<20), float64(res.RSSStartBytes)/(1<<20), res.BytesPerBlock))
	}
	fmt.Fprintln(stdout)
	_ = t.Fprint(stdout)
	g := res.Growth
	if g == nil {
		return
	}
	gt := report.Table{
		Title: fmt.Sprintf("\nQuery latency while the index grows %d -> %d blocks (%.1f s, %.0f blocks/s applied)",
			g.FromBlocks, g.ToBlocks, g.Seconds, g.BlocksPerSec),
		Header: []string{"phase", "tokens", "shape", "clients", "queries", "queries/s", "p50 us", "p99 us", "p999 us", "max us", "wrong"},
	}
	for _, r := range []struct {
		name string
		c    *loadgen.Cell
	}{{"idle", &g.Idle}, {"growing", &g.During}} {
		gt.Add(r.name, r.c.PromptTokens, r.c.Shape, r.c.Concurrency, r.c.Queries, fmt.Sprintf("%.0f", r.c.QPS),
			fmt.Sprintf("%.1f", r.c.Latency.P50US), fmt.Sprintf("%.1f", r.c.Latency.P99US),
			fmt.Sprintf("%.1f", r.c.Latency.P999US), fmt.Sprintf("%.1f", r.c.Latency.MaxUS), r.c.Wrong)
	}
	if g.RSSBytes > 0 {
		gt.Notes = append(gt.Notes, fmt.Sprintf("RSS after growth: %.1f MiB", float64(g.RSSBytes)/(1<<20)))
	}
	_ = gt.Fprint(stdout)
}
