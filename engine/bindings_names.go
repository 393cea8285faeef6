package engine

import (
	"math/bits"
)

// Interned names and component sets of a context's shared bindings (see bindings.go).

// compSets interns the sets of component names that bindings hold, with reference
// counts: a set is a bitmask over interned component names (at most setNames live at
// once; a name goes when the last set holding it does), and its id (1..limit; 0 is the
// empty set, never counted) goes when the last binding holding it does. A set that
// cannot be interned (limit sets live, or a name past setNames) is the caller's to keep
// in another form.
type compSets struct {
	names nameTable[string] // refs: the live sets holding the name
	// sets interns the masks: id 0 is the empty set, held for good and never looked up
	// (it has no idx entry), so ids 1..limit are the interned sets.
	sets  nameTable[uint64]
	limit int
}

func newCompSets(limit int) compSets {
	return compSets{sets: nameTable[uint64]{idx: map[uint64]uint16{}, names: []uint64{0}, refs: []uint32{1}}, limit: limit}
}

// with takes a reference on set ∪ {comp} and drops one on set, when comp is not in set
// (added); ok is false when that set cannot be interned (nothing changed then).
func (cs *compSets) with(set uint16, comp string) (nset uint16, added, ok bool) {
	m := cs.sets.names[set]
	c, known := cs.names.idx[comp]
	if known && m&(1<<c) != 0 {
		return set, false, true
	}
	if !known {
		// A reference of its own while the set is interned (which takes one per name).
		if c, ok = cs.names.ref(comp, setNames); !ok {
			return set, true, false
		}
		defer cs.names.unref(c)
	}
	if nset, ok = cs.intern(m | 1<<c); !ok {
		return set, true, false
	}
	cs.release(set)
	return nset, true, true
}

// without takes a reference on set \ {comp} and drops one on set, when comp is in set
// (removed); ok is false when that set cannot be interned (nothing changed then).
func (cs *compSets) without(set uint16, comp string) (nset uint16, removed, ok bool) {
	m := cs.sets.names[set]
	c, known := cs.names.idx[comp]
	if !known || m&(1<<c) == 0 {
		return set, false, true
	}
	if nset, ok = cs.intern(m &^ (1 << c)); !ok {
		return set, true, false
	}
	cs.release(set)
	return nset, true, true
}

// intern takes a reference on the set of mask.
func (cs *compSets) intern(mask uint64) (uint16, bool) {
	if mask == 0 {
		return 0, true
	}
	id, ok := cs.sets.ref(mask, cs.limit+1)
	if ok && cs.sets.refs[id] == 1 { // newly interned: it holds a reference on each name
		for m := mask; m != 0; m &= m - 1 {
			cs.names.refs[bits.TrailingZeros64(m)]++
		}
	}
	return id, ok
}

// release drops a reference on set.
func (cs *compSets) release(set uint16) {
	if set == 0 {
		return
	}
	mask := cs.sets.names[set]
	if cs.sets.refs[set] == 1 { // its last reference: it lets go of its names
		for m := mask; m != 0; m &= m - 1 {
			cs.names.unref(uint16(bits.TrailingZeros64(m)))
		}
	}
	cs.sets.unref(set)
}

func (cs *compSets) appendNames(dst []string, set uint16) []string {
	for m := cs.sets.names[set]; m != 0; m &= m - 1 {
		dst = append(dst, cs.names.names[bits.TrailingZeros64(m)])
	}
	return dst
}

// nameTable interns names (component strings, origins) with reference counts; an index
// is reused once its name's last reference is gone.
type nameTable[K comparable] struct {
	idx   map[K]uint16
	names []K
	refs  []uint32
	free  []uint16
}

// ref takes a reference on name, interning it below limit indices; false when full.
func (t *nameTable[K]) ref(name K, limit int) (uint16, bool) {
	if i, ok := t.idx[name]; ok {
		t.refs[i]++
		return i, true
	}
	var i uint16
	if n := len(t.free); n > 0 {
		i = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		if len(t.names) >= limit {
			return 0, false
		}
		i = uint16(len(t.names))
		var zero K
		t.names = append(t.names, zero)
		t.refs = append(t.refs, 0)
	}
	if t.idx == nil {
		t.idx = map[K]uint16{}
	}
	t.names[i], t.refs[i] = name, 1
	t.idx[name] = i
	return i, true
}

func (t *nameTable[K]) unref(i uint16) {
	if t.refs[i]--; t.refs[i] == 0 {
		// A detached name (see bindStore.detach) no longer owns its map entry.
		if j, ok := t.idx[t.names[i]]; ok && j == i {
			delete(t.idx, t.names[i])
		}
		var zero K
		t.names[i] = zero
		t.free = append(t.free, i)
	}
}
