package engine

import (
	"errors"
	"hash/maphash"
	"math/bits"
	"unsafe"

	"github.com/conductor-go/conductor/arena"
)

// Shared (Mooncake) bindings of one context, kept compact and off the Go heap.
//
// A binding is one fixed-size entry of bindWords words in an arena (outside the Go heap,
// addressed by uint32 index, no pointers):
//
//	w0  the block hash it binds
//	w1  origin, the interned (source, backend) (16 bits) | next binding of the same block,
//	    index+1 (32 bits, from bit 32)
//	w2  component bitmask (bits 0..30 over the interned component names, bit 31: more
//	    components in the overflow list) | tier << 32 | string key << 33 | live << 34
//	w3..w6  the object key: a 64-hex-digit key as 32 binary bytes (big-endian words);
//	    any other key's index in strs (w3)
//
// Origins (source, backend) and component names are interned per context in small tables
// with reference counts (a name goes when its last binding does). Two hash indexes of uint32
// slots (bindTable), also outside the heap, find a binding by (source, backend, tier,
// object key) and the first binding of a block by block hash; the bindings of one block
// are chained through w1.
// All of it is owned by the context's writer goroutine; queries never read it (they read
// the shared flags in the block's record meta).
type bindStore struct {
	ents *arena.Arena
	n    int // live bindings

	obj, blk bindTable

	seed    maphash.Seed
	blkSeed uint64

	origins nameTable[origin] // (source, backend) pairs
	comps   nameTable[string] // components (the first compBits get a bit in w2)
	// doomed marks the origins a pending ClearShared or RetractSource is dropping (see
	// detach); doomedList lists them. Each holds one reference until its sweep ends.
	doomed     []bool
	doomedList []uint16
	strs       []string // object keys that are not 64 hex digits, by index
	strFree    []uint32
	// over holds, per binding index, the components past the bitmask (interned names
	// that got no bit, when compBits names were live at once).
	over map[uint32][]string
}

const (
	bindWords = 7

	bwHash  = 0
	bwNames = 1
	bwFlags = 2
	bwKey   = 3

	compBits     = 31
	flagOverflow = 1 << 31
	flagTier     = 1 << 32
	flagStrKey   = 1 << 33
	flagLive     = 1 << 34
)

// ErrTooManyNames: a shared store named a (source, backend) pair when a context already
// held 65,536 distinct live ones (they are interned in 16 bits).
var ErrTooManyNames = errors.New("too many distinct shared (source, backend) pairs in one context")

// origin is a binding's (source, backend).
type origin struct{ source, backend string }

// Memory charges of a binding (Config.MemoryLimitBytes): its entry (bindWords words) and
// a slot in each of the two index tables, which are between 3/8 and 3/4 full (about 7
// bytes each, 8 charged); an object key that is not 64 hex digits is held as a string (header and
// bytes); a component past the bitmask as a string too. Interned names are shared and
// not charged per binding.
const (
	bindingBaseBytes = bindWords*8 + 16
	stringBytes      = 16
)

func newBindStore() *bindStore {
	s := &bindStore{
		ents: arena.New(arena.Config{RecordWords: bindWords, ChunkRecords: 1 << 12}),
		seed: maphash.MakeSeed(),
		obj:  newBindTable(),
		blk:  newBindTable(),
	}
	s.blkSeed = maphash.Comparable(s.seed, uint64(0x9e3779b97f4a7c15))
	return s
}

// release gives the store's memory back (the store is not used afterwards).
func (s *bindStore) release() {
	s.ents.Release()
	s.obj.release()
	s.blk.release()
}

// objKey is an object key in entry form.
type objKey struct {
	words [4]uint64 // 64 hex digits, when !str
	s     string    // when str
	str   bool
}

func encodeKey(k string) objKey {
	if len(k) != 64 {
		return objKey{s: k, str: true}
	}
	var o objKey
	for i := 0; i < 64; i++ {
		ch := k[i]
		var v uint64
		switch {
		case ch >= '0' && ch <= '9':
			v = uint64(ch - '0')
		case ch >= 'a' && ch <= 'f':
			v = uint64(ch-'a') + 10
		default:
			return objKey{s: k, str: true}
		}
		o.words[i/16] |= v << (60 - 4*uint(i%16))
	}
	return o
}

func fmix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func (s *bindStore) objHash(o uint16, tier uint64, k *objKey) uint64 {
	var h uint64
	if k.str {
		h = maphash.String(s.seed, k.s)
	} else {
		h = maphash.Comparable(s.seed, k.words)
	}
	return fmix(h ^ uint64(o) ^ tier<<32)
}

func (s *bindStore) blkHash(hash uint64) uint64 {
	return fmix(hash ^ s.blkSeed)
}

func (s *bindStore) ent(i uint32) []uint64 { return s.ents.Record(i) }

// entObjHash recomputes the object-table hash of entry e.
func (s *bindStore) entObjHash(e []uint64) uint64 {
	k := objKey{str: e[bwFlags]&flagStrKey != 0}
	if k.str {
		k.s = s.strs[uint32(e[bwKey])]
	} else {
		copy(k.words[:], e[bwKey:bwKey+4])
	}
	return s.objHash(uint16(e[bwNames]), (e[bwFlags]>>32)&1, &k)
}

func (s *bindStore) matches(e []uint64, o uint16, tier uint64, k *objKey) bool {
	if uint16(e[bwNames]) != o || (e[bwFlags]>>32)&1 != tier {
		return false
	}
	if k.str {
		return e[bwFlags]&flagStrKey != 0 && s.strs[uint32(e[bwKey])] == k.s
	}
	return e[bwFlags]&flagStrKey == 0 && e[bwKey] == k.words[0] && e[bwKey+1] == k.words[1] &&
		e[bwKey+2] == k.words[2] && e[bwKey+3] == k.words[3]
}

// find returns the binding (source, backend, tier, object key), if any.
func (s *bindStore) find(source, backend string, tier SharedTier, key string) (uint32, bool) {
	o, ok := s.origins.idx[origin{source, backend}]
	if !ok {
		return 0, false
	}
	k := encodeKey(key)
	h := s.objHash(o, uint64(tier), &k)
	r, ok := s.obj.probe(h, func(v uint32) bool { return s.matches(s.ent(v-1), o, uint64(tier), &k) })
	if !ok {
		return 0, false
	}
	return s.obj.get(r) - 1, true
}

// add creates the binding (source, backend, tier, object key) of block hash, without
// components, first of its block's chain. It returns its memory charge.
func (s *bindStore) add(source, backend string, tier SharedTier, key string, hash uint64) (uint32, int64, error) {
	o, ok := s.origins.ref(origin{source, backend}, 1<<16)
	if !ok {
		return 0, 0, ErrTooManyNames
	}
	for int(o) >= len(s.doomed) {
		s.doomed = append(s.doomed, false)
	}
	k := encodeKey(key)
	i := s.ents.Alloc()
	e := s.ent(i)
	e[bwHash] = hash
	e[bwFlags] = uint64(tier)<<32 | flagLive
	charge := int64(bindingBaseBytes)
	if k.str {
		var si uint32
		if n := len(s.strFree); n > 0 {
			si = s.strFree[n-1]
			s.strFree = s.strFree[:n-1]
			s.strs[si] = k.s
		} else {
			si = uint32(len(s.strs))
			s.strs = append(s.strs, k.s)
		}
		e[bwFlags] |= flagStrKey
		e[bwKey], e[bwKey+1], e[bwKey+2], e[bwKey+3] = uint64(si), 0, 0, 0
		charge += stringBytes + int64(len(k.s))
	} else {
		copy(e[bwKey:bwKey+4], k.words[:])
	}
	// First of its block's chain.
	var next uint32
	hb := s.blkHash(hash)
	slot, found := s.blkSlot(hb, hash)
	if found {
		next = s.blk.get(slot)
		s.blk.set(slot, i+1)
	}
	e[bwNames] = uint64(o) | uint64(next)<<32
	if !found {
		s.blk.insert(s, hb, i+1, true)
	}
	s.obj.insert(s, s.objHash(o, uint64(tier), &k), i+1, false)
	s.n++
	return i, charge, nil
}

// blkSlot returns the block table slot of hash's chain, if any.
func (s *bindStore) blkSlot(hb, hash uint64) (slotRef, bool) {
	return s.blk.probe(hb, func(v uint32) bool { return s.ent(v - 1)[bwHash] == hash })
}

// addComp adds component comp to binding i; it reports whether it was new and its charge.
func (s *bindStore) addComp(i uint32, comp string) (bool, int64) {
	e := s.ent(i)
	if e[bwFlags]&flagOverflow != 0 {
		for _, o := range s.over[i] {
			if o == comp {
				return false, 0
			}
		}
	}
	if c, ok := s.comps.idx[comp]; ok {
		if e[bwFlags]&(1<<c) != 0 {
			return false, 0
		}
		s.comps.refs[c]++
		e[bwFlags] |= 1 << c
		return true, 0
	}
	if c, ok := s.comps.ref(comp, compBits); ok {
		e[bwFlags] |= 1 << c
		return true, 0
	}
	if s.over == nil {
		s.over = map[uint32][]string{}
	}
	s.over[i] = append(s.over[i], comp)
	e[bwFlags] |= flagOverflow
	return true, stringBytes + int64(len(comp))
}

// removeComp drops component comp of binding i; it reports whether it was there, its
// charge, and whether the binding has components left.
func (s *bindStore) removeComp(i uint32, comp string) (removed bool, charge int64, left bool) {
	e := s.ent(i)
	if c, ok := s.comps.idx[comp]; ok && e[bwFlags]&(1<<c) != 0 {
		e[bwFlags] &^= 1 << c
		s.comps.unref(c)
		removed = true
	} else if e[bwFlags]&flagOverflow != 0 {
		o := s.over[i]
		for j, x := range o {
			if x == comp {
				o = append(o[:j], o[j+1:]...)
				removed, charge = true, stringBytes+int64(len(comp))
				break
			}
		}
		if len(o) == 0 {
			delete(s.over, i)
			e[bwFlags] &^= flagOverflow
		} else {
			s.over[i] = o
		}
	}
	return removed, charge, e[bwFlags]&(flagOverflow|(1<<compBits-1)) != 0
}

// remove drops binding i with whatever components it has; it returns its block hash and
// the binding's whole charge.
func (s *bindStore) remove(i uint32) (uint64, int64) {
	e := s.ent(i)
	hash := e[bwHash]
	// Out of its block's chain.
	hb := s.blkHash(hash)
	slot, _ := s.blkSlot(hb, hash)
	next := uint32(e[bwNames] >> 32)
	if s.blk.get(slot) == i+1 {
		if next != 0 {
			s.blk.set(slot, next)
		} else {
			s.blk.delete(s, slot, true)
		}
	} else {
		p := s.ent(s.blk.get(slot) - 1)
		for uint32(p[bwNames]>>32) != i+1 {
			p = s.ent(uint32(p[bwNames]>>32) - 1)
		}
		p[bwNames] = uint64(uint32(p[bwNames])) | uint64(next)<<32
	}
	s.obj.delete(s, s.obj.slotOf(s.entObjHash(e), i+1), false)
	return hash, s.free(i)
}

// free releases binding i's names, key and components (it is out of both tables).
func (s *bindStore) free(i uint32) int64 {
	e := s.ent(i)
	charge := int64(bindingBaseBytes)
	s.origins.unref(uint16(e[bwNames]))
	if e[bwFlags]&flagStrKey != 0 {
		si := uint32(e[bwKey])
		charge += stringBytes + int64(len(s.strs[si]))
		s.strs[si] = ""
		s.strFree = append(s.strFree, si)
	}
	for m := e[bwFlags] & (1<<compBits - 1); m != 0; m &= m - 1 {
		s.comps.unref(uint16(bits.TrailingZeros64(m)))
	}
	if e[bwFlags]&flagOverflow != 0 {
		for _, o := range s.over[i] {
			charge += stringBytes + int64(len(o))
		}
		delete(s.over, i)
	}
	e[bwFlags] = 0
	s.ents.Free(i)
	s.n--
	return charge
}

// dropBlock drops every binding of block hash; it returns how many and their charge.
func (s *bindStore) dropBlock(hash uint64) (int, int64) {
	slot, found := s.blkSlot(s.blkHash(hash), hash)
	if !found {
		return 0, 0
	}
	head := s.blk.get(slot)
	s.blk.delete(s, slot, true)
	n, charge := 0, int64(0)
	for v := head; v != 0; {
		e := s.ent(v - 1)
		next := uint32(e[bwNames] >> 32)
		s.obj.delete(s, s.obj.slotOf(s.entObjHash(e), v), false)
		charge += s.free(v - 1)
		n++
		v = next
	}
	return n, charge
}

// detach starts dropping every binding whose origin matches: those origins leave the
// look-up map (a store of the same pair interns a fresh origin, so bindings made from
// now on are not dropped, and a look-up no longer finds the doomed ones) and are marked
// doomed, each holding one reference until the sweep that removes their bindings ends
// (so that their index is not reused meanwhile). It reports whether any matched.
func (s *bindStore) detach(match func(origin) bool) bool {
	found := false
	for o, i := range s.origins.idx {
		if match(o) {
			delete(s.origins.idx, o)
			s.doomed[i] = true
			s.origins.refs[i]++
			s.doomedList = append(s.doomedList, i)
			found = true
		}
	}
	return found
}

// undoom ends the drops: the doomed origins' held references go.
func (s *bindStore) undoom() {
	for _, i := range s.doomedList {
		s.doomed[i] = false
		s.origins.unref(i)
	}
	s.doomedList = s.doomedList[:0]
}

// flags returns the shared meta flags of block hash: which tiers its bindings are in.
func (s *bindStore) flags(hash uint64) uint64 {
	slot, found := s.blkSlot(s.blkHash(hash), hash)
	if !found {
		return 0
	}
	var f uint64
	for v := s.blk.get(slot); v != 0; {
		e := s.ent(v - 1)
		if SharedTier((e[bwFlags]>>32)&1) == SharedCPU {
			f |= metaSharedCPU
		} else {
			f |= metaSharedDisk
		}
		v = uint32(e[bwNames] >> 32)
	}
	return f
}

// eachOf calls fn with every live binding of block hash, decoded (source, backend,
// object key as stored, tier, components); bindings a pending ClearShared or
// RetractSource is dropping are skipped (they are gone once it is acknowledged). For
// snapshots; writer only.
func (s *bindStore) eachOf(hash uint64, fn func(source, backend, key string, tier SharedTier, comps []string)) {
	slot, found := s.blkSlot(s.blkHash(hash), hash)
	if !found {
		return
	}
	var comps []string
	for v := s.blk.get(slot); v != 0; {
		e := s.ent(v - 1)
		next := uint32(e[bwNames] >> 32)
		o := uint16(e[bwNames])
		if int(o) < len(s.doomed) && s.doomed[o] {
			v = next
			continue
		}
		var key string
		if e[bwFlags]&flagStrKey != 0 {
			key = s.strs[uint32(e[bwKey])]
		} else {
			var hex [64]byte
			const digits = "0123456789abcdef"
			for i := range hex {
				hex[i] = digits[(e[bwKey+i/16]>>(60-4*uint(i%16)))&0xf]
			}
			key = string(hex[:])
		}
		comps = comps[:0]
		for m := e[bwFlags] & (1<<compBits - 1); m != 0; m &= m - 1 {
			comps = append(comps, s.comps.names[bits.TrailingZeros64(m)])
		}
		if e[bwFlags]&flagOverflow != 0 {
			comps = append(comps, s.over[v-1]...)
		}
		org := s.origins.names[o]
		fn(org.source, org.backend, key, SharedTier((e[bwFlags]>>32)&1), comps)
		v = next
	}
}

func tierFlag(t SharedTier) uint64 {
	if t == SharedCPU {
		return metaSharedCPU
	}
	return metaSharedDisk
}

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
	e := s.ent(v - 1)
	if blk {
		return s.blkHash(e[bwHash])
	}
	return s.entObjHash(e)
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
