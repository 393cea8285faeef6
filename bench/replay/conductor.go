package replay

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/conductor-go/conductor/bench/report"
	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/httpclient"
)

// conductorRun is the conductor policy's state: a publishing fleet registered with the
// conductor, and the query and verification machinery around the router loop.
type conductorRun struct {
	cfg   *Config
	fleet *sim.Fleet
	cl    *httpclient.Client
	// s sends the router loop's queries: its reused request keeps pooling out of the
	// measured latency.
	s    *httpclient.Session
	res  httpclient.QueryResult
	hits []*httpclient.InstanceHit // res filed by fleet instance (sim.Fleet.Hits)
	q    httpclient.QueryRequest
	cr   ConductorResult
	lat  []time.Duration
	plen []int32 // prompt length of each lat entry
	toks []int32
	// timeline sampling (on the router loop's goroutine, which owns the fleet)
	t0, lastSample time.Time
	rng            *rand.Rand
}

func runConductor(ctx context.Context, cfg *Config) (PolicyResult, *ConductorResult, error) {
	l, err := newLoop(cfg, true)
	if err != nil {
		return PolicyResult{}, nil, err
	}
	defer l.fleet.Close()
	fc := l.fleet.Config()
	c := &conductorRun{
		cfg: cfg, fleet: l.fleet, cl: cfg.Client,
		q: httpclient.QueryRequest{Model: fc.Model, LoraName: fc.Lora, TenantID: fc.Tenant, BlockSize: int64(fc.BlockSize),
			BinaryTokens: cfg.BinaryTokens},
		lat: make([]time.Duration, 0, cfg.Workload.Len()),
		rng: rand.New(rand.NewPCG(cfg.Seed, 77)),
	}
	c.cr.Addr = c.cl.Host()
	c.s = c.cl.NewSession()
	defer c.s.Close()
	defer l.fleet.Unregister(c.cl)
	if err := l.fleet.Register(c.cl, 15*time.Second); err != nil {
		return PolicyResult{}, nil, err
	}
	counters0, countersErr := readQueryCounters(ctx, c.cl.Host())
	// One marker round trip proves every stream is live before anything is measured.
	if _, err := c.drain(); err != nil {
		return PolicyResult{}, nil, fmt.Errorf("first events never reached the conductor: %w", err)
	}
	var cpu0 time.Duration
	if cfg.Sample != nil {
		if rss, cpu, err := cfg.Sample(); err == nil {
			c.cr.RSSStartBytes, cpu0 = rss, cpu
		}
	}
	if cfg.VerifyEvery > 0 {
		l.after = func(i int) error {
			if (i+1)%cfg.VerifyEvery != 0 || i+1 == cfg.Workload.Len() {
				return nil
			}
			return c.checkpoint(i)
		}
	}
	n, d := l.fleet.Instances(), l.fleet.DPRanks()
	instMatch := make([]int64, n)
	rankMatch := make([]int64, d)
	turn := 0
	choose := func(_ int, tokens []int32, _ []uint64, lm *loadModel) (int, int, int64, error) {
		c.q.TokenIDs = tokens
		t := time.Now()
		if err := c.s.Query(&c.q, &c.res); err != nil {
			return 0, 0, 0, err
		}
		c.lat = append(c.lat, time.Since(t))
		c.plen = append(c.plen, int32(len(tokens)))
		c.sample(false)
		c.hits = l.fleet.Hits(c.hits, &c.res)
		for i, h := range c.hits {
			instMatch[i] = 0
			if h != nil {
				instMatch[i] = h.LongestMatched
			}
		}
		inst := pickLongest(instMatch, lm.instLoad, cfg.LoadSlack, turn%n)
		for r := range rankMatch {
			rankMatch[r] = 0
			if h := c.hits[inst]; h != nil {
				if rh := h.Rank(int64(r)); rh != nil {
					rankMatch[r] = rh.Disk
				}
			}
		}
		rank := pickLongest(rankMatch, lm.rankLoad[inst], cfg.LoadSlack, turn%d)
		turn++
		return inst, rank, rankMatch[rank], nil
	}
	started := time.Now()
	c.t0 = started
	c.sample(true)
	pr, err := l.run(ctx, PolicyConductor, choose)
	if err != nil {
		return pr, &c.cr, err
	}
	lastPublish := time.Now()
	count, err := c.drain()
	if err != nil {
		return pr, &c.cr, fmt.Errorf("final drain: %w", err)
	}
	applied := time.Now()
	c.cr.DrainSeconds = applied.Sub(lastPublish).Seconds()
	c.cr.PrefixCount = count
	c.cr.FleetBlocks = l.fleet.UnionBlocks()
	if err := c.verifySample(cfg.Workload.Len()-1, cfg.VerifySamples); err != nil {
		return pr, &c.cr, err
	}
	st := l.fleet.Stats()
	c.cr.Batches, c.cr.Events, c.cr.StoredBlocks, c.cr.RemovedBlocks, c.cr.EventBytes = st.Batches, st.Events, st.Stored, st.Removed, st.Bytes
	span := applied.Sub(started).Seconds()
	c.cr.EventsPerSec = float64(st.Events) / span
	c.cr.BlocksPerSec = float64(st.Stored+st.Removed) / span
	c.cr.Queries = len(c.lat)
	c.cr.QPS = float64(len(c.lat)) / pr.WallSeconds
	c.cr.Latency = report.Summarize(c.lat)
	c.cr.LatencyCDF = latencyCDFs(c.lat, c.plen)
	c.sample(true)
	c.cr.StaleAnswers = l.stale
	c.cr.StaleRate = float64(l.stale) / float64(max(1, len(c.lat)))
	for i := 0; i < n; i++ {
		for r := 0; r < d; r++ {
			c.cr.Replays += l.fleet.Rank(i, r).Publisher().Replays()
		}
	}
	if counters, err := readQueryCounters(ctx, c.cl.Host()); err == nil && countersErr == nil {
		c.cr.addQueryCounters(counters0, counters)
	}
	if cfg.Sample != nil {
		if rss, cpu, err := cfg.Sample(); err == nil {
			c.cr.RSSEndBytes = rss
			c.cr.CPUSeconds = (cpu - cpu0).Seconds()
			if count > 0 && rss > c.cr.RSSStartBytes {
				c.cr.BytesPerBlock = float64(rss-c.cr.RSSStartBytes) / float64(count)
			}
		}
	}
	if c.cr.Mismatches > 0 {
		return pr, &c.cr, fmt.Errorf("conductor answers differ from the simulated caches in %d of %d checks; first: %s",
			c.cr.Mismatches, c.cr.Checks, c.cr.FirstMismatch)
	}
	if uint64(c.cr.FleetBlocks) != count {
		return pr, &c.cr, fmt.Errorf("conductor prefix_count %d, simulated fleet holds %d distinct blocks", count, c.cr.FleetBlocks)
	}
	return pr, &c.cr, nil
}

// timelineEvery is the sampling period of ConductorResult.Timeline.
const timelineEvery = 200 * time.Millisecond

// sample appends a timeline point when timelineEvery has passed (or force): the fleet's
// cumulative event counters and the conductor's RSS. It runs on the router loop, which
// owns the fleet, so the counters are read without races.
func (c *conductorRun) sample(force bool) {
	now := time.Now()
	if !force && now.Sub(c.lastSample) < timelineEvery {
		return
	}
	c.lastSample = now
	st := c.fleet.Stats()
	p := TimelinePoint{Seconds: now.Sub(c.t0).Seconds(), Queries: len(c.lat), Events: st.Events, StoredBlocks: st.Stored, RemovedBlocks: st.Removed}
	if c.cfg.Sample != nil {
		if rss, _, err := c.cfg.Sample(); err == nil {
			p.RSSBytes = rss
		}
	}
	c.cr.Timeline = append(c.cr.Timeline, p)
}

// latencyCDFs cuts the query latencies by prompt length (<2K, 2K-8K, 8K-32K, >=32K
// tokens) and returns each bucket's distribution as 101 percentiles.
func latencyCDFs(lat []time.Duration, plen []int32) []LatencyCDF {
	bounds := []struct {
		label  string
		lo, hi int32
	}{{"<2K tokens", 0, 2048}, {"2K-8K tokens", 2048, 8192}, {"8K-32K tokens", 8192, 32768}, {">=32K tokens", 32768, 1<<31 - 1}}
	var out []LatencyCDF
	for _, b := range bounds {
		var xs []time.Duration
		for i, d := range lat {
			if plen[i] >= b.lo && plen[i] < b.hi {
				xs = append(xs, d)
			}
		}
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		cdf := LatencyCDF{Prompts: b.label, Count: len(xs), PercentilesUS: make([]float64, 101)}
		for p := range cdf.PercentilesUS {
			cdf.PercentilesUS[p] = float64(report.Percentile(xs, float64(p))) / float64(time.Microsecond)
		}
		out = append(out, cdf)
	}
	return out
}

// drain waits until the conductor has applied every published event (sim.Fleet.Drain).
func (c *conductorRun) drain() (uint64, error) {
	return c.fleet.Drain(c.cl, c.cfg.QuiesceTimeout)
}

// checkpoint drains the event streams after request i and compares answers.
func (c *conductorRun) checkpoint(i int) error {
	if _, err := c.drain(); err != nil {
		return fmt.Errorf("checkpoint after request %d: %w", i, err)
	}
	return c.verifySample(i, c.cfg.VerifySamples)
}

// verifySample compares the conductor's answers with the simulated caches for n prompts:
// the most recent requests up to last, the upcoming ones, and random earlier ones. The
// conductor must have applied every event (drain) beforehand.
func (c *conductorRun) verifySample(last, n int) error {
	w := c.cfg.Workload
	idx := make([]int, 0, n)
	for k := 0; k < n/4 && last-k >= 0; k++ {
		idx = append(idx, last-k)
	}
	for k := 1; k <= n/4 && last+k < w.Len(); k++ {
		idx = append(idx, last+k)
	}
	for len(idx) < n {
		idx = append(idx, c.rng.IntN(last+1))
	}
	for _, i := range idx {
		if err := c.verify(i); err != nil {
			return err
		}
	}
	return nil
}

// verify queries request i's prompt and checks every rank's tier counts.
func (c *conductorRun) verify(i int) error {
	w := c.cfg.Workload
	c.toks = w.Prompt(c.toks[:0], i)
	keys := w.Keys(i)
	q := c.q
	q.TokenIDs = c.toks
	if err := c.s.Query(&q, &c.res); err != nil {
		return fmt.Errorf("verify request %d: %w", i, err)
	}
	bs := int64(w.BlockSize())
	c.hits = c.fleet.Hits(c.hits, &c.res)
	for inst, k := range c.hits {
		var best httpclient.TierCounts
		for r := 0; r < c.fleet.DPRanks(); r++ {
			m := c.fleet.Rank(inst, r).Match(keys)
			want := httpclient.TierCounts{Device: int64(m.Device) * bs, CPULocal: int64(m.CPULocal) * bs,
				CPUShare: int64(m.CPULocal) * bs, Disk: int64(m.Disk) * bs}
			best.Device, best.CPULocal = max(best.Device, want.Device), max(best.CPULocal, want.CPULocal)
			best.CPUShare, best.Disk = max(best.CPUShare, want.CPUShare), max(best.Disk, want.Disk)
			var rh *httpclient.RankHit
			if k != nil {
				rh = k.Rank(int64(r))
			}
			if rh == nil {
				c.mismatch(fmt.Sprintf("request %d: %s rank %d missing from the answer", i, c.fleet.InstanceID(inst), r))
				continue
			}
			c.cr.Checks++
			if rh.TierCounts != want {
				c.mismatch(fmt.Sprintf("request %d: %s rank %d: conductor %+v, engine holds %+v", i, c.fleet.InstanceID(inst), r, rh.TierCounts, want))
			}
		}
		if k != nil && (k.TierCounts != best || k.LongestMatched != best.Disk) {
			c.mismatch(fmt.Sprintf("request %d: %s: conductor %+v (longest %d), ranks say %+v", i, c.fleet.InstanceID(inst), k.TierCounts, k.LongestMatched, best))
		}
	}
	return nil
}

func (c *conductorRun) mismatch(s string) {
	c.cr.Mismatches++
	if c.cr.FirstMismatch == "" {
		c.cr.FirstMismatch = s
	}
}

// queryCounters are the conductor's cumulative query counters from its /metrics.
type queryCounters struct {
	// MemoHits and MemoMisses are conductor_query_memo_hits_total and _misses_total;
	// Memo says both were found (the memo may be off, or the conductor older).
	MemoHits, MemoMisses uint64
	Memo                 bool
	// HandlingSeconds and Queries are the sum and count of
	// conductor_query_duration_seconds over its protocols: the time the server's handlers
	// spent on queries, from taking the received body to encoding the answer; Handling
	// says they were found.
	HandlingSeconds float64
	Queries         uint64
	Handling        bool
}

// readQueryCounters fetches the conductor's /metrics and parses its query counters.
func readQueryCounters(ctx context.Context, host string) (queryCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/metrics", nil)
	if err != nil {
		return queryCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return queryCounters{}, fmt.Errorf("read query counters: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return queryCounters{}, fmt.Errorf("read query counters: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return queryCounters{}, fmt.Errorf("read query counters: /metrics answered %s", resp.Status)
	}
	return parseQueryCounters(body)
}

// parseQueryCounters finds the memo counters and the query duration histogram's sum and
// count (every protocol label added up) in a Prometheus text exposition. A counter that is
// absent leaves its group unset; one with a value that is not a non-negative number is an
// error.
func parseQueryCounters(body []byte) (queryCounters, error) {
	var c queryCounters
	var memoFound, sumFound, countFound int
	for _, line := range strings.Split(string(body), "\n") {
		series, val, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(series, "#") {
			continue
		}
		name, _, _ := strings.Cut(series, "{")
		switch name {
		case "conductor_query_memo_hits_total", "conductor_query_memo_misses_total",
			"conductor_query_duration_seconds_sum", "conductor_query_duration_seconds_count":
		default:
			continue
		}
		v, perr := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if perr != nil || v < 0 {
			return queryCounters{}, fmt.Errorf("query counter %s: bad value %q", series, val)
		}
		switch name {
		case "conductor_query_memo_hits_total":
			c.MemoHits = uint64(v)
			memoFound++
		case "conductor_query_memo_misses_total":
			c.MemoMisses = uint64(v)
			memoFound++
		case "conductor_query_duration_seconds_sum":
			c.HandlingSeconds += v
			sumFound++
		case "conductor_query_duration_seconds_count":
			c.Queries += uint64(v)
			countFound++
		}
	}
	c.Memo = memoFound == 2
	c.Handling = sumFound > 0 && sumFound == countFound
	if !c.Memo {
		c.MemoHits, c.MemoMisses = 0, 0
	}
	if !c.Handling {
		c.HandlingSeconds, c.Queries = 0, 0
	}
	return c, nil
}

// addQueryCounters sets the memo and query-handling figures from the conductor's counters
// before and after the replay; a group missing from either, or one that went backwards (a
// restarted conductor), is left at zero.
func (cr *ConductorResult) addQueryCounters(before, after queryCounters) {
	if before.Memo && after.Memo && after.MemoHits >= before.MemoHits && after.MemoMisses >= before.MemoMisses {
		cr.MemoHits, cr.MemoMisses = after.MemoHits-before.MemoHits, after.MemoMisses-before.MemoMisses
		if n := cr.MemoHits + cr.MemoMisses; n > 0 {
			cr.MemoHitRate = float64(cr.MemoHits) / float64(n)
		}
	}
	if before.Handling && after.Handling && after.Queries >= before.Queries && after.HandlingSeconds >= before.HandlingSeconds {
		cr.QueryHandlingSeconds = after.HandlingSeconds - before.HandlingSeconds
		cr.QueriesHandled = after.Queries - before.Queries
	}
}
