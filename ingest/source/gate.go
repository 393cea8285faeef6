package source

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/conductor-go/conductor/ingest"
)

// DefaultGateBufferBytes bounds the batches one source's gate buffers while its replica
// bootstraps; a source that publishes more meanwhile is marked stale (as on a gap).
const DefaultGateBufferBytes = 256 << 20

// gatedHandler is what a gate forwards to: the ingest event handler, which applies the
// batches of a burst together.
type gatedHandler interface {
	ingest.BurstHandler
	ingest.RestartHandler
}

type bufferedBatch struct {
	seq     uint64
	payload []byte
}

// hole is a run of batches the subscriber lost for good (no replay could supply them)
// while the gate was closed: the peer's snapshot may hold them.
type hole struct {
	first, last uint64
	reason      string
}

// gate sits between a subscriber and its event handler. It records the last sequence
// number applied (a lower bound of what the index holds from the source, read into
// snapshots), and while closed (a replica bootstrapping) it keeps the batches instead of
// applying them, until open says from which sequence number on they are still needed.
// It is an ingest.HoleHandler: it takes batches the subscriber lost for good while it is
// closed (open then checks that the snapshot's cut reaches past them) and, once open,
// those at or below the cut it opened with.
// It is an ingest.BurstHandler: batches handed over deferred go on deferred, and count as
// applied only once the burst is flushed. HandleBatch, HandleBatchDeferred, Flush,
// OnStale and OnPublisherRestart run on the subscriber's goroutine; open and lastApplied
// on others.
type gate struct {
	inner    gatedHandler
	maxBytes int

	mu       sync.Mutex
	closed   bool
	buf      []bufferedBatch
	bufBytes int
	// restarted: the publisher restarted while closed (the buffer holds the new stream).
	restarted bool
	// overflow: the buffer limit was hit while closed; the source goes stale at open.
	overflow bool
	// floor and checkNext after open with a threshold and nothing buffered: live batches
	// at or below floor are already in the snapshot, and the first one above must be
	// floor+1 (else the gap makes the source stale).
	floor     uint64
	checkNext bool
	stale     bool
	// staleReason: why the gate made the source stale (empty when the subscriber did).
	staleReason string
	// lastHole, holed: the latest run of batches lost while closed. Holes come in
	// order, so a cut that reaches past it reaches past every earlier one.
	lastHole hole
	holed    bool
	// cut, hasCut: the snapshot cut open applied (have).
	cut    uint64
	hasCut bool

	// applied is the last sequence number applied plus one (0: none yet).
	applied atomic.Uint64
	// through: open, not stale and no check pending: batches pass without the lock.
	through atomic.Bool

	// The burst in flight, owned by the subscriber's goroutine: deferred says the inner
	// handler holds deferred batches, pending is the last of them accepted plus one
	// (0: none). A closed gate defers nothing, so open (on another goroutine) never
	// meets a burst in flight.
	deferred bool
	pending  uint64
}

func newGate(inner gatedHandler, closed bool) *gate {
	g := &gate{inner: inner, closed: closed, maxBytes: DefaultGateBufferBytes}
	g.through.Store(!closed)
	return g
}

// lastApplied returns the last sequence number whose batch was applied (ok false: none).
func (g *gate) lastApplied() (uint64, bool) {
	v := g.applied.Load()
	return v - 1, v != 0
}

// apply applies one batch at once, after the burst in flight.
func (g *gate) apply(seq uint64, payload []byte) error {
	g.Flush()
	err := g.inner.HandleBatch(seq, payload)
	if err == nil {
		g.applied.Store(seq + 1)
	}
	return err
}

// deferBatch hands one batch on deferred; it counts as applied at the next Flush.
func (g *gate) deferBatch(seq uint64, payload []byte) error {
	g.deferred = true
	err := g.inner.HandleBatchDeferred(seq, payload)
	if err == nil {
		g.pending = seq + 1
	}
	return err
}

// Flush applies the burst in flight and records its last batch as applied.
func (g *gate) Flush() {
	if !g.deferred {
		return
	}
	g.inner.Flush()
	if g.pending != 0 {
		g.applied.Store(g.pending)
	}
	g.deferred, g.pending = false, 0
}

// HandleBatch buffers (closed) or applies one batch.
func (g *gate) HandleBatch(seq uint64, payload []byte) error {
	if g.through.Load() {
		return g.apply(seq, payload)
	}
	if ok, err := g.admit(seq, payload); !ok {
		return err
	}
	return g.apply(seq, payload)
}

// HandleBatchDeferred buffers (closed) or hands one batch on deferred, to be applied at
// the next Flush.
func (g *gate) HandleBatchDeferred(seq uint64, payload []byte) error {
	if g.through.Load() {
		return g.deferBatch(seq, payload)
	}
	if ok, err := g.admit(seq, payload); !ok {
		return err
	}
	return g.deferBatch(seq, payload)
}

// admit decides for a batch that did not pass through: it buffers it (closed), drops it
// (already in the snapshot), or reports that it is to be applied (true). When the gate
// has made the source stale (at open, or on a gap after it) it takes nothing and
// returns an ingest.ErrSourceStale error, on which the subscriber goes stale too.
func (g *gate) admit(seq uint64, payload []byte) (bool, error) {
	g.mu.Lock()
	if g.stale {
		reason := g.staleReason
		g.mu.Unlock()
		return false, fmt.Errorf("%w: %s", ingest.ErrSourceStale, reason)
	}
	if g.closed {
		if g.overflow || g.bufBytes+len(payload) > g.maxBytes {
			g.overflow, g.buf, g.bufBytes = true, nil, 0
		} else {
			g.buf = append(g.buf, bufferedBatch{seq: seq, payload: append([]byte(nil), payload...)})
			g.bufBytes += len(payload)
		}
		g.mu.Unlock()
		return false, nil
	}
	if g.checkNext {
		if seq <= g.floor {
			g.mu.Unlock()
			return false, nil // already in the snapshot
		}
		g.checkNext = false
		if seq != g.floor+1 {
			reason := fmt.Sprintf("bootstrap: batches %d..%d are neither in the peer's snapshot nor received", g.floor+1, seq-1)
			g.stale, g.staleReason = true, reason
			g.mu.Unlock()
			g.Flush()
			g.inner.OnStale(reason)
			return false, fmt.Errorf("%w: %s", ingest.ErrSourceStale, reason)
		}
		g.through.Store(true)
	}
	g.mu.Unlock()
	return true, nil
}

// isStale tells whether the gate made its source stale, or was told it is (false for
// a nil gate: an ungated subscription).
func (g *gate) isStale() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stale
}

// OnStale passes the source's staleness on, after the burst in flight.
func (g *gate) OnStale(reason string) {
	g.Flush()
	g.mu.Lock()
	g.through.Store(false)
	g.buf, g.bufBytes, g.stale = nil, 0, true
	g.mu.Unlock()
	g.inner.OnStale(reason)
}

// OnHole takes batches first..last that the subscriber lost for good when a peer's
// snapshot holds, or may hold, them: while closed it records them for open to check
// against the snapshot's cut; once open, only a hole at or below the cut it opened with
// is taken. Otherwise it refuses, and the subscriber marks the source stale.
func (g *gate) OnHole(first, last uint64, reason string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stale:
		return false
	case g.closed:
		g.lastHole, g.holed = hole{first: first, last: last, reason: reason}, true
		return true
	default:
		return g.hasCut && last <= g.cut
	}
}

// OnPublisherRestart passes a restart on; while closed, it drops what was buffered of the
// old stream and remembers to retract the old stream's entries (the snapshot's) at open.
func (g *gate) OnPublisherRestart(lastSeq, firstSeq uint64) {
	g.Flush()
	g.mu.Lock()
	if g.closed {
		g.buf, g.bufBytes, g.restarted = nil, 0, true
		g.holed = false // of the old stream, retracted at open
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	g.inner.OnPublisherRestart(lastSeq, firstSeq)
}

// reachesBack reports whether the batches a closed gate holds continue a snapshot cut at
// threshold: none is past it, or the first past it is threshold+1, and every hole is at
// or below it. It is false only when open(threshold, true) would find batches neither
// in the peer's snapshot nor received (a snapshot cut at a later sequence number might
// not); a gate that is open, stale, overflowed or whose publisher restarted reports
// true, since a later cut changes nothing for it.
func (g *gate) reachesBack(threshold uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed || g.stale || g.overflow || g.restarted {
		return true
	}
	if g.holed && g.lastHole.last > threshold {
		return false
	}
	i := firstPast(g.buf, threshold)
	return i == len(g.buf) || g.buf[i].seq == threshold+1
}

// firstPast returns the index of the first batch of buf past threshold (len(buf): none).
func firstPast(buf []bufferedBatch, threshold uint64) int {
	i := 0
	for i < len(buf) && buf[i].seq <= threshold {
		i++
	}
	return i
}

// open applies what is still needed of the buffer (as one burst) and lets batches through
// from then on.
// With have, the index already holds the source's batches up to threshold (a peer's
// snapshot): buffered batches at or below it are dropped, and the rest must start at
// threshold+1, or the missing batches make the source stale. Without have, everything
// buffered is applied. It reports whether the source went stale.
func (g *gate) open(threshold uint64, have bool) (stale bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		return g.stale, ""
	}
	g.closed = false
	buf := g.buf
	g.buf, g.bufBytes = nil, 0
	switch {
	case g.stale:
		return true, "stale before bootstrap ended"
	case g.overflow:
		reason = fmt.Sprintf("bootstrap: more than %d bytes of batches arrived while the snapshot loaded", g.maxBytes)
	case g.restarted:
		// The snapshot holds the old stream: retract it, then apply the new stream whole.
		g.inner.OnPublisherRestart(threshold, 0)
		have = false
	}
	if h := g.lastHole; reason == "" && g.holed {
		switch {
		case !have:
			reason = fmt.Sprintf("bootstrap: batches %d..%d were lost (%s) and no peer snapshot holds them", h.first, h.last, h.reason)
		case h.last > threshold:
			reason = fmt.Sprintf("bootstrap: batches %d..%d were lost (%s) and the peer's snapshot is cut at %d", h.first, h.last, h.reason, threshold)
		}
	}
	if reason == "" && have {
		buf = buf[firstPast(buf, threshold):]
		switch {
		case len(buf) == 0:
			g.floor, g.checkNext = threshold, true
		case buf[0].seq != threshold+1:
			reason = fmt.Sprintf("bootstrap: batches %d..%d are neither in the peer's snapshot nor received", threshold+1, buf[0].seq-1)
		}
		if reason == "" && g.applied.Load() < threshold+1 {
			// The index holds the source's batches up to threshold (the snapshot's): a
			// snapshot of this replica is cut there too, even before a live batch.
			g.applied.Store(threshold + 1)
		}
		if reason == "" {
			g.cut, g.hasCut = threshold, true
		}
	}
	if reason != "" {
		g.stale, g.staleReason = true, reason
		g.inner.OnStale(reason)
		return true, reason
	}
	// The buffer is one burst: deferred, flushed once, then counted as applied.
	var applied uint64
	for _, b := range buf {
		if err := g.inner.HandleBatchDeferred(b.seq, b.payload); err != nil {
			g.inner.Flush()
			if applied != 0 {
				g.applied.Store(applied)
			}
			reason = fmt.Sprintf("bootstrap: buffered batch %d rejected: %v", b.seq, err)
			g.stale, g.staleReason = true, reason
			g.inner.OnStale(reason)
			return true, reason
		}
		applied = b.seq + 1
	}
	if len(buf) > 0 {
		g.inner.Flush()
		g.applied.Store(applied)
	}
	g.through.Store(!g.checkNext)
	return false, ""
}
