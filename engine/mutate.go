package engine

import (
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/conductor-go/conductor/arena"
)

// Everything in this file runs on the context writer goroutine. The writer reads its own
// words with plain loads and publishes every change with atomic stores, because queries
// read the same words concurrently.

func (c *context) applyOp(op *Op) {
	op.Err = nil
	switch op.Kind {
	case OpStore:
		c.engineStore(op)
	case OpRemove:
		c.engineRemove(op)
	case OpClear:
		if n, ok := c.slots[op.Slot]; ok {
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
}

// findOrCreate returns the record of key, creating an empty one (stamped with a fresh
// epoch by the caller's touch) when absent.
func (c *context) findOrCreate(key uint64) (rec []uint64, created bool) {
	if _, idx, ok := c.tab.slotOf(key); ok {
		return c.tab.ar.Record(idx), false
	}
	if c.tab.full() {
		c.rebuild(c.tab.live+1, c.tab.w)
		c.publishTable()
	}
	idx := c.tab.ar.Alloc()
	rec = c.tab.ar.Record(idx)
	// A reused record may still be read by a query that found it under its old key: it
	// goes busy (dropping the old block's shared flags) before the key and bitsets change,
	// and stays busy until the caller's final meta store, which gives it a fresh epoch.
	atomic.StoreUint64(&rec[recMeta], rec[recMeta]&^metaFlags|metaBusy)
	atomic.StoreUint64(&rec[recKey], key)
	for j := recBits; j < len(rec); j++ {
		if rec[j] != 0 {
			atomic.StoreUint64(&rec[j], 0)
		}
	}
	c.tab.insertNew(key, idx)
	return rec, true
}

// lockRec marks rec busy before the writer changes its key or a bitset; setMeta ends the
// change.
func lockRec(rec []uint64) {
	atomic.StoreUint64(&rec[recMeta], rec[recMeta]|metaBusy)
}

// setMeta ends a change of rec: it stores meta with epoch and flags (shared flags, free
// bit), seq bumped and busy clear. Epochs only grow, and within one epoch seq only grows,
// so the record never holds the same meta twice and a reader's before/after comparison
// sees every change; should seq wrap within one epoch, the record takes a fresh epoch.
func (c *context) setMeta(rec []uint64, epoch, flags uint64) {
	cur := rec[recMeta]
	seq := (cur>>metaSeqShift + 1) & metaSeqMask
	if seq == 0 && epoch == cur>>metaEpochShift {
		c.epoch++
		epoch = c.epoch
	}
	atomic.StoreUint64(&rec[recMeta], epoch<<metaEpochShift|seq<<metaSeqShift|flags)
}

// keepMeta ends a change of rec that leaves its epoch and flags as they are.
func (c *context) keepMeta(rec []uint64) {
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&(metaFlags|metaFree))
}

// touch stamps rec with a new write epoch: every store moves its block to the newest end
// of the eviction order.
func (c *context) touch(rec []uint64) {
	c.epoch++
	c.setMeta(rec, c.epoch, rec[recMeta]&metaFlags)
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
	bit := uint64(1) << (n & 63)
	c.tab.prefetch(op.Hashes)
	for _, h := range op.Hashes {
		rec, created := c.findOrCreate(h)
		word := recBits + t*c.tab.w + n>>6
		if old := rec[word]; old&bit == 0 {
			if !created {
				lockRec(rec)
			}
			atomic.StoreUint64(&rec[word], old|bit)
			c.slotCounts[n][t]++
		}
		c.touch(rec)
		if created {
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
	bit := uint64(1) << (n & 63)
	word := recBits + t*c.tab.w + n>>6
	c.tab.prefetch(op.Hashes)
	for _, h := range op.Hashes {
		pos, idx, ok := c.tab.slotOf(h)
		if !ok {
			continue
		}
		rec := c.tab.ar.Record(idx)
		old := rec[word]
		if old&bit == 0 {
			continue
		}
		lockRec(rec)
		atomic.StoreUint64(&rec[word], old&^bit)
		c.slotCounts[n][t]--
		if recordEmpty(rec) {
			c.deleteRecord(pos, idx, rec)
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

// deleteRecord drops the entry at pos and frees its record. The record keeps its words so
// that a query still reading it sees the last state; reuse rewrites the key first.
func (c *context) deleteRecord(pos uint64, idx uint32, rec []uint64) {
	c.tab.deleteAt(pos)
	c.freeRecord(idx, rec)
}

// freeRecord marks rec free (ending any change in progress) and returns it to the arena.
func (c *context) freeRecord(idx uint32, rec []uint64) {
	m := rec[recMeta]
	c.setMeta(rec, m>>metaEpochShift, m&metaFlags|metaFree)
	c.tab.ar.Free(idx)
}

// clearSlot drops slot number n from the tiers in mask of every block. Scanning the records
// costs a pass over the arena, but keeps per-block memory free of ownership lists; the
// per-slot counts skip the pass when the slot owns nothing and end it early. When the slot
// owns most blocks, emptied records are not tombstoned one by one (a random table access
// each) but dropped by rebuilding the table from the survivors.
func (c *context) clearSlot(n int, mask TierMask) {
	remaining := 0
	for t := 0; t < 3; t++ {
		if mask&(1<<t) != 0 {
			remaining += c.slotCounts[n][t]
		}
	}
	if remaining == 0 {
		return
	}
	bulk := remaining > c.tab.live/2
	ar, w := c.tab.ar, c.tab.w
	bit := uint64(1) << (n & 63)
	hw := ar.HighWater()
	emptied := 0
	for idx := uint32(0); idx < hw && remaining > 0; idx++ {
		rec := ar.Record(idx)
		if rec[recMeta]&metaFree != 0 {
			continue
		}
		changed := false
		for t := 0; t < 3; t++ {
			if mask&(1<<t) == 0 {
				continue
			}
			word := recBits + t*w + n>>6
			if old := rec[word]; old&bit != 0 {
				if !changed {
					lockRec(rec)
				}
				atomic.StoreUint64(&rec[word], old&^bit)
				c.slotCounts[n][t]--
				remaining--
				changed = true
			}
		}
		if !changed {
			continue
		}
		if !recordEmpty(rec) {
			c.keepMeta(rec)
			continue
		}
		if bulk {
			// Queries may still reach it through the current table: it reads as
			// free, which answers like a missing block. No Alloc happens before the
			// rebuild below drops its entry.
			c.freeRecord(idx, rec)
			emptied++
		} else {
			pos, _, _ := c.tab.slotOf(rec[recKey])
			c.deleteRecord(pos, idx, rec)
		}
	}
	if emptied > 0 {
		c.tab.live -= emptied
		c.rebuild(c.tab.live, w)
		c.publishTable()
	}
}

func (c *context) sharedStore(op *Op) {
	if op.SharedTier > SharedDisk {
		op.Err = ErrInvalidOp
		return
	}
	bk := bindingKey{source: op.Source, backend: op.Backend, object: op.ObjectKey, tier: op.SharedTier}
	b := c.bindings[bk]
	if b != nil && b.hash != op.Hash {
		op.Err = ErrBindingConflict
		return
	}
	if b == nil {
		b = &binding{hash: op.Hash}
		c.bindings[bk] = b
	}
	if !slices.Contains(b.comps, op.Component) {
		b.comps = append(b.comps, op.Component)
	}
	rec, created := c.findOrCreate(op.Hash)
	sc, ok := c.shared[op.Hash]
	if !ok || sc.gen != b.gen {
		if !ok {
			c.gen++
			sc = sharedCount{gen: c.gen}
		}
		b.gen = sc.gen
		if op.SharedTier == SharedCPU {
			sc.cpu++
		} else {
			sc.disk++
		}
		c.shared[op.Hash] = sc
	}
	c.epoch++
	c.setMeta(rec, c.epoch, sharedFlags(sc))
	if created {
		c.maybeEvict()
	}
}

func sharedFlags(sc sharedCount) uint64 {
	var f uint64
	if sc.cpu > 0 {
		f |= metaSharedCPU
	}
	if sc.disk > 0 {
		f |= metaSharedDisk
	}
	return f
}

func (c *context) sharedRemove(op *Op) {
	if op.SharedTier > SharedDisk {
		op.Err = ErrInvalidOp
		return
	}
	bk := bindingKey{source: op.Source, backend: op.Backend, object: op.ObjectKey, tier: op.SharedTier}
	b := c.bindings[bk]
	if b == nil {
		return
	}
	if b.hash != op.Hash {
		op.Err = ErrBindingMismatch
		return
	}
	i := slices.Index(b.comps, op.Component)
	if i < 0 {
		return
	}
	b.comps = slices.Delete(b.comps, i, i+1)
	if len(b.comps) > 0 {
		return
	}
	delete(c.bindings, bk)
	c.deactivate(b, op.SharedTier)
}

// deactivate removes binding b (of tier) from its block's shared counts, if it is active.
func (c *context) deactivate(b *binding, tier SharedTier) {
	sc, ok := c.shared[b.hash]
	if !ok || sc.gen != b.gen {
		return // its block was evicted since: nothing is counted for it
	}
	if tier == SharedCPU {
		sc.cpu--
	} else {
		sc.disk--
	}
	if sc.cpu == 0 && sc.disk == 0 {
		delete(c.shared, b.hash)
	} else {
		c.shared[b.hash] = sc
	}
	pos, idx, found := c.tab.slotOf(b.hash)
	if !found {
		return // unreachable: a counted binding keeps its record alive
	}
	rec := c.tab.ar.Record(idx)
	c.setMeta(rec, rec[recMeta]>>metaEpochShift, sharedFlags(sc))
	if recordEmpty(rec) {
		c.deleteRecord(pos, idx, rec)
	}
}

// dropBindings removes every binding whose key matches, all components at once.
func (c *context) dropBindings(match func(bindingKey) bool) {
	for k, b := range c.bindings {
		if match(k) {
			delete(c.bindings, k)
			c.deactivate(b, k.tier)
		}
	}
	c.maybeShrink()
}

func (c *context) maybeEvict() {
	if limit := c.eng.maxBlocks; limit > 0 && c.tab.live > limit {
		c.evict(c.tab.live - limit*9/10)
	}
}

// evict drops the n oldest-written blocks with every owner; shared bindings stay (and a
// repeated store re-adds them). The threshold epoch is found with a histogram pass and an
// exact pass over one bucket, so eviction needs no per-block ordering structure.
func (c *context) evict(n int) {
	if n <= 0 {
		return
	}
	ar := c.tab.ar
	hw := ar.HighWater()
	lo, hi := ^uint64(0), uint64(0)
	for idx := uint32(0); idx < hw; idx++ {
		m := ar.Record(idx)[recMeta]
		if m&metaFree != 0 {
			continue
		}
		e := m >> metaEpochShift
		lo, hi = min(lo, e), max(hi, e)
	}
	const buckets = 1 << 12
	sh := uint(0)
	for (hi-lo)>>sh >= buckets {
		sh++
	}
	if cap(c.evictHist) < buckets {
		c.evictHist = make([]int, buckets)
	}
	hist := c.evictHist[:buckets]
	clear(hist)
	for idx := uint32(0); idx < hw; idx++ {
		m := ar.Record(idx)[recMeta]
		if m&metaFree == 0 {
			hist[((m>>metaEpochShift)-lo)>>sh]++
		}
	}
	need, bucket := n, 0
	for ; bucket < buckets && hist[bucket] < need; bucket++ {
		need -= hist[bucket]
	}
	scr := c.evictScr[:0]
	for idx := uint32(0); idx < hw; idx++ {
		m := ar.Record(idx)[recMeta]
		if m&metaFree == 0 && int(((m>>metaEpochShift)-lo)>>sh) == bucket {
			scr = append(scr, m>>metaEpochShift)
		}
	}
	slices.Sort(scr)
	thr := scr[need-1] // epochs are unique, so exactly n records are at or below thr
	c.evictScr = scr[:0]

	w := c.tab.w
	evicted := 0
	for idx := uint32(0); idx < hw; idx++ {
		rec := ar.Record(idx)
		m := rec[recMeta]
		if m&metaFree != 0 || m>>metaEpochShift > thr {
			continue
		}
		for t := 0; t < 3; t++ {
			for j := 0; j < w; j++ {
				for b := rec[recBits+t*w+j]; b != 0; b &= b - 1 {
					c.slotCounts[j*64+bits.TrailingZeros64(b)][t]--
				}
			}
		}
		key := rec[recKey]
		delete(c.shared, key)
		pos, _, _ := c.tab.slotOf(key)
		c.deleteRecord(pos, idx, rec)
		evicted++
	}
	c.evictions.Add(1)
	total := c.evictedBlocks.Add(uint64(evicted))
	c.eng.log.Warn("prefix context over capacity: evicted oldest-written blocks",
		"tenant_id", c.key.TenantID, "model_name", c.key.ModelName, "lora_name", c.key.LoraName,
		"block_size", c.key.BlockSize, "evicted", evicted, "remaining", c.tab.live,
		"max_blocks", c.eng.maxBlocks, "evicted_total", total)
}

// rebuild replaces c.tab with a table sized for live entries and records of w bitset
// words per tier. It re-indexes the same arena, or copies every live record into a new
// arena when the width grows or most of the old one is free. Readers keep using the old table until the
// caller publishes. The caller publishes.
func (c *context) rebuild(live, w int) {
	old := c.tab
	ar := old.ar
	// A new arena also compacts one that removals left mostly free.
	compact := w != old.w || int(old.ar.HighWater()) > 4*live+arena.DefaultChunkRecords
	if compact {
		ar = arena.New(arena.Config{RecordWords: recordWords(w)})
	}
	nt := newTable(sizeFor(live), ar, w)
	hw := old.ar.HighWater()
	for idx := uint32(0); idx < hw; idx++ {
		rec := old.ar.Record(idx)
		if rec[recMeta]&metaFree != 0 {
			continue
		}
		nidx := idx
		if compact {
			nidx = ar.Alloc()
			nrec := ar.Record(nidx)
			nrec[recKey], nrec[recMeta] = rec[recKey], rec[recMeta]
			for t := 0; t < 3; t++ {
				copy(nrec[recBits+t*w:recBits+t*w+old.w], rec[recBits+t*old.w:recBits+(t+1)*old.w])
			}
		}
		nt.insertNew(rec[recKey], nidx)
	}
	c.tab = nt
}

// maybeShrink rebuilds a table that clears and removals left mostly empty.
func (c *context) maybeShrink() {
	t := c.tab
	if len(t.entries) > minTableCap && t.live*8 < len(t.entries) && sizeFor(t.live) < len(t.entries) {
		c.rebuild(t.live, t.w)
		c.publishTable()
	}
}
