package zmqtransport

import (
	"testing"
	"time"
)

// TestTrimmerTrimsOnceAfterEnoughBytes: bytes below trimAfterBytes ask for nothing; once
// they add up to it, one trim follows trimDelay later, requests made meanwhile included,
// and the count starts again from zero. (The delay's coalescing is package deferred's.)
func TestTrimmerTrimsOnceAfterEnoughBytes(t *testing.T) {
	asked := make(chan time.Duration, 1)
	fire := make(chan time.Time)
	trimmed := make(chan struct{}, 1)
	tm := newTrimmer(func() { trimmed <- struct{}{} }, func(d time.Duration) <-chan time.Time {
		asked <- d
		return fire
	})
	defer tm.close()
	noRequest := func(when string) {
		t.Helper()
		select {
		case d := <-asked:
			t.Fatalf("asked for a trim (delay %v) %s", d, when)
		default:
		}
	}
	tm.note(trimAfterBytes - 1)
	tm.note(0)
	noRequest("below trimAfterBytes")
	tm.note(1)
	if d := <-asked; d != trimDelay {
		t.Fatalf("waits %v, want %v", d, trimDelay)
	}
	tm.note(trimAfterBytes) // more of the burst while it waits: the same trim
	fire <- time.Time{}
	<-trimmed
	for tm.trims() != 1 { // counted once fn has returned
	}
	if p := tm.pending.Load(); p != 0 {
		t.Fatalf("%d bytes pending after the trim", p)
	}
	tm.note(trimAfterBytes / 2)
	noRequest("with half the bytes after a trim")
	tm.note(trimAfterBytes / 2)
	<-asked
	fire <- time.Time{}
	<-trimmed
}
