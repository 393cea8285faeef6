package engine

import (
	"unsafe"

	"github.com/conductor-go/conductor/arena"
)

// bindTable, the hash index of a context's shared bindings (see bindings.go).

// bindTable finds bindings by a 64-bit hash: extendible hashing over fixed tables of
// tabSlots uint32 slots (binding index+1, 0 empty; linear probing within a table,
// backward-shift deletion), allocated from an arena outside the Go heap. A directory on
// the heap maps the top depth bits of a hash to a table; a table past 3/4 full splits in
// two (one table's entries moved: bounded work, no whole-index rehash on the event path),
// doubling the directory when its local depth reaches the global one. Tables are between
// 3/8 and 3/4 full after their first split, about 7 bytes per entry.
type bindTable struct {
	ar    *arena.Arena
	dir   []uint32 // table per directory entry
	depth uint     // global depth: len(dir) == 1<<depth
	local []uint8  // per table: its local depth
	count []uint16 // per table: used slots
	n     int
	tmp   []uint32 // split buffer
}

const (
	tabSlots    = 1024
	tabMask     = tabSlots - 1
	tabMaxLoad  = tabSlots * 3 / 4
	tabMaxDepth = 40
)

func newBindTable() bindTable {
	t := bindTable{ar: arena.New(arena.Config{RecordWords: tabSlots / 2, ChunkRecords: 64})}
	ti := t.ar.Alloc()
	t.dir = []uint32{ti}
	t.local = []uint8{0}
	t.count = []uint16{0}
	return t
}

func (t *bindTable) release() { t.ar.Release() }

// table returns the slots of table ti.
func (t *bindTable) table(ti uint32) []uint32 {
	w := t.ar.Record(ti)
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(w))), tabSlots)
}

func (t *bindTable) tableOf(h uint64) uint32 {
	if t.depth == 0 {
		return t.dir[0]
	}
	return t.dir[h>>(64-t.depth)]
}

// slotRef names slot pos of table ti.
type slotRef struct {
	ti  uint32
	pos uint32
}

func (t *bindTable) get(r slotRef) uint32    { return t.table(r.ti)[r.pos] }
func (t *bindTable) set(r slotRef, v uint32) { t.table(r.ti)[r.pos] = v }

// probe calls match on each value of h's probe run until it returns true (found) or the
// run ends at an empty slot (not found, that slot returned).
func (t *bindTable) probe(h uint64, match func(v uint32) bool) (slotRef, bool) {
	ti := t.tableOf(h)
	slots := t.table(ti)
	for i := uint32(h) & tabMask; ; i = (i + 1) & tabMask {
		v := slots[i]
		if v == 0 {
			return slotRef{ti, i}, false
		}
		if match(v) {
			return slotRef{ti, i}, true
		}
	}
}

// slotOf returns the slot holding v, inserted under hash h.
func (t *bindTable) slotOf(h uint64, v uint32) slotRef {
	r, _ := t.probe(h, func(x uint32) bool { return x == v })
	return r
}

// hashOf recomputes the hash under which slot value v was inserted.
func (s *bindStore) hashOf(v uint32, blk bool) uint64 {
	if blk {
		return s.blkHash(s.tailRec(v - 1))
	}
	return s.entObjHash(s.ent(v - 1))
}

func (t *bindTable) insert(s *bindStore, h uint64, v uint32, blk bool) {
	ti := t.tableOf(h)
	for int(t.count[ti]) >= tabMaxLoad && t.local[ti] < tabMaxDepth {
		t.split(s, ti, blk)
		ti = t.tableOf(h)
	}
	if int(t.count[ti]) >= tabSlots-1 {
		panic("engine: binding table full at its maximum depth") // unreachable with a seeded hash
	}
	t.place(ti, h, v)
	t.n++
}

func (t *bindTable) place(ti uint32, h uint64, v uint32) {
	slots := t.table(ti)
	i := uint32(h) & tabMask
	for slots[i] != 0 {
		i = (i + 1) & tabMask
	}
	slots[i] = v
	t.count[ti]++
}

// split moves the entries of table ti whose next hash bit is set to a new table.
func (t *bindTable) split(s *bindStore, ti uint32, blk bool) {
	if uint(t.local[ti]) == t.depth {
		nd := make([]uint32, 2*len(t.dir))
		for i, x := range t.dir {
			nd[2*i], nd[2*i+1] = x, x
		}
		t.dir = nd
		t.depth++
	}
	nt := t.ar.Alloc()
	clear(t.table(nt)) // a reused table keeps its old words
	for int(nt) >= len(t.local) {
		t.local = append(t.local, 0)
		t.count = append(t.count, 0)
	}
	t.local[ti]++
	t.local[nt] = t.local[ti]
	t.count[nt] = 0
	// The directory entries of ti are a run of 1<<(depth-oldLocal); its upper half goes to nt.
	span := 1 << (t.depth - uint(t.local[ti]) + 1)
	first := 0
	for t.dir[first] != ti {
		first += span
	}
	for j := first + span/2; j < first+span; j++ {
		t.dir[j] = nt
	}
	slots := t.table(ti)
	t.tmp = append(t.tmp[:0], slots...)
	clear(slots)
	t.count[ti] = 0
	for _, v := range t.tmp {
		if v != 0 {
			h := s.hashOf(v, blk)
			t.place(t.tableOf(h), h, v)
		}
	}
}

// delete empties slot r, shifting back the entries of its probe run that follow it.
func (t *bindTable) delete(s *bindStore, r slotRef, blk bool) {
	slots := t.table(r.ti)
	i := r.pos
	slots[i] = 0
	t.count[r.ti]--
	t.n--
	for j := (i + 1) & tabMask; slots[j] != 0; j = (j + 1) & tabMask {
		home := uint32(s.hashOf(slots[j], blk)) & tabMask
		// The entry at j may move to i when its home is not in (i, j] (cyclically).
		if (j-home)&tabMask >= (j-i)&tabMask {
			slots[i], slots[j] = slots[j], 0
			i = j
		}
	}
}
