package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// refModel is a deliberately naive model of the index, written straight from reference
// notes §4: per context, maps of owner sets per tier, a write-order stamp per block, and the
// nested-phase walk with one cursor per rank. The differential tests compare the engine
// against it.
type refModel struct {
	max  int // capacity per context; 0 unlimited
	ctxs map[ContextKey]*refCtx
}

// bindingKey identifies a shared binding within a context in the model.
type bindingKey struct {
	source, backend, object string
	tier                    SharedTier
}

type refBinding struct {
	hash  uint64
	comps map[string]bool
}

type refCtx struct {
	slots    map[Slot]bool
	dev      map[uint64]map[Slot]bool
	loc      map[uint64]map[Slot]bool
	dsk      map[uint64]map[Slot]bool
	cpuOwn   map[uint64]map[bindingKey]bool
	diskOwn  map[uint64]map[bindingKey]bool
	bindings map[bindingKey]*refBinding
	written  map[uint64]int // last store stamp per block
	stamp    int
	evicted  int
}

func newRefModel(max int) *refModel {
	return &refModel{max: max, ctxs: map[ContextKey]*refCtx{}}
}

func (m *refModel) register(k ContextKey, s Slot) bool {
	c := m.ctxs[k]
	if c == nil {
		c = &refCtx{
			slots: map[Slot]bool{}, dev: map[uint64]map[Slot]bool{}, loc: map[uint64]map[Slot]bool{},
			dsk: map[uint64]map[Slot]bool{}, cpuOwn: map[uint64]map[bindingKey]bool{},
			diskOwn: map[uint64]map[bindingKey]bool{}, bindings: map[bindingKey]*refBinding{},
			written: map[uint64]int{},
		}
		m.ctxs[k] = c
	}
	if c.slots[s] {
		return false
	}
	c.slots[s] = true
	return true
}

func (c *refCtx) tierMap(t EngineTier) map[uint64]map[Slot]bool {
	switch t {
	case TierDevice:
		return c.dev
	case TierCPULocal:
		return c.loc
	default:
		return c.dsk
	}
}

func (c *refCtx) exists(h uint64) bool {
	return len(c.dev[h])+len(c.loc[h])+len(c.dsk[h])+len(c.cpuOwn[h])+len(c.diskOwn[h]) > 0
}

func (c *refCtx) blockKeys() []uint64 {
	set := map[uint64]bool{}
	for _, mm := range []map[uint64]map[Slot]bool{c.dev, c.loc, c.dsk} {
		for h, s := range mm {
			if len(s) > 0 {
				set[h] = true
			}
		}
	}
	for _, mm := range []map[uint64]map[bindingKey]bool{c.cpuOwn, c.diskOwn} {
		for h, s := range mm {
			if len(s) > 0 {
				set[h] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func addTo[K comparable](mm map[uint64]map[K]bool, h uint64, k K) {
	if mm[h] == nil {
		mm[h] = map[K]bool{}
	}
	mm[h][k] = true
}

func delFrom[K comparable](mm map[uint64]map[K]bool, h uint64, k K) {
	delete(mm[h], k)
	if len(mm[h]) == 0 {
		delete(mm, h)
	}
}

// stored records a successful store of h; a store that created the block or a binding may
// push the context over capacity, which counts blocks and bindings: the oldest-written
// blocks go, with their bindings, until it fits.
func (m *refModel) stored(c *refCtx, h uint64, existed, addedBinding bool) {
	c.stamp++
	c.written[h] = c.stamp
	if (!existed || addedBinding) && m.max > 0 {
		for len(c.blockKeys())+len(c.bindings) > m.max && len(c.blockKeys()) > 0 {
			m.evictOldest(c)
		}
	}
}

func (m *refModel) evictOldest(c *refCtx) {
	keys := c.blockKeys()
	sort.Slice(keys, func(i, j int) bool { return c.written[keys[i]] < c.written[keys[j]] })
	h := keys[0]
	delete(c.dev, h)
	delete(c.loc, h)
	delete(c.dsk, h)
	delete(c.cpuOwn, h)
	delete(c.diskOwn, h)
	delete(c.written, h)
	for bk, b := range c.bindings {
		if b.hash == h {
			delete(c.bindings, bk)
		}
	}
	c.evicted++
}

func (m *refModel) apply(k ContextKey, ops []Op) ([]error, error) {
	c := m.ctxs[k]
	if c == nil {
		return nil, ErrUnknownContext
	}
	errs := make([]error, len(ops))
	for i := range ops {
		errs[i] = m.applyOp(c, &ops[i])
	}
	return errs, nil
}

func (m *refModel) applyOp(c *refCtx, op *Op) error {
	switch op.Kind {
	case OpStore:
		if !c.slots[op.Slot] {
			return ErrSlotNotRegistered
		}
		for _, h := range op.Hashes {
			existed := c.exists(h)
			addTo(c.tierMap(op.Tier), h, op.Slot)
			m.stored(c, h, existed, false)
		}
	case OpRemove:
		for _, h := range op.Hashes {
			delFrom(c.tierMap(op.Tier), h, op.Slot)
		}
	case OpClear:
		for t := TierDevice; t <= TierDisk; t++ {
			if op.ClearTiers&(1<<t) == 0 {
				continue
			}
			tm := c.tierMap(t)
			for h := range tm {
				delFrom(tm, h, op.Slot)
			}
		}
	case OpSharedStore:
		bk := bindingKey{source: op.Source, backend: op.Backend, object: op.ObjectKey, tier: op.SharedTier}
		b := c.bindings[bk]
		if b != nil && b.hash != op.Hash {
			return ErrBindingConflict
		}
		added := b == nil
		if added {
			b = &refBinding{hash: op.Hash, comps: map[string]bool{}}
			c.bindings[bk] = b
		}
		b.comps[op.Component] = true
		existed := c.exists(op.Hash)
		if op.SharedTier == SharedCPU {
			addTo(c.cpuOwn, op.Hash, bk)
		} else {
			addTo(c.diskOwn, op.Hash, bk)
		}
		m.stored(c, op.Hash, existed, added)
	case OpSharedRemove:
		bk := bindingKey{source: op.Source, backend: op.Backend, object: op.ObjectKey, tier: op.SharedTier}
		b := c.bindings[bk]
		if b == nil {
			return nil
		}
		if b.hash != op.Hash {
			return ErrBindingMismatch
		}
		if !b.comps[op.Component] {
			return nil
		}
		delete(b.comps, op.Component)
		if len(b.comps) == 0 {
			c.dropBinding(bk)
		}
	}
	return nil
}

func (c *refCtx) dropBinding(bk bindingKey) {
	b := c.bindings[bk]
	delete(c.bindings, bk)
	delFrom(c.cpuOwn, b.hash, bk)
	delFrom(c.diskOwn, b.hash, bk)
}

func (m *refModel) unregister(k ContextKey, s Slot) {
	c := m.ctxs[k]
	if c == nil || !c.slots[s] {
		return
	}
	delete(c.slots, s)
	for _, tm := range []map[uint64]map[Slot]bool{c.dev, c.loc, c.dsk} {
		for h := range tm {
			delFrom(tm, h, s)
		}
	}
}

func (m *refModel) clearShared(source, backend, tenant string) {
	for k, c := range m.ctxs {
		if k.TenantID != tenant {
			continue
		}
		for bk := range c.bindings {
			if bk.source == source && bk.backend == backend {
				c.dropBinding(bk)
			}
		}
	}
}

func (m *refModel) retract(source string) {
	for _, c := range m.ctxs {
		for bk := range c.bindings {
			if bk.source == source {
				c.dropBinding(bk)
			}
		}
	}
}

// query is the upstream algorithm: for each registered rank one cursor runs through four
// nested phases, each accepting its own tier and every tier above it.
func (m *refModel) query(k ContextKey, keys []uint64, positions int, filter string) []InstanceHit {
	c := m.ctxs[k]
	if c == nil {
		return nil
	}
	byInst := map[string][]int{}
	for s := range c.slots {
		if filter == "" || s.InstanceID == filter {
			byInst[s.InstanceID] = append(byInst[s.InstanceID], s.DPRank)
		}
	}
	matched := func(cur int) int64 { return min(int64(cur)*k.BlockSize, int64(positions)) }
	var out []InstanceHit
	for _, id := range slices.Sorted(maps.Keys(byInst)) {
		ranks := byInst[id]
		slices.Sort(ranks)
		hit := InstanceHit{InstanceID: id}
		for _, r := range ranks {
			s := Slot{id, r}
			npu := func(h uint64) bool { return c.dev[h][s] }
			local := func(h uint64) bool { return npu(h) || c.loc[h][s] }
			share := func(h uint64) bool { return len(c.cpuOwn[h]) > 0 || local(h) }
			disk := func(h uint64) bool { return share(h) || len(c.diskOwn[h]) > 0 || c.dsk[h][s] }
			cur := 0
			var t Tiers
			for _, phase := range []struct {
				pred func(uint64) bool
				out  *int64
			}{{npu, &t.Device}, {local, &t.CPULocal}, {share, &t.CPUShare}, {disk, &t.Disk}} {
				for cur < len(keys) && phase.pred(keys[cur]) {
					cur++
				}
				*phase.out = matched(cur)
			}
			hit.Ranks = append(hit.Ranks, RankHit{Rank: r, Tiers: t})
			hit.Device = max(hit.Device, t.Device)
			hit.CPULocal = max(hit.CPULocal, t.CPULocal)
			hit.CPUShare = max(hit.CPUShare, t.CPUShare)
			hit.Disk = max(hit.Disk, t.Disk)
		}
		out = append(out, hit)
	}
	return out
}

// globalView mirrors Engine.GlobalView's counts and instances.
func (m *refModel) globalView() []ContextView {
	var out []ContextView
	for k, c := range m.ctxs {
		cv := ContextView{Key: k, PrefixCount: uint64(len(c.blockKeys()))}
		byInst := map[string][]int{}
		for s := range c.slots {
			byInst[s.InstanceID] = append(byInst[s.InstanceID], s.DPRank)
		}
		for _, id := range slices.Sorted(maps.Keys(byInst)) {
			r := byInst[id]
			slices.Sort(r)
			cv.Instances = append(cv.Instances, InstanceRanks{InstanceID: id, Ranks: r})
		}
		out = append(out, cv)
	}
	slices.SortFunc(out, func(a, b ContextView) int { return compareKeys(a.Key, b.Key) })
	return out
}

// sameHits compares two answers; nil and empty are equal.
func sameHits(a, b []InstanceHit) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].InstanceID != b[i].InstanceID || a[i].Tiers != b[i].Tiers || !slices.Equal(a[i].Ranks, b[i].Ranks) {
			return false
		}
	}
	return true
}

func formatHits(h []InstanceHit) string {
	var sb strings.Builder
	for _, in := range h {
		fmt.Fprintf(&sb, "%s:", in.InstanceID)
		for _, r := range in.Ranks {
			fmt.Fprintf(&sb, " r%d(%d,%d,%d,%d)", r.Rank, r.Device, r.CPULocal, r.CPUShare, r.Disk)
		}
		sb.WriteString("; ")
	}
	return sb.String()
}

func sameErr(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, b)
}
