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
//	w1  source name (16 bits) | backend name (16) | next binding of the same block, index+1 (32)
//	w2  component bitmask (bits 0..30 over the interned component names, bit 31: more
//	    components in the overflow list) | tier << 32 | string key << 33 | live << 34
//	w3..w6  the object key: a 64-hex-digit key as 32 binary bytes (big-endian words);
//	    any other key's index in strs (w3)
//
// Source, backend and component names are interned per context in small tables with
// reference counts (a name goes when its last binding does). Two open-addressing tables
// of uint32 slots (index+1, 0 empty, linear probing, backward-shift deletion), also
// outside the heap, find a binding by (source, backend, tier, object key) and the first
// binding of a block by block hash; the bindings of one block are chained through w1.
// All of it is owned by the context's writer goroutine; queries never read it (they read
// the shared flags in the block's record meta).
type bindStore struct {
	ents *arena.Arena
	n    int // live bindings

	obj, blk bindTable

	seed    maphash.Seed
	blkSeed uint64

	names   nameTable // sources and backends
	comps   nameTable // components (the first compBits get a bit in w2)
	strs    []string  // object keys that are not 64 hex digits, by index
	strFree []uint32
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

// ErrTooManyNames: a shared store named a source or backend when a context already held
// 65,535 distinct live ones (their names are interned in 16 bits).
var ErrTooManyNames = errors.New("too many distinct shared sources or backends in one context")

// Memory charges of a binding (Config.MemoryLimitBytes): its entry (bindWords words) and
// a slot in each of the two index tables, which are between 3/8 and 3/4 full (about 8
// bytes each); an object key that is not 64 hex digits is held as a string (header and
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
	arena.Release(s.obj.words)
	arena.Release(s.blk.words)
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

func (s *bindStore) objHash(src, bk uint16, tier uint64, k *objKey) uint64 {
	var h uint64
	if k.str {
		h = maphash.String(s.seed, k.s)
	} else {
		h = maphash.Comparable(s.seed, k.words)
	}
	return fmix(h ^ uint64(src) ^ uint64(bk)<<16 ^ tier<<32)
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
	return s.objHash(uint16(e[bwNames]), uint16(e[bwNames]>>16), (e[bwFlags]>>32)&1, &k)
}

func (s *bindStore) matches(e []uint64, src, bk uint16, tier uint64, k *objKey) bool {
	if uint32(e[bwNames]) != uint32(src)|uint32(bk)<<16 || (e[bwFlags]>>32)&1 != tier {
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
	src, ok1 := s.names.idx[source]
	bk, ok2 := s.names.idx[backend]
	if !ok1 || !ok2 {
		return 0, false
	}
	k := encodeKey(key)
	h := s.objHash(src, bk, uint64(tier), &k)
	t := &s.obj
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		v := t.slots[i]
		if v == 0 {
			return 0, false
		}
		if s.matches(s.ent(v-1), src, bk, uint64(tier), &k) {
			return v - 1, true
		}
	}
}

// add creates the binding (source, backend, tier, object key) of block hash, without
// components, first of its block's chain. It returns its memory charge.
func (s *bindStore) add(source, backend string, tier SharedTier, key string, hash uint64) (uint32, int64, error) {
	src, ok := s.names.ref(source, 1<<16-1)
	if !ok {
		return 0, 0, ErrTooManyNames
	}
	bk, ok := s.names.ref(backend, 1<<16-1)
	if !ok {
		s.names.unref(src)
		return 0, 0, ErrTooManyNames
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
		next = s.blk.slots[slot]
		s.blk.slots[slot] = i + 1
	}
	e[bwNames] = uint64(src) | uint64(bk)<<16 | uint64(next)<<32
	if !found {
		s.blk.insert(s, hb, i+1, true)
	}
	s.obj.insert(s, s.objHash(src, bk, uint64(tier), &k), i+1, false)
	s.n++
	return i, charge, nil
}

// blkSlot returns the block table slot of hash's chain, or the empty slot ending the probe.
func (s *bindStore) blkSlot(hb, hash uint64) (uint64, bool) {
	t := &s.blk
	for i := hb & t.mask; ; i = (i + 1) & t.mask {
		v := t.slots[i]
		if v == 0 {
			return i, false
		}
		if s.ent(v - 1)[bwHash] == hash {
			return i, true
		}
	}
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
	if s.blk.slots[slot] == i+1 {
		if next != 0 {
			s.blk.slots[slot] = next
		} else {
			s.blk.delete(s, slot, true)
		}
	} else {
		p := s.ent(s.blk.slots[slot] - 1)
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
	s.names.unref(uint16(e[bwNames]))
	s.names.unref(uint16(e[bwNames] >> 16))
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
	head := s.blk.slots[slot]
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

// flags returns the shared meta flags of block hash: which tiers its bindings are in.
func (s *bindStore) flags(hash uint64) uint64 {
	slot, found := s.blkSlot(s.blkHash(hash), hash)
	if !found {
		return 0
	}
	var f uint64
	for v := s.blk.slots[slot]; v != 0; {
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

func tierFlag(t SharedTier) uint64 {
	if t == SharedCPU {
		return metaSharedCPU
	}
	return metaSharedDisk
}

// bindTable is an open-addressing table of uint32 slots (binding index+1, 0 empty) in
// memory outside the Go heap, kept between 3/8 and 3/4 full (it doubles past 3/4 and
// halves under 3/16).
type bindTable struct {
	words []uint64 // the mapping; slots aliases it
	slots []uint32
	mask  uint64
	n     int
}

const bindTableMin = 64

func newBindTable() bindTable { return makeBindTable(bindTableMin) }

func makeBindTable(size int) bindTable {
	w := arena.Map(size / 2)
	return bindTable{words: w, slots: unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(w))), size), mask: uint64(size - 1)}
}

// slotOf returns the slot holding v, probing from hash h (v is in the table).
func (t *bindTable) slotOf(h uint64, v uint32) uint64 {
	i := h & t.mask
	for t.slots[i] != v {
		i = (i + 1) & t.mask
	}
	return i
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
	if (t.n+1)*4 > len(t.slots)*3 {
		t.resize(s, len(t.slots)*2, blk)
	}
	i := h & t.mask
	for t.slots[i] != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = v
	t.n++
}

// delete empties slot i, shifting back the entries of its probe run that follow it.
func (t *bindTable) delete(s *bindStore, i uint64, blk bool) {
	t.slots[i] = 0
	t.n--
	for j := (i + 1) & t.mask; t.slots[j] != 0; j = (j + 1) & t.mask {
		home := s.hashOf(t.slots[j], blk) & t.mask
		// The entry at j may move to i when its home is not in (i, j] (cyclically).
		if (j-home)&t.mask >= (j-i)&t.mask {
			t.slots[i], t.slots[j] = t.slots[j], 0
			i = j
		}
	}
	if len(t.slots) > bindTableMin && t.n*16 < len(t.slots)*3 {
		t.resize(s, len(t.slots)/2, blk)
	}
}

// resize rehashes the table into one of size slots and gives the old memory back.
func (t *bindTable) resize(s *bindStore, size int, blk bool) {
	nt := makeBindTable(size)
	for _, v := range t.slots {
		if v != 0 {
			i := s.hashOf(v, blk) & nt.mask
			for nt.slots[i] != 0 {
				i = (i + 1) & nt.mask
			}
			nt.slots[i] = v
			nt.n++
		}
	}
	arena.Release(t.words)
	*t = nt
}

// nameTable interns names with reference counts; an index is reused once its name's last
// reference is gone.
type nameTable struct {
	idx   map[string]uint16
	names []string
	refs  []uint32
	free  []uint16
}

// ref takes a reference on name, interning it below limit indices; false when full.
func (t *nameTable) ref(name string, limit int) (uint16, bool) {
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
		t.names = append(t.names, "")
		t.refs = append(t.refs, 0)
	}
	if t.idx == nil {
		t.idx = map[string]uint16{}
	}
	t.names[i], t.refs[i] = name, 1
	t.idx[name] = i
	return i, true
}

func (t *nameTable) unref(i uint16) {
	if t.refs[i]--; t.refs[i] == 0 {
		delete(t.idx, t.names[i])
		t.names[i] = ""
		t.free = append(t.free, i)
	}
}
