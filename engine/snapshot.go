package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/conductor-go/conductor/hashing"
)

// DefaultSnapshotStep is how many records one snapshot step copies: the context's writer
// does nothing else during a step, then serves its queue again before the next one.
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

// SnapshotChunk is what one snapshot step copied from a context: the changes the writer
// applied since the previous step (Journal, to be applied first), its registered slots at
// this step, and the blocks and bindings of the records the step visited.
type SnapshotChunk struct {
	Journal  []SnapshotOp
	Slots    []Slot
	Entries  []SnapshotEntry
	Bindings []SnapshotBinding
}

// SnapshotOp is one change applied while a snapshot was being copied: an Op (Hashes
// copied), or with Retract set, the removal of every binding of Op.Source (with
// ClearShared, only those of Op.Source and Op.Backend).
type SnapshotOp struct {
	Op
	Retract, ClearShared bool
}

// Reset empties the chunk, keeping its memory.
func (ch *SnapshotChunk) Reset() {
	ch.Journal = ch.Journal[:0]
	ch.Slots = ch.Slots[:0]
	ch.Entries = ch.Entries[:0]
	ch.Bindings = ch.Bindings[:0]
}

// MaxSnapshotJournal bounds the block hashes a context's snapshot journal holds between
// two steps; a snapshot whose context changes faster than that fails with
// ErrSnapshotJournalFull (and can be retried).
const MaxSnapshotJournal = 4 << 20

// ErrSnapshotJournalFull: too many changes arrived between two snapshot steps.
var ErrSnapshotJournalFull = errors.New("engine: context changed faster than its snapshot could record (snapshot journal full)")

// snapJournal records the changes a context's writer applies while a snapshot of it is
// being copied (writer-owned).
type snapJournal struct {
	ops    []SnapshotOp
	hashes int
	full   bool
}

// recordOps records applied ops (a whole Apply, or the part of one applied before it
// stalled on a clear, the rest being recorded when it resumes).
func (j *snapJournal) recordOps(ops []Op) {
	if j.full {
		return
	}
	for i := range ops {
		op := ops[i]
		op.Err = nil
		op.Hashes = append([]uint64(nil), op.Hashes...)
		j.hashes += len(op.Hashes) + 1
		j.ops = append(j.ops, SnapshotOp{Op: op})
	}
	if j.hashes > MaxSnapshotJournal {
		j.full = true
		j.ops = nil
	}
}

func (j *snapJournal) record(r *request) {
	if j.full {
		return
	}
	switch r.kind {
	case reqApply:
		j.recordOps(r.ops)
	case reqClearShared:
		j.ops = append(j.ops, SnapshotOp{Op: Op{Source: r.source, Backend: r.backend}, Retract: true, ClearShared: true})
	case reqRetractSource:
		j.ops = append(j.ops, SnapshotOp{Op: Op{Source: r.source}, Retract: true})
	}
	if j.hashes > MaxSnapshotJournal {
		j.full = true
		j.ops = nil
	}
}

// SnapshotContext copies the context of key in steps of at most step records (0:
// DefaultSnapshotStep), each taken by the context's writer between two of its requests,
// and calls fn with each step's chunk (off the writer; the chunk is reused afterwards).
//
// Each record is copied whole at one moment, and every change the writer applies between
// two steps is recorded and handed over in the next chunk's Journal. Loading the chunks in
// order (LoadSnapshotChunk: journal, then records, the records adding to what is there)
// rebuilds the context as it was at the last step: a block bit is set by the last change
// that touched it, and a record copied later already holds every earlier change. Blocks
// the context evicted for its block budget during the copy may remain in the rebuilt one
// (they are blocks the engine did store). An error from fn stops the copy and is returned.
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
	first := true
	// This snapshot's own journal: snapshots of the same context copied at once each
	// record every change between their own steps.
	j := &snapJournal{}
	leave := func(c *cacheContext) {
		if i := slices.Index(c.snaps, j); i >= 0 {
			c.snaps = slices.Delete(c.snaps, i, i+1)
		}
	}
	sync := func(f func(c *cacheContext)) error {
		r := e.getReq()
		r.kind = reqSync
		r.fn = f
		err := c.do(r)
		dropped := r.dropped || errors.Is(err, errDropped)
		r.fn = nil
		e.putReq(r)
		if dropped {
			return ErrUnknownContext
		}
		return err
	}
	for {
		ch.Reset()
		done, full := false, false
		err := sync(func(c *cacheContext) {
			if first {
				c.snaps = append(c.snaps, j)
			}
			if j.full {
				full = true
				leave(c)
				return
			}
			ch.Journal = append(ch.Journal, j.ops...)
			j.ops, j.hashes = j.ops[:0], 0
			done = c.snapshotStep(&ch, &cursor, step)
			if done {
				leave(c)
			}
		})
		first = false
		if err != nil {
			return err
		}
		if full {
			return ErrSnapshotJournalFull
		}
		if err := fn(&ch); err != nil {
			if !done {
				_ = sync(leave)
			}
			return err
		}
		if done {
			return nil
		}
	}
}

// snapshotStep copies up to step records from *cursor on; it reports whether the cursor
// reached the end of the arena. Writer only.
func (c *cacheContext) snapshotStep(ch *SnapshotChunk, cursor *uint32, step int) bool {
	nums := make(map[int]uint32, len(c.slots))
	for s, n := range c.slots {
		nums[n] = uint32(len(ch.Slots))
		ch.Slots = append(ch.Slots, s)
	}
	ar := c.tab.ar
	end := ar.HighWater()
	w := c.tab.w
	var masked []uint64
	for ; *cursor < end && step > 0; *cursor++ {
		step--
		rec := ar.Record(*cursor)
		meta := rec[recMeta]
		if meta&metaFree != 0 {
			continue
		}
		k := rec[recKey]
		bw := rec[recBits:]
		if c.clr != nil {
			// Bits of a pending slot clear stay in records until the sweep reaches them,
			// and a freed slot number may already name a new owner: copy what readers see.
			if m := c.clr.mask(meta); m != nil {
				masked = append(masked[:0], bw...)
				for j := range masked {
					masked[j] &^= m[j]
				}
				bw = masked
			}
		}
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
		if meta&metaFlags != 0 && c.bs != nil {
			c.bs.eachOf(k, func(source, backend, key string, tier SharedTier, comps []string) {
				ch.Bindings = append(ch.Bindings, SnapshotBinding{Source: source, Backend: backend,
					ObjectKey: key, Tier: tier, Hash: k, Components: append([]string(nil), comps...)})
			})
		}
	}
	return *cursor >= end
}

// LoadSnapshotChunk applies a snapshot chunk to the context of key, creating the context
// with profile p when absent (a context with another profile is ErrProfileConflict).
// Entries of slots for which allowSlot is false, and bindings for which allowSource is
// false, are skipped and counted in skipped; the rest goes through Apply, as events
// would. It returns how many blocks entries and bindings it applied. A load that must
// apply whole or not at all goes through a Stage instead.
func (e *Engine) LoadSnapshotChunk(key ContextKey, p hashing.Profile, ch *SnapshotChunk,
	allowSlot func(Slot) bool, allowSource func(string) bool) (applied, skipped int, err error) {
	return loadChunk(liveTarget{e}, key, p, ch, allowSlot, allowSource)
}

// loadTarget is where a snapshot chunk goes: the engine's published contexts
// (liveTarget) or a stage's (Stage).
type loadTarget interface {
	// profile is the profile the context of key has (or will have), if any.
	profile(key ContextKey) (hashing.Profile, bool)
	// context returns the context of key, creating it with profile p.
	context(key ContextKey, p hashing.Profile) (*cacheContext, error)
}

// liveTarget loads into the engine's published contexts.
type liveTarget struct{ e *Engine }

func (t liveTarget) profile(key ContextKey) (hashing.Profile, bool) { return t.e.ContextProfile(key) }
func (t liveTarget) context(key ContextKey, p hashing.Profile) (*cacheContext, error) {
	return t.e.getOrCreate(key, p)
}

// request runs one request of kind on c (filled by set) and reports the writer's
// verdict: errDropped when the context was dropped or retired first.
func (c *cacheContext) request(kind reqKind, set func(r *request)) error {
	r := c.eng.getReq()
	r.kind = kind
	set(r)
	err := c.do(r)
	if r.dropped {
		err = errDropped
	}
	c.eng.putReq(r)
	return err
}

// requestOn runs a request on the target's context of key, created when absent.
func requestOn(t loadTarget, key ContextKey, p hashing.Profile, kind reqKind, set func(r *request)) error {
	c, err := t.context(key, p)
	if err != nil {
		return err
	}
	return c.request(kind, set)
}

// loadChunk is LoadSnapshotChunk on target t.
func loadChunk(t loadTarget, key ContextKey, p hashing.Profile, ch *SnapshotChunk,
	allowSlot func(Slot) bool, allowSource func(string) bool) (applied, skipped int, err error) {
	if cp, ok := t.profile(key); ok && !cp.Equal(p) {
		return 0, 0, ErrProfileConflict
	}
	for i := range ch.Entries {
		if int(ch.Entries[i].Slot) >= len(ch.Slots) {
			return 0, 0, fmt.Errorf("snapshot entry %d names slot %d of %d", i, ch.Entries[i].Slot, len(ch.Slots))
		}
	}
	if err := loadJournal(t, key, p, ch.Journal, allowSlot, allowSource); err != nil {
		return 0, 0, err
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
		for tier := TierDevice; tier <= TierDisk; tier++ {
			if en.Tiers&(1<<tier) == 0 {
				continue
			}
			k := st{en.Slot, tier}
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
		if err := registerSlotOn(t, key, p, s); err != nil {
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
	if err := applyOn(t, key, p, ops); err != nil {
		return 0, 0, err
	}
	for i := range ops {
		if ops[i].Err != nil {
			return applied, skipped, fmt.Errorf("snapshot op %d: %w", i, ops[i].Err)
		}
	}
	return applied, skipped, nil
}

// registerSlotOn registers slot in the target's context of key, as RegisterSlot does.
func registerSlotOn(t loadTarget, key ContextKey, p hashing.Profile, slot Slot) error {
	if lt, ok := t.(liveTarget); ok {
		_, err := lt.e.RegisterSlot(key, p, slot)
		return err
	}
	return requestOn(t, key, p, reqRegister, func(r *request) { r.slot = slot })
}

// applyOn applies ops to the target's context of key (created when absent), as Apply does.
func applyOn(t loadTarget, key ContextKey, p hashing.Profile, ops []Op) error {
	if lt, ok := t.(liveTarget); ok {
		if _, ok := lt.e.ContextProfile(key); !ok {
			if _, err := lt.e.getOrCreate(key, p); err != nil {
				return err
			}
		}
		return lt.e.Apply(key, ops)
	}
	return requestOn(t, key, p, reqApply, func(r *request) { r.ops = ops })
}

// loadJournal applies a chunk's journal in order, leaving out changes of slots and
// sources that are not allowed.
func loadJournal(t loadTarget, key ContextKey, p hashing.Profile, j []SnapshotOp,
	allowSlot func(Slot) bool, allowSource func(string) bool) error {
	var ops []Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := applyOn(t, key, p, ops)
		ops = ops[:0]
		return err
	}
	for i := range j {
		op := &j[i]
		switch {
		case op.Retract:
			if allowSource != nil && !allowSource(op.Source) {
				continue
			}
			if err := flush(); err != nil {
				return err
			}
			if _, ok := t.profile(key); !ok {
				continue // nothing there to retract
			}
			kind, backend := reqRetractSource, ""
			if op.ClearShared {
				kind, backend = reqClearShared, op.Backend
			}
			if err := requestOn(t, key, p, kind, func(r *request) { r.source, r.backend = op.Source, backend }); err != nil &&
				!errors.Is(err, errDropped) && !errors.Is(err, ErrClosed) {
				return err
			}
		case op.Kind == OpSharedStore || op.Kind == OpSharedRemove:
			if allowSource == nil || allowSource(op.Source) {
				ops = append(ops, op.Op)
			}
		default:
			if allowSlot != nil && !allowSlot(op.Slot) {
				continue
			}
			if op.Kind == OpStore {
				if err := registerSlotOn(t, key, p, op.Slot); err != nil {
					return err
				}
			}
			ops = append(ops, op.Op)
		}
	}
	return flush()
}
