package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/conductor-go/conductor/internal/pulse"
)

// TestBinaryQueryPulse: the spawned binary's query pulse (query_pulse_ms, default on)
// starts with the first query and not before (an idle conductor has no wake-ups),
// stops by itself once queries stop, after at least a second's worth of ticks, and
// starts again with the next query; with query_pulse_ms 0 there is none.
func TestBinaryQueryPulse(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("on=%v", on), func(t *testing.T) {
			var extra map[string]any
			if !on {
				extra = map[string]any{"query_pulse_ms": 0}
			}
			_, c, base := startWithPublisherConfig(t, extra)
			metric := func(name string) float64 {
				v, found := metricSum(t, base, name)
				if found != on {
					t.Fatalf("%s exported: %v, want %v", name, found, on)
				}
				return v
			}
			ask := func() {
				if code, resp := call(t, http.MethodPost, base+"/query", queryBody(tokenRun(1, 64))); code != http.StatusOK {
					t.Fatalf("/query: %d %v", code, resp)
				}
			}
			if s, r := metric("conductor_query_pulse_starts_total"), metric("conductor_query_pulse_running"); s != 0 || r != 0 {
				t.Fatalf("before any query: %v starts, running %v", s, r)
			}
			ask()
			if !on {
				c.terminate()
				return
			}
			// The query's Beat precedes its answer.
			if s := metric("conductor_query_pulse_starts_total"); s != 1 {
				t.Fatalf("after a query: %v starts, want 1", s)
			}
			c.waitFor("the pulse to stop", func() error {
				if r := metric("conductor_query_pulse_running"); r != 0 {
					return fmt.Errorf("running %v", r)
				}
				return nil
			})
			// It stops only after a second without queries, a second's worth of ticks.
			if n, want := metric("conductor_query_pulse_ticks_total"), float64(pulse.IdleAfter/pulse.DefaultInterval); n < want {
				t.Fatalf("stopped after %v ticks, want at least %v", n, want)
			}
			ask()
			if s := metric("conductor_query_pulse_starts_total"); s != 2 {
				t.Fatalf("a query after the pulse stopped: %v starts, want 2", s)
			}
			c.terminate()
		})
	}
}
