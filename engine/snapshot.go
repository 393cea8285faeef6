package engine

import (
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/hashing"
)

// DefaultSnapshotStep is how many records one snapshot step copies: the context's writer
// does nothing else during a step (a few hundred microseconds), then serves its queue
// again before the next one.
const DefaultSnapshotStep = 4096

// SnapshotEntry is one (block, slot) pair of an engine-tier block: Slot indexes the
// chunk's Slots, Tiers says in which engine tiers that slot holds the block.
type SnapshotEntry struct {
	Key   uint64
	Slot  uint32
	Tiers TierMask
}

// SnapshotBinding is one shared binding (a Mooncake Store object bound to a block) with
// the physical components still present.
type SnapshotBinding struct {
	Source, Backend, ObjectKey string
	Tier                       SharedTier
	Hash                       uint64
	Components                 []string
}

// SnapshotChunk is what one snapshot step copied from a context: its registered slots
// at that step, and the blocks and bindings of the records the step visited.
type SnapshotChunk struct {
	Slots    []Slot
	Entries  []SnapshotEntry
	Bindings []SnapshotBinding
}

// Reset empties the chunk, keeping its memory.
func (ch *SnapshotChunk) Reset() {
	ch.Slots = ch.Slots[:0]
	ch.Entries = ch.Entries[:0]
	ch.Bindings = ch.Bindings[:0]
}

// SnapshotContext copies the context of key in steps of at most step records (0:
// DefaultSnapshotStep), each taken by the context's writer between two of its requests,
// and calls fn with each step's chunk (off the writer; the chunk is reused afterwards).
// Each record is copied whole at one moment, but different steps see different moments:
// the copy is exact only when nothing changes the context meanwhile (a quiescent node).
// An error from fn stops the copy and is returned.
func (e *Engine) SnapshotContext(key ContextKey, step int, fn func(*SnapshotChunk) error) error {
	if step <= 0 {
		step = DefaultSnapshotStep
	}
	c := e.lookup(key)
	if c == nil {
		return ErrUnknownContext
	}
	var ch SnapshotChunk
	cursor := uint32(0)
	for {
		ch.Reset()
		done := false
		r := e.getReq()
		r.kind = reqSync
		r.fn = func(c *context) { done = c.snapshotStep(&ch, &cursor, step) }
		err := c.do(r)
		dropped := r.dropped || errors.Is(err, errDropped)
		r.fn = nil
		e.putReq(r)
		if dropped {
			return ErrUnknownContext
		}
		if err != nil {
			return err
		}
		if len(ch.Entries) > 0 || len(ch.Bindings) > 0 || cursor == 0 || done {
			if err := fn(&ch); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// snapshotStep copies up to step records from *cursor on; it reports whether the cursor
// reached the end of the arena. Writer only.
func (c *context) snapshotStep(ch *SnapshotChunk, cursor *uint32, step int) bool {
	nums := make(map[int]uint32, len(c.slots))
	for s, n := range c.slots {
		nums[n] = uint32(len(ch.Slots))
		ch.Slots = append(ch.Slots, s)
	}
	ar := c.tab.ar
	end := ar.HighWater()
	w := c.tab.w
	for ; *cursor < end && step > 0; *cursor++ {
		step--
		rec := ar.Record(*cursor)
		meta := rec[recMeta]
		if meta&metaFree != 0 {
			continue
		}
		k := rec[recKey]
		bw := rec[recBits:]
		for n, used := range c.slotUsed {
			if !used {
				continue
			}
			var tiers TierMask
			for t := 0; t < 3; t++ {
				wo, bit := bitAt(w, t, n)
				if bw[wo]&bit != 0 {
					tiers |= 1 << t
				}
			}
			if tiers != 0 {
				if idx, ok := nums[n]; ok {
					ch.Entries = append(ch.Entries, SnapshotEntry{Key: k, Slot: idx, Tiers: tiers})
				}
			}
		}
		if meta&metaFlags != 0 {
			sc := c.shared[k]
			for b := sc.head; b != nil; b = b.next {
				if b.gen != sc.gen || c.bindings[b.key] != b {
					continue
				}
				ch.Bindings = append(ch.Bindings, SnapshotBinding{Source: b.key.source, Backend: b.key.backend,
					ObjectKey: b.key.object, Tier: b.key.tier, Hash: b.hash, Components: append([]string(nil), b.comps...)})
			}
		}
	}
	return *cursor >= end
}

// LoadSnapshotChunk applies a snapshot chunk to the context of key, creating the context
// with profile p when absent (a context with another profile is ErrProfileConflict).
// Entries of slots for which allowSlot is false, and bindings for which allowSource is
// false, are skipped and counted in skipped; the rest goes through Apply, as events
// would. It returns how many blocks entries and bindings it applied.
func (e *Engine) LoadSnapshotChunk(key ContextKey, p hashing.Profile, ch *SnapshotChunk,
	allowSlot func(Slot) bool, allowSource func(string) bool) (applied, skipped int, err error) {
	if cp, ok := e.ContextProfile(key); ok && !cp.Equal(p) {
		return 0, 0, ErrProfileConflict
	}
	for i := range ch.Entries {
		if int(ch.Entries[i].Slot) >= len(ch.Slots) {
			return 0, 0, fmt.Errorf("snapshot entry %d names slot %d of %d", i, ch.Entries[i].Slot, len(ch.Slots))
		}
	}
	// One store op per (slot, tier), in the chunk's record order.
	type st struct {
		slot uint32
		tier EngineTier
	}
	byOp := map[st][]uint64{}
	var order []st
	for _, en := range ch.Entries {
		if allowSlot != nil && !allowSlot(ch.Slots[en.Slot]) {
			skipped++
			continue
		}
		for t := TierDevice; t <= TierDisk; t++ {
			if en.Tiers&(1<<t) == 0 {
				continue
			}
			k := st{en.Slot, t}
			if _, ok := byOp[k]; !ok {
				order = append(order, k)
			}
			byOp[k] = append(byOp[k], en.Key)
		}
		applied++
	}
	ops := make([]Op, 0, len(order)+len(ch.Bindings))
	for _, k := range order {
		s := ch.Slots[k.slot]
		if _, err := e.RegisterSlot(key, p, s); err != nil {
			return 0, 0, err
		}
		ops = append(ops, Op{Kind: OpStore, Slot: s, Tier: k.tier, Hashes: byOp[k]})
	}
	for _, b := range ch.Bindings {
		if allowSource != nil && !allowSource(b.Source) {
			skipped++
			continue
		}
		comps := b.Components
		if len(comps) == 0 {
			comps = []string{""}
		}
		for _, comp := range comps {
			ops = append(ops, Op{Kind: OpSharedStore, Source: b.Source, Backend: b.Backend, ObjectKey: b.ObjectKey,
				Component: comp, SharedTier: b.Tier, Hash: b.Hash})
		}
		applied++
	}
	if len(ops) == 0 {
		return applied, skipped, nil
	}
	if _, ok := e.ContextProfile(key); !ok {
		if _, err := e.getOrCreate(key, p); err != nil {
			return 0, 0, err
		}
	}
	if err := e.Apply(key, ops); err != nil {
		return 0, 0, err
	}
	for i := range ops {
		if ops[i].Err != nil {
			return applied, skipped, fmt.Errorf("snapshot op %d: %w", i, ops[i].Err)
		}
	}
	return applied, skipped, nil
}
