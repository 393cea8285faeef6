// Package loadgen measures /query at fixed concurrency and prompt shape: it indexes a
// known set of prompts through a simulated fleet, then sends prompts that fully hit,
// half hit or miss them from N concurrent clients for a fixed time, reporting latency
// percentiles, queries per second and the conductor's CPU time per query.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// Shape is how much of a query prompt is indexed.
type Shape string

// Shapes.
const (
	// ShapeHit: the whole prompt is a prefix of an indexed prompt.
	ShapeHit Shape = "hit"
	// ShapeHalf: the first half is indexed, the rest is new.
	ShapeHalf Shape = "half"
	// ShapeMiss: nothing is indexed.
	ShapeMiss Shape = "miss"
)

// ParseShape accepts a shape name.
func ParseShape(s string) (Shape, error) {
	return parseName("prompt shape", s, "hit, half or miss", ShapeHit, ShapeHalf, ShapeMiss)
}

// parseName returns s as one of names, or an error naming what and, in want, the names.
func parseName[T ~string](what, s, want string, names ...T) (T, error) {
	if slices.Contains(names, T(s)) {
		return T(s), nil
	}
	return "", fmt.Errorf("%s %q: want %s", what, s, want)
}

// Memo is how each measured prompt relates to the conductor's query key memo.
type Memo string

// Memo modes.
const (
	// MemoWarm: each cell cycles through a few prompts, so after the first round every
	// block of a prompt is memoised (a router asking about the same prefix again).
	MemoWarm Memo = "warm"
	// MemoCold: each prompt is asked once, and no prompt of the run shares a prefix with
	// another: every block is hashed (the first query of a prompt).
	MemoCold Memo = "cold"
	// MemoExtend: each prompt is asked once, after a prompt that is its first ~91% was
	// (unmeasured): a conversation turn extending a memoised prefix by 10%.
	MemoExtend Memo = "extend"
)

// ParseMemo accepts a memo mode name.
func ParseMemo(s string) (Memo, error) {
	return parseName("memo mode", s, "warm, cold or extend", MemoWarm, MemoCold, MemoExtend)
}

// Sampler reads the conductor process's RSS and CPU time.
type Sampler func() (rssBytes uint64, cpu time.Duration, err error)

// Floor is a floor server to measure cells against (Config.Floor).
type Floor struct {
	// Addr is its HTTP address; Sample reads its CPU time (required).
	Addr   string
	Sample Sampler
}

// Config configures a load run.
type Config struct {
	// Addr is the conductor's HTTP address.
	Addr string
	// Instances engines (one rank each) hold IndexedBlocks distinct blocks between them.
	Instances     int
	IndexedBlocks int
	BlockSize     int
	Hash          sim.HashSpec
	Model         string
	// PromptTokens, Shapes and Concurrency span the measured grid.
	PromptTokens []int
	Shapes       []Shape
	Concurrency  []int
	// Memo modes to measure (nil = warm only). Cold and extend cells send each prompt
	// once, so they are as long as the prompts they have (ColdPrompts, or the indexed
	// prompts shared out among those cells), not Duration.
	Memo []Memo
	// ColdPrompts caps the prompts of one cold or extend cell (0 = 64).
	ColdPrompts int
	// ColdWarmup indexed prompts are asked once each, unmeasured, before the first cell,
	// and are not used by cold or extend cells: a conductor whose query key memo grows
	// with use (issue 28) pays the growth's page zeroing while cold traffic first fills
	// it; after a warm-up that long, cold cells measure what a conductor that has served
	// cold traffic for a while pays.
	ColdWarmup int
	// Duration is how long each cell runs (0 = 1 s); every cell sends at least one query
	// per client.
	Duration time.Duration
	// BinaryTokens sends prompts as int32 bins (block keys as uint64 bins with ByHash).
	BinaryTokens bool
	// WriteBufferSize is the measuring clients' httpclient.Options.WriteBufferSize (0:
	// its default, a request of up to 128 KiB in one write; 4096 sends an 8K prompt as
	// two writes, as the client did before).
	WriteBufferSize int
	// KeepAwake records that the caller keeps the machine's CPUs from idling while it
	// measures (target.SpawnAwake); Run only reports it.
	KeepAwake bool
	// ByHash sends POST /query_by_hash with the prompts' block keys instead of /query.
	ByHash bool
	// MixedWidths spreads token ids so that an array mixes positive fixint (about 20%),
	// uint16 (50%) and uint32 (30%) element by element, as real prompts' ids do, and
	// encodes measured arrays as Python's msgpack does (unsigned forms, AppendQueryUnsigned);
	// otherwise ids are uniform under sim.DefaultVocab and arrays are encoded by
	// httpclient (Go's signed forms: int16 under 32768, int32 above). The index is built
	// from the same ids either way.
	MixedWidths bool
	// Sample reads the conductor's CPU time and RSS (nil: no CPU per query).
	Sample Sampler
	// Floor, when set, measures each cell's floor right after it: the same prompts,
	// clients and duration (or count) sent to a floor server (bench/floor) that reads
	// each body and answers the conductor's own answer to the cell's first prompt
	// without other work (Cell.FloorCPUPerQueryUS).
	Floor *Floor
	Seed  uint64
	// Progress gets one line per cell (nil = silent).
	Progress io.Writer
	// GrowTo, when above IndexedBlocks, adds a growth phase after the grid: the first
	// cell's shape (first prompt length, shape and concurrency, warm memo) is measured
	// idle for Duration, then again while the fleet publishes new prompts until the
	// index holds GrowTo blocks and the conductor has applied them (Result.Growth).
	GrowTo int
}

// Growth is the growth phase of a run (Config.GrowTo).
type Growth struct {
	FromBlocks uint64 `json:"from_blocks"`
	ToBlocks   uint64 `json:"to_blocks"`
	// Seconds is the time to publish the new blocks and have them applied.
	Seconds      float64 `json:"seconds"`
	BlocksPerSec float64 `json:"blocks_per_second"`
	// Idle is the cell measured before the growth, During the same cell measured while
	// the index grew (from the first new block published to the last one applied).
	Idle   Cell `json:"idle"`
	During Cell `json:"during"`
	// RSSBytes is the conductor's RSS after the growth (0 when unknown).
	RSSBytes uint64 `json:"rss_bytes,omitempty"`
}

// Cell is one (prompt length, shape, concurrency) measurement.
type Cell struct {
	PromptTokens int            `json:"prompt_tokens"`
	Shape        Shape          `json:"shape"`
	Memo         Memo           `json:"memo"`
	Concurrency  int            `json:"concurrency"`
	Queries      int            `json:"queries"`
	QPS          float64        `json:"queries_per_second"`
	Latency      report.Latency `json:"latency"`
	// CPUPerQueryUS is the conductor's CPU time per query (the harness's too when the
	// conductor runs in-process); 0 when unknown.
	CPUPerQueryUS float64 `json:"cpu_per_query_us,omitempty"`
	// FloorCPUPerQueryUS is the floor server's CPU time per request for the same bodies
	// and clients, measured right after the cell (Config.Floor; 0 when not measured), and
	// FloorQueries the requests it answered.
	FloorCPUPerQueryUS float64 `json:"floor_cpu_per_query_us,omitempty"`
	FloorQueries       int     `json:"floor_queries,omitempty"`
	// RequestBytes is the mean request body size (the response is the same either way).
	RequestBytes float64 `json:"request_body_bytes"`
	// Wrong counts answers whose longest match differed from the prompt's shape.
	Wrong int `json:"wrong_answers"`
}

// Result is a whole load run.
type Result struct {
	Instances     int          `json:"instances"`
	BlockSize     int          `json:"block_size"`
	Hash          sim.HashSpec `json:"hash_profile"`
	IndexedBlocks uint64       `json:"indexed_blocks"`
	// PopulateSeconds is the time to publish the index and have it applied.
	PopulateSeconds   float64 `json:"populate_seconds"`
	PopulateBlocksSec float64 `json:"populate_blocks_per_second"`
	// PopulateCPUPerBlockUS is the conductor's CPU time (user + system) spent while the
	// index was published and applied, per block applied; 0 when unknown.
	PopulateCPUPerBlockUS float64 `json:"populate_cpu_per_block_us,omitempty"`
	// SettleSeconds is how long the conductor took, after the index was applied, to go
	// idle (its background steps done: sweeps of the records that the engines'
	// evictions emptied, slab releases, table migrations) before the cells were
	// measured; Settled is false if it was still busy after settleMax.
	SettleSeconds float64 `json:"settle_seconds,omitempty"`
	Settled       bool    `json:"settled,omitempty"`
	RSSBytes      uint64  `json:"rss_bytes,omitempty"`
	// RSSStartBytes is the conductor's RSS after registration, before indexing;
	// BytesPerBlock is (RSSBytes - RSSStartBytes) / IndexedBlocks.
	RSSStartBytes uint64  `json:"rss_start_bytes,omitempty"`
	BytesPerBlock float64 `json:"bytes_per_block,omitempty"`
	BinaryTokens  bool    `json:"binary_tokens"`
	MixedWidths   bool    `json:"mixed_widths,omitempty"`
	KeepAwake     bool    `json:"keep_awake,omitempty"`
	ByHash        bool    `json:"by_hash"`
	Cells         []Cell  `json:"cells"`
	Growth        *Growth `json:"growth,omitempty"`
	// WriteBufferSize is Config.WriteBufferSize (0: the client's default).
	WriteBufferSize int `json:"write_buffer_size,omitempty"`
}

// settleWindow is the interval over which settle looks at the conductor's CPU, and
// settleMax how long it waits at most for an idle one.
const (
	settleWindow = 250 * time.Millisecond
	settleMax    = 60 * time.Second
)

// settleIdleShare is the share of one CPU under which a conductor counts as idle.
const settleIdleShare = 0.02

// settle waits (through sleep) until the conductor's CPU time over one window is below
// settleIdleShare of the window, at most limit, and returns how long it waited and
// whether it went idle.
func settle(sample Sampler, window, limit time.Duration, sleep func(time.Duration)) (time.Duration, bool) {
	_, last, err := sample()
	if err != nil {
		return 0, false
	}
	for waited := time.Duration(0); waited < limit; {
		sleep(window)
		waited += window
		_, cpu, err := sample()
		if err != nil {
			return waited, false
		}
		if float64(cpu-last) < settleIdleShare*float64(window) {
			return waited, true
		}
		last = cpu
	}
	return limit, false
}

// bodiesPerCell is how many distinct prompts each cell cycles through, so the server
// does not see one prompt over and over.
const bodiesPerCell = 16

type prompt struct {
	body     []byte
	owner    int   // instance that holds the indexed part
	expected int64 // longest_matched the owner must report
}

// Run indexes the prompts, measures every cell, and unregisters the fleet.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Instances <= 0 || cfg.BlockSize <= 0 || cfg.IndexedBlocks <= 0 || len(cfg.PromptTokens) == 0 {
		return nil, errors.New("loadgen: instances, block size, indexed blocks and prompt lengths must be positive")
	}
	if cfg.Duration <= 0 {
		cfg.Duration = time.Second
	}
	if cfg.Model == "" {
		cfg.Model = "loadgen"
	}
	maxLen := 0
	for _, l := range cfg.PromptTokens {
		maxLen = max(maxLen, l)
	}
	// Indexed prompts are as long as the longest query, whole hash-id runs.
	ids := (maxLen + sim.TokensPerHashID - 1) / sim.TokensPerHashID
	perPrompt := ids * sim.TokensPerHashID / cfg.BlockSize
	nPrompts := (cfg.IndexedBlocks + perPrompt - 1) / perPrompt
	// Every rank's cache holds all it is given (the growth's too): nothing is evicted.
	nGrow := max(nPrompts, (cfg.GrowTo+perPrompt-1)/perPrompt)
	perInstance := (nGrow + cfg.Instances - 1) / cfg.Instances * perPrompt
	f, err := sim.NewFleet(sim.FleetConfig{
		Instances: cfg.Instances, DPRanks: 1, Kind: kindOf(cfg.Hash), Hash: cfg.Hash, Model: cfg.Model,
		BlockSize: cfg.BlockSize, Cache: sim.CacheConfig{Device: perInstance}, Publish: true, InstancePrefix: "load-",
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cl, detach, err := f.Attach(cfg.Addr, httpclient.Options{Timeout: time.Minute}, 15*time.Second)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	defer detach()
	res := &Result{Instances: cfg.Instances, BlockSize: cfg.BlockSize, Hash: cfg.Hash, BinaryTokens: cfg.BinaryTokens, WriteBufferSize: cfg.WriteBufferSize, MixedWidths: cfg.MixedWidths, KeepAwake: cfg.KeepAwake, ByHash: cfg.ByHash}
	var cpuStart time.Duration
	if cfg.Sample != nil {
		if rss, cpu, err := cfg.Sample(); err == nil {
			res.RSSStartBytes, cpuStart = rss, cpu
		}
	}

	start := time.Now()
	var toks []int32
	var keys []uint64
	// promptTokens appends the synthetic tokens of a prompt (sim.AppendPrompt), their widths
	// mixed when cfg.MixedWidths.
	promptTokens := func(dst []int32, seed uint64, hashIDs []uint32, n int) []int32 {
		start := len(dst)
		dst = sim.AppendPrompt(dst, seed, hashIDs, n, 0)
		if cfg.MixedWidths {
			MixWidths(dst[start:])
		}
		return dst
	}
	promptIDs := func(p int) []uint32 {
		out := make([]uint32, ids)
		for j := range out {
			out[j] = uint32(p*ids + j)
		}
		return out
	}
	for p := 0; p < nPrompts; p++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		toks = promptTokens(toks[:0], cfg.Seed, promptIDs(p), ids*sim.TokensPerHashID)
		if keys, err = f.Hasher().AppendKeys(keys[:0], toks); err != nil {
			return nil, err
		}
		if _, err := f.Rank(p%cfg.Instances, 0).Store(toks, keys, sim.Now()); err != nil {
			return nil, err
		}
	}
	count, err := f.Drain(cl, 5*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("populate: %w", err)
	}
	res.PopulateSeconds = time.Since(start).Seconds()
	res.IndexedBlocks = count
	res.PopulateBlocksSec = float64(f.Stats().Stored) / res.PopulateSeconds
	if count != uint64(f.UnionBlocks()) {
		return nil, fmt.Errorf("populate: conductor indexes %d blocks, fleet holds %d", count, f.UnionBlocks())
	}
	if cfg.Sample != nil {
		if rss, cpu, err := cfg.Sample(); err == nil {
			res.RSSBytes = rss
			if cpuStart > 0 && f.Stats().Stored > 0 {
				res.PopulateCPUPerBlockUS = float64(cpu-cpuStart) / float64(time.Microsecond) / float64(f.Stats().Stored)
			}
			if res.RSSStartBytes > 0 && count > 0 {
				res.BytesPerBlock = (float64(rss) - float64(res.RSSStartBytes)) / float64(count)
			}
		}
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "indexed %d blocks on %d instances in %.1fs\n", count, cfg.Instances, res.PopulateSeconds)
	}
	if cfg.Sample != nil {
		// The writer's background steps after the build would be counted as the first
		// cells' CPU: wait for the conductor to go idle first.
		var waited time.Duration
		waited, res.Settled = settle(cfg.Sample, settleWindow, settleMax, time.Sleep)
		res.SettleSeconds = waited.Seconds()
		if cfg.Progress != nil {
			state := "idle"
			if !res.Settled {
				state = "still busy; measuring anyway"
			}
			fmt.Fprintf(cfg.Progress, "conductor %s after %.1fs\n", state, res.SettleSeconds)
		}
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 99))
	modes := cfg.Memo
	if len(modes) == 0 {
		modes = []Memo{MemoWarm}
	}
	// Cold and extend cells take indexed prompts nobody asked about yet, each once.
	unused := rng.Perm(nPrompts)
	var warmRes httpclient.QueryResult
	onceCells := 0
	for _, md := range modes {
		if md != MemoWarm {
			onceCells += len(cfg.PromptTokens) * len(cfg.Shapes) * len(cfg.Concurrency)
		}
	}
	w := min(cfg.ColdWarmup, len(unused))
	if err := warmUp(cfg, cl, unused[:w], func(p int) []int32 {
		return promptTokens(nil, cfg.Seed, promptIDs(p), ids*sim.TokensPerHashID)
	}); err != nil {
		return res, err
	}
	unused = unused[w:]
	perOnce := cfg.ColdPrompts
	if perOnce <= 0 {
		perOnce = 64
	}
	if onceCells > 0 {
		perOnce = max(1, min(perOnce, len(unused)/onceCells))
	}
	fresh := uint64(0) // distinct seeds for new tokens across the run
	build := func(p int, L, cached int) ([]byte, error) {
		q := httpclient.QueryRequest{Model: cfg.Model, BlockSize: int64(cfg.BlockSize), BinaryTokens: cfg.BinaryTokens}
		full := promptTokens(nil, cfg.Seed, promptIDs(p), ids*sim.TokensPerHashID)
		toks := append([]int32(nil), full[:cached]...)
		// Fresh tokens come from another seed: they share nothing with the index.
		fresh++
		toks = append(toks, promptTokens(nil, cfg.Seed+1+fresh, promptIDs(p), L-cached)...)
		q.TokenIDs = toks
		if !cfg.ByHash && cfg.MixedWidths && !cfg.BinaryTokens {
			return AppendQueryUnsigned(nil, &q), nil
		}
		if !cfg.ByHash {
			return httpclient.AppendQueryRequest(nil, &q), nil
		}
		keys, err := f.Hasher().AppendKeys(nil, toks)
		if err != nil {
			return nil, err
		}
		return httpclient.AppendQueryByHashRequest(nil, &httpclient.QueryByHashRequest{Model: cfg.Model,
			BlockSize: int64(cfg.BlockSize), BlockHashes: keys, BinaryHashes: cfg.BinaryTokens}), nil
	}
	for _, md := range modes {
		for _, L := range cfg.PromptTokens {
			for _, sh := range cfg.Shapes {
				cached := 0
				switch sh {
				case ShapeHit:
					cached = L
				case ShapeHalf:
					cached = L / 2
				}
				mk := func(p int) (prompt, error) {
					body, err := build(p, L, cached)
					return prompt{body: body, owner: p % cfg.Instances,
						expected: int64(cached / cfg.BlockSize * cfg.BlockSize)}, err
				}
				for _, conc := range cfg.Concurrency {
					var prompts []prompt
					once := md != MemoWarm
					if once {
						take := min(perOnce, len(unused))
						if take == 0 {
							return res, errors.New("loadgen: no unused indexed prompts left for cold cells (raise --blocks)")
						}
						for _, p := range unused[:take] {
							pr, err := mk(p)
							if err != nil {
								return res, err
							}
							prompts = append(prompts, pr)
						}
						if md == MemoExtend {
							// The prompt without its last ~9%, asked first and not measured.
							pre := L * 10 / 11
							for _, p := range unused[:take] {
								q := httpclient.QueryRequest{Model: cfg.Model, BlockSize: int64(cfg.BlockSize), BinaryTokens: cfg.BinaryTokens,
									TokenIDs: promptTokens(nil, cfg.Seed, promptIDs(p), ids*sim.TokensPerHashID)[:min(pre, cached)]}
								if sh != ShapeHit {
									continue // only the indexed part can be memoised by a query
								}
								if err := cl.Query(&q, &warmRes); err != nil {
									return res, fmt.Errorf("extend warm-up: %w", err)
								}
							}
						}
						unused = unused[take:]
					} else {
						for range bodiesPerCell {
							pr, err := mk(rng.IntN(nPrompts))
							if err != nil {
								return res, err
							}
							prompts = append(prompts, pr)
						}
					}
					cell, err := measure(ctx, &cfg, f, prompts, L, sh, conc, once, nil)
					if err != nil {
						return res, err
					}
					cell.Memo = md
					if cfg.Floor != nil {
						if err := measureFloor(ctx, &cfg, cl, prompts, &cell, once); err != nil {
							return res, err
						}
					}
					res.Cells = append(res.Cells, cell)
					if cfg.Progress != nil {
						floor := ""
						if cfg.Floor != nil {
							floor = fmt.Sprintf("  floor %7.1fus", cell.FloorCPUPerQueryUS)
						}
						fmt.Fprintf(cfg.Progress, "  %6d tokens %-4s %-6s x%d: %7.0f q/s  p50 %7.1fus  p99 %7.1fus  cpu/q %7.1fus%s\n",
							L, sh, md, conc, cell.QPS, cell.Latency.P50US, cell.Latency.P99US, cell.CPUPerQueryUS, floor)
					}
				}
			}
		}
	}
	if nGrow > nPrompts {
		L, sh, conc := cfg.PromptTokens[0], ShapeHit, 1
		if len(cfg.Shapes) > 0 {
			sh = cfg.Shapes[0]
		}
		if len(cfg.Concurrency) > 0 {
			conc = cfg.Concurrency[0]
		}
		cached := map[Shape]int{ShapeHit: L, ShapeHalf: L / 2}[sh]
		var prompts []prompt
		for range bodiesPerCell {
			p := rng.IntN(nPrompts)
			body, err := build(p, L, cached)
			if err != nil {
				return res, err
			}
			prompts = append(prompts, prompt{body: body, owner: p % cfg.Instances, expected: int64(cached / cfg.BlockSize * cfg.BlockSize)})
		}
		g, err := grow(ctx, &cfg, f, cl, prompts, L, sh, conc, nPrompts, nGrow, promptIDs, ids)
		if g != nil {
			res.Growth = g
		}
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// grow runs the growth phase (Config.GrowTo): the cell idle, then the same cell while
// warmUp asks each of prompts (whose tokens tokens gives) once, unmeasured
// (Config.ColdWarmup), then waits for the conductor to go idle: the memo's growth step
// that the last of them asked for runs in the background.
func warmUp(cfg Config, cl *httpclient.Client, prompts []int, tokens func(p int) []int32) error {
	if len(prompts) == 0 {
		return nil
	}
	var res httpclient.QueryResult
	for _, p := range prompts {
		q := httpclient.QueryRequest{Model: cfg.Model, BlockSize: int64(cfg.BlockSize), BinaryTokens: cfg.BinaryTokens,
			TokenIDs: tokens(p)}
		if err := cl.Query(&q, &res); err != nil {
			return fmt.Errorf("cold warm-up: %w", err)
		}
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "warm-up: %d cold prompts asked (unmeasured)\n", len(prompts))
	}
	if cfg.Sample != nil {
		if waited, ok := settle(cfg.Sample, settleWindow, settleMax, time.Sleep); cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "conductor idle after the warm-up: %v (%.1fs)\n", ok, waited.Seconds())
		}
	}
	return nil
}

// prompts from..to-1 are published (on their owners, round-robin) and applied.
func grow(ctx context.Context, cfg *Config, f *sim.Fleet, cl *httpclient.Client, prompts []prompt, L int, sh Shape, conc int,
	from, to int, promptIDs func(int) []uint32, ids int) (*Growth, error) {
	idle, err := measure(ctx, cfg, f, prompts, L, sh, conc, false, nil)
	if err != nil {
		return nil, err
	}
	idle.Memo = MemoWarm
	g := &Growth{FromBlocks: uint64(f.UnionBlocks()), Idle: idle}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "growth: idle %d tokens %s x%d: p50 %.1fus p99 %.1fus max %.1fus; publishing up to %d blocks\n",
			L, sh, conc, idle.Latency.P50US, idle.Latency.P99US, idle.Latency.MaxUS, to*ids*sim.TokensPerHashID/cfg.BlockSize)
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var count uint64
	var pubErr error
	start := time.Now()
	stored0 := f.Stats().Stored
	go func() {
		defer close(done)
		var toks []int32
		var keys []uint64
		for p := from; p < to; p++ {
			if pubErr = pctx.Err(); pubErr != nil {
				return
			}
			toks = sim.AppendPrompt(toks[:0], cfg.Seed, promptIDs(p), ids*sim.TokensPerHashID, 0)
			if keys, pubErr = f.Hasher().AppendKeys(keys[:0], toks); pubErr != nil {
				return
			}
			if _, pubErr = f.Rank(p%cfg.Instances, 0).Store(toks, keys, sim.Now()); pubErr != nil {
				return
			}
		}
		count, pubErr = f.Drain(cl, 10*time.Minute)
	}()
	during, err := measure(ctx, cfg, f, prompts, L, sh, conc, false, done)
	if err != nil {
		cancel()
	}
	<-done
	g.Seconds = time.Since(start).Seconds()
	during.Memo = MemoWarm
	g.During = during
	if err != nil {
		return g, fmt.Errorf("growth: %w", err)
	}
	if pubErr != nil {
		return g, fmt.Errorf("growth: %w", pubErr)
	}
	g.ToBlocks = count
	g.BlocksPerSec = float64(f.Stats().Stored-stored0) / g.Seconds
	if count != uint64(f.UnionBlocks()) {
		return g, fmt.Errorf("growth: conductor indexes %d blocks, fleet holds %d", count, f.UnionBlocks())
	}
	if cfg.Sample != nil {
		if rss, _, err := cfg.Sample(); err == nil {
			g.RSSBytes = rss
		}
	}
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "growth: %d -> %d blocks in %.1fs; during: %d queries p50 %.1fus p99 %.1fus max %.1fus, %d wrong\n",
			g.FromBlocks, g.ToBlocks, g.Seconds, during.Queries, during.Latency.P50US, during.Latency.P99US, during.Latency.MaxUS, during.Wrong)
	}
	return g, nil
}

func kindOf(h sim.HashSpec) publisher.Kind {
	if h.Strategy == "vllm_v1" {
		return publisher.VLLM
	}
	return publisher.SGLang
}

// MixWidths maps synthetic token ids (uniform under sim.DefaultVocab) in place so that
// their msgpack encodings mix widths element by element: ids ending in 0 or 1 (decimal)
// become positive fixints (under 128), those ending in 2..6 uint16 (128..65127), the
// rest uint32 (65536 and above). Equal ids stay equal, so prompts that share a prefix
// still do.
func MixWidths(toks []int32) {
	for i, v := range toks {
		switch v % 10 {
		case 0, 1:
			toks[i] = v % 128
		case 2, 3, 4, 5, 6:
			toks[i] = 128 + v%65000
		default:
			toks[i] = 65536 + v
		}
	}
}

// AppendQueryUnsigned appends q as httpclient.AppendQueryRequest does, but with the token
// array in the unsigned forms Python's msgpack writes (positive fixint, uint8, uint16,
// uint32) instead of Go's signed ones.
func AppendQueryUnsigned(dst []byte, q *httpclient.QueryRequest) []byte {
	empty := *q
	empty.TokenIDs, empty.BinaryTokens = nil, false
	dst = httpclient.AppendQueryRequest(dst, &empty)
	dst = msgp.AppendArrayHeader(dst[:len(dst)-1], uint32(len(q.TokenIDs))) // token_ids is last: drop its empty array
	for _, t := range q.TokenIDs {
		if t < 0 {
			dst = msgp.AppendInt32(dst, t)
		} else {
			dst = msgp.AppendUint32(dst, uint32(t))
		}
	}
	return dst
}
