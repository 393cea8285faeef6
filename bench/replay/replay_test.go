package replay

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/bench/target"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/wire/publisher"
)

// TestLoadTrace parses the Mooncake trace format and rejects inconsistent lines.
func TestLoadTrace(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}

{"timestamp": 7, "input_length": 512, "output_length": 1, "hash_ids": [0]}
{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [3]}
`
	reqs, err := LoadTrace(strings.NewReader(in), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[1].TimestampMs != 7 || reqs[0].InputLength != 600 || len(reqs[0].HashIDs) != 2 {
		t.Fatalf("parsed %+v", reqs)
	}
	if _, err := LoadTrace(strings.NewReader(`{"timestamp": 0, "input_length": 513, "hash_ids": [0]}`), 0); err == nil {
		t.Fatal("input longer than its hash ids accepted")
	}
	if _, err := LoadTrace(strings.NewReader(`{"timestamp": "x"}`), 0); err == nil {
		t.Fatal("malformed line accepted")
	}
}

// TestWorkloadKeysAndBound: precomputed keys equal hashing each prompt directly, and the
// infinite-cache bound counts exactly the reusable whole blocks.
func TestWorkloadKeysAndBound(t *testing.T) {
	reqs := []Request{
		{InputLength: 1000, HashIDs: []uint32{1, 2}},    // nothing cached yet
		{InputLength: 1100, HashIDs: []uint32{1, 2, 3}}, // id 1 whole, id 2: 488 tokens seen -> 1000 tokens
		{InputLength: 700, HashIDs: []uint32{1, 9}},     // 512
		{InputLength: 300, HashIDs: []uint32{4}},        // 0
	}
	w, err := NewWorkload(reqs, WorkloadConfig{Hash: sim.VLLMHash("sha256_cbor", "0"), BlockSize: 100, Seed: 3, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	h, err := sim.NewHasher(sim.VLLMHash("sha256_cbor", "0"), 100, "", "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		want, err := h.AppendKeys(nil, w.Prompt(nil, i))
		if err != nil {
			t.Fatal(err)
		}
		got := w.Keys(i)
		if len(got) != reqs[i].InputLength/100 || len(got) != len(want) {
			t.Fatalf("request %d: %d keys, want %d", i, len(got), len(want))
		}
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("request %d block %d differs", i, j)
			}
		}
	}
	// Hits in whole 100-token blocks: 0 + 1000 + 500 + 0 over 3100 prompt tokens.
	if got, want := w.InfiniteCacheHitRate(), 1500.0/3100.0; got != want {
		t.Fatalf("bound %v, want %v", got, want)
	}
	if w.Keys(1)[4] != w.Keys(0)[4] || w.Keys(2)[5] == w.Keys(1)[5] {
		t.Fatal("shared prefixes must share keys exactly as far as the hash ids agree")
	}
}

// TestPickLongest: longest match wins among instances within the load slack; ties go to
// the least loaded, then rotate.
func TestPickLongest(t *testing.T) {
	cases := []struct {
		match       []int64
		load        []int
		slack, from int
		want        int
	}{
		{[]int64{0, 64, 32}, []int{0, 0, 0}, 2, 0, 1},
		{[]int64{0, 64, 32}, []int{0, 5, 0}, 2, 0, 2},  // 1 is overloaded
		{[]int64{0, 64, 32}, []int{0, 5, 0}, -1, 0, 1}, // guard off
		{[]int64{16, 16, 16}, []int{3, 1, 2}, 5, 0, 1}, // tie: least loaded
		{[]int64{0, 0, 0}, []int{0, 0, 0}, 0, 2, 2},    // full tie: rotation
	}
	for i, c := range cases {
		if got := pickLongest(c.match, c.load, c.slack, c.from); got != c.want {
			t.Errorf("case %d: got %d, want %d", i, got, c.want)
		}
	}
}

// TestLoadModel: requests occupy their rank for prefill plus decode, then finish.
func TestLoadModel(t *testing.T) {
	m := newLoadModel(2, 2, 1000, 10) // 1000 tok/s prefill, 10 ms per output token
	m.start(0, 1, 0, 1000, 100)       // busy until t=2
	m.start(0, 0, 0, 0, 50)           // until t=0.5
	m.start(1, 0, 1, 0, 1)            // until t=1.01
	m.advance(0.6)
	if m.instLoad[0] != 1 || m.rankLoad[0][1] != 1 || m.rankLoad[0][0] != 0 || m.instLoad[1] != 1 {
		t.Fatalf("at 0.6: inst %v ranks %v", m.instLoad, m.rankLoad)
	}
	m.advance(2)
	if m.instLoad[0]+m.instLoad[1] != 0 {
		t.Fatalf("at 2: inst %v", m.instLoad)
	}
	if m.peakActive != 2 || m.imbalance() != 2*2/3.0 {
		t.Fatalf("peak %d imbalance %v", m.peakActive, m.imbalance())
	}
	var h finishHeap
	for _, v := range []float64{5, 1, 4, 2, 3} {
		h.push(v)
	}
	for want := 1.0; want <= 5; want++ {
		if h[0] != want {
			t.Fatalf("heap min %v, want %v", h[0], want)
		}
		h.pop()
	}
}

// startConductor runs an in-process conductor for one test.
func startConductor(t *testing.T) *httpclient.Client {
	t.Helper()
	c := target.StartInProcess(t)
	cl, err := httpclient.New(c.Addr, httpclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// TestReplayMatchesEngines is the harness's end-to-end proof: a short replay through a
// real conductor, with the engines' caches evicting, where at every quiescent point the
// conductor's per-rank, per-tier answers equal what the simulated engines hold, its
// prefix_count equals the fleet's distinct blocks, and routing by its answers beats
// random and round-robin routing on a conversational trace.
func TestReplayMatchesEngines(t *testing.T) {
	cases := []struct {
		name  string
		fleet sim.FleetConfig
		reqs  int
	}{
		{"vllm", sim.FleetConfig{Instances: 4, DPRanks: 2, Kind: publisher.VLLM, Hash: sim.VLLMHash("sha256_cbor", "0"),
			BlockSize: 64, Cache: sim.CacheConfig{Device: 160}, Style: sim.StyleCurrent}, 160},
		{"sglang-tiers", sim.FleetConfig{Instances: 3, DPRanks: 2, Kind: publisher.SGLang, Hash: sim.SGLangHash(),
			BlockSize: 32, Cache: sim.CacheConfig{Device: 96, CPU: 96, Disk: 128}, MaxBatchEvents: 64}, 120},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cl := startConductor(t)
			tc.fleet.Model = "replay-" + tc.name
			w, err := NewWorkload(SyntheticTrace(tc.reqs, 11), WorkloadConfig{Hash: tc.fleet.Hash, BlockSize: tc.fleet.BlockSize, Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			var progress bytes.Buffer
			res, err := Run(context.Background(), Config{
				Workload: w, Fleet: tc.fleet, LoadSlack: 2, Seed: 1, Client: cl,
				Policies:    []Policy{PolicyConductor, PolicyOracle, PolicyRandom, PolicyRoundRobin},
				VerifyEvery: 20, VerifySamples: 8, Progress: &progress, QuiesceTimeout: 30 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			cr := res.Conductor
			if cr == nil || cr.Checks < 100 || cr.Mismatches != 0 || cr.Queries != tc.reqs {
				t.Fatalf("conductor result %+v", cr)
			}
			// Every query hashes its blocks through the key memo (on by default): the
			// counters cover them, and conversations repeat prefixes, so some hit.
			if cr.MemoHits == 0 || cr.MemoMisses == 0 || cr.MemoHitRate <= 0 || cr.MemoHitRate >= 1 {
				t.Fatalf("memo hits %d misses %d rate %.3f", cr.MemoHits, cr.MemoMisses, cr.MemoHitRate)
			}
			// The router's queries and the verifier's: all of them timed by the conductor.
			if cr.QueriesHandled < uint64(cr.Queries) || cr.QueryHandlingSeconds <= 0 {
				t.Fatalf("%d queries handled in %.6f s, %d sent by the router", cr.QueriesHandled, cr.QueryHandlingSeconds, cr.Queries)
			}
			if cr.PrefixCount == 0 || cr.PrefixCount != uint64(cr.FleetBlocks) || cr.RemovedBlocks == 0 {
				t.Fatalf("prefix_count %d, fleet blocks %d, removed %d (evictions expected)", cr.PrefixCount, cr.FleetBlocks, cr.RemovedBlocks)
			}
			byPolicy := map[Policy]PolicyResult{}
			for _, p := range res.Policies {
				byPolicy[p.Policy] = p
				if p.Requests != tc.reqs || p.HitRate < 0 || p.HitRate > res.InfiniteCacheHitRate+1e-9 || p.DeviceHitRate > p.HitRate {
					t.Fatalf("%s: %+v (bound %.3f)", p.Policy, p, res.InfiniteCacheHitRate)
				}
			}
			kv := byPolicy[PolicyConductor].HitRate
			for _, base := range []Policy{PolicyRandom, PolicyRoundRobin} {
				if kv <= byPolicy[base].HitRate || byPolicy[PolicyOracle].HitRate <= byPolicy[base].HitRate {
					t.Errorf("conductor %.3f / oracle %.3f routing should beat %s %.3f", kv, byPolicy[PolicyOracle].HitRate, base, byPolicy[base].HitRate)
				}
			}
			if !strings.Contains(progress.String(), "conductor") {
				t.Errorf("no progress lines: %q", progress.String())
			}
			t.Logf("hit rates: conductor %.3f oracle %.3f random %.3f rr %.3f bound %.3f; %d checks, %d stale answers",
				kv, byPolicy[PolicyOracle].HitRate, byPolicy[PolicyRandom].HitRate, byPolicy[PolicyRoundRobin].HitRate,
				res.InfiniteCacheHitRate, cr.Checks, cr.StaleAnswers)
		})
	}
}

func TestParseQueryCounters(t *testing.T) {
	body := []byte("# HELP conductor_query_memo_hits_total x\n# TYPE conductor_query_memo_hits_total counter\n" +
		"conductor_query_memo_hits_total 1.234567e+06\nconductor_query_memo_misses_total 42\n" +
		"conductor_query_memo_evictions_total 7\n" +
		"conductor_query_duration_seconds_bucket{protocol=\"http\",le=\"5e-06\"} 3\n" +
		"conductor_query_duration_seconds_sum{protocol=\"http\"} 1.5\n" +
		"conductor_query_duration_seconds_count{protocol=\"http\"} 100\n" +
		"conductor_query_duration_seconds_sum{protocol=\"rpc\"} 0.25\n" +
		"conductor_query_duration_seconds_count{protocol=\"rpc\"} 20\n")
	c, err := parseQueryCounters(body)
	if err != nil || !c.Memo || c.MemoHits != 1234567 || c.MemoMisses != 42 ||
		!c.Handling || c.HandlingSeconds != 1.75 || c.Queries != 120 {
		t.Fatalf("got %+v %v", c, err)
	}
	// A memo counter alone is no memo figure; the durations still count.
	c, err = parseQueryCounters([]byte("conductor_query_memo_hits_total 3\nconductor_query_duration_seconds_sum 2\nconductor_query_duration_seconds_count 4\n"))
	if err != nil || c.Memo || c.MemoHits != 0 || !c.Handling || c.Queries != 4 {
		t.Fatalf("one memo counter: %+v %v", c, err)
	}
	// A sum without its count is no handling figure.
	c, err = parseQueryCounters([]byte("conductor_query_memo_hits_total 3\nconductor_query_memo_misses_total 1\nconductor_query_duration_seconds_sum 2\n"))
	if err != nil || !c.Memo || c.Handling || c.HandlingSeconds != 0 {
		t.Fatalf("sum without count: %+v %v", c, err)
	}
	for _, bad := range []string{
		"conductor_query_memo_hits_total x\nconductor_query_memo_misses_total 1\n",
		"conductor_query_duration_seconds_sum{protocol=\"http\"} -1\n",
	} {
		if _, err := parseQueryCounters([]byte(bad)); err == nil {
			t.Fatalf("bad value accepted: %q", bad)
		}
	}
}

func TestAddQueryCounters(t *testing.T) {
	before := queryCounters{MemoHits: 10, MemoMisses: 30, Memo: true, HandlingSeconds: 1, Queries: 5, Handling: true}
	after := queryCounters{MemoHits: 40, MemoMisses: 60, Memo: true, HandlingSeconds: 3.5, Queries: 105, Handling: true}
	var cr ConductorResult
	cr.addQueryCounters(before, after)
	if cr.MemoHits != 30 || cr.MemoMisses != 30 || cr.MemoHitRate != 0.5 || cr.QueryHandlingSeconds != 2.5 || cr.QueriesHandled != 100 {
		t.Fatalf("%+v", cr)
	}
	// A restarted conductor's counters go backwards: no figure rather than a wrong one.
	var restarted ConductorResult
	restarted.addQueryCounters(after, before)
	if restarted.MemoHits != 0 || restarted.MemoHitRate != 0 || restarted.QueriesHandled != 0 || restarted.QueryHandlingSeconds != 0 {
		t.Fatalf("counters going backwards gave %+v", restarted)
	}
	var memoOff ConductorResult
	memoOff.addQueryCounters(queryCounters{Handling: true}, queryCounters{HandlingSeconds: 1, Queries: 2, Handling: true})
	if memoOff.MemoHits+memoOff.MemoMisses != 0 || memoOff.QueriesHandled != 2 {
		t.Fatalf("memo off: %+v", memoOff)
	}
}
