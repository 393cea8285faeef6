package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// TestQueryPulseHearsEveryQueryRoute: /query, /query_by_hash and the RPC Query call
// each start the pulse (query_pulse_ms); other routes do not. The interval is long
// enough that the pulse never ticks during the test.
func TestQueryPulseHearsEveryQueryRoute(t *testing.T) {
	for _, route := range []string{"/query", "/query_by_hash", "rpc Query", "/global_view"} {
		t.Run(route, func(t *testing.T) {
			app := startWith(t, AppConfig{QueryPulse: time.Hour})
			if s := app.pulse.Stats(); s.Starts != 0 || s.Running {
				t.Fatalf("before any request: %+v", s)
			}
			code := 0
			switch route {
			case "/query":
				code, _ = msgpackPost(t, app, route, queryBody("m", 16, seqTokens(32, 1)))
			case "/query_by_hash":
				code, _ = msgpackPost(t, app, route, mp("model", "m", "block_size", 16, "block_hashes", anys([]uint64{1, 2})))
			case "rpc Query":
				cl, ctx := dialRPC(t, app, 30*time.Second)
				var res cororpc.QueryResult
				rq := cororpc.QueryRequest{Context: cororpc.ContextKey{ModelName: "m", BlockSize: 16}, Tokens: seqTokens(32, 1)}
				if c, err := cl.Query(ctx, &rq, &res); err != nil || c != cororpc.CodeOK {
					t.Fatal(c, err)
				}
				code = http.StatusOK
			default:
				code, _ = httpGet(t, app, route)
			}
			if code != http.StatusOK {
				t.Fatalf("%s: %d", route, code)
			}
			want := uint64(1)
			if route == "/global_view" {
				want = 0
			}
			if s := app.pulse.Stats(); s.Starts != want || s.Running != (want == 1) {
				t.Fatalf("after %s: %+v, want %d starts", route, s, want)
			}
		})
	}
	// query_pulse_ms 0 (AppConfig's zero value): no pulse.
	app := startWith(t, AppConfig{})
	if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(32, 1))); code != http.StatusOK || app.pulse != nil {
		t.Fatalf("without a pulse: %d, pulse %v", code, app.pulse)
	}
}
