package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/httpclient"
)

// Policy is a routing policy.
type Policy string

// Policies.
const (
	// PolicyConductor asks the conductor for every prompt and picks the longest match.
	PolicyConductor Policy = "conductor"
	// PolicyOracle applies the same rule to the simulated caches themselves: the
	// conductor with zero event lag.
	PolicyOracle Policy = "oracle"
	// PolicyRandom picks an instance and rank uniformly at random.
	PolicyRandom Policy = "random"
	// PolicyRoundRobin cycles through instances, then ranks.
	PolicyRoundRobin Policy = "round-robin"
)

// ParsePolicy accepts a policy name.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyConductor, PolicyOracle, PolicyRandom, PolicyRoundRobin:
		return p, nil
	case "rr":
		return PolicyRoundRobin, nil
	}
	return "", fmt.Errorf("routing policy %q: want conductor, oracle, random or round-robin", s)
}

// Sampler reads the conductor process's RSS and CPU time (target.Conductor.Sample).
type Sampler func() (rssBytes uint64, cpu time.Duration, err error)

// Config configures a replay.
type Config struct {
	Workload *Workload
	// Fleet describes the simulated engines; Publish is set per policy.
	Fleet    sim.FleetConfig
	Policies []Policy
	// Speed is the pace relative to the trace's timestamps (1 = real time); 0 replays
	// as fast as possible. Simulated load always follows trace time.
	Speed float64
	// LoadSlack keeps an instance out of the running for longest match while it serves
	// more than LoadSlack requests above the least loaded one; < 0 disables the guard
	// (pure longest match, ties to the least loaded).
	LoadSlack int
	// PrefillTPS and DecodeMsPerToken model how long a request occupies its rank.
	PrefillTPS       float64
	DecodeMsPerToken float64
	// Seed drives the random policy.
	Seed uint64
	// Client talks to the conductor (required for PolicyConductor).
	Client *httpclient.Client
	// BinaryTokens sends prompts as int32 bins instead of msgpack arrays.
	BinaryTokens bool
	// Sample reads the conductor's RSS and CPU; nil skips those figures.
	Sample Sampler
	// VerifyEvery waits for the conductor to apply every event after that many requests
	// and compares its answers with the simulated caches (0 = only at the end).
	VerifyEvery int
	// VerifySamples is how many prompts each verification compares (0 = 32).
	VerifySamples int
	// QuiesceTimeout bounds each wait for the conductor to catch up (0 = 2 min).
	QuiesceTimeout time.Duration
	// Progress receives one line per ~10% of each policy's replay (nil = silent).
	Progress io.Writer
}

// PolicyResult is what one routing policy achieved on the trace.
type PolicyResult struct {
	Policy       Policy `json:"policy"`
	Requests     int    `json:"requests"`
	PromptTokens int64  `json:"prompt_tokens"`
	// HitTokens were found cached in any tier of the chosen rank; DeviceHitTokens in
	// its device memory.
	HitTokens       int64   `json:"hit_tokens"`
	DeviceHitTokens int64   `json:"device_hit_tokens"`
	HitRate         float64 `json:"hit_rate"`
	DeviceHitRate   float64 `json:"device_hit_rate"`
	// Imbalance is the busiest instance's request count over the mean (1 = even).
	Imbalance float64 `json:"imbalance"`
	// PeakActive is the most requests one instance served at once (simulated time).
	PeakActive  int     `json:"peak_active"`
	WallSeconds float64 `json:"wall_seconds"`
}

// ConductorResult is what the conductor did during its policy's replay.
type ConductorResult struct {
	Addr    string         `json:"addr"`
	Queries int            `json:"queries"`
	QPS     float64        `json:"queries_per_second"`
	Latency report.Latency `json:"query_latency"`
	// LatencyCDF is the latency distribution per prompt-length bucket.
	LatencyCDF []LatencyCDF `json:"query_latency_cdf,omitempty"`
	// Timeline samples ingest progress and RSS every 200 ms of the replay.
	Timeline []TimelinePoint `json:"timeline,omitempty"`
	// StaleAnswers counts queries whose answer for the chosen rank differed from what
	// the rank held at that moment: events still in flight.
	StaleAnswers int     `json:"stale_answers"`
	StaleRate    float64 `json:"stale_rate"`
	// Published traffic.
	Batches       uint64 `json:"batches"`
	Events        uint64 `json:"events"`
	StoredBlocks  uint64 `json:"stored_blocks"`
	RemovedBlocks uint64 `json:"removed_blocks"`
	EventBytes    uint64 `json:"event_bytes"`
	// EventsPerSec and BlocksPerSec are events (and block hashes) applied per second,
	// from the first publish to the moment the conductor had applied the last one.
	EventsPerSec float64 `json:"events_per_second"`
	BlocksPerSec float64 `json:"blocks_per_second"`
	// DrainSeconds is how long the conductor needed after the last publish.
	DrainSeconds float64 `json:"drain_seconds"`
	// PrefixCount is the conductor's prefix_count at the end; FleetBlocks the distinct
	// blocks the simulated fleet held (they must agree).
	PrefixCount uint64 `json:"prefix_count"`
	FleetBlocks int    `json:"fleet_blocks"`
	// RSS and CPU of the conductor process (the harness too when in-process).
	RSSStartBytes uint64  `json:"rss_start_bytes,omitempty"`
	RSSEndBytes   uint64  `json:"rss_end_bytes,omitempty"`
	BytesPerBlock float64 `json:"bytes_per_block,omitempty"`
	CPUSeconds    float64 `json:"cpu_seconds,omitempty"`
	// Checks compares conductor answers with the simulated caches at quiescent points.
	Checks        int    `json:"checks"`
	Mismatches    int    `json:"mismatches"`
	FirstMismatch string `json:"first_mismatch,omitempty"`
	Replays       uint64 `json:"replays_served"`
	// MemoHits and MemoMisses are the blocks the conductor's queries took from its key
	// memo, and those they hashed, during the replay (from its /metrics; both 0 when
	// the memo is off or the metrics could not be read); MemoHitRate is hits over both.
	MemoHits    uint64  `json:"memo_hits"`
	MemoMisses  uint64  `json:"memo_misses"`
	MemoHitRate float64 `json:"memo_hit_rate"`
	// QueryHandlingSeconds is the time the conductor spent handling the QueriesHandled
	// queries it answered during the replay (its conductor_query_duration_seconds: decode,
	// hash, walk, encode; the router's and the verifier's queries both), the query part of
	// CPUSeconds as long as a query is not preempted; both 0 when /metrics could not be read.
	QueryHandlingSeconds float64 `json:"query_handling_seconds"`
	QueriesHandled       uint64  `json:"queries_handled"`
}

// LatencyCDF is the query latency distribution of the prompts in one length bucket:
// PercentilesUS[p] is the p-th percentile (0..100) in microseconds.
type LatencyCDF struct {
	Prompts       string    `json:"prompts"`
	Count         int       `json:"count"`
	PercentilesUS []float64 `json:"percentiles_us"`
}

// TimelinePoint is one sample of the replay: the fleet's cumulative published events and
// blocks (what the conductor ingests) and the conductor's RSS, Seconds after the start.
type TimelinePoint struct {
	Seconds       float64 `json:"t_s"`
	Queries       int     `json:"queries"`
	Events        uint64  `json:"events"`
	StoredBlocks  uint64  `json:"stored_blocks"`
	RemovedBlocks uint64  `json:"removed_blocks"`
	RSSBytes      uint64  `json:"rss_bytes,omitempty"`
}

// Result is a whole replay.
type Result struct {
	Requests     int          `json:"requests"`
	PromptTokens int64        `json:"prompt_tokens"`
	PromptBlocks int          `json:"prompt_blocks"`
	Instances    int          `json:"instances"`
	DPRanks      int          `json:"dp_ranks"`
	BlockSize    int          `json:"block_size"`
	Engine       string       `json:"engine"`
	Hash         sim.HashSpec `json:"hash_profile"`
	DeviceBlocks int          `json:"device_blocks_per_rank"`
	CPUBlocks    int          `json:"cpu_blocks_per_rank"`
	DiskBlocks   int          `json:"disk_blocks_per_rank"`
	Speed        float64      `json:"speed"`
	LoadSlack    int          `json:"load_slack"`
	// InfiniteCacheHitRate bounds every policy: one engine with unlimited cache.
	InfiniteCacheHitRate float64          `json:"infinite_cache_hit_rate"`
	Policies             []PolicyResult   `json:"policies"`
	Conductor            *ConductorResult `json:"conductor,omitempty"`
	GOMAXPROCS           int              `json:"gomaxprocs"`
	StartedAt            time.Time        `json:"started_at"`
}

// Run replays the workload once per policy.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	w := cfg.Workload
	if w == nil || w.Len() == 0 {
		return nil, errors.New("replay: empty workload")
	}
	if cfg.Fleet.BlockSize != w.BlockSize() {
		return nil, fmt.Errorf("replay: fleet block size %d differs from the workload's %d", cfg.Fleet.BlockSize, w.BlockSize())
	}
	if cfg.PrefillTPS <= 0 {
		cfg.PrefillTPS = 10000
	}
	if cfg.DecodeMsPerToken <= 0 {
		cfg.DecodeMsPerToken = 20
	}
	if cfg.VerifySamples <= 0 {
		cfg.VerifySamples = 32
	}
	if cfg.QuiesceTimeout <= 0 {
		cfg.QuiesceTimeout = 2 * time.Minute
	}
	res := &Result{
		Requests: w.Len(), PromptTokens: w.PromptTokens(), PromptBlocks: w.Blocks(),
		Instances: cfg.Fleet.Instances, DPRanks: cfg.Fleet.DPRanks, BlockSize: cfg.Fleet.BlockSize,
		Engine: cfg.Fleet.Kind.String(), Hash: cfg.Fleet.Hash,
		DeviceBlocks: cfg.Fleet.Cache.Device, CPUBlocks: cfg.Fleet.Cache.CPU, DiskBlocks: cfg.Fleet.Cache.Disk,
		Speed: cfg.Speed, LoadSlack: cfg.LoadSlack, InfiniteCacheHitRate: w.InfiniteCacheHitRate(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), StartedAt: time.Now().UTC(),
	}
	for _, p := range cfg.Policies {
		var (
			pr  PolicyResult
			err error
		)
		if p == PolicyConductor {
			if cfg.Client == nil {
				return nil, errors.New("replay: the conductor policy needs a conductor client")
			}
			var cr *ConductorResult
			pr, cr, err = runConductor(ctx, &cfg)
			res.Conductor = cr
		} else {
			pr, err = runOffline(ctx, &cfg, p)
		}
		if err != nil {
			return res, fmt.Errorf("replay %s: %w", p, err)
		}
		res.Policies = append(res.Policies, pr)
	}
	return res, nil
}

// chooser picks the rank for request i. pred is the conductor's predicted matched tokens
// for the chosen rank (any tier), or -1 when the policy makes no prediction.
type chooser func(i int, tokens []int32, keys []uint64, lm *loadModel) (inst, rank int, pred int64, err error)

// loop is the router: for each request in trace order it paces, advances the load model,
// lets choose pick a rank, lands the request there and accounts the hit.
type loop struct {
	cfg    *Config
	fleet  *sim.Fleet
	lm     *loadModel
	tokens []int32
	stale  int
	// after is called after request i landed (verification checkpoints).
	after func(i int) error
}

func (l *loop) run(ctx context.Context, policy Policy, choose chooser) (PolicyResult, error) {
	w := l.cfg.Workload
	pr := PolicyResult{Policy: policy, Requests: w.Len(), PromptTokens: w.PromptTokens()}
	bs := int64(w.BlockSize())
	start := time.Now()
	t0 := w.Reqs[0].TimestampMs
	step := max(1, w.Len()/10)
	for i := range w.Reqs {
		if err := ctx.Err(); err != nil {
			return pr, err
		}
		r := &w.Reqs[i]
		if l.cfg.Speed > 0 {
			due := start.Add(time.Duration(float64(r.TimestampMs-t0) * float64(time.Millisecond) / l.cfg.Speed))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		now := float64(r.TimestampMs) / 1000
		l.lm.advance(now)
		l.tokens = w.Prompt(l.tokens[:0], i)
		keys := w.Keys(i)
		inst, rank, pred, err := choose(i, l.tokens, keys, l.lm)
		if err != nil {
			return pr, fmt.Errorf("request %d: %w", i, err)
		}
		m, err := l.fleet.Rank(inst, rank).Store(l.tokens, keys, sim.Now())
		if err != nil {
			return pr, fmt.Errorf("request %d: %w", i, err)
		}
		if pred >= 0 && pred != int64(m.Disk)*bs {
			l.stale++
		}
		pr.HitTokens += int64(m.Disk) * bs
		pr.DeviceHitTokens += int64(m.Device) * bs
		l.lm.start(inst, rank, now, r.InputLength-m.Disk*int(bs), r.OutputLength)
		if l.after != nil {
			if err := l.after(i); err != nil {
				return pr, err
			}
		}
		if l.cfg.Progress != nil && (i+1)%step == 0 {
			fmt.Fprintf(l.cfg.Progress, "  %-11s %6d/%d requests  %6.1fs  hit %.1f%%\n", policy, i+1, w.Len(),
				time.Since(start).Seconds(), 100*float64(pr.HitTokens)/float64(max(1, promptTokensUpTo(w, i))))
		}
	}
	pr.WallSeconds = time.Since(start).Seconds()
	if pr.PromptTokens > 0 {
		pr.HitRate = float64(pr.HitTokens) / float64(pr.PromptTokens)
		pr.DeviceHitRate = float64(pr.DeviceHitTokens) / float64(pr.PromptTokens)
	}
	pr.Imbalance = l.lm.imbalance()
	pr.PeakActive = l.lm.peakActive
	return pr, nil
}

func promptTokensUpTo(w *Workload, i int) int64 {
	var n int64
	for j := 0; j <= i; j++ {
		n += int64(w.Reqs[j].InputLength)
	}
	return n
}

func newLoop(cfg *Config, publish bool) (*loop, error) {
	fc := cfg.Fleet
	fc.Publish = publish
	f, err := sim.NewFleet(fc)
	if err != nil {
		return nil, err
	}
	return &loop{cfg: cfg, fleet: f, lm: newLoadModel(fc.Instances, fc.DPRanks, cfg.PrefillTPS, cfg.DecodeMsPerToken)}, nil
}

// runOffline replays a policy that needs no conductor on an in-memory fleet.
func runOffline(ctx context.Context, cfg *Config, p Policy) (PolicyResult, error) {
	l, err := newLoop(cfg, false)
	if err != nil {
		return PolicyResult{}, err
	}
	defer l.fleet.Close()
	n, d := l.fleet.Instances(), l.fleet.DPRanks()
	var choose chooser
	switch p {
	case PolicyRandom:
		rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
		choose = func(int, []int32, []uint64, *loadModel) (int, int, int64, error) {
			return rng.IntN(n), rng.IntN(d), -1, nil
		}
	case PolicyRoundRobin:
		k := 0
		choose = func(int, []int32, []uint64, *loadModel) (int, int, int64, error) {
			i, r := k%n, (k/n)%d
			k++
			return i, r, -1, nil
		}
	case PolicyOracle:
		instMatch := make([]int64, n)
		rankMatch := make([][]int64, n)
		for i := range rankMatch {
			rankMatch[i] = make([]int64, d)
		}
		turn := 0
		choose = func(_ int, _ []int32, keys []uint64, lm *loadModel) (int, int, int64, error) {
			for i := 0; i < n; i++ {
				instMatch[i] = 0
				for r := 0; r < d; r++ {
					rankMatch[i][r] = int64(l.fleet.Rank(i, r).Match(keys).Disk)
					instMatch[i] = max(instMatch[i], rankMatch[i][r])
				}
			}
			inst := pickLongest(instMatch, lm.instLoad, cfg.LoadSlack, turn%n)
			rank := pickLongest(rankMatch[inst], lm.rankLoad[inst], cfg.LoadSlack, turn%d)
			turn++
			return inst, rank, -1, nil
		}
	default:
		return PolicyResult{}, fmt.Errorf("policy %q needs a conductor", p)
	}
	return l.run(ctx, p, choose)
}
