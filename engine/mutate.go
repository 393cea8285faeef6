package engine

import (
	"sync/atomic"
)

// Everything in this file and in mutate_*.go runs on the context writer goroutine. The
// writer reads its own words with plain loads and publishes every change with atomic
// stores, because queries read the same words concurrently.

// applyOps applies r's ops from r.next on, journals them for each running snapshot, and
// reports whether all were applied: it stops before a clear that must wait for a stamp
// (clear.go), leaving r.next at it.
func (c *cacheContext) applyOps(r *request) bool {
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
func (c *cacheContext) applyOp(op *Op) bool {
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
func (c *cacheContext) findOrCreate(key uint64) (idx uint32, rec []uint64, created bool) {
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
func (c *cacheContext) create(key uint64) (idx uint32, rec []uint64) {
	return c.createFrom(key, nil, 0)
}

// createFrom is create for a key whose look-up in table tab missed at pos
// (table.locate): while tab is still the current table after makeRoom, its entry goes in
// from pos on rather than from its home position (table.insertFrom).
func (c *cacheContext) createFrom(key uint64, tab *table, pos uint64) (idx uint32, rec []uint64) {
	c.makeRoom()
	idx, fresh := c.tab.ar.AllocFresh()
	rec = c.rec(idx)
	if fresh {
		// Never allocated: every word is zero and no reader holds its index. It is
		// written without being read first (see arena.AllocFresh: no zero-page copy),
		// busy until the caller's final meta store.
		atomic.StoreUint64(&rec[recMeta], c.stamp<<metaStampShift|metaBusy)
		atomic.StoreUint64(&rec[recKey], key)
	} else {
		// A reused record may still be read by a query that found it under its old
		// key: it goes busy (dropping the old block's shared flags) before the key and
		// bitsets change, and stays busy until the caller's final meta store, which
		// gives it a fresh epoch. Its bitsets start empty: it reflects every clear (the
		// current stamp).
		atomic.StoreUint64(&rec[recMeta], rec[recMeta]&^(metaFlags|metaStampMask<<metaStampShift)|c.stamp<<metaStampShift|metaBusy)
		atomic.StoreUint64(&rec[recKey], key)
		for j := recBits; j < len(rec); j++ {
			if rec[j] != 0 {
				atomic.StoreUint64(&rec[j], 0)
			}
		}
	}
	// Counted before a query can find it: a reader that sees a block sees it in
	// PrefixCount, also in the middle of a request that stores many (a burst); the
	// store at the end of the step settles removals.
	c.blocks.Store(int64(c.tab.ar.Len()))
	if c.tab == tab {
		c.tab.insertFrom(key, pos, idx)
	} else {
		c.tab.insertNew(key, idx)
	}
	if h := c.eng.hooks; h != nil && h.created != nil {
		h.created(key)
	}
	c.linkNewest(idx, rec)
	c.charge(1, blockBytes(c.tab.w))
	return idx, rec
}

// mark notes that the writer changes record idx, found by a table look-up: while a
// widening runs, a record already copied is copied again (see cacheContext.rec).
func (c *cacheContext) mark(idx uint32) {
	if c.wide != nil {
		c.wide.mark(idx)
	}
}

// setMeta ends a change of rec: it stores meta with epoch and flags (shared flags, free
// bit), seq bumped and busy clear. Epochs only grow, and within one epoch seq only grows,
// so the record never holds the same meta twice and a reader's before/after comparison
// sees every change; should seq wrap within one epoch, the record takes a fresh epoch.
func (c *cacheContext) setMeta(rec []uint64, epoch, flags uint64) {
	c.setMetaStamp(rec, epoch, flags, stampOf(rec[recMeta]))
}

// setMetaStamp is setMeta with the record's clear stamp set to stamp.
func (c *cacheContext) setMetaStamp(rec []uint64, epoch, flags, stamp uint64) {
	cur := rec[recMeta]
	seq := (cur>>metaSeqShift + 1) & metaSeqMask
	if seq == 0 && epoch == cur>>metaEpochShift {
		c.epoch++
		epoch = c.epoch
	}
	atomic.StoreUint64(&rec[recMeta], epoch<<metaEpochShift|stamp<<metaStampShift|seq<<metaSeqShift|flags)
}

// keepMeta ends a change of rec that leaves its epoch and flags as they are.
func (c *cacheContext) keepMeta(rec []uint64) {
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&(metaFlags|metaFree))
}

// The write order is a doubly linked list through the records' link words (writer only,
// indices + 1, 0 = none): oldest at c.oldest, newest at c.newest. A write moves its block
// to the newest end; eviction takes the oldest, so both are O(1).
func linkPrev(l uint64) uint32 { return uint32(l >> 32) }

func linkNext(l uint64) uint32 { return uint32(l) }

func (c *cacheContext) linkNewest(idx uint32, rec []uint64) {
	rec[recLink] = uint64(c.newest) << 32
	if c.newest != 0 {
		p := c.rec(c.newest - 1)
		p[recLink] = p[recLink]&^0xFFFFFFFF | uint64(idx+1)
	} else {
		c.oldest = idx + 1
	}
	c.newest = idx + 1
}

func (c *cacheContext) unlink(rec []uint64) {
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
func (c *cacheContext) moveNewest(idx uint32, rec []uint64) {
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

func (c *cacheContext) engineStore(op *Op) {
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
		tab := c.tab
		pos, _, idx, rec, found := tab.locate(h)
		if found {
			c.mark(idx)
			if found = c.clr == nil || c.cleanRec(idx, rec); !found {
				idx, rec = c.create(h) // it held only cleared bits and was deleted
			}
		} else {
			idx, rec = c.createFrom(h, tab, pos)
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

func (c *cacheContext) engineRemove(op *Op) {
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
		// One word, one bit: no busy (see the record layout); keepMeta or markFree
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
func (c *cacheContext) deleteRecord(idx uint32, rec []uint64) {
	key := rec[recKey]
	c.markFree(idx, rec)
	c.deleting(key)
	c.tab.remove(key)
	c.releaseRecord(idx, rec)
}

// markFree sets rec's free flag (ending any change in progress): from then on no read
// takes it for its key.
func (c *cacheContext) markFree(idx uint32, rec []uint64) {
	c.mark(idx) // callers may hold rec from a read-only look-up
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&metaFlags|metaFree)
}

// deleting runs the test hook of that name.
func (c *cacheContext) deleting(key uint64) {
	if h := c.eng.hooks; h != nil && h.deleting != nil {
		h.deleting(key)
	}
}

// releaseRecord takes rec, marked free, out of the write order and returns it to the
// arena.
func (c *cacheContext) releaseRecord(idx uint32, rec []uint64) {
	c.unlink(rec)
	c.tab.ar.Free(idx)
	c.charge(-1, -blockBytes(c.tab.w))
}

func (c *cacheContext) sharedStore(op *Op) {
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

func (c *cacheContext) sharedRemove(op *Op) {
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
func (c *cacheContext) dropEmptyStore() {
	if c.bs != nil && c.bs.n == 0 {
		c.bs.release()
		c.bs = nil
	}
}

// reflag sets the shared flags of block hash after one of its bindings went, and deletes
// its record when nothing owns it any more.
func (c *cacheContext) reflag(hash uint64) {
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
func (c *cacheContext) dropShared(r *request, withBackend bool) bool {
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
func (c *cacheContext) dropStep() {
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
func (c *cacheContext) endDrops() {
	c.flushCharges()
	for i, r := range c.dropWaiters {
		r.done <- struct{}{}
		c.dropWaiters[i] = nil
	}
	c.dropWaiters = c.dropWaiters[:0]
}
