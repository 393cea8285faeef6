package server

import (
	"sort"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// fillInstances registers n vLLM slots in context (m, bs 16) and stores the prompt's blocks
// directly in the engine for each of them (the HTTP path is what is measured, not ingest).
func fillInstances(tb testing.TB, app *App, n int, tokens []int32) {
	tb.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		tb.Fatal(err)
	}
	key := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	keys := blockKeys(tb, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	for i := 0; i < n; i++ {
		slot := engine.Slot{InstanceID: "inst-" + string(rune('a'+i)), DPRank: 0}
		if _, err := app.Engine.RegisterSlot(key, p, slot); err != nil {
			tb.Fatal(err)
		}
		ops := []engine.Op{{Kind: engine.OpStore, Slot: slot, Tier: engine.TierDevice, Hashes: keys}}
		if err := app.Engine.Apply(key, ops); err != nil || ops[0].Err != nil {
			tb.Fatal(err, ops[0].Err)
		}
	}
}

// binQuery is a /query body (model m, block size 16) whose token_ids is a bin of
// little-endian uint32s.
func binQuery(tokens []int32) []byte {
	bin := make([]byte, 4*len(tokens))
	for i, v := range tokens {
		u := uint32(v)
		bin[4*i], bin[4*i+1], bin[4*i+2], bin[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return msgp.AppendBytes(queryHead("token_ids"), bin)
}

// queryHead starts a query body for model m and block size 16, up to its listKey key
// (token_ids of a /query, block_hashes of a /query_by_hash), whose value the caller
// appends.
func queryHead(listKey string) []byte {
	b := msgp.AppendMapHeader(nil, 3)
	b = msgp.AppendString(b, "model")
	b = msgp.AppendString(b, "m")
	b = msgp.AppendString(b, "block_size")
	b = msgp.AppendInt(b, 16)
	return msgp.AppendString(b, listKey)
}

func percentile(d []time.Duration, p float64) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(p*float64(len(d)-1))]
}

// BenchmarkQueryMetricsOnOff measures /query over loopback HTTP (8 instances holding a
// 2K-token prefix, full hit) against two conductors in one process, one with metrics and
// one without, alternating requests so both see the same machine noise. It reports p50 and
// p99 for each; the difference is the cost of metrics on the query path.
func BenchmarkQueryMetricsOnOff(b *testing.B) {
	tokens := seqTokens(2048, 1)
	body := binQuery(tokens)
	var apps [2]*App
	for i, disabled := range []bool{false, true} {
		app := startWith(b, AppConfig{RPCPort: -1, DisableMetrics: disabled})
		fillInstances(b, app, 8, tokens)
		apps[i] = app
	}
	reportOnOff(b, alternateQueries(b, apps, body, nil))
}

// alternateQueries posts body as /query to apps[0] and apps[1] in turn (after 200
// warm-up requests), b.N times each, with header adding its headers (nil: none), and
// returns each one's latencies.
func alternateQueries(b *testing.B, apps [2]*App, body []byte, header func(h *fasthttp.RequestHeader)) (lat [2][]time.Duration) {
	client := &fasthttp.Client{}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	do := func(i int) time.Duration {
		req.SetRequestURI("http://" + apps[i].HTTPAddr + "/query")
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/msgpack")
		if header != nil {
			header(&req.Header)
		}
		req.SetBody(body)
		start := time.Now()
		if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
			b.Fatalf("query: %v %d", err, resp.StatusCode())
		}
		return time.Since(start)
	}
	for i := 0; i < 200; i++ { // warm both servers and connections
		do(i % 2)
	}
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for i := 0; i < 2; i++ {
			lat[(n+i)%2] = append(lat[(n+i)%2], do((n+i)%2))
		}
	}
	b.StopTimer()
	return lat
}

// reportOnOff reports the p50 and p99 of both latency sets (on: lat[0], off: lat[1]),
// in µs, when there are enough of them.
func reportOnOff(b *testing.B, lat [2][]time.Duration) {
	if b.N < 10 {
		return
	}
	b.ReportMetric(float64(percentile(lat[0], 0.5).Nanoseconds())/1e3, "p50-on-us")
	b.ReportMetric(float64(percentile(lat[1], 0.5).Nanoseconds())/1e3, "p50-off-us")
	b.ReportMetric(float64(percentile(lat[0], 0.99).Nanoseconds())/1e3, "p99-on-us")
	b.ReportMetric(float64(percentile(lat[1], 0.99).Nanoseconds())/1e3, "p99-off-us")
}
