package engine

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"slices"
	"unsafe"

	"github.com/conductor-go/conductor/arena"
)

// Shared (Mooncake) bindings of one context, kept compact and off the Go heap.
//
// A binding is one fixed-size entry of bindWords words in an arena (outside the Go heap,
// addressed by uint32 index, no pointers):
//
//	w0  origin, the interned (source, backend) (bits 0..15) | link (bits 16..48: the next
//	    binding of the same block, index+1, or, with bit 48 (linkTail) set, the index of
//	    the block's engine record, for the last binding of the chain; 0 for a free entry)
//	    | tier (bit 49) | explicit (bit 50) | component set (bits 51..63: an interned set
//	    of component names, see compSets; 0 the empty set, setOverflow: the binding's own
//	    list in over)
//	w1..w3  a derived binding: its object key, 64 lowercase hex digits as 32 binary bytes
//	    (big-endian words), whose first 64 bits are the block hash, the SGLang projection
//	    of a HiCache key: the block hash is not stored (it is the key of the block's
//	    engine record, which the chain's last binding names), the other 192 bits are
//	    w1..w3; an explicit binding (any other key, or a 64-hex key bound to another
//	    hash): the key's index in strs (w1) and the block hash (w2)
//
// A binding's block always has an engine record (the binding keeps it alive, see
// reflag), whose index changes only when a compaction copies the records into a new
// arena (cacheContext.rebuild), which retargets the chains (retarget, retargeted).

// Origins (source, backend) and component names are interned per context in small tables
// with reference counts (a name goes when its last binding does), and so are the sets of
// component names bindings hold (most bindings hold one of a few sets: K, V, K and V).
// One hash index of uint32 slots (bindTable), also outside the heap, finds the first
// binding of a block by the index of the block's engine record (looked up first by block
// hash in the context's table, see chainOf; hashed and compared through the record
// index a chain ends at, so that no record is read to place or find a chain); the
// bindings of one block are chained through w0. A
// derived binding is found by its key through the chain of the hash its key gives; only
// explicit bindings are also in a second index, by (origin, tier, key text), which holds
// nothing when every key is a derived one.
// All of it is owned by the context's writer goroutine; queries never read it (they read
// the shared flags in the block's record meta).
type bindStore struct {
	ents *arena.Arena
	n    int // live bindings

	// recs reads the context's engine records (the context itself).
	recs records
	// moves are the chains a compaction retargets (retarget).
	moves []chainMove

	obj, blk bindTable

	seed    maphash.Seed
	blkSeed uint64

	origins nameTable[origin] // (source, backend) pairs
	sets    compSets          // component names and sets of them
	// doomed marks the origins a pending ClearShared or RetractSource is dropping (see
	// detach); doomedList lists them. Each holds one reference until its sweep ends.
	doomed     []bool
	doomedList []uint16
	strs       []string // object keys of explicit bindings, by index
	strFree    []uint32
	// over holds, per binding index, the components of a binding whose set could not be
	// interned (setOverflow: the set table was full, a name past setNames, or more).
	over map[uint32][]string
}

const (
	bindWords = 4

	bwHead = 0
	bwKey  = 1

	headLinkShift = 16
	headTierShift = 49
	headExplicit  = 1 << 50
	headSetShift  = 51

	// linkTail marks a link that names the block's engine record (the chain's end).
	linkTail = 1 << 32
	linkMask = 1<<33 - 1

	// setOverflow is the set id of a binding whose components are in over.
	setOverflow = 1<<(64-headSetShift) - 1
	// maxSets is the number of interned component sets (ids 1..maxSets).
	maxSets = setOverflow - 1
	// setNames is the number of component names a set can hold (a bit each).
	setNames = 64
)

// ErrTooManyNames: a shared store named a (source, backend) pair when a context already
// held 65,536 distinct live ones (they are interned in 16 bits).
var ErrTooManyNames = errors.New("too many distinct shared (source, backend) pairs in one context")

// origin is a binding's (source, backend).
type origin struct{ source, backend string }

// Memory charges of a binding (Config.MemoryLimitBytes): its entry (bindWords words) and
// a slot of the block index, which is between 3/8 and 3/4 full (about 7 bytes, 8 charged;
// the bindings of one block share it, each is charged). An explicit binding also has a
// slot in the key index and its object key held as a string (header and bytes); a
// binding past the interned sets its components as strings too. Interned names and sets
// are shared and not charged per binding.
const (
	bindingBaseBytes = bindWords*8 + 8
	objSlotBytes     = 8
	stringBytes      = 16
)

// records is what a binding store reads of its context's engine records (context
// implements it; tests that drive a store alone, fakeRecords).
type records interface {
	// recordKey returns the key (block hash) of record idx.
	recordKey(idx uint32) uint64
	// recordOf returns the record of block hash, if any.
	recordOf(hash uint64) (uint32, bool)
}

// newBindStore returns an empty store whose bindings' engine records recs reads.
func newBindStore(recs records) *bindStore {
	s := &bindStore{
		recs: recs,
		ents: arena.New(arena.Config{RecordWords: bindWords, ChunkRecords: 1 << 12}),
		seed: maphash.MakeSeed(),
		obj:  newBindTable(),
		blk:  newBindTable(),
		sets: newCompSets(maxSets),
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

// hexKey decodes a key of 64 lowercase hex digits; ok is false for any other key. Eight
// digits at a time (hex8), without a branch per digit.
func hexKey(k string) (w [4]uint64, ok bool) {
	if len(k) != 64 {
		return w, false
	}
	b := unsafe.Slice(unsafe.StringData(k), 64)
	valid := true
	for i := range w {
		hi, ok1 := hex8(binary.BigEndian.Uint64(b[16*i:]))
		lo, ok2 := hex8(binary.BigEndian.Uint64(b[16*i+8:]))
		valid = valid && ok1 && ok2
		w[i] = hi<<32 | lo
	}
	if !valid {
		return [4]uint64{}, false
	}
	return w, true
}

// hex8 decodes 8 lowercase hex digits (the bytes of x, first digit in the top byte) into
// 32 bits; ok is false when a byte is not one of 0-9, a-f. Each byte is range-checked
// in parallel: a byte c < 0x80 plus 0x80-lo has its top bit set iff c >= lo, plus
// 0x7f-hi iff c > hi, and no sum carries into the next byte (bytes of 0x80 or more are
// refused first, their sums unused).
func hex8(x uint64) (uint64, bool) {
	const ones, tops = 0x0101010101010101, 0x8080808080808080
	digit := (x + (0x80-'0')*ones) &^ (x + (0x7f-'9')*ones)
	letter := (x + (0x80-'a')*ones) &^ (x + (0x7f-'f')*ones)
	ok := x&tops == 0 && (digit|letter)&tops == tops
	// The digit's value: its low nibble, plus 9 for a letter (a is 0x61).
	v := x&(0x0f*ones) + ((letter&tops)>>7)*9
	v = (v | v>>4) & 0x00ff00ff00ff00ff
	v = (v | v>>8) & 0x0000ffff0000ffff
	v = (v | v>>16) & 0x00000000ffffffff
	return v, ok
}

func fmix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func (s *bindStore) objHash(o uint16, tier uint64, key string) uint64 {
	return fmix(maphash.String(s.seed, key) ^ uint64(o) ^ tier<<32)
}

// blkHash is the block index hash of the chain ending at engine record rec.
func (s *bindStore) blkHash(rec uint32) uint64 {
	return fmix(uint64(rec) ^ s.blkSeed)
}

func (s *bindStore) ent(i uint32) []uint64 { return s.ents.Record(i) }

// Entry head fields.
func entOrigin(e []uint64) uint16 { return uint16(e[bwHead]) }
func entLink(e []uint64) uint64   { return (e[bwHead] >> headLinkShift) & linkMask }
func entTier(e []uint64) uint64   { return (e[bwHead] >> headTierShift) & 1 }
func entSet(e []uint64) uint16    { return uint16(e[bwHead] >> headSetShift) }
func entExplicit(e []uint64) bool { return e[bwHead]&headExplicit != 0 }

// entLive reports whether e is a live binding (linked into its block's chain).
func entLive(e []uint64) bool { return entLink(e) != 0 }
func setLink(e []uint64, l uint64) {
	e[bwHead] = e[bwHead]&^(linkMask<<headLinkShift) | l<<headLinkShift
}
func setSet(e []uint64, set uint16) {
	e[bwHead] = e[bwHead]&(1<<headSetShift-1) | uint64(set)<<headSetShift
}

// hash returns the block hash binding i binds: an explicit binding's own, otherwise the
// key of the engine record its chain ends at (or the hash of an explicit binding met on
// the way).
func (s *bindStore) hash(i uint32) uint64 {
	for {
		e := s.ent(i)
		if entExplicit(e) {
			return e[bwKey+1]
		}
		l := entLink(e)
		if l&linkTail != 0 {
			return s.recs.recordKey(uint32(l))
		}
		i = uint32(l) - 1
	}
}

// tailRec returns the engine record the chain of binding i ends at.
func (s *bindStore) tailRec(i uint32) uint32 {
	for {
		l := entLink(s.ent(i))
		if l&linkTail != 0 {
			return uint32(l)
		}
		i = uint32(l) - 1
	}
}

// tail returns the last binding of the chain binding i is in.
func (s *bindStore) tail(i uint32) uint32 {
	for {
		l := entLink(s.ent(i))
		if l&linkTail != 0 {
			return i
		}
		i = uint32(l) - 1
	}
}

// doomedAt reports whether entry i is a live binding of a doomed origin (detach).
func (s *bindStore) doomedAt(i uint32) bool {
	e := s.ent(i)
	return entLive(e) && s.doomed[entOrigin(e)]
}

// entObjHash recomputes the key-index hash of explicit entry e.
func (s *bindStore) entObjHash(e []uint64) uint64 {
	return s.objHash(entOrigin(e), entTier(e), s.strs[uint32(e[bwKey])])
}

// find returns the binding (source, backend, tier, object key), if any.
func (s *bindStore) find(source, backend string, tier SharedTier, key string) (uint32, bool) {
	o, ok := s.origins.idx[origin{source, backend}]
	if !ok {
		return 0, false
	}
	t := uint64(tier)
	if w, ok := hexKey(key); ok {
		// A derived binding of this key is in the chain of the block its key names.
		if slot, found := s.chainOf(w[0]); found {
			for v := s.blk.get(slot); ; {
				e := s.ent(v - 1)
				if entOrigin(e) == o && entTier(e) == t && !entExplicit(e) &&
					e[bwKey] == w[1] && e[bwKey+1] == w[2] && e[bwKey+2] == w[3] {
					return v - 1, true
				}
				l := entLink(e)
				if l&linkTail != 0 {
					break
				}
				v = uint32(l)
			}
		}
	}
	if s.obj.n == 0 {
		return 0, false
	}
	r, ok := s.obj.probe(s.objHash(o, t, key), func(v uint32) bool {
		e := s.ent(v - 1)
		return entOrigin(e) == o && entTier(e) == t && s.strs[uint32(e[bwKey])] == key
	})
	if !ok {
		return 0, false
	}
	return s.obj.get(r) - 1, true
}

// add creates the binding (source, backend, tier, object key) of block hash, without
// components and not yet in its block's chain: the caller links it (link) once the
// block's engine record exists, before any other call. It returns its memory charge.
func (s *bindStore) add(source, backend string, tier SharedTier, key string, hash uint64) (uint32, int64, error) {
	o, ok := s.origins.ref(origin{source, backend}, 1<<16)
	if !ok {
		return 0, 0, ErrTooManyNames
	}
	for int(o) >= len(s.doomed) {
		s.doomed = append(s.doomed, false)
	}
	w, derived := hexKey(key)
	derived = derived && w[0] == hash
	i := s.ents.Alloc()
	e := s.ent(i)
	head := uint64(o) | uint64(tier)<<headTierShift
	charge := int64(bindingBaseBytes)
	if derived {
		copy(e[bwKey:bwKey+3], w[1:])
	} else {
		var si uint32
		if n := len(s.strFree); n > 0 {
			si = s.strFree[n-1]
			s.strFree = s.strFree[:n-1]
			s.strs[si] = key
		} else {
			si = uint32(len(s.strs))
			s.strs = append(s.strs, key)
		}
		head |= headExplicit
		e[bwKey], e[bwKey+1], e[bwKey+2] = uint64(si), hash, 0
		charge += objSlotBytes + stringBytes + int64(len(key))
	}
	e[bwHead] = head
	if !derived {
		s.obj.insert(s, s.objHash(o, uint64(tier), key), i+1, false)
	}
	s.n++
	return i, charge, nil
}

// link puts binding i (just added) first in the chain of its block, whose engine record
// is rec (its key the block hash the binding was added with).
func (s *bindStore) link(i, rec uint32) {
	e := s.ent(i)
	if slot, found := s.chainAt(rec); found {
		setLink(e, uint64(s.blk.get(slot)))
		s.blk.set(slot, i+1)
		return
	}
	setLink(e, linkTail|uint64(rec))
	s.blk.insert(s, s.blkHash(rec), i+1, true)
}

// chainMove is a chain (its first binding) whose block's record a compaction moves.
type chainMove struct{ head, from, to uint32 }

// retarget notes, during a compaction that copies engine records into a new arena, that
// the record of block hash (found through recs: the old table until retargeted) gets
// index rec; retargeted moves its chain, after every record is copied and recs reads
// the new ones. The caller may skip records without shared flags (a block with bindings
// always has them). Writer only.
func (s *bindStore) retarget(hash uint64, rec uint32) {
	from, ok := s.recs.recordOf(hash)
	if !ok {
		return
	}
	if slot, found := s.chainAt(from); found {
		s.moves = append(s.moves, chainMove{s.blk.get(slot) - 1, from, rec})
	}
}

// retargeted moves the chains retarget noted to their new records: all out of the block
// index (found and rehashed under the old record indices, as every chain still ends
// there), then each ends at its new record and goes back in under it.
func (s *bindStore) retargeted() {
	for _, m := range s.moves {
		slot, _ := s.chainAt(m.from)
		s.blk.delete(s, slot, true)
	}
	for _, m := range s.moves {
		setLink(s.ent(s.tail(m.head)), linkTail|uint64(m.to))
	}
	for _, m := range s.moves {
		s.blk.insert(s, s.blkHash(m.to), m.head+1, true)
	}
	s.moves = s.moves[:0]
}

// chainOf returns the block table slot of block hash's chain, if any: a block with
// bindings has an engine record, and its chain is the one ending there.
func (s *bindStore) chainOf(hash uint64) (slotRef, bool) {
	rec, ok := s.recs.recordOf(hash)
	if !ok {
		return slotRef{}, false
	}
	return s.chainAt(rec)
}

// chainAt returns the block table slot of the chain that ends at engine record rec, if
// any.
func (s *bindStore) chainAt(rec uint32) (slotRef, bool) {
	return s.blk.probe(s.blkHash(rec), func(v uint32) bool { return s.tailRec(v-1) == rec })
}

// addComp adds component comp to binding i; it reports whether it was new and the change
// of its charge.
func (s *bindStore) addComp(i uint32, comp string) (bool, int64) {
	e := s.ent(i)
	set := entSet(e)
	if set == setOverflow {
		for _, o := range s.over[i] {
			if o == comp {
				return false, 0
			}
		}
		s.over[i] = append(s.over[i], comp)
		return true, stringBytes + int64(len(comp))
	}
	nset, added, ok := s.sets.with(set, comp)
	if !added {
		return false, 0
	}
	if ok {
		setSet(e, nset)
		return true, 0
	}
	// No interned set for it: the binding's components go to its own list.
	return true, s.toOverflow(i, e, comp)
}

// toOverflow moves binding i's components (its set's, and extra) to its overflow list; it returns the charge of the list.
func (s *bindStore) toOverflow(i uint32, e []uint64, extra string) int64 {
	set := entSet(e)
	list := append(s.sets.appendNames(nil, set), extra)
	s.sets.release(set)
	setSet(e, setOverflow)
	if s.over == nil {
		s.over = map[uint32][]string{}
	}
	s.over[i] = list
	var charge int64
	for _, c := range list {
		charge += stringBytes + int64(len(c))
	}
	return charge
}

// removeComp drops component comp of binding i; it reports whether it was there, the
// change of its charge (its release), and whether the binding has components left.
func (s *bindStore) removeComp(i uint32, comp string) (removed bool, charge int64, left bool) {
	e := s.ent(i)
	set := entSet(e)
	if set == setOverflow {
		o := s.over[i]
		for j, x := range o {
			if x == comp {
				o = append(o[:j], o[j+1:]...)
				s.over[i] = o
				return true, stringBytes + int64(len(comp)), len(o) > 0
			}
		}
		return false, 0, len(o) > 0
	}
	nset, removed, ok := s.sets.without(set, comp)
	if !removed {
		return false, 0, set != 0
	}
	if ok {
		setSet(e, nset)
		return true, 0, nset != 0
	}
	// The set left (a subset of the binding's) could not be interned (the table is full):
	// the other components go to the binding's own list, charged.
	list := s.sets.appendNames(nil, set)
	list = slices.DeleteFunc(list, func(x string) bool { return x == comp })
	s.sets.release(set)
	setSet(e, setOverflow)
	if s.over == nil {
		s.over = map[uint32][]string{}
	}
	s.over[i] = list
	for _, c := range list {
		charge -= stringBytes + int64(len(c))
	}
	return true, charge, true
}

// remove drops binding i with whatever components it has; it returns its block hash and
// the binding's whole charge.
func (s *bindStore) remove(i uint32) (uint64, int64) {
	e := s.ent(i)
	rec := s.tailRec(i)
	hash := s.recs.recordKey(rec)
	// Out of its block's chain (the binding before it takes its link: the next one, or
	// the record when it was the last).
	slot, _ := s.chainAt(rec)
	l := entLink(e)
	if s.blk.get(slot) == i+1 {
		if l&linkTail == 0 {
			s.blk.set(slot, uint32(l))
		} else {
			s.blk.delete(s, slot, true)
		}
	} else {
		p := s.ent(s.blk.get(slot) - 1)
		for entLink(p) != uint64(i+1) {
			p = s.ent(uint32(entLink(p)) - 1)
		}
		setLink(p, l)
	}
	if entExplicit(e) {
		s.obj.delete(s, s.obj.slotOf(s.entObjHash(e), i+1), false)
	}
	return hash, s.free(i)
}

// free releases binding i's names, key and components (it is out of both tables).
func (s *bindStore) free(i uint32) int64 {
	e := s.ent(i)
	charge := int64(bindingBaseBytes)
	s.origins.unref(entOrigin(e))
	if entExplicit(e) {
		si := uint32(e[bwKey])
		charge += objSlotBytes + stringBytes + int64(len(s.strs[si]))
		s.strs[si] = ""
		s.strFree = append(s.strFree, si)
	}
	if set := entSet(e); set == setOverflow {
		for _, o := range s.over[i] {
			charge += stringBytes + int64(len(o))
		}
		delete(s.over, i)
	} else {
		s.sets.release(set)
	}
	e[bwHead] = 0
	s.ents.Free(i)
	s.n--
	return charge
}

// dropBlock drops every binding of block hash; it returns how many and their charge.
func (s *bindStore) dropBlock(hash uint64) (int, int64) {
	slot, found := s.chainOf(hash)
	if !found {
		return 0, 0
	}
	head := s.blk.get(slot)
	s.blk.delete(s, slot, true)
	n, charge := 0, int64(0)
	for v := head; ; {
		e := s.ent(v - 1)
		l := entLink(e)
		if entExplicit(e) {
			s.obj.delete(s, s.obj.slotOf(s.entObjHash(e), v), false)
		}
		charge += s.free(v - 1)
		n++
		if l&linkTail != 0 {
			return n, charge
		}
		v = uint32(l)
	}
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
	slot, found := s.chainOf(hash)
	if !found {
		return 0
	}
	var f uint64
	for v := s.blk.get(slot); ; {
		e := s.ent(v - 1)
		if SharedTier(entTier(e)) == SharedCPU {
			f |= metaSharedCPU
		} else {
			f |= metaSharedDisk
		}
		l := entLink(e)
		if l&linkTail != 0 {
			return f
		}
		v = uint32(l)
	}
}

// eachOf calls fn with every live binding of block hash, decoded (source, backend,
// object key as stored, tier, components); bindings a pending ClearShared or
// RetractSource is dropping are skipped (they are gone once it is acknowledged). For
// snapshots; writer only.
func (s *bindStore) eachOf(hash uint64, fn func(source, backend, key string, tier SharedTier, comps []string)) {
	slot, found := s.chainOf(hash)
	if !found {
		return
	}
	var comps []string
	for v := s.blk.get(slot); v != 0; {
		e := s.ent(v - 1)
		next := uint32(0) // the chain's end
		if l := entLink(e); l&linkTail == 0 {
			next = uint32(l)
		}
		o := entOrigin(e)
		if int(o) < len(s.doomed) && s.doomed[o] {
			v = next
			continue
		}
		var key string
		if entExplicit(e) {
			key = s.strs[uint32(e[bwKey])]
		} else {
			w := [4]uint64{hash, e[bwKey], e[bwKey+1], e[bwKey+2]}
			var hex [64]byte
			const digits = "0123456789abcdef"
			for i := range hex {
				hex[i] = digits[(w[i/16]>>(60-4*uint(i%16)))&0xf]
			}
			key = string(hex[:])
		}
		comps = comps[:0]
		if set := entSet(e); set == setOverflow {
			comps = append(comps, s.over[v-1]...)
		} else {
			comps = s.sets.appendNames(comps, set)
		}
		org := s.origins.names[o]
		fn(org.source, org.backend, key, SharedTier(entTier(e)), comps)
		v = next
	}
}

func tierFlag(t SharedTier) uint64 {
	if t == SharedCPU {
		return metaSharedCPU
	}
	return metaSharedDisk
}

// recordKey returns the key of engine record idx in the context's current arena (for
// its binding store, records). Writer only.
func (c *cacheContext) recordKey(idx uint32) uint64 { return c.tab.ar.Record(idx)[recKey] }

// recordOf returns the engine record of block hash in the context's current table, if
// any (for its binding store, records). Writer only.
func (c *cacheContext) recordOf(hash uint64) (uint32, bool) { return c.tab.lookup(hash) }
