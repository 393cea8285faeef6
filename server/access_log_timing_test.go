package server

import (
	"path/filepath"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/internal/accesslog"
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
			cfg.AccessLog = accesslog.Config{Path: filepath.Join(b.TempDir(), "access.log")}
		}
		app, err := Start(cfg)
		if err != nil {
			b.Fatal(err)
		}
		defer app.Stop()
		fillInstances(b, app, 8, tokens)
		apps[i] = app
	}
	lat := alternateQueries(b, apps, body, func(h *fasthttp.RequestHeader) {
		h.Set("x-trace-id", "0af7651916cd43dd8448eb211c80319c")
	})
	reportOnOff(b, lat)
	if d := apps[0].AccessLog.Dropped(); d != 0 {
		b.Errorf("%d access log lines dropped", d)
	}
}
