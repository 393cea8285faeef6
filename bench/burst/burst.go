// Package burst measures what ingesting a burst of KV events costs a conductor: N
// simulated vLLM engines, each a real ZMQ publisher (with its replay endpoint), send
// pre-encoded BlockStored batches of distinct blocks as fast as they can (or at a fixed
// rate) until the conductor has applied them all. It reports blocks applied per second,
// the conductor's CPU time per block, its RSS before, at the peak and after a settling
// time, what the publishers and the harness itself managed and spent, and whether any
// sequence gap, replay or stale source appeared.
package burst

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Config configures a burst.
type Config struct {
	// Addr is the conductor's HTTP address.
	Addr string
	// PID is the conductor's process, sampled for CPU time and RSS (0: no such figures).
	PID int
	// Publishers is the number of simulated engines (one rank each), 0 = 8.
	Publishers int
	// Blocks is the number of distinct blocks published in all (0 = 1,000,000).
	Blocks int
	// BlocksPerEvent is the blocks of one BlockStored event (0 = 64), EventsPerBatch the
	// events of one published batch (0 = 1).
	BlocksPerEvent int
	EventsPerBatch int
	// PromptBlocks is the length of one simulated prompt in blocks (0 = 512, an 8K prompt
	// of 16-token blocks): its events follow each other on one publisher, each naming the
	// last block of the one before as its parent, as a chunked prefill's do.
	PromptBlocks int
	// BlockSize is the tokens per block (0 = 16); Hash the engines' hash profile (zero:
	// vLLM sha256_cbor, PYTHONHASHSEED 0).
	BlockSize int
	Hash      sim.HashSpec
	// Rate paces the publishers to this many blocks per second in all (shared equally);
	// 0 sends flat out.
	Rate float64
	// Warmup is the time between the registration and the burst (negative: none; 0 = 2
	// s), so that the subscriptions' catch-up and join check (1 s after connecting, by
	// default, unless a live batch arrived first) are over and not measured.
	Warmup time.Duration
	// Settle is how long after the last block is applied the settled RSS is read (0 =
	// read at once).
	Settle time.Duration
	// Seed varies the prompts' tokens.
	Seed uint64
	// Progress gets a line per phase (nil = silent).
	Progress io.Writer
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Publishers, 8)
	def(&c.Blocks, 1_000_000)
	def(&c.BlocksPerEvent, 64)
	def(&c.EventsPerBatch, 1)
	def(&c.PromptBlocks, 512)
	def(&c.BlockSize, 16)
	if c.Warmup == 0 {
		c.Warmup = 2 * time.Second
	}
	if c.Hash == (sim.HashSpec{}) {
		c.Hash = sim.VLLMHash("sha256_cbor", "0")
	}
	return c
}

// Result is one burst's figures. Sizes are bytes, times seconds, rates per second.
type Result struct {
	Publishers     int     `json:"publishers"`
	Blocks         int     `json:"blocks"`
	BlocksPerEvent int     `json:"blocks_per_event"`
	EventsPerBatch int     `json:"events_per_batch"`
	PromptBlocks   int     `json:"prompt_blocks"`
	BlockSize      int     `json:"block_size"`
	HashAlgorithm  string  `json:"hash_algorithm"`
	PacedRate      float64 `json:"paced_blocks_per_second"` // 0: flat out
	WarmupSeconds  float64 `json:"warmup_seconds"`
	Batches        int     `json:"batches"`
	PayloadBytes   int64   `json:"payload_bytes"`
	// EncodeSeconds is the time the harness took to hash and encode every batch before
	// the burst (not part of any other figure).
	EncodeSeconds float64 `json:"encode_seconds"`

	// SendSeconds is from the first batch handed to a publisher's socket to the last;
	// SendBlocksPerSec the blocks handed over per second: what the publishers managed
	// (libzmq queues a batch and its I/O thread writes it to TCP later).
	SendSeconds      float64 `json:"send_seconds"`
	SendBlocksPerSec float64 `json:"send_blocks_per_second"`
	// Seconds is from the first batch handed over to the conductor having applied them
	// all (the fleet's drain marker seen on every publisher's stream); BlocksPerSec is
	// Blocks / Seconds.
	Seconds      float64 `json:"seconds"`
	BlocksPerSec float64 `json:"blocks_per_second"`
	// IndexedBlocks is the context's prefix_count once everything is applied: Blocks
	// when nothing was lost.
	IndexedBlocks uint64 `json:"indexed_blocks"`

	// The conductor process (all 0 without a pid). CPUSeconds is its CPU time from the
	// first batch to the last applied; CPUPerBlockUS that per block; CPUCores that over
	// Seconds (how many cores it kept busy).
	CPUSeconds    float64 `json:"cpu_seconds,omitempty"`
	CPUPerBlockUS float64 `json:"cpu_per_block_us,omitempty"`
	CPUCores      float64 `json:"cpu_cores,omitempty"`
	// RSSBeforeBytes is its RSS right before the burst (after registration),
	// RSSPeakBytes the highest from then to the settled sample (PeakSinceStart: since
	// the process started, where the peak could not be reset), RSSSettledBytes its RSS
	// Settle after the last block was applied, and SettleCPUSeconds its CPU time
	// meanwhile.
	RSSBeforeBytes   uint64  `json:"rss_before_bytes,omitempty"`
	RSSPeakBytes     uint64  `json:"rss_peak_bytes,omitempty"`
	PeakSinceStart   bool    `json:"peak_since_start,omitempty"`
	RSSSettledBytes  uint64  `json:"rss_settled_bytes,omitempty"`
	SettleSeconds    float64 `json:"settle_seconds"`
	SettleCPUSeconds float64 `json:"settle_cpu_seconds,omitempty"`
	// RSSGrowthPerBlock is (settled - before) / Blocks, RSSPerBlock settled / Blocks.
	RSSGrowthPerBlock float64 `json:"rss_growth_per_block,omitempty"`
	RSSPerBlock       float64 `json:"rss_per_block,omitempty"`

	// HarnessCPUSeconds is this process's CPU time over the same window as CPUSeconds
	// (publishers, their libzmq I/O thread, the drain queries): on a small machine it
	// competes with the conductor for the same cores.
	HarnessCPUSeconds float64 `json:"harness_cpu_seconds"`

	// What the conductor's /metrics counted over the burst and the settling time (the
	// fleet's services only exist for this burst): sequence gaps, sequence numbers missed
	// in them, replays by result, batches received twice and dropped (a replay at join
	// overlapping the live stream), other messages rejected, and sources stale at the
	// end. MetricsRead is false when /metrics could not be read (the counts are then 0).
	MetricsRead   bool   `json:"metrics_read"`
	Gaps          uint64 `json:"sequence_gaps"`
	Missed        uint64 `json:"sequences_missed"`
	ReplaysOK     uint64 `json:"replays_ok"`
	ReplaysFailed uint64 `json:"replays_failed"`
	Duplicates    uint64 `json:"duplicate_batches"`
	Rejected      uint64 `json:"rejected_messages"`
	Stale         uint64 `json:"stale_sources"`
	// CatchUps and JoinChecks are the subscriptions' replay catch-ups and join checks
	// (any result) over the same time: none when the warm-up covered them.
	CatchUps   uint64 `json:"catch_ups"`
	JoinChecks uint64 `json:"join_checks"`
}

// Lossless reports whether the conductor indexed every block without a gap, replay,
// rejection or stale source (a batch received twice loses nothing).
func (r *Result) Lossless() bool {
	return r.IndexedBlocks == uint64(r.Blocks) && r.Gaps == 0 && r.Missed == 0 && r.ReplaysOK == 0 &&
		r.ReplaysFailed == 0 && r.Rejected == 0 && r.Stale == 0
}

// stream is one publisher's pre-encoded batches: batch i is buf[ends[i-1]:ends[i]] and
// carries blocks[i] blocks.
type stream struct {
	buf    []byte
	ends   []int
	blocks []int
}

func (s *stream) batch(i int) []byte {
	from := 0
	if i > 0 {
		from = s.ends[i-1]
	}
	return s.buf[from:s.ends[i]]
}

// Run publishes the burst and measures it. The fleet is registered first and
// unregistered at the end.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if cfg.Hash.Strategy != "vllm_v1" {
		return nil, fmt.Errorf("burst: hash strategy %q: the burst simulates vLLM engines", cfg.Hash.Strategy)
	}
	if cfg.Rate < 0 {
		return nil, fmt.Errorf("burst: rate %v blocks/s: must not be negative", cfg.Rate)
	}
	res := &Result{Publishers: cfg.Publishers, Blocks: cfg.Blocks, BlocksPerEvent: cfg.BlocksPerEvent,
		EventsPerBatch: cfg.EventsPerBatch, PromptBlocks: cfg.PromptBlocks, BlockSize: cfg.BlockSize,
		HashAlgorithm: cfg.Hash.Algorithm, PacedRate: cfg.Rate}
	t0 := time.Now()
	streams, err := encode(ctx, cfg)
	if err != nil {
		return nil, err
	}
	res.EncodeSeconds = time.Since(t0).Seconds()
	for i := range streams {
		res.Batches += len(streams[i].ends)
		res.PayloadBytes += int64(len(streams[i].buf))
	}
	progress(cfg.Progress, "encoded %d blocks in %d batches (%.1f MiB) for %d publishers in %.1fs",
		cfg.Blocks, res.Batches, float64(res.PayloadBytes)/(1<<20), cfg.Publishers, res.EncodeSeconds)

	f, err := sim.NewFleet(sim.FleetConfig{
		Instances: cfg.Publishers, DPRanks: 1, Kind: publisher.VLLM, Hash: cfg.Hash, Model: "burst",
		BlockSize: cfg.BlockSize, Cache: sim.CacheConfig{Device: 1}, Publish: true, InstancePrefix: "burst-",
		// The drain's queries run while the conductor works: one every 2 ms at most times
		// the end within 2 ms for a few dozen microseconds of its CPU each.
		DrainPoll: 2 * time.Millisecond,
	})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cl, detach, err := f.Attach(cfg.Addr, httpclient.Options{Timeout: time.Minute}, 30*time.Second)
	if err != nil {
		return nil, fmt.Errorf("burst: %w", err)
	}
	defer detach()
	if cfg.Warmup > 0 {
		progress(cfg.Progress, "registered %d publishers; warming up for %v", cfg.Publishers, cfg.Warmup)
		if err := target.Sleep(ctx, cfg.Warmup); err != nil {
			return nil, err
		}
		res.WarmupSeconds = cfg.Warmup.Seconds()
	}
	m0, m0err := target.ReadMetrics(ctx, cfg.Addr)
	var s0 target.Sample
	if cfg.PID > 0 {
		if err := target.ResetPeakRSS(cfg.PID); err != nil {
			res.PeakSinceStart = true
			progress(cfg.Progress, "peak RSS since the conductor started: %v", err)
		}
		if s0, err = target.ReadProc(cfg.PID); err != nil {
			return nil, err
		}
		res.RSSBeforeBytes = s0.RSSBytes
	}
	h0, err := target.ReadProc(os.Getpid())
	if err != nil {
		return nil, err
	}

	pubs := make([]*sim.Publisher, cfg.Publishers)
	for i := range pubs {
		pubs[i] = f.Rank(i, 0).Publisher()
	}
	start := time.Now()
	sent, err := send(ctx, pubs, streams, cfg.Rate, start)
	if err != nil {
		return nil, err
	}
	res.SendSeconds = sent.Sub(start).Seconds()
	res.SendBlocksPerSec = float64(cfg.Blocks) / res.SendSeconds
	count, err := drain(ctx, f, cl, cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("burst: %w", err)
	}
	res.Seconds = time.Since(start).Seconds()
	res.BlocksPerSec = float64(cfg.Blocks) / res.Seconds
	res.IndexedBlocks = count
	var s1 target.Sample
	if cfg.PID > 0 {
		if s1, err = target.ReadProc(cfg.PID); err != nil {
			return nil, err
		}
		res.CPUSeconds = (s1.CPU - s0.CPU).Seconds()
		res.CPUPerBlockUS = res.CPUSeconds * 1e6 / float64(cfg.Blocks)
		res.CPUCores = res.CPUSeconds / res.Seconds
	}
	h1, err := target.ReadProc(os.Getpid())
	if err != nil {
		return nil, err
	}
	res.HarnessCPUSeconds = (h1.CPU - h0.CPU).Seconds()
	progress(cfg.Progress, "applied %d blocks in %.2fs (%.0f blocks/s; publishers handed them over in %.2fs)",
		count, res.Seconds, res.BlocksPerSec, res.SendSeconds)

	settleStart := time.Now()
	if err := target.Sleep(ctx, cfg.Settle); err != nil {
		return nil, err
	}
	res.SettleSeconds = time.Since(settleStart).Seconds()
	if cfg.PID > 0 {
		s2, err := target.ReadProc(cfg.PID)
		if err != nil {
			return nil, err
		}
		res.RSSSettledBytes = s2.RSSBytes
		// The kernel folds per-thread RSS counts into the peak lazily, so it may trail an
		// RSS read by a few pages: the peak is at least every RSS read.
		res.RSSPeakBytes = max(s2.PeakRSSBytes, s0.RSSBytes, s1.RSSBytes, s2.RSSBytes)
		res.SettleCPUSeconds = (s2.CPU - s1.CPU).Seconds()
		res.RSSGrowthPerBlock = (float64(s2.RSSBytes) - float64(s0.RSSBytes)) / float64(cfg.Blocks)
		res.RSSPerBlock = float64(s2.RSSBytes) / float64(cfg.Blocks)
	}
	if m1, err := target.ReadMetrics(ctx, cfg.Addr); err == nil && m0err == nil {
		res.MetricsRead = true
		delta := func(name string, labels ...string) uint64 {
			a, _ := m0.Sum(name, labels...)
			b, _ := m1.Sum(name, labels...)
			return uint64(max(b-a, 0))
		}
		res.Gaps = delta("conductor_service_sequence_gaps_total")
		res.Missed = delta("conductor_service_sequences_missed_total")
		res.ReplaysOK = delta("conductor_service_replays_total", `result="ok"`)
		res.ReplaysFailed = delta("conductor_service_replays_total", `result="failed"`)
		res.Duplicates = delta("conductor_service_rejected_total", `reason="duplicate_sequence"`)
		res.Rejected = delta("conductor_service_rejected_total") - res.Duplicates
		res.CatchUps = delta("conductor_service_catchups_total")
		res.JoinChecks = delta("conductor_service_join_checks_total")
		stale, _ := m1.Sum("conductor_service_stale")
		res.Stale = uint64(stale)
	}
	if count != uint64(cfg.Blocks) {
		return res, fmt.Errorf("burst: conductor indexes %d blocks, %d were published", count, cfg.Blocks)
	}
	return res, nil
}

// staleWatch is how often drain reads the conductor's /metrics for stale sources.
const staleWatch = 500 * time.Millisecond

// errStale is the cause drain gives up with when a source went stale: its marker will
// never be applied.
var errStale = errors.New("a publisher's source went stale (its entries retracted)")

// drain waits for the fleet's drain marker (at most 10 minutes), giving up as soon as the
// conductor's /metrics shows a stale source.
func drain(ctx context.Context, f *sim.Fleet, cl *httpclient.Client, addr string) (uint64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(staleWatch):
			}
			if m, err := target.ReadMetrics(ctx, addr); err == nil {
				if stale, _ := m.Sum("conductor_service_stale"); stale > 0 {
					cancel(fmt.Errorf("%w: %.0f of them", errStale, stale))
					return
				}
			}
		}
	}()
	count, err := f.DrainContext(ctx, cl, 10*time.Minute)
	cancel(nil)
	<-watched
	return count, err
}

func progress(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// encode hashes and encodes every publisher's batches, one publisher per CPU at a time.
// Prompt p goes to publisher p mod Publishers; its tokens are synthetic runs of hash ids
// no other prompt uses, so every block is distinct.
func encode(ctx context.Context, cfg Config) ([]stream, error) {
	promptTokens := cfg.PromptBlocks * cfg.BlockSize
	idsPerPrompt := (promptTokens + sim.TokensPerHashID - 1) / sim.TokensPerHashID
	prompts := (cfg.Blocks + cfg.PromptBlocks - 1) / cfg.PromptBlocks
	streams := make([]stream, cfg.Publishers)
	errs := make([]error, cfg.Publishers)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i := range streams {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			h, err := sim.NewHasher(cfg.Hash, cfg.BlockSize, "", "")
			if err != nil {
				errs[i] = err
				return
			}
			s := &streams[i]
			enc := sim.NewBatchEncoder(publisher.VLLM, sim.StyleMinimal, cfg.BlockSize, "")
			pending := 0 // blocks in enc
			flush := func() {
				s.buf = append(s.buf, enc.Finish(sim.Now(), 0)...)
				s.ends = append(s.ends, len(s.buf))
				s.blocks = append(s.blocks, pending)
				pending = 0
			}
			var toks []int32
			var keys []uint64
			ids := make([]uint32, idsPerPrompt)
			for p := i; p < prompts; p += cfg.Publishers {
				if err := ctx.Err(); err != nil {
					errs[i] = err
					return
				}
				n := min(cfg.PromptBlocks, cfg.Blocks-p*cfg.PromptBlocks)
				for j := range ids {
					ids[j] = uint32(p*idsPerPrompt + j)
				}
				toks = sim.AppendPrompt(toks[:0], cfg.Seed, ids, n*cfg.BlockSize, 0)
				if keys, err = h.AppendKeys(keys[:0], toks); err != nil {
					errs[i] = err
					return
				}
				for from := 0; from < n; from += cfg.BlocksPerEvent {
					to := min(from+cfg.BlocksPerEvent, n)
					var parent uint64
					if from > 0 {
						parent = keys[from-1]
					}
					enc.Stored(keys[from:to], parent, from > 0, toks[from*cfg.BlockSize:to*cfg.BlockSize], sim.TierDevice)
					pending += to - from
					if enc.Len() == cfg.EventsPerBatch {
						flush()
					}
				}
			}
			if enc.Len() > 0 {
				flush()
			}
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("burst: encode: %w", err)
	}
	return streams, nil
}

// send hands every stream's batches to its publisher, one goroutine per publisher: flat
// out, or with rate > 0 each batch no earlier than the time at which, counted from start,
// the publisher's share of rate reaches the blocks before it. It returns when the last
// batch was handed over.
func send(ctx context.Context, pubs []*sim.Publisher, streams []stream, rate float64, start time.Time) (time.Time, error) {
	errs := make([]error, len(pubs))
	var wg sync.WaitGroup
	perPub := rate / float64(len(pubs))
	for i := range pubs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := &streams[i]
			blocks := 0
			for b := range s.ends {
				if perPub > 0 {
					due := start.Add(time.Duration(float64(blocks) / perPub * float64(time.Second)))
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				}
				if err := pubs[i].Publish(s.batch(b)); err != nil {
					errs[i] = err
					return
				}
				blocks += s.blocks[b]
				if b%256 == 0 && ctx.Err() != nil {
					errs[i] = ctx.Err()
					return
				}
			}
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return time.Time{}, fmt.Errorf("burst: send: %w", err)
	}
	return time.Now(), nil
}
