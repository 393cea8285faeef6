package pulse

import (
	"testing"
	"time"
)

// TestNext: the pulse's state through a run of ticks, 3 idle ticks to stop.
func TestNext(t *testing.T) {
	// Per tick: 'q' if a query came since the tick before, else '.'; then the idle
	// count and whether to stop after it.
	const ticks, idles, stops = "q..q...", "0120123", "......s"
	idle := 0
	for i := range ticks {
		var stop bool
		idle, stop = next(idle, ticks[i] == 'q', 3)
		if idle != int(idles[i]-'0') || stop != (stops[i] == 's') {
			t.Fatalf("after ticks %q: idle %d, stop %v; want %c, %c", ticks[:i+1], idle, stop, idles[i], stops[i])
		}
	}
	if _, stop := next(0, false, 1); !stop {
		t.Fatal("one idle tick of one does not stop")
	}
}

// stepped is a pulse on a ticker the test drives: tick sends one tick and returns once
// the goroutine has taken it in; exited receives when the goroutine returns.
type stepped struct {
	*Pulse
	ticks   chan time.Time
	stops   chan struct{}
	took    chan struct{}
	exited  chan struct{}
	t       *testing.T
	stopped int
}

// newStepped returns a stepped pulse that stops after 3 ticks without a query.
func newStepped(t *testing.T) *stepped {
	s := &stepped{ticks: make(chan time.Time), stops: make(chan struct{}, 16), took: make(chan struct{}, 1),
		exited: make(chan struct{}, 16), t: t}
	s.Pulse = New(Config{Interval: IdleAfter / 3, Ticker: func(time.Duration) (<-chan time.Time, func()) {
		return s.ticks, func() { s.stops <- struct{}{} }
	}})
	if s.idleTicks != 3 {
		t.Fatalf("idleTicks %d, want 3", s.idleTicks)
	}
	s.afterTick = func() { s.took <- struct{}{} }
	s.onExit = func() { s.exited <- struct{}{} }
	t.Cleanup(s.Close)
	return s
}

func (s *stepped) tick() {
	s.t.Helper()
	s.ticks <- time.Time{}
	<-s.took
}

// exit waits for the goroutine to return and checks that it stopped its ticker.
func (s *stepped) exit() {
	s.t.Helper()
	<-s.exited
	<-s.stops
}

// noExit fails if the goroutine returned since the last exit.
func (s *stepped) noExit(why string) {
	s.t.Helper()
	select {
	case <-s.exited:
		s.t.Fatal(why)
	default:
	}
}

func (s *stepped) want(starts, ticks uint64, running bool) {
	s.t.Helper()
	if st := s.Stats(); st != (Stats{Starts: starts, Ticks: ticks, Running: running}) {
		s.t.Fatalf("stats %+v, want starts %d ticks %d running %v", st, starts, ticks, running)
	}
}

func TestPulseRunsWhileQueriesComeAndStopsWhenIdle(t *testing.T) {
	s := newStepped(t)
	s.want(0, 0, false)
	s.Beat()
	s.want(1, 0, true)
	s.Beat() // running: starts nothing more
	s.tick() // a query came: not idle
	for range 2 {
		s.tick() // idle 1, 2
	}
	s.Beat()
	s.tick() // the query resets the count
	s.want(1, 4, true)
	for range 2 {
		s.tick()
	}
	s.want(1, 6, true)
	s.tick() // the third idle tick stops it
	s.exit()
	s.want(1, 7, false)

	// The next query starts it again; Close stops it and nothing starts after.
	s.Beat()
	s.want(2, 7, true)
	s.tick()
	s.Close()
	s.exit()
	s.Beat()
	s.want(2, 8, false)
	s.noExit("a goroutine ran after Close")
}

// A query whose Beat saw the pulse running just before it marked itself stopped: the
// goroutine finds the query and goes on.
func TestPulseQueryBeforeStopKeepsItRunning(t *testing.T) {
	s := newStepped(t)
	s.Beat()
	s.beforeStop = func() { s.Beat() } // running is still set: this Beat only marks seen
	for range 4 {
		s.tick() // the first takes the Beat in; the fourth would stop it
	}
	s.beforeStop = nil
	s.want(1, 4, true)
	s.noExit("the pulse stopped with a query pending")
	// It takes the query in and counts idle ticks from zero again.
	for range 3 {
		s.tick()
	}
	s.want(1, 7, true)
	s.tick()
	s.exit()
	s.want(1, 8, false)
}

// A query whose Beat saw the pulse stopped, before the goroutine looked again: the Beat
// starts a new goroutine and the old one returns, so exactly one runs.
func TestPulseQueryAfterStopStartsOneGoroutine(t *testing.T) {
	s := newStepped(t)
	s.Beat()
	s.beforeRecheck = func() { s.Beat() }
	for range 4 {
		s.tick()
	}
	s.beforeRecheck = nil
	s.exit() // the old goroutine
	s.want(2, 4, true)
	// The new one takes the query in on its first tick, and stops after three idle ones.
	for range 4 {
		s.tick()
	}
	s.exit()
	s.want(2, 8, false)
	s.noExit("two goroutines ran")
}

func TestPulseDisabled(t *testing.T) {
	var p *Pulse = New(Config{})
	if p != nil {
		t.Fatal("New with no interval returned a pulse")
	}
	p.Beat()
	p.Close()
	if p.Stats() != (Stats{}) {
		t.Fatal("a nil pulse has stats")
	}
	if q := New(Config{Interval: 2 * IdleAfter}); q.idleTicks != 1 {
		t.Fatalf("interval above IdleAfter: idleTicks %d, want 1", q.idleTicks)
	}
}

// The real ticker: the pulse ticks and Close returns with its goroutine gone.
func TestPulseRealTicker(t *testing.T) {
	p := New(Config{Interval: time.Millisecond})
	exited := make(chan struct{})
	ticked := make(chan struct{}, 1)
	p.onExit = func() { close(exited) }
	p.afterTick = func() {
		select {
		case ticked <- struct{}{}:
		default:
		}
	}
	p.Beat()
	<-ticked
	p.Close()
	<-exited
	if st := p.Stats(); st.Starts != 1 || st.Ticks == 0 || st.Running {
		t.Fatalf("stats %+v", st)
	}
}

// A Beat racing Close, after the pulse stopped by itself: either the Beat starts a
// goroutine before Close, and Close waits for it, or it starts none.
func TestPulseBeatRacingClose(t *testing.T) {
	s := newStepped(t)
	s.Beat()
	for range 4 {
		s.tick()
	}
	s.exit()
	done := make(chan struct{})
	go func() {
		s.Beat()
		close(done)
	}()
	s.Close()
	<-done
	switch starts := s.Stats().Starts; starts {
	case 1:
	case 2:
		select {
		case <-s.exited: // it returned before Close did
		default:
			t.Fatal("a goroutine outlived Close")
		}
	default:
		t.Fatalf("%d starts", starts)
	}
	s.noExit("more goroutines returned than started")
	if s.Stats().Running {
		t.Fatal("running after Close")
	}
}
