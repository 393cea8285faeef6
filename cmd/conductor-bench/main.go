// Command conductor-bench drives the conductor with simulated engines:
//
//	conductor-bench replay --trace bench/testdata/conversation_trace_2000.jsonl --instances 16
//	conductor-bench load --instances 8 --blocks 1000000 --prompt-tokens 2048,8192,32768
//	conductor-bench ingest --conductor-bin bin/mooncake_conductor --blocks 1000000
//	conductor-bench idle --conductor-bin bin/mooncake_conductor --dead-endpoints 100
//	conductor-bench snapshot-upload --conductor-bin bin/mooncake_conductor --bytes 1073741824
//	conductor-bench replicas-race --conductor-bin bin/mooncake_conductor --runs 100
//
// replay routes a Mooncake trace through the conductor and compares the prefix-cache hit
// rate with oracle, random and round-robin routing of the same fleet; load measures
// /query latency and throughput at fixed concurrency and prompt shape; ingest measures a
// burst of KV events and idle a conductor with nothing to do (both can alternate two
// binaries and print medians); snapshot-upload, snapshot-downloads, replicas-race and
// etcd-reset put the snapshot routes and replica clusters (on a real etcd) through the
// scenes of issue 27. They print tables and write JSON under bench/results/.
// See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/conductor-go/conductor/bench/floor"
	"github.com/conductor-go/conductor/bench/replay"
	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: conductor-bench <command> [flags]

commands:
  replay   replay a request trace through the conductor and compare routing policies
  load     measure /query latency and throughput at fixed concurrency and prompt shape
  services measure descriptors and OS threads per registered service (register, unregister)
  bigmsg   measure RSS around one outsized ZMQ message from a registered publisher
  logflood measure the log a spawned conductor writes for a flood of malformed batches
  ingest   measure a burst of KV events from N publishers: blocks/s applied, CPU and RSS per block
  idle     measure a ready conductor's RSS and its idle CPU (optionally with dead endpoints)
  snapshot-upload
           measure RSS while a conductor receives K large snapshot POSTs (it must refuse
           or stream them in bounded memory)
  snapshot-downloads
           start K snapshot GETs at once while an engine churns the index: each must
           deliver a snapshot that verifies or fail visibly
  replicas-race
           race registrations for the last max_services slots across replicas on a
           real etcd, R times
  etcd-reset
           restore etcd empty under running replicas: the registry must heal and every
           replica agree with it
  floor-server
           serve the load command's floor server (load --floor starts it)
  keep-awake [N]
           spin N threads (default: one per CPU) at SCHED_IDLE until stopped (load
           --keep-awake starts it)

Run "conductor-bench <command> -h" for the flags of a command.
`

// command runs one measuring command with its arguments (after the command name).
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// commands are the measuring commands by name; run handles the helper processes'
// commands (floor-server, keep-awake) and help itself.
var commands = map[string]command{
	"replay":             runReplay,
	"load":               runLoad,
	"services":           runServices,
	"bigmsg":             runBigMessage,
	"logflood":           runLogFlood,
	"ingest":             runIngest,
	"idle":               runIdle,
	"snapshot-upload":    runSnapshotUpload,
	"snapshot-downloads": runSnapshotDownloads,
	"replicas-race":      runReplicasRace,
	"etcd-reset":         runEtcdReset,
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, ok := commands[args[0]]; {
	case ok:
		err = cmd(ctx, args[1:], stdout, stderr)
	case args[0] == floor.Command:
		err = floor.Run(ctx, stdout)
	case args[0] == target.AwakeCommand:
		n := 0
		if len(args) > 1 {
			n, err = strconv.Atoi(args[1])
		}
		if err == nil {
			err = target.RunAwake(ctx, n, stdout)
		}
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "unknown command %q\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "conductor-bench %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// conductorFlags select the conductor under test (shared by every command).
type conductorFlags struct {
	url, bin string
	pid      int
	verbose  bool
	config   configSet
}

// configSet collects repeated --config-set key=value flags.
type configSet map[string]any

func (c *configSet) String() string { return fmt.Sprint(map[string]any(*c)) }

func (c *configSet) Set(kv string) error {
	k, v, err := target.ParseConfigSet(kv)
	if err != nil {
		return err
	}
	if *c == nil {
		*c = configSet{}
	}
	(*c)[k] = v
	return nil
}

func (c *conductorFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "conductor", "", "URL of a running conductor (e.g. http://127.0.0.1:13333); default: start one in-process")
	fs.StringVar(&c.bin, "conductor-bin", "", "spawn this mooncake_conductor binary on free ports (clean RSS and CPU figures)")
	fs.IntVar(&c.pid, "pid", 0, "pid of the --conductor process, to read its RSS and CPU time from /proc")
	fs.BoolVar(&c.verbose, "v", false, "log the in-process conductor at info level")
	fs.Var(&c.config, "config-set", "key=value: set a configuration key of the spawned conductor (value as JSON, else a string; repeatable; needs --conductor-bin)")
}

func (c *conductorFlags) start(stderr io.Writer) (*target.Conductor, error) {
	switch {
	case c.url != "" && c.bin != "":
		return nil, errors.New("--conductor and --conductor-bin are exclusive")
	case len(c.config) > 0 && c.bin == "":
		return nil, errors.New("--config-set configures a spawned conductor: it needs --conductor-bin")
	case c.url != "":
		return target.External(c.url, c.pid)
	case c.bin != "":
		return target.SpawnWith(c.bin, stderr, target.SpawnOptions{Config: c.config})
	}
	level := slog.LevelWarn
	if c.verbose {
		level = slog.LevelInfo
	}
	return target.InProcess(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
}

// newFlagSet is the flag set of a command, with the conductor's flags registered on cf;
// the command adds its own before Parse.
func newFlagSet(name string, cf *conductorFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cf.register(fs)
	return fs
}

// startSampled starts the conductor cf selects for a command (name) that samples its
// process, which must then be known: spawned, or external with --pid.
func (c *conductorFlags) startSampled(name string, stderr io.Writer) (*target.Conductor, error) {
	cond, err := c.start(stderr)
	if err != nil {
		return nil, err
	}
	if cond.PID <= 0 {
		cond.Stop()
		return nil, errors.New(name + " needs a process to sample: --conductor-bin, or --conductor with --pid")
	}
	return cond, nil
}

func sampler(c *target.Conductor) func() (uint64, time.Duration, error) {
	if c.PID <= 0 {
		return nil
	}
	return func() (uint64, time.Duration, error) {
		s, err := c.Sample()
		return s.RSSBytes, s.CPU, err
	}
}

// hashFlags select the simulated engines' kind and, for vLLM, hash (replay, load).
type hashFlags struct{ engine, algo, seed string }

func (h *hashFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.engine, "engine", "vllm", "engine kind: vllm or sglang")
	fs.StringVar(&h.algo, "hash-algo", "sha256_cbor", "vLLM prefix-caching hash: sha256 or sha256_cbor")
	fs.StringVar(&h.seed, "python-hash-seed", "0", "vLLM PYTHONHASHSEED")
}

// spec is the engine kind and hash the flags select.
func (h *hashFlags) spec() (publisher.Kind, sim.HashSpec, error) {
	return hashSpec(h.engine, h.algo, h.seed)
}

func hashSpec(engine, algo, seed string) (publisher.Kind, sim.HashSpec, error) {
	kind, err := sim.ParseKind(engine)
	if err != nil {
		return 0, sim.HashSpec{}, err
	}
	if kind == publisher.SGLang {
		return kind, sim.SGLangHash(), nil
	}
	return kind, sim.VLLMHash(algo, seed), nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// parseList parses each item of the comma-separated list s with parse.
func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range splitList(s) {
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func intList(s string) ([]int, error) {
	return parseList(s, func(f string) (int, error) {
		v, err := strconv.Atoi(f)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("%q: want positive integers separated by commas", s)
		}
		return v, nil
	})
}

func runReplay(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cf conductorFlags
	fs := newFlagSet("replay", &cf, stderr)
	var hf hashFlags
	hf.register(fs)
	tracePath := fs.String("trace", "", `trace file (JSON lines), or "synthetic:N" for N generated chat requests`)
	maxReq := fs.Int("max-requests", 0, "replay only the first N requests (0 = all)")
	instances := fs.Int("instances", 16, "engine instances")
	dpRanks := fs.Int("dp-ranks", 1, "data-parallel ranks per instance (each its own cache and publisher)")
	blockSize := fs.Int("block-size", 16, "tokens per KV block")
	style := fs.String("events", "minimal", "vLLM event fields: minimal or current (adds extra_keys, group_idx, kv_cache_spec_kind)")
	devTokens := fs.Int("device-tokens", 1<<20, "device (GPU) KV cache per rank, in tokens")
	cpuTokens := fs.Int("cpu-tokens", 0, "SGLang host-memory tier per rank, in tokens (0 = none)")
	diskTokens := fs.Int("disk-tokens", 0, "SGLang disk tier per rank, in tokens (0 = none; needs --cpu-tokens)")
	policies := fs.String("policies", "conductor,oracle,random,round-robin", "routing policies to compare")
	speed := fs.Float64("speed", 0, "pace relative to trace time (1 = real time); 0 = as fast as possible")
	slack := fs.Int("load-slack", 4, "skip instances serving more than this many requests above the least loaded; -1 = pure longest match")
	prefill := fs.Float64("prefill-tps", 10000, "simulated prefill speed of one rank, tokens/s (load model)")
	decode := fs.Float64("decode-ms", 20, "simulated decode time per output token, ms (load model)")
	binary := fs.Bool("binary-tokens", false, "send token_ids as an int32 bin instead of an array")
	verifyEvery := fs.Int("verify-every", 0, "drain and compare conductor answers with the engines every N requests (0 = at the end only)")
	verifySamples := fs.Int("verify-samples", 32, "prompts compared per verification")
	model := fs.String("model", "bench-model", "model name of the simulated context")
	tokenSeed := fs.Uint64("token-seed", 1, "seed of the synthetic token runs")
	rngSeed := fs.Uint64("seed", 1, "seed of the random policy")
	results := fs.String("results", "bench/results", "directory for the JSON result")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tracePath == "" {
		return errors.New("--trace is required")
	}
	kind, hs, err := hf.spec()
	if err != nil {
		return err
	}
	var evStyle sim.EventStyle
	switch *style {
	case "minimal":
	case "current":
		evStyle = sim.StyleCurrent
	default:
		return fmt.Errorf("--events %q: want minimal or current", *style)
	}
	pols, err := parseList(*policies, replay.ParsePolicy)
	if err != nil {
		return err
	}
	var reqs []replay.Request
	if n, ok := strings.CutPrefix(*tracePath, "synthetic:"); ok {
		count, err := strconv.Atoi(n)
		if err != nil || count <= 0 {
			return fmt.Errorf("--trace %q: want synthetic:N", *tracePath)
		}
		reqs = replay.SyntheticTrace(count, *tokenSeed)
	} else if reqs, err = replay.LoadTraceFile(*tracePath, *maxReq); err != nil {
		return err
	}
	if *maxReq > 0 && len(reqs) > *maxReq {
		reqs = reqs[:*maxReq]
	}
	t0 := time.Now()
	w, err := replay.NewWorkload(reqs, replay.WorkloadConfig{Hash: hs, BlockSize: *blockSize, Seed: *tokenSeed})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "hashed %d requests (%d blocks) in %.1fs\n", w.Len(), w.Blocks(), time.Since(t0).Seconds())
	cfg := replay.Config{
		Workload: w,
		Fleet: sim.FleetConfig{
			Instances: *instances, DPRanks: *dpRanks, Kind: kind, Hash: hs, Model: *model, BlockSize: *blockSize,
			Cache: sim.CacheConfig{Device: *devTokens / *blockSize, CPU: *cpuTokens / *blockSize, Disk: *diskTokens / *blockSize},
			Style: evStyle,
		},
		Policies: pols, Speed: *speed, LoadSlack: *slack, PrefillTPS: *prefill, DecodeMsPerToken: *decode,
		Seed: *rngSeed, BinaryTokens: *binary, VerifyEvery: *verifyEvery, VerifySamples: *verifySamples,
		Progress: stderr,
	}
	var cond *target.Conductor
	for _, p := range pols {
		if p == replay.PolicyConductor {
			if cond, err = cf.start(stderr); err != nil {
				return err
			}
			defer cond.Stop()
			if cfg.Client, err = httpclient.New(cond.Addr, httpclient.Options{Timeout: time.Minute}); err != nil {
				return err
			}
			defer cfg.Client.Close()
			if s := sampler(cond); s != nil {
				cfg.Sample = replay.Sampler(s)
			}
		}
	}
	res, runErr := replay.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	printReplay(stdout, *tracePath, res, cond)
	path, err := report.WriteJSON(*results, "replay", map[string]any{"trace": *tracePath, "conductor_mode": modeOf(cond), "result": res})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "results: %s\n", path)
	return runErr
}

func modeOf(c *target.Conductor) string {
	if c == nil {
		return ""
	}
	return string(c.Mode)
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func printReplay(w io.Writer, trace string, r *replay.Result, cond *target.Conductor) {
	bs := r.BlockSize
	t := report.Table{
		Title: fmt.Sprintf("Replay %s: %d requests, %d prompt tokens; %d x %d %s ranks, block %d, device %d tokens/rank",
			trace, r.Requests, r.PromptTokens, r.Instances, r.DPRanks, r.Engine, bs, r.DeviceBlocks*bs),
		Header: []string{"routing", "hit rate", "device hit", "imbalance", "peak active", "wall s"},
	}
	for _, p := range r.Policies {
		t.Add(p.Policy, pct(p.HitRate), pct(p.DeviceHitRate), fmt.Sprintf("%.2f", p.Imbalance), p.PeakActive, fmt.Sprintf("%.1f", p.WallSeconds))
	}
	t.Notes = append(t.Notes, fmt.Sprintf("upper bound (one engine, unlimited cache): %s; load slack %d; speed %g (0 = as fast as possible)",
		pct(r.InfiniteCacheHitRate), r.LoadSlack, r.Speed))
	fmt.Fprintln(w)
	_ = t.Fprint(w)
	c := r.Conductor
	if c == nil {
		return
	}
	ct := report.Table{Title: fmt.Sprintf("\nConductor (%s, %s)", modeOf(cond), c.Addr), Header: []string{"metric", "value"}, LeftAlign: true}
	ct.Add("queries/s (router loop)", fmt.Sprintf("%.0f", c.QPS))
	ct.Add("query latency p50 / p99 / p999", fmt.Sprintf("%.0f / %.0f / %.0f us", c.Latency.P50US, c.Latency.P99US, c.Latency.P999US))
	ct.Add("events applied/s", fmt.Sprintf("%.0f (%.0f block hashes/s)", c.EventsPerSec, c.BlocksPerSec))
	ct.Add("events published", fmt.Sprintf("%d in %d batches, %.1f MiB", c.Events, c.Batches, float64(c.EventBytes)/(1<<20)))
	ct.Add("drain after last event", fmt.Sprintf("%.3f s", c.DrainSeconds))
	ct.Add("indexed blocks (prefix_count)", fmt.Sprintf("%d (engines hold %d)", c.PrefixCount, c.FleetBlocks))
	if c.RSSEndBytes > 0 {
		what := "conductor"
		if cond != nil && cond.Mode == target.ModeInProcess {
			what = "harness+conductor"
		}
		ct.Add("RSS "+what, fmt.Sprintf("%.1f MiB (start %.1f MiB)", float64(c.RSSEndBytes)/(1<<20), float64(c.RSSStartBytes)/(1<<20)))
		ct.Add("bytes per indexed block", fmt.Sprintf("%.0f (RSS growth / prefix_count)", c.BytesPerBlock))
		ct.Add("CPU time "+what, fmt.Sprintf("%.1f s", c.CPUSeconds))
	}
	if c.MemoHits+c.MemoMisses > 0 {
		ct.Add("key memo hit rate (query blocks)", fmt.Sprintf("%s (%d of %d blocks)", pct(c.MemoHitRate), c.MemoHits, c.MemoHits+c.MemoMisses))
	}
	if c.QueriesHandled > 0 {
		ct.Add("query handling time", fmt.Sprintf("%.2f s, %.1f us per query (%d queries; conductor_query_duration_seconds)",
			c.QueryHandlingSeconds, 1e6*c.QueryHandlingSeconds/float64(c.QueriesHandled), c.QueriesHandled))
	}
	ct.Add("stale answers (events in flight)", fmt.Sprintf("%d (%s)", c.StaleAnswers, pct(c.StaleRate)))
	ct.Add("verified rank answers", fmt.Sprintf("%d checks, %d mismatches", c.Checks, c.Mismatches))
	if c.Replays > 0 {
		ct.Add("replay requests served", c.Replays)
	}
	_ = ct.Fprint(w)
}
