package deferred

import (
	"testing"
	"time"
)

// stepped is a Runner whose delays the test ends by hand: asked receives each delay run
// waits out (fire ends it), called each call of fn.
type stepped struct {
	*Runner
	asked  chan time.Duration
	fire   chan time.Time
	called chan struct{}
}

func startStepped(delay time.Duration) *stepped {
	s := &stepped{asked: make(chan time.Duration, 1), fire: make(chan time.Time), called: make(chan struct{}, 1)}
	s.Runner = StartWith(delay, func() { s.called <- struct{}{} }, func(d time.Duration) <-chan time.Time {
		s.asked <- d
		return s.fire
	})
	return s
}

func (s *stepped) notCalled(t *testing.T, when string) {
	t.Helper()
	select {
	case <-s.called:
		t.Fatalf("fn called %s", when)
	default:
	}
}

// TestRequestsCoalesceIntoOneCallAfterTheDelay: a request makes the runner wait out the
// delay, requests made meanwhile add nothing, fn runs once when the delay ends, and the
// next request starts over.
func TestRequestsCoalesceIntoOneCallAfterTheDelay(t *testing.T) {
	s := startStepped(time.Second)
	defer s.Close()
	s.Request()
	if d := <-s.asked; d != time.Second {
		t.Fatalf("waits %v, want 1s", d)
	}
	s.Request()
	s.Request()
	s.notCalled(t, "before the delay ended")
	s.fire <- time.Time{}
	<-s.called
	// Requests made before the call were served by it: none is left pending.
	if len(s.kick) != 0 || len(s.now) != 0 {
		t.Fatalf("%d requests left after the call", len(s.kick)+len(s.now))
	}
	s.Request()
	<-s.asked
	s.fire <- time.Time{}
	<-s.called
	s.Close()
	if n := s.Runs(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}

// TestNowSkipsTheDelay: Now calls fn without a delay, and ends the wait of a pending
// request.
func TestNowSkipsTheDelay(t *testing.T) {
	s := startStepped(time.Hour)
	defer s.Close()
	s.Now()
	<-s.called
	s.Request()
	<-s.asked
	s.Now()
	<-s.called
	s.notCalled(t, "twice")
}

// TestCloseDropsAPendingRequest: Close ends a wait without calling fn, and may be called
// again.
func TestCloseDropsAPendingRequest(t *testing.T) {
	s := startStepped(time.Hour)
	s.Request()
	<-s.asked
	s.Close()
	s.Close()
	s.notCalled(t, "after Close")
	if n := s.Runs(); n != 0 {
		t.Fatalf("%d runs after close", n)
	}
}
