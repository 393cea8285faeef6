package zmqtransport

import (
	"testing"
	"time"
)

// steppedTrimmer is a trimmer whose delay the test ends by hand: asked says that run is
// waiting out trimDelay (fire ends it), trimmed that it trimmed.
type steppedTrimmer struct {
	*trimmer
	asked   chan time.Duration
	fire    chan time.Time
	trimmed chan struct{}
}

// newSteppedTrimmer starts one; the caller closes it.
func newSteppedTrimmer() *steppedTrimmer {
	st := &steppedTrimmer{asked: make(chan time.Duration, 1), fire: make(chan time.Time), trimmed: make(chan struct{}, 1)}
	st.trimmer = newTrimmer(func() { st.trimmed <- struct{}{} }, func(d time.Duration) <-chan time.Time {
		st.asked <- d
		return st.fire
	})
	go st.run()
	return st
}

// TestTrimmerTrimsOnceAfterEnoughBytes: bytes below trimAfterBytes ask for nothing; once
// they add up to it, one trim follows trimDelay later, requests made meanwhile included,
// and the count starts again from zero.
func TestTrimmerTrimsOnceAfterEnoughBytes(t *testing.T) {
	st := newSteppedTrimmer()
	defer st.close()
	st.note(trimAfterBytes - 1)
	st.note(0)
	if len(st.kick) != 0 {
		t.Fatal("asked for a trim below trimAfterBytes")
	}
	st.note(1)
	if d := <-st.asked; d != trimDelay {
		t.Fatalf("waits %v, want %v", d, trimDelay)
	}
	// More bursts while it waits: still one trim.
	st.note(trimAfterBytes)
	st.note(trimAfterBytes)
	select {
	case <-st.trimmed:
		t.Fatal("trimmed before the delay ended")
	default:
	}
	st.fire <- time.Time{}
	<-st.trimmed
	if p := st.pending.Load(); p != 0 || len(st.kick) != 0 {
		t.Fatalf("after the trim: %d bytes pending, %d requests", p, len(st.kick))
	}
	// The next trim needs trimAfterBytes again.
	st.note(trimAfterBytes / 2)
	if len(st.kick) != 0 {
		t.Fatal("asked for a trim with half the bytes")
	}
	st.note(trimAfterBytes / 2)
	<-st.asked
	st.fire <- time.Time{}
	<-st.trimmed
	if n := st.trims.Load(); n != 2 {
		t.Fatalf("%d trims, want 2", n)
	}
}

// TestTrimmerCloseWhileWaiting: close ends a wait without trimming.
func TestTrimmerCloseWhileWaiting(t *testing.T) {
	st := newSteppedTrimmer()
	st.note(trimAfterBytes)
	<-st.asked
	st.close()
	if n := st.trims.Load(); n != 0 || len(st.trimmed) != 0 {
		t.Fatalf("%d trims after close", n)
	}
}
