// Package deferred runs background work on demand instead of on a ticker: a Runner calls
// its function a fixed delay after it is asked to (Request), or at once (Now), and the
// requests made meanwhile are served by that one call. In between it waits on a channel,
// so a process with nothing to do never wakes for it.
package deferred

import (
	"sync"
	"sync/atomic"
	"time"
)

// Runner calls fn on its own goroutine when asked. Request and Now may be called from any
// goroutine and never block.
type Runner struct {
	delay time.Duration
	fn    func()
	after func(time.Duration) <-chan time.Time

	kick, now chan struct{}
	stop      chan struct{}
	done      chan struct{}
	once      sync.Once
	runs      atomic.Uint64
}

// Start starts a Runner that calls fn delay after a Request. Close stops it.
func Start(delay time.Duration, fn func()) *Runner {
	return StartWith(delay, fn, time.After)
}

// StartWith is Start with the clock's After (tests step it).
func StartWith(delay time.Duration, fn func(), after func(time.Duration) <-chan time.Time) *Runner {
	r := &Runner{delay: delay, fn: fn, after: after, kick: make(chan struct{}, 1), now: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go r.run()
	return r
}

// Request asks for a call of fn delay from now, unless one is pending already (then that
// one serves this request too).
func (r *Runner) Request() { signal(r.kick) }

// Now asks for a call of fn as soon as possible, ending the wait of a pending request.
func (r *Runner) Now() { signal(r.now) }

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // one is pending already
	}
}

// Runs counts the calls of fn that have returned.
func (r *Runner) Runs() uint64 { return r.runs.Load() }

// Close stops the Runner and waits for a call in progress to return; a pending request
// is dropped. It is idempotent.
func (r *Runner) Close() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

func (r *Runner) run() {
	defer close(r.done)
	for {
		select {
		case <-r.stop:
			return
		case <-r.now:
		case <-r.kick:
			select {
			case <-r.stop:
				return
			case <-r.after(r.delay):
			case <-r.now:
			}
		}
		// Requests made until now are served by this call; later ones ask for the next.
		drain(r.kick)
		drain(r.now)
		r.fn()
		r.runs.Add(1)
	}
}

func drain(c chan struct{}) {
	select {
	case <-c:
	default:
	}
}
