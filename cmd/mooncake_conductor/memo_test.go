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
