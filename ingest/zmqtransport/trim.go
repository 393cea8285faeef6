package zmqtransport

import (
	"sync/atomic"
	"time"
)

// libzmq allocates every message it receives with malloc, in its I/O thread's arena, and
// the subscriber frees it once copied out. glibc keeps freed memory in the arena for
// reuse and gives back only what lies at the arena's top, so after a burst that queued
// many messages the arena's high-water mark stays resident although almost nothing in
// it is in use (1M blocks sent flat out to subscribers with upstream's RCVHWM of 200,000
// messages left 87 MiB resident and 0.5 MiB in use). The trimmer gives such memory back
// (malloc_trim) once subscribers have read trimAfterBytes since the last trim and one of
// them has drained its socket, trimDelay later, so that a burst's requests coalesce into
// about one trim per trimDelay and the last one follows the burst's end. It waits on a
// channel in between: an idle process never wakes for it.
const (
	// trimAfterBytes is how much subscribers read before a trim is worth its cost (it
	// walks every arena's free chunks).
	trimAfterBytes = 8 << 20
	// trimDelay is how long after a request the trimmer trims.
	trimDelay = time.Second
)

// trimmer decides when the C heap is trimmed; trim does it.
type trimmer struct {
	// pending is the bytes read since the last trim.
	pending atomic.Int64
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	trims   atomic.Uint64
	trim    func()
	// after is time.After (tests step it).
	after func(time.Duration) <-chan time.Time
}

func newTrimmer(trim func(), after func(time.Duration) <-chan time.Time) *trimmer {
	return &trimmer{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		trim: trim, after: after}
}

// note adds n bytes read by a subscriber that has just drained its socket, and asks for
// a trim once enough were read.
func (tm *trimmer) note(n int64) {
	if n > 0 && tm.pending.Add(n) >= trimAfterBytes {
		select {
		case tm.kick <- struct{}{}:
		default: // one is pending already
		}
	}
}

// run trims trimDelay after each request until close.
func (tm *trimmer) run() {
	defer close(tm.done)
	for {
		select {
		case <-tm.stop:
			return
		case <-tm.kick:
		}
		select {
		case <-tm.stop:
			return
		case <-tm.after(trimDelay):
		}
		// Requests made until now are served by this trim; bytes read from now on count
		// towards the next.
		select {
		case <-tm.kick:
		default:
		}
		tm.pending.Store(0)
		tm.trim()
		tm.trims.Add(1)
	}
}

// close stops run and waits for it.
func (tm *trimmer) close() {
	close(tm.stop)
	<-tm.done
}
