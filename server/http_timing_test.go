package server

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tinylib/msgp/msgp"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
)

// BenchmarkQueryHandler measures one /query in-process (no sockets): the fasthttp handler
// (decode, hash, walk, encode) next to engine.Query alone (hash + walk) on the same index,
// 8 instances holding the prompt, block size 16. handler minus engine is the handler's
// own overhead (decode + encode), which should stay small next to hashing + walk.
func BenchmarkQueryHandler(b *testing.B) {
	app := startWith(b, AppConfig{RPCPort: -1, DisableMetrics: true})
	full := seqTokens(32768, 1)
	fillInstances(b, app, 8, full)
	// Prompts of real shape, indexed too: ids of a 151,936-id vocabulary at random, and
	// the conductor-bench --mixed-widths mix.
	vocab := vocabTokens(32768, 1)
	fillInstances(b, app, 8, vocab)
	mixed := mixedWidthTokens(vocabTokens(32768, 2))
	fillInstances(b, app, 8, mixed)
	h := app.HTTP.Handler()
	run := func(b *testing.B, body []byte) {
		var ctx fasthttp.RequestCtx
		setPost(&ctx, "/query", body)
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			serveOK(b, h, &ctx)
		}
	}
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
				b.Run(name+"/handler-"+enc, func(b *testing.B) { run(b, body) })
			}
			// The real shapes: the half and miss prompts differ from the indexed one by
			// other ids of the vocabulary (not by negative ones, which no client sends).
			// "python" is Python msgpack's unsigned forms, "go" Go msgp's signed ones
			// (conductor-bench's default array encoding), "mixed" the --mixed-widths
			// prompt in unsigned forms.
			vt := realShape(vocab[:n], shape, 3)
			mt := realShape(mixed[:n], shape, 4)
			for _, c := range []struct {
				enc  string
				body []byte
			}{
				{"bin-vocab", binQuery(vt)},
				{"array-python", arrayQuery(vt, false)},
				{"array-go", arrayQuery(vt, true)},
				{"array-mixed", arrayQuery(mt, false)},
			} {
				b.Run(name+"/handler-"+c.enc, func(b *testing.B) { run(b, c.body) })
			}
		}
	}
}

// vocabTokens is n token ids drawn uniformly from a 151,936-id vocabulary (Qwen2's).
func vocabTokens(n int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 151936))
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(r.IntN(151936))
	}
	return t
}

// mixedWidthTokens maps ids so that their array encodings mix positive fixint (20%),
// uint16 (50%) and uint32 (30%) element by element, like conductor-bench --mixed-widths.
func mixedWidthTokens(t []int32) []int32 {
	out := make([]int32, len(t))
	for i, v := range t {
		switch v % 10 {
		case 0, 1:
			out[i] = v % 128
		case 2, 3, 4, 5, 6:
			out[i] = 128 + v%65000
		default:
			out[i] = 65536 + v%86000
		}
	}
	return out
}

// realShape is a copy of an indexed prompt shaped as hit (unchanged), half (its second
// half replaced by other ids) or miss (all of it replaced), the new ids from seed.
func realShape(indexed []int32, shape string, seed uint64) []int32 {
	t := append([]int32(nil), indexed...)
	from := len(t)
	switch shape {
	case "half":
		from = len(t) / 2
	case "miss":
		from = 0
	}
	other := vocabTokens(len(t), seed)
	for i := from; i < len(t); i++ {
		t[i] = other[i]
	}
	return t
}

// arrayQuery is a /query body whose token_ids is an array in Go msgp's signed forms
// (signed) or Python msgpack's unsigned ones.
func arrayQuery(tokens []int32, signed bool) []byte {
	b := msgp.AppendArrayHeader(queryHead("token_ids"), uint32(len(tokens)))
	for _, v := range tokens {
		if signed {
			b = msgp.AppendInt32(b, v)
		} else {
			b = msgp.AppendUint32(b, uint32(v))
		}
	}
	return b
}

// TestQueryArrayOfRealShape: 8K-token prompts of real shape (random ids of a 152K
// vocabulary, the --mixed-widths mix) sent as Python (unsigned) and Go (signed) int
// arrays get the same response as the same prompt as a bin, for a full hit, a half hit
// and a miss, and a query allocates nothing once its pooled buffers have grown.
func TestQueryArrayOfRealShape(t *testing.T) {
	app := startWith(t, AppConfig{RPCPort: -1, DisableMetrics: true})
	vocab := vocabTokens(8192, 11)
	mixed := mixedWidthTokens(vocabTokens(8192, 12))
	fillInstances(t, app, 4, vocab)
	fillInstances(t, app, 4, mixed)
	h := app.HTTP.Handler()
	var ctx fasthttp.RequestCtx
	ask := func(body []byte) []byte {
		ctx.Request.Reset()
		ctx.Response.Reset()
		setPost(&ctx, "/query", body)
		return serveOK(t, h, &ctx)
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
