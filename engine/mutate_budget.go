package engine

import (
	"math"
	"math/bits"
	"time"
)

// Capacity and memory budgets: charges, eviction of the oldest blocks, debts between
// contexts. Everything in this file runs on the context writer goroutine (see mutate.go).

// charge adds n blocks or bindings and b bytes to the engine-wide counts (Engine.total,
// Engine.bytes). With an engine budget (Config.MaxBlocks, MemoryLimitBytes), which
// maybeEvict checks against those counts after every new block, at once, as other
// contexts' writers read them too; otherwise the counts are only reported
// (TotalBlocks, IndexBytes), and the writer adds them up and publishes them once per
// step (flushCharges, before it hands a request back) instead of two atomic additions,
// contended across writers, per block.
func (c *cacheContext) charge(n, b int64) {
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
func (c *cacheContext) flushCharges() {
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
func (c *cacheContext) maybeEvict() {
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
func (c *cacheContext) units() int {
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
func (c *cacheContext) evictForBudget() bool {
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
func (c *cacheContext) payDebt() {
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
func (c *cacheContext) countEvicted(evicted int, msg string) {
	if evicted == 0 {
		return
	}
	c.evictions.Add(1)
	total := c.evictedBlocks.Add(uint64(evicted))
	c.logEviction(msg, evicted, total)
}

// evictOldest drops the oldest-written block.
func (c *cacheContext) evictOldest() {
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
func (c *cacheContext) logEviction(msg string, evicted int, total uint64) {
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
