package syncbuf

import (
	"fmt"
	"sync"
	"testing"
)

// TestBufferConcurrentWrites: lines written by several goroutines while another reads
// all arrive whole (run under -race).
func TestBufferConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(&b, "line %d-%d\n", w, i)
			}
		})
	}
	wg.Go(func() {
		for range 100 {
			_ = b.Count("line")
		}
	})
	wg.Wait()
	if n := b.Count("line "); n != 400 {
		t.Fatalf("%d lines, want 400", n)
	}
	if n := b.Count("line 3-99\n"); n != 1 {
		t.Fatalf("line 3-99 appears %d times", n)
	}
}
