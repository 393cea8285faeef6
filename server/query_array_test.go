package server

import (
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestQueryArrayOfRealShape: 8K-token prompts of real shape (random ids of a 152K
// vocabulary, the --mixed-widths mix) sent as Python (unsigned) and Go (signed) int
// arrays get the same response as the same prompt as a bin, for a full hit, a half hit
// and a miss, and a query allocates nothing once its pooled buffers have grown.
func TestQueryArrayOfRealShape(t *testing.T) {
	app, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(), DisableMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Stop()
	vocab := vocabTokens(8192, 11)
	mixed := mixedWidthTokens(vocabTokens(8192, 12))
	fillInstances(t, app, 4, vocab)
	fillInstances(t, app, 4, mixed)
	h := app.HTTP.Handler()
	var ctx fasthttp.RequestCtx
	ask := func(body []byte) []byte {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/query")
		ctx.Request.Header.SetContentType("application/msgpack")
		ctx.Request.SetBody(body)
		h(&ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
		return ctx.Response.Body()
	}
	for _, p := range []struct {
		name    string
		indexed []int32
	}{{"vocab", vocab}, {"mixed", mixed}} {
		answers := map[string][]byte{}
		for _, shape := range []string{"hit", "half", "miss"} {
			tokens := realShape(p.indexed, shape, 13)
			want := bytes.Clone(ask(binQuery(tokens)))
			answers[shape] = want
			for _, signed := range []bool{false, true} {
				body := arrayQuery(tokens, signed)
				if got := ask(body); !bytes.Equal(got, want) {
					t.Fatalf("%s %s (signed %v): array answer %x, bin answer %x", p.name, shape, signed, got, want)
				}
				if raceEnabled {
					continue // sync.Pool drops items at random under -race
				}
				if n := testing.AllocsPerRun(20, func() { ask(body) }); n != 0 {
					t.Errorf("%s %s (signed %v): %v allocs per /query", p.name, shape, signed, n)
				}
			}
		}
		// The three shapes are told apart: the index does hold the prompt.
		if bytes.Equal(answers["hit"], answers["half"]) || bytes.Equal(answers["half"], answers["miss"]) {
			t.Fatalf("%s: hit, half and miss answers are not all different", p.name)
		}
	}
}
