package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

// TestBinaryMemoGrowsAheadOfIndex: the binary's query key memo starts at its small
// default size, stays there while the index is small, and once the index holds more than
// two blocks per memo block a query makes the background grower take it to one memo block
// per four indexed blocks (conductor_query_memo_capacity_entries, and the log line).
func TestBinaryMemoGrowsAheadOfIndex(t *testing.T) {
	pub, c, base := startWithPublisher(t, "CONDUCTOR_LOG_LEVEL=info")
	capacity := func() float64 {
		v, _ := metricSum(t, base, "conductor_query_memo_capacity_entries")
		return v
	}
	query := queryBody(tokenRun(7, 16*16))
	ask := func() {
		if code, resp := call(t, http.MethodPost, base+"/query", query); code != http.StatusOK {
			t.Fatalf("/query: %d %v", code, resp)
		}
	}
	ask()
	if got := capacity(); got != hashing.DefaultMemoStart {
		t.Fatalf("fresh memo capacity %v, want %d", got, hashing.DefaultMemoStart)
	}
	// 620,000 blocks: past four indexed blocks per memo block (4 x 131,072).
	const blocks, perBatch = 620_000, 10_000
	keys := make([]uint64, perBatch)
	for sent := 0; sent < blocks; sent += perBatch {
		for i := range keys {
			keys[i] = uint64(sent+i)*0x9E3779B97F4A7C15 | 1
		}
		if _, err := pub.Publish(vllmBatch(keys)); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor("the blocks indexed", func() error {
		if v, _ := metricSum(t, base, "conductor_context_blocks"); v != blocks {
			return fmt.Errorf("%v blocks", v)
		}
		return nil
	})
	want := float64(hashing.DefaultMemoStart * 2) // blocks/2 rounded up to a power of two
	c.waitFor("the memo grown ahead of the index", func() error {
		ask() // a query that hashes asks for it
		if got := capacity(); got != want {
			return fmt.Errorf("capacity %v, want %v", got, want)
		}
		return nil
	})
	// The grower logs the step after publishing the table that the metric reports.
	c.waitFor("the growth logged", func() error {
		if !strings.Contains(c.out.String(), "query key memo grew") {
			return errors.New("no \"query key memo grew\" line yet")
		}
		return nil
	})
	c.terminate()
}

// TestBinaryMemoSecondSight: by default the binary's memo remembers a prompt from its
// second ask: the first is hashed without it (every block a miss, no hit), the second
// looks it up and remembers its runs, the third takes them from the memo. With
// query_memo_second_sight false, the second ask is already served. A new prompt that
// shares a remembered first run is served it on its own first ask.
func TestBinaryMemoSecondSight(t *testing.T) {
	for _, second := range []bool{true, false} {
		t.Run(fmt.Sprintf("second_sight=%v", second), func(t *testing.T) {
			var extra map[string]any
			if !second {
				extra = map[string]any{"query_memo_second_sight": false}
			}
			pub, c, base := startWithPublisherConfig(t, extra)
			prompt := tokenRun(1000, 16*20) // 20 blocks: two whole runs of 8
			if _, err := pub.Publish(vllmBatch(vllmKeys(t, prompt))); err != nil {
				t.Fatal(err)
			}
			// Indexed, seen through the metrics: a query would be a sight of the prompt.
			c.waitFor("the prompt indexed", func() error {
				if v, _ := metricSum(t, base, "conductor_context_blocks"); v != 20 {
					return fmt.Errorf("%v blocks", v)
				}
				return nil
			})
			hits := func() float64 {
				v, _ := metricSum(t, base, "conductor_query_memo_hits_total")
				return v
			}
			ask := func(tokens []int32) {
				code, resp := call(t, http.MethodPost, base+"/query", queryBody(tokens))
				if inst, _ := resp["instances"].(map[string]any)["engine-a"].(map[string]any); code != http.StatusOK || inst == nil {
					t.Fatalf("/query: %d %v", code, resp)
				}
			}
			ask(prompt) // its first sight
			if got := hits(); got != 0 {
				t.Fatalf("memo hits after the first asks: %v", got)
			}
			ask(prompt)
			wantSecond := 16.0 // both runs
			if second {
				wantSecond = 0
			}
			if got := hits(); got != wantSecond {
				t.Fatalf("memo hits after asking again: %v, want %v", got, wantSecond)
			}
			ask(prompt)
			if got := hits(); got != wantSecond+16 {
				t.Fatalf("memo hits after the third ask: %v, want %v", got, wantSecond+16)
			}
			// A new prompt sharing the first run (a system prompt's, say) takes that run
			// from the memo on its own first ask (its other blocks are not indexed: the
			// walk stops at block 8).
			before := hits()
			ask(append(append([]int32{}, prompt[:16*8]...), tokenRun(5000, 16*12)...))
			if got := hits() - before; got != 8 {
				t.Fatalf("a new prompt sharing a remembered first run: %v hits on its first ask, want 8", got)
			}
			c.terminate()
		})
	}
}
