package server

import (
	"strconv"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
)

// BenchmarkQueryHandler measures one /query in-process (no sockets): the fasthttp handler
// (decode, hash, walk, encode) next to engine.Query alone (hash + walk) on the same index,
// 8 instances holding the prompt, block size 16. handler minus engine is the handler's
// own overhead (decode + encode), which should stay small next to hashing + walk.
func BenchmarkQueryHandler(b *testing.B) {
	app, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(), DisableMetrics: true})
	if err != nil {
		b.Fatal(err)
	}
	defer app.Stop()
	full := seqTokens(32768, 1)
	fillInstances(b, app, 8, full)
	h := app.HTTP.Handler()
	for _, n := range []int{2048, 8192, 32768} {
		for _, shape := range []string{"hit", "half", "miss"} {
			tokens := append([]int32(nil), full[:n]...)
			switch shape {
			case "half":
				for i := n / 2; i < n; i++ {
					tokens[i] = -tokens[i] - 7
				}
			case "miss":
				tokens[0] = -5
			}
			name := strconv.Itoa(n/1024) + "K-" + shape
			b.Run(name+"/engine", func(b *testing.B) {
				q := engine.Query{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Tokens: tokens}
				var res engine.Result
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if err := app.Engine.Query(&q, &res); err != nil || len(res.Instances) != 8 {
						b.Fatal(err)
					}
				}
			})
			for _, enc := range []string{"bin", "array"} {
				body := binQuery(tokens)
				if enc == "array" {
					body = queryBody("m", 16, tokens)
				}
				b.Run(name+"/handler-"+enc, func(b *testing.B) {
					var ctx fasthttp.RequestCtx
					ctx.Request.Header.SetMethod("POST")
					ctx.Request.SetRequestURI("/query")
					ctx.Request.Header.SetContentType("application/msgpack")
					ctx.Request.SetBody(body)
					b.ReportAllocs()
					for i := 0; i < b.N; i++ {
						h(&ctx)
						if ctx.Response.StatusCode() != 200 {
							b.Fatal(ctx.Response.StatusCode())
						}
					}
				})
			}
		}
	}
}
