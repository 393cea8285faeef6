package engine

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/arena"
)

// Everything in this file runs on the context writer goroutine. The writer reads its own
// words with plain loads and publishes every change with atomic stores, because queries
// read the same words concurrently.

// applyOps applies r's ops from r.next on, journals them for each running snapshot, and
// reports whether all were applied: it stops before a clear that must wait for a stamp
// (clear.go), leaving r.next at it.
func (c *context) applyOps(r *request) bool {
	from := r.next
	for ; r.next < len(r.ops); r.next++ {
		if !c.applyOp(&r.ops[r.next]) {
			break
		}
	}
	for _, j := range c.snaps {
		j.recordOps(r.ops[from:r.next])
	}
	return r.next == len(r.ops)
}

// applyOp applies op; it reports false, changing nothing, for a clear that must wait for a
// stamp.
func (c *context) applyOp(op *Op) bool {
	op.Err = nil
	switch op.Kind {
	case OpStore:
		c.engineStore(op)
	case OpRemove:
		c.engineRemove(op)
	case OpClear:
		if n, ok := c.slots[op.Slot]; ok {
			if !c.stampFor(n, op.ClearTiers&MaskAllEngine) {
				return false
			}
			c.clearSlot(n, op.ClearTiers&MaskAllEngine)
			c.maybeShrink()
		}
	case OpSharedStore:
		c.sharedStore(op)
	case OpSharedRemove:
		c.sharedRemove(op)
	default:
		op.Err = ErrInvalidOp
	}
	return true
}

// findOrCreate returns the record of key, creating an empty one at the newest end of the
// write order when absent; a created record is left busy for the caller's final meta store
// (setMeta with a fresh epoch). A found record is cleaned of pending clears.
func (c *context) findOrCreate(key uint64) (idx uint32, rec []uint64, created bool) {
	if _, _, idx, rec, ok := c.tab.locate(key); ok {
		c.mark(idx)
		if c.clr == nil || c.cleanRec(idx, rec) {
			return idx, rec, false
		}
		// It held only cleared bits and was deleted: create it anew.
	}
	idx, rec = c.create(key)
	return idx, rec, true
}

// create makes the record of key, absent (findOrCreate).
func (c *context) create(key uint64) (idx uint32, rec []uint64) {
	c.makeRoom()
	idx = c.tab.ar.Alloc()
	rec = c.rec(idx)
	// A reused record may still be read by a query that found it under its old key: it
	// goes busy (dropping the old block's shared flags) before the key and bitsets change,
	// and stays busy until the caller's final meta store, which gives it a fresh epoch.
	// Its bitsets start empty: it reflects every clear (the current stamp).
	atomic.StoreUint64(&rec[recMeta], rec[recMeta]&^(metaFlags|metaStampMask<<metaStampShift)|c.stamp<<metaStampShift|metaBusy)
	atomic.StoreUint64(&rec[recKey], key)
	for j := recBits; j < len(rec); j++ {
		if rec[j] != 0 {
			atomic.StoreUint64(&rec[j], 0)
		}
	}
	c.tab.insertNew(key, idx)
	c.linkNewest(idx, rec)
	c.charge(1, blockBytes(c.tab.w))
	return idx, rec
}

// mark notes that the writer changes record idx, found by a table look-up: while a
// widening runs, a record already copied is copied again (see context.rec).
func (c *context) mark(idx uint32) {
	if c.wide != nil {
		c.wide.mark(idx)
	}
}

// makeRoom ensures one more entry fits the table, in bounded work: it advances a running
// migration by one step, or starts one (publishing a larger table that reads through to
// the current one) when the table is full.
func (c *context) makeRoom() {
	if c.tab.prev.Load() != nil {
		if c.tab.migrate() {
			c.endMigration()
		} else if c.tab.full() {
			// Not reached: a migration ends long before its table fills (see
			// migrateMoves). Should it happen, finishing is correct, only slower.
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
// faults (each a zeroed page from the kernel, 10-20 µs on a loaded VM) are paid a few at a
// time rather than hundreds in one step once the migration writes entries all over the
// new table. The pages are spread evenly over the inserts left before the current table
// is full, at twice the rate that would just finish then (faultDebt carries the fraction
// from insert to insert): one page per insert, as before, made a 64-block batch fault 64
// pages (about 1.3 ms) in one step at 10M blocks, where about 4 suffice.
func (c *context) prepareNext() {
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
func (c *context) migrateStep() {
	if c.tab.prev.Load() != nil && c.tab.migrate() {
		c.endMigration()
	}
}

// endMigration detaches the migrated table and releases its entries: a query still
// probing them reads zeros (empty) and goes on to the new table, which holds every entry.
func (c *context) endMigration() {
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
func (c *context) releaseLater(words []uint64) {
	c.toRelease = append(c.toRelease, words)
}

// releaseStep gives back one chunk of queued memory.
func (c *context) releaseStep() {
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

// setMeta ends a change of rec: it stores meta with epoch and flags (shared flags, free
// bit), seq bumped and busy clear. Epochs only grow, and within one epoch seq only grows,
// so the record never holds the same meta twice and a reader's before/after comparison
// sees every change; should seq wrap within one epoch, the record takes a fresh epoch.
func (c *context) setMeta(rec []uint64, epoch, flags uint64) {
	c.setMetaStamp(rec, epoch, flags, stampOf(rec[recMeta]))
}

// setMetaStamp is setMeta with the record's clear stamp set to stamp.
func (c *context) setMetaStamp(rec []uint64, epoch, flags, stamp uint64) {
	cur := rec[recMeta]
	seq := (cur>>metaSeqShift + 1) & metaSeqMask
	if seq == 0 && epoch == cur>>metaEpochShift {
		c.epoch++
		epoch = c.epoch
	}
	atomic.StoreUint64(&rec[recMeta], epoch<<metaEpochShift|stamp<<metaStampShift|seq<<metaSeqShift|flags)
}

// keepMeta ends a change of rec that leaves its epoch and flags as they are.
func (c *context) keepMeta(rec []uint64) {
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&(metaFlags|metaFree))
}

// The write order is a doubly linked list through the records' link words (writer only,
// indices + 1, 0 = none): oldest at c.oldest, newest at c.newest. A write moves its block
// to the newest end; eviction takes the oldest, so both are O(1).
func linkPrev(l uint64) uint32 { return uint32(l >> 32) }
func linkNext(l uint64) uint32 { return uint32(l) }

func (c *context) linkNewest(idx uint32, rec []uint64) {
	rec[recLink] = uint64(c.newest) << 32
	if c.newest != 0 {
		p := c.rec(c.newest - 1)
		p[recLink] = p[recLink]&^0xFFFFFFFF | uint64(idx+1)
	} else {
		c.oldest = idx + 1
	}
	c.newest = idx + 1
}

func (c *context) unlink(rec []uint64) {
	l := rec[recLink]
	p, n := linkPrev(l), linkNext(l)
	if p != 0 {
		pr := c.rec(p - 1)
		pr[recLink] = pr[recLink]&^0xFFFFFFFF | uint64(n)
	} else {
		c.oldest = n
	}
	if n != 0 {
		nr := c.rec(n - 1)
		nr[recLink] = nr[recLink]&0xFFFFFFFF | uint64(p)<<32
	} else {
		c.newest = p
	}
	rec[recLink] = 0
}

// moveNewest moves rec (linked, not the newest) to the newest end of the write order:
// unlink and linkNewest in one, with one look-up per neighbour.
func (c *context) moveNewest(idx uint32, rec []uint64) {
	l := rec[recLink]
	p, n := linkPrev(l), linkNext(l) // n != 0: rec is not the newest
	nr := c.rec(n - 1)
	nr[recLink] = nr[recLink]&0xFFFFFFFF | uint64(p)<<32
	if p != 0 {
		pr := c.rec(p - 1)
		pr[recLink] = pr[recLink]&^0xFFFFFFFF | uint64(n)
	} else {
		c.oldest = n
	}
	last := c.rec(c.newest - 1) // may be nr: its prev half was just written
	last[recLink] = last[recLink]&^0xFFFFFFFF | uint64(idx+1)
	rec[recLink] = uint64(c.newest) << 32
	c.newest = idx + 1
}

func (c *context) engineStore(op *Op) {
	n, ok := c.slots[op.Slot]
	if !ok {
		op.Err = ErrSlotNotRegistered
		return
	}
	if op.Tier > TierDisk {
		op.Err = ErrInvalidOp
		return
	}
	t := int(op.Tier)
	c.tab.prefetch(op.Hashes)
	for _, h := range op.Hashes {
		// findOrCreate, with the path of a stored block inline (one call level fewer
		// for the most common event).
		_, _, idx, rec, found := c.tab.locate(h)
		if found {
			c.mark(idx)
			found = c.clr == nil || c.cleanRec(idx, rec)
		}
		if !found {
			idx, rec = c.create(h)
		}
		wo, bit := bitAt(c.tab.w, t, n) // after create: the table cannot widen here
		word := recBits + wo
		if old := rec[word]; old&bit == 0 {
			// One word, one bit: no busy (see the record layout); the meta store
			// below ends the change.
			atomic.StoreUint64(&rec[word], old|bit)
			c.slotCounts[n][t]++
		}
		// A new write epoch, and the newest end of the write order: every store
		// makes its block the last to be evicted.
		c.epoch = max(c.epoch, c.now)
		c.setMeta(rec, c.epoch, rec[recMeta]&metaFlags)
		if c.newest != idx+1 {
			c.moveNewest(idx, rec)
		}
		if !found {
			c.maybeEvict()
		}
	}
}

func (c *context) engineRemove(op *Op) {
	if op.Tier > TierDisk {
		op.Err = ErrInvalidOp
		return
	}
	n, ok := c.slots[op.Slot]
	if !ok {
		return // removing what an unknown slot never stored is a no-op
	}
	t := int(op.Tier)
	wo, bit := bitAt(c.tab.w, t, n)
	word := recBits + wo
	c.tab.prefetch(op.Hashes)
	for _, h := range op.Hashes {
		pos, inPrev, idx, rec, ok := c.tab.locate(h)
		if !ok {
			continue
		}
		c.mark(idx)
		if c.clr != nil && !c.cleanRec(idx, rec) {
			continue // it held only cleared bits
		}
		old := rec[word]
		if old&bit == 0 {
			continue
		}
		// One word, one bit: no busy (see the record layout); keepMeta or freeRecord
		// ends the change.
		atomic.StoreUint64(&rec[word], old&^bit)
		c.slotCounts[n][t]--
		if recordEmpty(rec) {
			// Where the look-up found it: cleanRec deleted nothing (the record is
			// here), and nothing else changed the tables since. Free first, as
			// deleteRecord does.
			c.markFree(idx, rec)
			c.deleting(h)
			c.tab.removeAt(h, pos, inPrev)
			c.releaseRecord(idx, rec)
		} else {
			c.keepMeta(rec)
		}
	}
}

func recordEmpty(rec []uint64) bool {
	if rec[recMeta]&metaFlags != 0 {
		return false
	}
	for _, w := range rec[recBits:] {
		if w != 0 {
			return false
		}
	}
	return true
}

// deleteRecord drops the entries of rec's key and frees the record. The record keeps its
// words; its meta says free, so a query still reading it reads again and finds nothing.
// It goes free before its key leaves the table: a walk that reads records by hint, not
// through the table (sameAlive1), must never find a live record whose key the table no
// longer holds.
func (c *context) deleteRecord(idx uint32, rec []uint64) {
	key := rec[recKey]
	c.markFree(idx, rec)
	c.deleting(key)
	c.tab.remove(key)
	c.releaseRecord(idx, rec)
}

// markFree sets rec's free flag (ending any change in progress): from then on no read
// takes it for its key.
func (c *context) markFree(idx uint32, rec []uint64) {
	c.mark(idx) // callers may hold rec from a read-only look-up
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&metaFlags|metaFree)
}

// deleting runs the test hook of that name.
func (c *context) deleting(key uint64) {
	if h := c.eng.hooks; h != nil && h.deleting != nil {
		h.deleting(key)
	}
}

// releaseRecord takes rec, marked free, out of the write order and returns it to the
// arena.
func (c *context) releaseRecord(idx uint32, rec []uint64) {
	c.unlink(rec)
	c.tab.ar.Free(idx)
	c.charge(-1, -blockBytes(c.tab.w))
}

func (c *context) sharedStore(op *Op) {
	if op.SharedTier > SharedDisk {
		op.Err = ErrInvalidOp
		return
	}
	if c.bs == nil {
		c.bs = newBindStore(c)
		if h := c.eng.hooks; h != nil && h.bindSets > 0 {
			c.bs.sets.limit = h.bindSets
		}
	}
	bs := c.bs
	i, found := bs.find(op.Source, op.Backend, op.SharedTier, op.ObjectKey)
	if found && bs.hash(i) != op.Hash {
		op.Err = ErrBindingConflict
		return
	}
	if !found {
		var charge int64
		var err error
		if i, charge, err = bs.add(op.Source, op.Backend, op.SharedTier, op.ObjectKey, op.Hash); err != nil {
			op.Err = err
			c.dropEmptyStore()
			return
		}
		c.charge(1, charge)
	}
	if added, charge := bs.addComp(i, op.Component); added {
		c.charge(0, charge)
	}
	idx, rec, created := c.findOrCreate(op.Hash)
	if !found {
		bs.link(i, idx) // the chain ends at the record (bindings.go)
	}
	c.epoch = max(c.epoch, c.now)
	c.setMeta(rec, c.epoch, rec[recMeta]&metaFlags|tierFlag(op.SharedTier))
	if c.newest != idx+1 {
		c.moveNewest(idx, rec)
	}
	if created || !found {
		c.maybeEvict()
	}
}

func (c *context) sharedRemove(op *Op) {
	if op.SharedTier > SharedDisk {
		op.Err = ErrInvalidOp
		return
	}
	if c.bs == nil {
		return
	}
	bs := c.bs
	i, found := bs.find(op.Source, op.Backend, op.SharedTier, op.ObjectKey)
	if !found {
		return
	}
	if bs.hash(i) != op.Hash {
		op.Err = ErrBindingMismatch
		return
	}
	removed, charge, left := bs.removeComp(i, op.Component)
	if !removed {
		return
	}
	c.charge(0, -charge)
	if left {
		return
	}
	hash, charge := bs.remove(i)
	c.charge(-1, -charge)
	c.reflag(hash)
	c.dropEmptyStore()
}

// dropEmptyStore gives the binding store's memory back once it holds no binding.
func (c *context) dropEmptyStore() {
	if c.bs != nil && c.bs.n == 0 {
		c.bs.release()
		c.bs = nil
	}
}

// reflag sets the shared flags of block hash after one of its bindings went, and deletes
// its record when nothing owns it any more.
func (c *context) reflag(hash uint64) {
	idx, found := c.tab.lookup(hash)
	if !found {
		return // unreachable: a binding keeps its block's record alive
	}
	rec := c.rec(idx)
	c.cleanRec(idx, rec) // it keeps its shared flags: not deleted
	c.setMeta(rec, rec[recMeta]>>metaEpochShift, c.bs.flags(hash))
	if recordEmpty(rec) {
		c.deleteRecord(idx, rec)
	}
}

// dropShared starts removing every binding of source (and backend, when withBackend),
// all components at once (ClearShared, RetractSource). The bindings are detached at once
// (a later store or remove of the same object is not affected by the drop, and look-ups
// no longer find them) and removed by dropStep, a bounded number per writer step, with r
// handed back when the last is gone; it reports whether r waits for that.
func (c *context) dropShared(r *request, withBackend bool) bool {
	if c.bs == nil || !c.bs.detach(func(o origin) bool { return o.source == r.source && (!withBackend || o.backend == r.backend) }) {
		return false
	}
	c.dropPos = 0 // a new drop rescans every binding
	c.dropWaiters = append(c.dropWaiters, r)
	return true
}

// Bounds of one dropStep: bindings visited and removed.
const (
	dropVisit  = 4096
	dropRemove = 256
)

// dropStep moves the pending drops (dropShared) on by a bounded number of bindings and,
// once every binding was visited, hands their requests back.
func (c *context) dropStep() {
	if len(c.dropWaiters) == 0 {
		return
	}
	if bs := c.bs; bs != nil {
		end := bs.ents.HighWater()
		for visited, removed := 0, 0; c.dropPos < end && visited < dropVisit && removed < dropRemove; c.dropPos, visited = c.dropPos+1, visited+1 {
			if !bs.doomedAt(c.dropPos) {
				continue
			}
			hash, charge := bs.remove(c.dropPos)
			c.charge(-1, -charge)
			c.reflag(hash)
			removed++
		}
		c.blocks.Store(int64(c.tab.ar.Len())) // also run between requests (run's idle loop)
		if c.dropPos < end {
			return
		}
		bs.undoom()
		c.dropEmptyStore()
		c.maybeShrink()
	}
	c.endDrops()
}

// endDrops hands back the requests waiting for drops.
func (c *context) endDrops() {
	c.flushCharges()
	for i, r := range c.dropWaiters {
		r.done <- struct{}{}
		c.dropWaiters[i] = nil
	}
	c.dropWaiters = c.dropWaiters[:0]
}

// charge adds n blocks or bindings and b bytes to the engine-wide counts (Engine.total,
// Engine.bytes). With an engine budget (Config.MaxBlocks, MemoryLimitBytes), which
// maybeEvict checks against those counts after every new block, at once, as other
// contexts' writers read them too; otherwise the counts are only reported
// (TotalBlocks, IndexBytes), and the writer adds them up and publishes them once per
// step (flushCharges, before it hands a request back) instead of two atomic additions,
// contended across writers, per block.
func (c *context) charge(n, b int64) {
	c.chargedN += n
	c.chargedB += b
	if c.budgeted {
		c.eng.total.Add(n)
		c.eng.bytes.Add(b)
		return
	}
	c.pendTotal += n
	c.pendBytes += b
}

// flushCharges publishes the counts charge added up (see there).
func (c *context) flushCharges() {
	if c.pendTotal != 0 {
		c.eng.total.Add(c.pendTotal)
		c.pendTotal = 0
	}
	if c.pendBytes != 0 {
		c.eng.bytes.Add(c.pendBytes)
		c.pendBytes = 0
	}
}

// Memory charges (Config.MemoryLimitBytes): what the index's own structures hold per
// block and per shared binding. A block is its record (recordWords(w) words, 32 bytes for
// contexts of up to 21 slots) and about two table entries (8 bytes each: tables are
// between 5/16 and 13/16 full); a binding is its entry and index slots
// (bindingBaseBytes, bindings.go) and the strings it holds alone.
const tableBytesPerBlock = 16

func blockBytes(w int) int64 { return int64(recordWords(w)*8 + tableBytesPerBlock) }

// maybeEvict keeps the context within its capacity after a block was created: the
// oldest-written block goes, with every owner (shared bindings stay, and a repeated store
// re-adds them). O(1): the write order is a list.
func (c *context) maybeEvict() {
	if limit := c.eng.maxBlocks; limit > 0 && c.units() > limit {
		evicted := 0
		for c.units() > limit && c.oldest != 0 {
			c.evictOldest()
			evicted++
		}
		c.countEvicted(evicted, "prefix context over capacity: evicted oldest-written blocks")
		return
	}
	if c.eng.maxTotal > 0 && c.eng.total.Load() > int64(c.eng.maxTotal) {
		c.evictForBudget()
		return
	}
	// Blocks other contexts owe (debts) count as gone already, at a packed block's charge.
	if limit := c.eng.memLimit; limit > 0 && c.eng.bytes.Load()-c.eng.debts.Load()*blockBytes(0) > limit {
		// At most two blocks out for each block or binding in: the charge comes back
		// under the limit after a binding or a widening raised it by more than a block,
		// in bounded work per step. (A block another context evicts leaves the charge
		// when that context's writer pays its debt, right after; debts in flight count
		// as evicted already.)
		c.evictForBudget()
		if c.oldest != 0 && c.eng.bytes.Load()-c.eng.debts.Load()*blockBytes(0) > limit {
			c.evictForBudget()
		}
	}
}

// units is what the capacities count: blocks, and shared bindings (each an object key
// string held for its block).
func (c *context) units() int {
	if c.bs == nil {
		return c.tab.ar.Len()
	}
	return c.tab.ar.Len() + c.bs.n
}

// evictForBudget keeps the engine within Config.MaxBlocks after this context created a
// block: the oldest-written block of the engine goes. When another context holds it,
// that context is asked to (debt, paid by its own writer right after); its published
// oldestAt may lag by the debts in flight, so the order across contexts is approximate
// by those few blocks. It reports whether the block went here (not as a debt).
func (c *context) evictForBudget() bool {
	e := c.eng
	victim, best := c, c.tab.ar.Record(c.oldest - 1)[recMeta]>>metaEpochShift
	for _, o := range *e.ctxs.Load() {
		if o != c {
			if at := o.oldestAt.Load(); at < best {
				victim, best = o, at
			}
		}
	}
	if victim == c {
		c.evictOldest()
		c.countEvicted(1, "engine over max_blocks or memory_limit_bytes: evicted its oldest-written block")
		return true
	}
	victim.debt.Add(1)
	c.eng.debts.Add(1)
	select {
	case victim.wake <- struct{}{}:
	default: // already woken
	}
	return false
}

// maxDebtPerStep bounds the evictions a writer makes for other contexts in one step.
const maxDebtPerStep = 1024

// payDebt evicts the oldest blocks other contexts asked this one to (see evictForBudget),
// a bounded number per step, and publishes the write epoch of its oldest block.
func (c *context) payDebt() {
	if n := c.debt.Load(); n > 0 && !c.dropped {
		pay := min(n, maxDebtPerStep)
		evicted := 0
		for ; evicted < int(pay) && c.oldest != 0; evicted++ {
			c.evictOldest()
		}
		// Debt a context cannot pay (it is empty) is dropped: it no longer holds blocks.
		c.eng.debts.Add(-pay)
		if c.debt.Add(-pay) > 0 && c.oldest != 0 {
			select {
			case c.wake <- struct{}{}:
			default:
			}
		} else if c.oldest == 0 {
			c.eng.debts.Add(-c.debt.Swap(0))
		}
		c.countEvicted(evicted, "engine over max_blocks or memory_limit_bytes: evicted its oldest-written block")
		c.blocks.Store(int64(c.tab.ar.Len()))
	}
	if c.oldest == 0 {
		c.oldestAt.Store(math.MaxUint64)
	} else {
		c.oldestAt.Store(c.tab.ar.Record(c.oldest - 1)[recMeta] >> metaEpochShift)
	}
}

// countEvicted counts evicted blocks in the context's metrics and logs them.
func (c *context) countEvicted(evicted int, msg string) {
	if evicted == 0 {
		return
	}
	c.evictions.Add(1)
	total := c.evictedBlocks.Add(uint64(evicted))
	c.logEviction(msg, evicted, total)
}

// evictOldest drops the oldest-written block.
func (c *context) evictOldest() {
	idx := c.oldest - 1
	rec := c.rec(idx)
	w := c.tab.w
	for t := 0; t < 3; t++ {
		for j := 0; j < maskWords(w); j++ {
			for b := tierBits(rec[recBits:], w, t, j); b != 0; b &= b - 1 {
				c.slotCounts[j*64+bits.TrailingZeros64(b)][t]--
			}
		}
	}
	// The block's shared bindings go with it (they count against the capacity too).
	if c.bs != nil {
		n, charge := c.bs.dropBlock(rec[recKey])
		c.charge(-int64(n), -charge)
		c.dropEmptyStore()
	}
	c.deleteRecord(idx, rec)
}

// evictLogEvery bounds eviction warnings to one per context per interval: a context at
// capacity evicts a block for every new one, and the log would otherwise repeat it.
const evictLogEvery = 10 * time.Second

// logEviction logs the first eviction of a context and then at most one summary per
// evictLogEvery, with the blocks evicted since the previous line.
func (c *context) logEviction(msg string, evicted int, total uint64) {
	c.evictUnlogged += evicted
	now := time.Now()
	if !c.evictLogged.IsZero() && now.Sub(c.evictLogged) < evictLogEvery {
		return
	}
	c.evictLogged = now
	c.flushCharges()
	c.eng.log.Warn(msg,
		"tenant_id", c.key.TenantID, "model_name", c.key.ModelName, "lora_name", c.key.LoraName,
		"block_size", c.key.BlockSize, "evicted", c.evictUnlogged, "remaining", c.tab.ar.Len(),
		"max_blocks_per_context", c.eng.maxBlocks, "max_blocks", c.eng.maxTotal,
		"memory_limit_bytes", c.eng.memLimit, "engine_blocks", c.eng.total.Load(),
		"engine_index_bytes", c.eng.bytes.Load(), "evicted_total", total)
	c.evictUnlogged = 0
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
func (c *context) rebuild(w int, compact bool) {
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
// step (a copy of each, about 50 ns apiece); a larger context keeps its arena and only
// its table shrinks, incrementally.
const compactMaxLive = 2048

// maybeShrink shrinks a table that clears and removals left mostly empty, in bounded
// work: a context left with few records is compacted into a new arena (its old slabs and
// table going back to the kernel a chunk per step); a larger one migrates into a smaller
// table incrementally, like growth.
func (c *context) maybeShrink() {
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
func (c *context) shrinkTable() {
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
