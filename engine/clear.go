package engine

import (
	"math/bits"
	"sync/atomic"
)

// Clearing a slot (OpClear, SGLang/vLLM AllBlocksCleared, stale retraction, unregistration)
// is exact at once and costs bounded work per writer step:
//
//   - The writer gives the clear the next stamp (context stamp + 1, modulo
//     1<<metaStampBits), adds it to its pending clears and publishes a view whose clearSet
//     masks the cleared (slot, tier) bits out of every record whose stamp is older. From
//     that view on, no query sees them, although they are still in the records.
//   - Any record the writer changes afterwards is cleaned first (cleanRec: the stale bits
//     dropped, the stamp set to the current one), so a block stored again after the clear
//     is visible at once, in the same batch too.
//   - A sweep (sweepStep) visits sweepChunk records per writer step (after each request,
//     and between requests while idle), in index order, cyclically, cleaning each. A clear
//     is complete when every record index below the arena's high-water mark at the time
//     of the clear was visited since; then it leaves the pending list (in order), and the
//     view that no longer masks it is published.
//
// Every record the writer creates or cleans takes the current stamp, and every record is
// visited by the sweep of each pending clear, so all live records hold stamps between the
// last completed clear's and the current one: a window of at most maxPendingClears+1
// values, which modular comparison tells apart. A record whose stamp lies outside a view's
// window can only be newer than every clear that view masks; the mask is applied to it
// anyway (clamped), which can only under-report, never invent a hit.

// maxPendingClears bounds the pending clears of a context (stamps are 6 bits). A clear
// beyond it waits for a stamp: its request stalls (cacheContext.stalled; an Apply keeps the ops
// before the clear applied and resumes at the clear) while the writer serves other
// requests and sweeps on, a bounded chunk per step, and resumes once the oldest pending
// clear is complete. The clear is acknowledged only once taken, and queries see its bits
// until then, as for any clear not yet acknowledged.
const maxPendingClears = metaStampMask - 1

// defaultSweepChunk is how many records one writer step sweeps (a few tens of µs).
const defaultSweepChunk = 256

// clearSet is what a view tells queries about pending clears: sup[d-1] holds, in a
// record's bitset layout (bitWords(w) words), the bits dropped by the d most recent
// pending clears. Immutable once published.
type clearSet struct {
	stamp uint64 // the context's stamp when published: that of the newest pending clear
	sup   [][]uint64
}

// mask returns the bitset words a record with meta must hide: nil when none.
func (cs *clearSet) mask(meta uint64) []uint64 {
	d := int((cs.stamp - meta>>metaStampShift) & metaStampMask)
	if d == 0 {
		return nil
	}
	if d > len(cs.sup) {
		d = len(cs.sup) // a stamp newer than the set (see above): mask all, an under-report
	}
	return cs.sup[d-1]
}

// apply clears in words (a record's bitsets as read with meta) the bits of clears the
// record does not reflect yet. Readers of records (walks, snapshots) call it on every
// record they accept when their view's clearSet is not nil.
func (cs *clearSet) apply(meta uint64, words []uint64) {
	if m := cs.mask(meta); m != nil {
		for j := range words {
			words[j] &^= m[j]
		}
	}
}

// pendingClear is one clear not yet applied to every record. Writer only.
type pendingClear struct {
	stamp uint64
	bits  []uint64 // the dropped bits, in record layout
	hw    uint32   // arena high-water mark when issued: indices from it on were created later
	need  uint32   // indices below hw still to visit
}

func stampOf(meta uint64) uint64 { return meta >> metaStampShift & metaStampMask }

// clearBits returns the record-layout bits of slot n in the tiers of mask at width w.
func clearBits(w, n int, mask TierMask) []uint64 {
	b := make([]uint64, bitWords(w))
	for t := 0; t < 3; t++ {
		if mask&(1<<t) != 0 {
			wo, bit := bitAt(w, t, n)
			b[wo] |= bit
		}
	}
	return b
}

// owned returns the bits of slot number n in the tiers of mask, per the writer's counts
// (which still count bits of pending clears not yet swept).
func (c *cacheContext) owned(n int, mask TierMask) int {
	owned := 0
	for t := 0; t < 3; t++ {
		if mask&(1<<t) != 0 {
			owned += c.slotCounts[n][t]
		}
	}
	return owned
}

// stampFor reports whether clearSlot(n, mask) can run now: it needs a stamp unless the
// slot owns nothing there.
func (c *cacheContext) stampFor(n int, mask TierMask) bool {
	return len(c.clears) < maxPendingClears || c.owned(n, mask) == 0
}

// stall parks r until a stamp is free (resumeStalled hands it back).
func (c *cacheContext) stall(r *request) {
	r.deferred = true
	c.stalled = append(c.stalled, r)
	if h := c.eng.hooks; h != nil && h.stalled != nil {
		h.stalled()
	}
}

// resumeStalled goes on with the stalled requests, oldest first, while stamps are free;
// each is handed back once wholly applied. Bounded: each request resumes at most once per
// clear the sweep completed, and applies what its caller sent.
func (c *cacheContext) resumeStalled() {
	for len(c.stalled) > 0 && len(c.clears) < maxPendingClears {
		r := c.stalled[0]
		var done bool
		switch r.kind {
		case reqApply:
			done = c.applyOps(r)
		case reqUnregister:
			done = c.unregister(r.slot)
		}
		if !done {
			return
		}
		c.stalled[0] = nil
		c.stalled = c.stalled[1:]
		if len(c.stalled) == 0 {
			c.stalled = nil
		}
		c.flushCharges()
		r.done <- struct{}{}
	}
}

// endWaiters hands back, when the engine closes, every request still waiting on this
// writer: shared drops (done: nothing changes any more) and stalled requests (ErrClosed).
func (c *cacheContext) endWaiters() {
	c.flushCharges()
	c.endDrops()
	c.endWidening()
	for _, r := range c.stalled {
		r.closed = true
		r.done <- struct{}{}
	}
	c.stalled = nil
}

// clearSlot drops slot number n from the tiers in mask of every block: at once for
// queries, lazily in the records (see above). A slot that owns nothing there costs
// nothing.
// The caller has checked stampFor.
func (c *cacheContext) clearSlot(n int, mask TierMask) {
	if c.owned(n, mask) == 0 {
		return
	}
	if len(c.clears) >= maxPendingClears {
		panic("engine: clearSlot without a free stamp") // callers check stampFor
	}
	hw := c.tab.ar.HighWater()
	c.stamp = (c.stamp + 1) & metaStampMask
	c.clears = append(c.clears, pendingClear{stamp: c.stamp, bits: clearBits(c.tab.w, n, mask), hw: hw, need: hw})
	c.buildClearSet()
	c.publish()
	if int(hw) <= c.sweepChunk() {
		// A small context is swept in this step: its counts are exact at once.
		c.finishClears()
	}
}

// sweepChunk returns the records a sweep step visits.
func (c *cacheContext) sweepChunk() int {
	if h := c.eng.hooks; h != nil && h.sweepChunk > 0 {
		return h.sweepChunk
	}
	return defaultSweepChunk
}

// buildClearSet rebuilds c.clr from the pending clears (nil when none).
func (c *cacheContext) buildClearSet() {
	if len(c.clears) == 0 {
		c.clr = nil
		return
	}
	cs := &clearSet{stamp: c.stamp, sup: make([][]uint64, len(c.clears))}
	var acc []uint64
	for d := 1; d <= len(c.clears); d++ {
		b := c.clears[len(c.clears)-d].bits
		next := make([]uint64, len(b))
		copy(next, acc)
		for j := range b {
			next[j] |= b[j]
		}
		cs.sup[d-1], acc = next, next
	}
	c.clr = cs
}

// finishClears completes every pending clear in this step (a pass over the arena): for
// small contexts (at most a sweep chunk of records) and tests.
func (c *cacheContext) finishClears() {
	for len(c.clears) > 0 {
		c.sweep(int(c.tab.ar.HighWater()) + 1)
	}
}

// sweepStep advances the pending clears by one bounded step; once the last completes, a
// table the clears left mostly empty shrinks (maybeShrink, bounded too).
func (c *cacheContext) sweepStep() {
	if len(c.clears) > 0 {
		c.sweep(c.sweepChunk())
		if len(c.clears) == 0 {
			c.maybeShrink()
		}
	}
}

// sweep cleans up to budget records, cyclically from c.sweepPos, completes the clears
// every record of which was visited and publishes the view without them.
func (c *cacheContext) sweep(budget int) {
	ar := c.tab.ar
	done := false
	for budget > 0 && len(c.clears) > 0 {
		hw := ar.HighWater()
		if c.sweepPos >= hw {
			c.sweepPos = 0
		}
		start := c.sweepPos
		end := start + uint32(min(budget, int(hw-start)))
		for idx := start; idx < end; idx++ {
			rec := ar.Record(idx)
			if rec[recMeta]&metaFree == 0 {
				c.cleanRec(idx, rec)
			}
		}
		c.sweepPos = end
		c.swept += int(end - start)
		budget -= int(end - start)
		for i := range c.clears {
			if pc := &c.clears[i]; pc.hw > start {
				pc.need -= min(pc.need, min(end, pc.hw)-start)
			}
		}
		for len(c.clears) > 0 && c.clears[0].need == 0 {
			c.clears = c.clears[1:]
			done = true
		}
		if hw == 0 {
			break
		}
	}
	if done {
		if len(c.clears) == 0 {
			c.clears = nil
		}
		c.buildClearSet()
		c.publish()
	}
}

// cleanRec applies the pending clears newer than rec's stamp to rec and gives it the
// current stamp. It reports false when that left the record empty and deleted it.
// Writer only; the caller has not started a change of rec.
func (c *cacheContext) cleanRec(idx uint32, rec []uint64) bool {
	m := rec[recMeta]
	if c.clr == nil || stampOf(m) == c.stamp {
		return true
	}
	c.rec(idx) // it changes below: marked for a running widening (widen.go)
	if sup := c.clr.mask(m); sup != nil {
		stale, left := false, m&metaFlags != 0
		for j, sj := range sup {
			b := rec[recBits+j]
			stale = stale || b&sj != 0
			left = left || b&^sj != 0
		}
		if stale && !left {
			// Nothing else holds the block: it goes. A freed record keeps its words
			// (readers see the free meta), so the bits need no stores of their own.
			for j, sj := range sup {
				c.uncount(j, rec[recBits+j]&sj)
			}
			c.deleteRecord(idx, rec)
			return false
		}
		if stale {
			for j, sj := range sup {
				if old := rec[recBits+j]; old&sj != 0 {
					// No busy bit: a reader that reads the old meta on both sides of
					// this store masks these very bits out (the stamp is still old).
					atomic.StoreUint64(&rec[recBits+j], old&^sj)
					c.uncount(j, old&sj)
				}
			}
		}
	}
	// The stamp goes with a version change: the bits just dropped stay dropped for
	// readers, which either see the new meta or mask them under the old stamp.
	c.setMetaStamp(rec, m>>metaEpochShift, m&(metaFlags|metaFree), c.stamp)
	return true
}

// uncount takes the bits b of bitset word j out of the per-slot counts.
func (c *cacheContext) uncount(j int, b uint64) {
	w := c.tab.w
	for ; b != 0; b &= b - 1 {
		pos := bits.TrailingZeros64(b)
		if w == 0 {
			c.slotCounts[pos%packedSlots][pos/packedSlots]--
		} else {
			c.slotCounts[(j%w)*64+pos][j/w]--
		}
	}
}
