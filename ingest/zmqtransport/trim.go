package zmqtransport

import (
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/internal/deferred"
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
// channel in between (package deferred): an idle process never wakes for it.
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
	r       *deferred.Runner
}

// newTrimmer starts a trimmer; after is time.After (tests step it).
func newTrimmer(trim func(), after func(time.Duration) <-chan time.Time) *trimmer {
	tm := &trimmer{}
	tm.r = deferred.StartWith(trimDelay, func() {
		// Bytes read from now on count towards the next trim.
		tm.pending.Store(0)
		trim()
	}, after)
	return tm
}

// note adds n bytes read by a subscriber that has just drained its socket, and asks for
// a trim once enough were read.
func (tm *trimmer) note(n int64) {
	if n > 0 && tm.pending.Add(n) >= trimAfterBytes {
		tm.r.Request()
	}
}

// trims counts the trims done.
func (tm *trimmer) trims() uint64 { return tm.r.Runs() }

// close stops the trimmer.
func (tm *trimmer) close() { tm.r.Close() }
