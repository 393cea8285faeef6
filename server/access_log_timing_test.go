package server

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkQueryAccessLogOnOff measures /query over loopback HTTP (8 instances holding a
// 2K-token prefix, full hit) against two conductors in one process, one writing the
// access log to a file and one without, alternating requests so both see the same
// machine noise. The p50/p99 difference is the access log's cost on the query path.
func BenchmarkQueryAccessLogOnOff(b *testing.B) {
	tokens := seqTokens(2048, 1)
	body := binQuery(tokens)
	var apps [2]*App
	for i, on := range []bool{true, false} {
		cfg := AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger()}
		if on {
			cfg.AccessLog = AccessLogConfig{Path: filepath.Join(b.TempDir(), "access.log")}
		}
		app, err := Start(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer app.Stop()
		fillInstances(b, app, 8, tokens)
		apps[i] = app
	}
	client := &fasthttp.Client{}
	var lat [2][]time.Duration
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	do := func(i int) time.Duration {
		req.SetRequestURI("http://" + apps[i].HTTPAddr + "/query")
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/msgpack")
		req.Header.Set("x-trace-id", "0af7651916cd43dd8448eb211c80319c")
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
	if b.N < 10 {
		return
	}
	b.ReportMetric(float64(percentile(lat[0], 0.5).Nanoseconds())/1e3, "p50-on-us")
	b.ReportMetric(float64(percentile(lat[1], 0.5).Nanoseconds())/1e3, "p50-off-us")
	b.ReportMetric(float64(percentile(lat[0], 0.99).Nanoseconds())/1e3, "p99-on-us")
	b.ReportMetric(float64(percentile(lat[1], 0.99).Nanoseconds())/1e3, "p99-off-us")
	if d := apps[0].AccessLog.Dropped(); d != 0 {
		b.Errorf("%d access log lines dropped", d)
	}
}
