package engine

import (
	"math/bits"

	"github.com/conductor-go/conductor/arena"
)

// Table growth, migration, compaction and the release of retired memory. Everything in
// this file runs on the context writer goroutine (see mutate.go).

// makeRoom ensures one more entry fits the table, in bounded work: it advances a running
// migration by one step, or starts one (publishing a larger table that reads through to
// the current one) when the table is full.
func (c *cacheContext) makeRoom() {
	if c.tab.prev.Load() != nil {
		if c.tab.migrate() {
			c.endMigration()
		} else if c.tab.full() {
			// Not reached: a migration ends long before its table fills (see
			// quotaFor). Should it happen, finishing is correct, only slower.
			for !c.tab.migrate() {
			}
			c.endMigration()
		}
	}
	if c.tab.prev.Load() == nil {
		c.prepareNext()
	}
	if c.tab.full() {
		old := c.tab
		size := max(sizeFor(old.live), len(old.entries)/4)
		nt := c.next
		if nt != nil {
			c.unfaulted += max(len(nt.entries)-c.nextFaulted, 0) / pageWords // tests
		}
		c.next, c.nextFaulted = nil, 0
		if nt == nil || len(nt.entries) < size || nt.w != old.w || nt.ar != old.ar {
			if nt != nil {
				arena.Release(nt.entries)
			}
			nt = newTable(size, old.ar, old.w, &c.state)
		}
		nt.prev.Store(old)
		nt.quota = quotaFor(old.live, len(nt.entries))
		c.tab = nt
		c.publishTable()
		c.migrations++
	}
}

// prepareNext readies the table the next migration will fill, while the current one
// fills from 11/16 to 13/16: it maps it and writes its pages ahead, so that the page
// faults (each a zeroed page from the kernel) are paid a few at a time rather than
// hundreds in one step once the migration writes entries all over the new table. The
// pages are spread evenly over the inserts left before the current table is full, at
// twice the rate that would just finish then (faultDebt carries the fraction from insert
// to insert): one page per insert, as before, made a 64-block batch fault 64 pages in one
// step, where about 4 suffice (BenchmarkWriterSteps reports the faults and time of the
// longest step).
func (c *cacheContext) prepareNext() {
	t := c.tab
	used := t.live + t.tombs
	if c.next == nil {
		if used*16 <= len(t.entries)*11 {
			return
		}
		// Live entries can only grow by the inserts left before the table is full.
		projected := t.live + len(t.entries)*13/16 - used + 1
		c.next = newTable(max(sizeFor(projected), len(t.entries)/4), t.ar, t.w, &c.state)
		c.nextFaulted, c.faultDebt = 0, 0
	}
	e := c.next.entries
	if c.nextFaulted >= len(e) {
		return
	}
	// Pages left over inserts left (each insert calls prepareNext once), doubled.
	left := max(len(t.entries)*13/16-used, 1)
	pages := (len(e) - c.nextFaulted + pageWords - 1) / pageWords
	c.faultDebt += 2 * pages
	for c.faultDebt >= left && c.nextFaulted < len(e) {
		e[c.nextFaulted] = 0 // a write: the kernel maps a page now
		c.nextFaulted += pageWords
		c.faultDebt -= left
	}
}

// pageWords is the number of table entries in a page.
const pageWords = 4096 / 8

// migrateStep advances a running migration by one step (after every request, so that a
// context that stops inserting still finishes).
func (c *cacheContext) migrateStep() {
	if c.tab.prev.Load() != nil && c.tab.migrate() {
		c.endMigration()
	}
}

// endMigration detaches the migrated table and releases its entries: a query still
// probing them reads zeros (empty) and goes on to the new table, which holds every entry.
func (c *cacheContext) endMigration() {
	old := c.tab.prev.Load()
	c.tab.prev.Store(nil)
	c.tab.moved = 0
	old.dead.Store(true)
	c.releaseLater(old.entries)
}

// releaseChunkWords is how much table memory one writer step gives back (256 KiB):
// madvise costs time per page, and a 10M-block table is 128 MiB.
const releaseChunkWords = 1 << 15

// releaseLater queues memory (a whole arena.Map'd table) to give back to the kernel a
// chunk per writer step (releaseStep).
func (c *cacheContext) releaseLater(words []uint64) {
	c.toRelease = append(c.toRelease, words)
}

// releaseStep gives back one chunk of queued memory.
func (c *cacheContext) releaseStep() {
	if len(c.toRelease) == 0 {
		return
	}
	w := c.toRelease[0]
	n := min(len(w), releaseChunkWords)
	arena.Release(w[:n])
	if n == len(w) {
		c.toRelease[0] = nil
		c.toRelease = c.toRelease[1:]
	} else {
		c.toRelease[0] = w[n:]
	}
}

// rebuild replaces c.tab with a complete table for records of w bitset words per tier
// and publishes it. It copies every live record (in write order) into a new arena when
// compact is set, the width grows or most of the old arena is free, applying the pending
// clears on the way (a cost in live records); otherwise it re-indexes the same arena after
// completing the pending clears (a cost in the arena's high-water mark). The old table's
// entries, and a replaced arena's slabs, go back to the kernel a chunk per writer step
// (releaseLater). Only the widening of a small context's records (registerWide) and the
// compaction of a context left with few blocks (maybeShrink) use it; growth, shrinking and
// the widening of larger contexts are incremental (makeRoom, shrinkTable, widen.go).
func (c *cacheContext) rebuild(w int, compact bool) {
	// Finish a running migration first, so that the walk below sees one table.
	for c.tab.prev.Load() != nil && !c.tab.migrate() {
	}
	if c.tab.prev.Load() != nil {
		c.endMigration()
	}
	old := c.tab
	ar := old.ar
	live := ar.Len()
	if c.next != nil {
		c.releaseLater(c.next.entries) // sized for the table being replaced
		c.next, c.nextFaulted = nil, 0
	}
	compact = compact || w != old.w || int(ar.HighWater()) > 4*live+arena.DefaultChunkRecords
	if !compact {
		c.finishClears()
		live = ar.Len()
	}
	if compact {
		ar = arena.New(arena.Config{RecordWords: recordWords(w)})
	}
	nt := newTable(sizeFor(live), ar, w, &c.state)
	if compact {
		// Copy in write order: the new arena's list is its index order. A record that
		// held only cleared bits is deleted on the way (in the old arena and table).
		var prev uint32
		for i := c.oldest; i != 0; {
			rec := old.ar.Record(i - 1)
			next := linkNext(rec[recLink])
			if !c.cleanRec(i-1, rec) {
				i = next
				continue
			}
			nidx := ar.Alloc()
			nrec := ar.Record(nidx)
			nrec[recKey], nrec[recMeta] = rec[recKey], rec[recMeta]&^metaBusy
			nrec[recLink] = uint64(prev) << 32
			if prev != 0 {
				pr := ar.Record(prev - 1)
				pr[recLink] |= uint64(nidx + 1)
			} else {
				c.oldest = nidx + 1
			}
			prev = nidx + 1
			convertBits(nrec[recBits:], w, rec[recBits:], old.w)
			nt.insertNew(nrec[recKey], nidx)
			if c.bs != nil && rec[recMeta]&metaFlags != 0 {
				c.bs.retarget(rec[recKey], nidx) // its bindings' chain ends at nidx
			}
			i = next
		}
		if prev == 0 {
			c.oldest = 0 // nothing was copied
		}
		c.newest = prev
		// Every record copied reflects every clear.
		c.clears, c.sweepPos = nil, 0
		c.buildClearSet()
	} else {
		hw := ar.HighWater()
		for idx := uint32(0); idx < hw; idx++ {
			rec := ar.Record(idx)
			if rec[recMeta]&metaFree == 0 {
				nt.insertNew(rec[recKey], idx)
			}
		}
	}
	if w != old.w {
		c.eng.bytes.Add(int64(ar.Len()) * (blockBytes(w) - blockBytes(old.w)))
	}
	c.tab = nt
	if c.bs != nil {
		c.bs.retargeted()
	}
	c.publishTable()
	old.dead.Store(true)
	c.releaseLater(old.entries)
	if compact {
		for _, slab := range old.ar.Slabs() {
			c.releaseLater(slab)
		}
	}
}

// convertBits writes into dst (zero, width dw) the bitsets of src (width sw <= dw).
func convertBits(dst []uint64, dw int, src []uint64, sw int) {
	if sw == dw {
		copy(dst, src)
		return
	}
	for t := 0; t < 3; t++ {
		for j := 0; j < maskWords(sw); j++ {
			for b := tierBits(src, sw, t, j); b != 0; b &= b - 1 {
				wo, bit := bitAt(dw, t, j*64+bits.TrailingZeros64(b))
				dst[wo] |= bit
			}
		}
	}
}

// compactMaxLive is the most live records maybeShrink compacts into a new arena in one
// step (a copy of each, which bounds the step); a larger context keeps its arena and
// only its table shrinks, incrementally.
const compactMaxLive = 2048

// maybeShrink shrinks a table that clears and removals left mostly empty, in bounded
// work: a context left with few records is compacted into a new arena (its old slabs and
// table going back to the kernel a chunk per step); a larger one migrates into a smaller
// table incrementally, like growth.
func (c *cacheContext) maybeShrink() {
	t := c.tab
	if c.wide != nil || t.prev.Load() != nil || len(t.entries) <= minTableCap || t.live*8 >= len(t.entries) || sizeFor(t.live) >= len(t.entries) {
		return
	}
	if c.tab.ar.Len() <= compactMaxLive {
		c.rebuild(t.w, true)
		return
	}
	c.shrinkTable()
}

// shrinkTable starts the migration of the current table into one sized for its live
// entries (see makeRoom).
func (c *cacheContext) shrinkTable() {
	old := c.tab
	if c.next != nil {
		c.releaseLater(c.next.entries)
		c.next, c.nextFaulted = nil, 0
	}
	nt := newTable(sizeFor(old.live), old.ar, old.w, &c.state)
	nt.prev.Store(old)
	nt.quota = quotaFor(old.live, len(nt.entries))
	c.tab = nt
	c.publishTable()
	c.migrations++
}
