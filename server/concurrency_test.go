package server

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// sglangStored is an SGLang map event; SGLang publishes its hashes as signed int64.
func sglangStored(hashes []uint64, medium string) []byte {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = int64(h)
	}
	return mp("type", "BlockStored", "block_hashes", hs, "parent_block_hash", nil, "token_ids", nil,
		"block_size", 4, "lora_id", nil, "medium", medium)
}

func sglangRemoved(hashes []uint64, medium string) []byte {
	hs := make([]any, len(hashes))
	for i, h := range hashes {
		hs[i] = int64(h)
	}
	return mp("type", "BlockRemoved", "block_hashes", hs, "medium", medium)
}

// postRaw is a goroutine-safe POST that returns the status and the decoded map.
func postRaw(c *http.Client, addr, path string, body []byte) (int, map[string]any, error) {
	resp, err := c.Post("http://"+addr+path, "application/msgpack", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, err
	}
	v, rest, err := msgp.ReadIntfBytes(raw)
	if err != nil || len(rest) != 0 {
		return resp.StatusCode, nil, fmt.Errorf("%s: body is not one msgpack value: %v", path, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return resp.StatusCode, nil, fmt.Errorf("%s: body is %T", path, v)
	}
	return resp.StatusCode, m, nil
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return int64(x), true
	}
	return 0, false
}

var tierNames = [...]string{"device", "cpu_local", "cpu_share", "disk"}

// tiersOf reads the four cumulative tiers of a map and checks
// device <= cpu_local <= cpu_share <= disk <= n.
func tiersOf(m map[string]any, n int) ([4]int64, error) {
	var t [4]int64
	for i, name := range tierNames {
		v, ok := toInt(m[name])
		if !ok {
			return t, fmt.Errorf("%s is %T", name, m[name])
		}
		t[i] = v
		if v < 0 || (i > 0 && v < t[i-1]) || v > int64(n) {
			return t, fmt.Errorf("tiers not cumulative within %d tokens: %v", n, m)
		}
	}
	return t, nil
}

// checkAnswer verifies the invariants of one /query answer for n queried tokens: tiers
// cumulative and bounded, longest_matched == disk, instance tiers the max over ranks, and
// dp[r] the device count of rank r.
func checkAnswer(resp map[string]any, n int) (nonZero bool, err error) {
	insts, ok := resp["instances"].(map[string]any)
	if !ok || len(resp) != 1 {
		return false, fmt.Errorf("bad response %v", resp)
	}
	for id, v := range insts {
		inst, ok := v.(map[string]any)
		if !ok || len(inst) != 7 {
			return false, fmt.Errorf("%s: bad instance %v", id, v)
		}
		tiers, err := tiersOf(inst, n)
		if err != nil {
			return false, fmt.Errorf("%s: %w", id, err)
		}
		if lm, _ := toInt(inst["longest_matched"]); lm != tiers[3] {
			return false, fmt.Errorf("%s: longest_matched %d != disk %d", id, lm, tiers[3])
		}
		dp, ok1 := inst["dp"].(map[string]any)
		rm, ok2 := inst["rank_matches"].(map[string]any)
		if !ok1 || !ok2 || len(dp) != len(rm) || len(rm) == 0 {
			return false, fmt.Errorf("%s: dp %v / rank_matches %v", id, inst["dp"], inst["rank_matches"])
		}
		var max [4]int64
		for rank, rv := range rm {
			rmap, ok := rv.(map[string]any)
			if !ok || len(rmap) != 4 {
				return false, fmt.Errorf("%s rank %s: %v", id, rank, rv)
			}
			rt, err := tiersOf(rmap, n)
			if err != nil {
				return false, fmt.Errorf("%s rank %s: %w", id, rank, err)
			}
			if d, ok := toInt(dp[rank]); !ok || d != rt[0] {
				return false, fmt.Errorf("%s: dp[%s] = %v, rank device %d", id, rank, dp[rank], rt[0])
			}
			for i := range rt {
				max[i] = maxI64(max[i], rt[i])
			}
		}
		if max != tiers {
			return false, fmt.Errorf("%s: tiers %v are not the max over ranks %v", id, tiers, max)
		}
		nonZero = nonZero || tiers[3] > 0
	}
	return nonZero, nil
}

func maxI64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// TestConcurrentQueriesEventsAndRegistrations: 8 HTTP clients query while three
// publishers stream stores and removals and a fourth service registers and unregisters in
// a loop. Every answer must be a 200 that keeps the tier invariants.
func TestConcurrentQueriesEventsAndRegistrations(t *testing.T) {
	app := startApp(t, false)
	pubA0, pubA1, pubS, pubC := newPublisher(t, false), newPublisher(t, false), newPublisher(t, false), newPublisher(t, false)
	sglProfile := profileMap("sglang", "sha256_raw", "", "first64_be")
	for _, body := range [][]byte{
		registerBody(pubA0.Endpoint(), "engine-a", 0),
		registerBody(pubA1.Endpoint(), "engine-a", 1),
		registerBody(pubS.Endpoint(), "engine-s", 0, "type", "SGLang", "modelname", "sg", "block_size", 4, "hash_profile", sglProfile),
	} {
		mustRegister(t, app, "", body)
	}
	for _, p := range []interface {
		WaitSubscribers(int, time.Duration) error
	}{pubA0, pubA1, pubS} {
		if err := p.WaitSubscribers(1, time.Minute); err != nil {
			t.Fatal(err)
		}
	}

	vTokens := seqTokens(128, 1000) // 8 vLLM blocks
	vKeys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", vTokens)
	sTokens := seqTokens(42, 7) // 11 SGLang blocks, the last one partial
	sKeys := blockKeys(t, "sglang", "sha256_raw", "", "first64_be", 4, "", "", sTokens)

	// Seed every source so that the storm starts with hits to lose and regain.
	if _, err := pubA0.Publish(vllmBatch(0, stored(vKeys, "GPU"))); err != nil {
		t.Fatal(err)
	}
	if _, err := pubS.Publish(vllmBatch(0, sglangStored(sKeys, "DISK"), sglangStored(sKeys[:5], "CPU_PINNED"), sglangStored(sKeys[:2], "GPU"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "seeded hits", func() error {
		_, r := msgpackPost(t, app, "/query", queryBody("sg", 4, sTokens))
		if d := tierOf(t, hits(t, r), "engine-s", "disk"); d != 42 {
			return errf("sglang disk = %d", d)
		}
		_, r = msgpackPost(t, app, "/query", queryBody("m", 16, vTokens))
		if d := tierOf(t, hits(t, r), "engine-a", "device"); d != 128 {
			return errf("vllm device = %d", d)
		}
		return nil
	})

	// The storm is bounded by work, not by time: each publisher sends stormBatches
	// batches, the churn runs stormCycles register/unregister cycles and waits, while
	// engine-c is registered, for queriesPerCycle answers; the query clients run until
	// both are done. A loaded machine makes it slower, never different.
	const (
		stormBatches    = 300
		stormCycles     = 20
		queriesPerCycle = 4
	)
	stop, failed := make(chan struct{}), make(chan struct{})
	var firstErr atomic.Pointer[error]
	var failOnce sync.Once
	fail := func(err error) {
		firstErr.CompareAndSwap(nil, &err)
		failOnce.Do(func() { close(failed) })
	}
	var workers, clients sync.WaitGroup
	var published, cycles, queries, nonZero atomic.Int64
	// answered gets a token per answered query (dropped when nobody waits for one).
	answered := make(chan struct{}, 64)

	// Publishers: random prefixes stored and random blocks removed, on every medium.
	streamer := func(seed uint64, publish func(rng *rand.Rand) error) {
		defer workers.Done()
		rng := rand.New(rand.NewPCG(seed, 1))
		for range stormBatches {
			select {
			case <-failed:
				return
			default:
			}
			if err := publish(rng); err != nil {
				fail(err)
				return
			}
			published.Add(1)
		}
	}
	vllmStream := func(pub interface{ Publish([]byte) (uint64, error) }, dp int) func(*rand.Rand) error {
		return func(rng *rand.Rand) error {
			n := 1 + rng.IntN(len(vKeys))
			i := rng.IntN(len(vKeys))
			_, err := pub.Publish(vllmBatch(dp, stored(vKeys[:n], "gpu"), removed(vKeys[i:i+1], "GPU")))
			return err
		}
	}
	media := []string{"GPU", "CPU_PINNED", "CPU", "DISK"}
	workers.Add(4)
	go streamer(1, vllmStream(pubA0, 0))
	go streamer(2, vllmStream(pubA1, 1))
	go streamer(3, vllmStream(pubC, 0))
	go streamer(4, func(rng *rand.Rand) error {
		n := 1 + rng.IntN(len(sKeys))
		i := rng.IntN(len(sKeys))
		_, err := pubS.Publish(vllmBatch(0, sglangStored(sKeys[:n], media[rng.IntN(4)]),
			sglangRemoved(sKeys[i:i+1], media[rng.IntN(4)])))
		return err
	})

	// Churn: engine-c joins and leaves context "m" over and over, each time staying
	// registered until queriesPerCycle queries have been answered.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	workers.Add(1)
	go func() {
		defer workers.Done()
		reg := registerBody(pubC.Endpoint(), "engine-c", 0)
		unreg := mp("instance_id", "engine-c", "dp_rank", 0)
		for range stormCycles {
			if code, resp, err := postRaw(client, app.HTTPAddr, "/register", reg); err != nil || code != http.StatusOK {
				fail(fmt.Errorf("churn register: %d %v %v", code, resp, err))
				return
			}
			for drained := false; !drained; { // answers from before the registration do not count
				select {
				case <-answered:
				default:
					drained = true
				}
			}
			for range queriesPerCycle {
				select {
				case <-answered:
				case <-failed:
					return
				}
			}
			if code, resp, err := postRaw(client, app.HTTPAddr, "/unregister", unreg); err != nil || code != http.StatusOK {
				fail(fmt.Errorf("churn unregister: %d %v %v", code, resp, err))
				return
			}
			cycles.Add(1)
		}
	}()

	// 8 query clients, each mixing contexts, encodings, filters and the read-only views.
	for c := range 8 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 2))
			for {
				select {
				case <-stop:
					return
				case <-failed:
					return
				default:
				}
				var body []byte
				var n int
				switch rng.IntN(6) {
				case 0, 1:
					n = rng.IntN(len(vTokens) + 1)
					body = queryBody("m", 16, vTokens[:n])
				case 2:
					n = len(vTokens)
					bin := make([]byte, 0, 4*n)
					for _, v := range vTokens {
						bin = append(bin, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
					}
					body = mp("model", "m", "block_size", 16, "token_ids", bin, "instance_id", "engine-c")
				case 3, 4:
					n = rng.IntN(len(sTokens) + 1)
					body = queryBody("sg", 4, sTokens[:n])
				default:
					path := "/services"
					if rng.IntN(2) == 0 {
						path = "/global_view"
					}
					resp, err := client.Get("http://" + app.HTTPAddr + path)
					if err != nil {
						fail(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						fail(fmt.Errorf("GET %s: %d", path, resp.StatusCode))
						return
					}
					continue
				}
				code, resp, err := postRaw(client, app.HTTPAddr, "/query", body)
				if err != nil || code != http.StatusOK {
					fail(fmt.Errorf("query: %d %v %v", code, resp, err))
					return
				}
				nz, err := checkAnswer(resp, n)
				if err != nil {
					fail(err)
					return
				}
				queries.Add(1)
				if nz {
					nonZero.Add(1)
				}
				select {
				case answered <- struct{}{}:
				default:
				}
			}
		}()
	}

	workers.Wait()
	close(stop)
	clients.Wait()
	if e := firstErr.Load(); e != nil {
		t.Fatal(*e)
	}
	t.Logf("%d queries (%d with hits), %d batches published, %d register/unregister cycles",
		queries.Load(), nonZero.Load(), published.Load(), cycles.Load())
	if queries.Load() < stormCycles*queriesPerCycle || nonZero.Load() == 0 || cycles.Load() != stormCycles ||
		published.Load() != 4*stormBatches {
		t.Errorf("the storm did not exercise everything: queries %d, with hits %d, cycles %d, batches %d",
			queries.Load(), nonZero.Load(), cycles.Load(), published.Load())
	}

	// Quiesced: engine-c is gone and the index still answers consistently.
	if _, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil); asInt(t, svcs["count"]) != 3 {
		t.Errorf("services after churn = %v", svcs)
	}
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, vTokens))
	if _, ok := hits(t, r)["engine-c"]; ok {
		t.Errorf("engine-c still answers after its last unregister: %v", r)
	}
	if _, err := checkAnswer(r, len(vTokens)); err != nil {
		t.Error(err)
	}
}
