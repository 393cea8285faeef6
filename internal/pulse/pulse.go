// Package pulse keeps a timer firing while queries arrive, and none while they do not.
//
// Why: on a VM whose vCPUs halt when idle, a lone client's queries cost more when the
// Go scheduler serves them all on one thread: it sleeps in the network poller between
// requests and each request wakes it, and the client after it, from a halted vCPU. A
// timer that fires now and then readies a goroutine, which starts a second thread;
// from then on the runtime's threads take turns at the poller.
//
// Measured on a 2-vCPU VM (conductor-bench load, one client, 8K-token prompts, CPUs
// free to idle, token arrays): without the pulse one thread served every query and the
// kernel migrated the process's threads ~9 times a second; with a 10 ms pulse three
// threads took turns and were migrated ~65 times a second, the p50 of a miss fell from
// 109 to 56 us, its server CPU from 43.2 to 37.5 us and a full hit's from 56.4 to 49.8 us
// (with binary tokens the CPU did not change). 50 ms, the default (20 wake-ups a second
// while busy), measured as well or better: against a193c11, whose idle subscribers
// still polled, a miss's CPU 37.5 -> 34.5 us (p50 83 -> 45 us) and a
// full hit's 53.0 -> 47.9 us; 5 ms and 2 ms measured worse (2 ms: 30% more CPU). The
// runs and their commands are in docs/performance.md. Until issue 27 the idle
// subscribers' 100 ms polls did this by accident, and at all times; the pulse runs only
// while there is traffic, so an idle conductor has no wake-ups at all.
//
// Beat is called once per query and costs two atomic loads while the pulse runs; the
// first query after a quiet spell starts the goroutine, which stops by itself once
// IdleAfter passed without a query.
package pulse

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultInterval is the pulse's period (query_pulse_ms).
const DefaultInterval = 50 * time.Millisecond

// IdleAfter is how long the pulse keeps firing after the last query.
const IdleAfter = time.Second

// Pulse is the timer; its zero value is not usable: call New. A nil *Pulse does
// nothing, so servers built without one call Beat freely.
type Pulse struct {
	interval  time.Duration
	idleTicks int
	newTicker func(time.Duration) (<-chan time.Time, func())

	// seen is set by Beat and cleared by each tick; running says whether the goroutine
	// runs (or is about to). Both are read on every query and written at most once per
	// tick, so the line stays shared between the CPUs.
	seen, running atomic.Bool

	// mu orders a start's wg.Add before Close's wg.Wait: a start after Close starts
	// nothing.
	mu     sync.Mutex
	closed chan struct{}
	wg     sync.WaitGroup

	starts, ticks atomic.Uint64

	// Test hooks: afterTick runs when a tick was dealt with; beforeStop when the goroutine
	// is about to mark itself stopped, beforeRecheck once it has, before it looks for a
	// query that came meanwhile; onExit when it returns.
	afterTick, beforeStop, beforeRecheck, onExit func()
}

// Config configures a Pulse.
type Config struct {
	// Interval is the period of the timer; zero or less disables the pulse (New
	// returns nil).
	Interval time.Duration
	// Ticker, in tests, replaces time.NewTicker: it returns the channel of ticks and a
	// function that stops them.
	Ticker func(time.Duration) (<-chan time.Time, func())
}

// New returns a pulse of cfg.Interval, or nil when the interval is zero or less.
func New(cfg Config) *Pulse {
	if cfg.Interval <= 0 {
		return nil
	}
	p := &Pulse{interval: cfg.Interval, newTicker: cfg.Ticker, closed: make(chan struct{})}
	p.idleTicks = max(1, int(IdleAfter/cfg.Interval))
	if p.newTicker == nil {
		p.newTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	return p
}

// Beat records a query: it starts the pulse unless it runs.
func (p *Pulse) Beat() {
	if p == nil {
		return
	}
	if !p.seen.Load() {
		p.seen.Store(true)
	}
	if !p.running.Load() && p.running.CompareAndSwap(false, true) {
		p.start()
	}
}

// start runs the goroutine (running is already set), unless the pulse is closed.
func (p *Pulse) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isClosed() {
		return // running stays set: nothing starts again
	}
	p.starts.Add(1)
	p.wg.Add(1)
	go p.run()
}

// isClosed says whether Close was called.
func (p *Pulse) isClosed() bool {
	select {
	case <-p.closed:
		return true
	default:
		return false
	}
}

// run ticks until IdleAfter passed without a query, or Close.
func (p *Pulse) run() {
	defer p.wg.Done()
	if p.onExit != nil {
		defer p.onExit()
	}
	ticks, stop := p.newTicker(p.interval)
	defer stop()
	idle := 0
	for {
		select {
		case <-p.closed:
			return
		case <-ticks:
		}
		p.ticks.Add(1)
		quit := p.tick(&idle)
		if p.afterTick != nil {
			p.afterTick()
		}
		if quit {
			return
		}
	}
}

// tick takes in one tick: it reports whether the goroutine is to return, having marked
// the pulse stopped.
func (p *Pulse) tick(idle *int) bool {
	var quit bool
	*idle, quit = next(*idle, p.seen.Swap(false), p.idleTicks)
	if !quit {
		return false
	}
	if p.beforeStop != nil {
		p.beforeStop()
	}
	p.running.Store(false)
	if p.beforeRecheck != nil {
		p.beforeRecheck()
	}
	// A Beat that saw running still set relies on this goroutine: it set seen before it
	// looked (both are sequentially consistent), so seen is visible here. One that saw
	// it clear started a goroutine of its own, and the CompareAndSwap fails.
	if p.seen.Load() && p.running.CompareAndSwap(false, true) {
		*idle = 0
		return false
	}
	return true
}

// next is the pulse's state on a tick: the idle ticks so far and whether a query came
// since the last tick give the idle ticks now and whether to stop.
func next(idle int, seen bool, idleTicks int) (int, bool) {
	if seen {
		return 0, false
	}
	idle++
	return idle, idle >= idleTicks
}

// Close stops the pulse and waits for its goroutine; Beat starts nothing after it.
func (p *Pulse) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.isClosed() {
		close(p.closed)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Stats are the pulse's counters, for metrics.
type Stats struct {
	// Starts counts the times a query started the pulse; Ticks the timer's ticks.
	Starts, Ticks uint64
	// Running says whether the pulse runs now.
	Running bool
}

// Stats returns the pulse's counters (zero for a nil pulse).
func (p *Pulse) Stats() Stats {
	if p == nil {
		return Stats{}
	}
	return Stats{Starts: p.starts.Load(), Ticks: p.ticks.Load(), Running: p.running.Load() && !p.isClosed()}
}
