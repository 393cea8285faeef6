package engine

import (
	"sync/atomic"

	"github.com/conductor-go/conductor/arena"
)

// Record layout, in 64-bit words: key, meta, link, then three bitsets of w words each
// (device, cpu_local, engine disk), one bit per slot number.
//
// meta = epoch<<metaEpochShift | stamp<<metaStampShift | seq<<metaSeqShift | busy | free |
// sharedCPU | sharedDisk.
// The epoch is the write order (eviction drops the oldest first); the free bit marks a
// record on the arena free list. meta is also the record's version word (a seqlock): the
// writer sets busy before it changes the key or more than one word of a record, and ends
// every change with a meta value the record never held before (a fresh epoch, or the same
// epoch with seq bumped). A reader loads meta, then the key and bitsets, then meta again,
// and accepts what it read only when both meta loads are equal and neither is busy or
// free: then nothing changed in between, so what it read was one block at one moment, even
// if the record was freed and reused meanwhile (K → K2 → K).
// A change of one bitset word alone (a store or a remove of one slot's bit in one tier)
// goes without busy: each load of that word returns it from before or after the store,
// both states of the same block, and the meta store that follows ends the change before
// the writer changes the record again, so a reader never combines two changes under one
// meta value. (A reader that sees the new word under the old meta on both sides saw the
// record between the word's store and the meta store: after the change, exactly.)
//
// A record that a reader may accept (live, not busy) always has its key in the table (or
// in the table's predecessor while a migration runs): a new or reused record stays busy
// until its key is inserted, and a deleted one is marked free before its key is removed
// (deleteRecord). So a walk may read a record found without the table, by a record hint
// from the key memo (sameAlive1), and accept it on its key and version alone.
//
// The stamp says which slot clears the record's bitsets already reflect (see clearSet):
// a clear (OpClear, unregistration) takes the next stamp and is applied to records lazily,
// and a reader masks out, in a record whose stamp is older than a pending clear, the bits
// that clear drops. Stamps are compared modulo 1<<metaStampBits.
const (
	recKey  = 0
	recMeta = 1
	recLink = 2 // writer only: the write-order list, (prev+1)<<32 | (next+1)
	recBits = 3

	metaSharedDisk = 1 << 0 // some shared disk binding owns the block
	metaSharedCPU  = 1 << 1 // some shared cpu binding owns the block
	metaFree       = 1 << 2 // record is on the arena free list
	metaBusy       = 1 << 3 // the writer is changing the key or bitsets
	metaSeqShift   = 4
	metaSeqMask    = 1<<6 - 1
	metaStampShift = 10
	metaStampBits  = 6
	metaStampMask  = 1<<metaStampBits - 1
	metaEpochShift = 16 // 48-bit epochs: 2.8e14 writes per context

	metaFlags = metaSharedCPU | metaSharedDisk
)

// Bitset layouts. Width w >= 1: tier t of slot n is bit n&63 of word recBits+t*w+n>>6.
// Width 0 (packed, contexts whose slot numbers are below packedSlots): one word holds all
// three tiers, tier t of slot n at bit t*packedSlots+n, so a record is 4 words (32 bytes)
// instead of 6. A context starts packed and widens when a slot number needs it.
const (
	packedSlots = 21
	packedMask  = 1<<packedSlots - 1
)

func recordWords(w int) int { return recBits + bitWords(w) }

// bitWords returns the number of bitset words of a record of width w.
func bitWords(w int) int { return max(3*w, 1) }

// maskWords returns the number of words of a slot bitset (masks, alive sets) at width w.
func maskWords(w int) int { return max(w, 1) }

// widthFor returns the narrowest width that holds slot number n.
func widthFor(n int) int {
	if n < packedSlots {
		return 0
	}
	return n/64 + 1
}

// bitAt returns the word (from recBits) and the bit of tier t of slot n at width w.
func bitAt(w, t, n int) (int, uint64) {
	if w == 0 {
		return 0, 1 << (t*packedSlots + n)
	}
	return t*w + n>>6, 1 << (n & 63)
}

// tierBits returns word j (of maskWords(w)) of tier t's slot bitset from a record's bitset
// words.
func tierBits(bw []uint64, w, t, j int) uint64 {
	if w == 0 {
		return bw[0] >> (t * packedSlots) & packedMask
	}
	return bw[t*w+j]
}

// Table entries: fingerprint<<32 | (record index + 1). 0 is empty; tombEntry marks a
// deleted entry (its low half cannot be a real index + 1, see arena.MaxRecords). The
// fingerprint is the high half of the key's mix, the bits the entry's position comes from
// (mix(key) >> shift): a migration places an entry in the new table from the entry alone
// (e >> shift, see migrate), without loading its record's key (a cache miss per entry at
// scale). Entries of one home position share the fingerprint's top bits, so it tells them
// apart by the rest (32 - log2 capacity bits), ample at the table's load.
const (
	tombEntry   = uint64(0xFFFFFFFF)
	hashMul     = 0x9E3779B97F4A7C15 // Fibonacci hashing: the high bits pick the slot
	minTableCap = 16

	// A migration step scans up to migrateScan entries of the previous table and moves
	// up to the table's quota of them (see quotaFor).
	migrateScan = 64
)

// quotaFor returns how many entries a migration step must move so that a migration of
// prevLive entries into a table of capacity newCap ends before the inserts made meanwhile
// (one step per insert) fill it: twice the rate that exactly uses the new table's free
// room. Growth (a full table into one twice as large) would need 2 per insert; at least 4 ends
// it in a quarter of the old size in inserts, so that two tables coexist only briefly.
func quotaFor(prevLive, newCap int) int {
	room := newCap*13/16 - prevLive
	if room < 1 {
		room = 1
	}
	return max(4, (2*prevLive+room-1)/room)
}

// table is an open-addressing (linear probing) hash table from block key to record,
// published as part of a view. Its entries live outside the Go heap (arena.Map). The
// writer mutates entries and records in place with atomic stores.
//
// Growing (or purging tombstones) is incremental: the writer publishes a new, larger
// table whose prev is the old one and moves a bounded number of old entries per insert.
// Entries moved stay in prev too; an entry deleted is tombstoned in both; new entries go
// to the new table only. Readers look in the new table, then in prev (findPrev): an
// entry the writer moves is in prev until the migration ends, and in the new table after;
// should prev be released (read as zeros) during the look, prev is dead and the new table
// holds every entry, so the reader looks there again. No reader misses an entry. A table
// that stops being current is marked dead before its memory goes; a reader that misses in
// a dead table looks again in the latest one (retryMiss).
type table struct {
	entries []uint64
	mask    uint64
	shift   uint8
	ar      *arena.Arena
	w       int // bitset words per tier
	// prev is the table being migrated into this one, nil when none (or done).
	prev atomic.Pointer[table]
	// dead is set (before its entries go back to the kernel) when no newer view reads
	// this table any more: a reader that misses in a dead table retries in the latest.
	dead atomic.Bool
	pub  *atomic.Pointer[view] // the context's published view

	// Writer-only.
	moved       int // prev entries below this position have been migrated
	quota       int // entries a migration step moves
	live, tombs int // entries of this table (not of prev)
	sink        uint64
}

func newTable(capacity int, ar *arena.Arena, w int, pub *atomic.Pointer[view]) *table {
	c := minTableCap
	shift := uint8(64 - 4)
	for c < capacity {
		c <<= 1
		shift--
	}
	return &table{entries: arena.Map(c), mask: uint64(c - 1), shift: shift, ar: ar, w: w, pub: pub}
}

// find returns the record of key. Safe for concurrent use with the writer: the caller must
// check the record's version and key (see the record layout), because the writer may free
// and reuse a record at any time.
func (t *table) find(key uint64) ([]uint64, bool) {
	p := t.prev.Load() // before probing t: see findPrev
	if rec, ok := t.find1(key); ok {
		return rec, true
	}
	return t.findPrev(p, key)
}

// findPrev looks key up in p, the table being migrated into t as loaded before the caller
// probed t, after that probe missed. t.prev only ever goes from set to nil (a migration
// ends), and entries stay in prev until it has, all of them being in t by then. So: p nil
// means t held every entry during the probe, and the miss stands; otherwise the entry is
// in p, unless p was released meanwhile (dead), and then t holds it: look there again.
func (t *table) findPrev(p *table, key uint64) ([]uint64, bool) {
	if p == nil {
		return nil, false
	}
	if rec, ok := p.find1(key); ok {
		return rec, true
	}
	if p.dead.Load() {
		return t.find1(key)
	}
	return nil, false
}

// findMissed is the walk's slow path after find1 missed key in t (prev being t.prev as
// loaded before that probe): it looks in prev, then, if t itself was released, in the
// latest table (retryMiss). It returns the table the walk goes on with and its prev, and
// the record, nil when key is in none of them.
func (t *table) findMissed(prev *table, key uint64) (*table, *table, []uint64) {
	if rec, ok := t.findPrev(prev, key); ok {
		return t, prev, rec
	}
	nt, rec, _ := t.retryMiss(key) // rec is nil when not found
	if nt != t {
		prev = nt.prev.Load() // no later than its probe in retryMiss: nil stays nil
	}
	return nt, prev, rec
}

// retryMiss is called after find missed key in t. A miss in a live table stands; t may
// however have been released (its entries read as zeros) after the caller loaded its view,
// and then the key is looked up in the latest published table, if its records have the
// same width. It returns the table the caller should go on with.
func (t *table) retryMiss(key uint64) (*table, []uint64, bool) {
	for t.dead.Load() {
		nt := t.pub.Load().tab
		if nt == t || nt.w != t.w {
			return t, nil, false
		}
		t = nt
		if rec, ok := t.find(key); ok {
			return t, rec, true
		}
	}
	return t, nil, false
}

// find1 looks key up in t alone (a leaf function: the walk's fast path).
func (t *table) find1(key uint64) ([]uint64, bool) {
	h := mix(key)
	fp := h &^ 0xFFFFFFFF
	pos := h >> (t.shift & 63) // &63: one shift instruction (shift < 64 always)
	for {
		e := atomic.LoadUint64(&t.entries[pos])
		if e == 0 {
			return nil, false
		}
		if e&^0xFFFFFFFF == fp && e != tombEntry {
			rec := t.ar.Record(uint32(e) - 1)
			if atomic.LoadUint64(&rec[recKey]) == key {
				return rec, true
			}
		}
		pos = (pos + 1) & t.mask
	}
}

// lookup returns the record index of key. Writer only.
func (t *table) lookup(key uint64) (idx uint32, ok bool) {
	_, _, idx, _, ok = t.locate(key)
	return idx, ok
}

// locate returns the record index and the record of key, and where its entry was found:
// at pos of this table, or (inPrev) at pos of prev, where it is not in this table. When
// key is in neither (ok false), pos is where its entry would go in this table (see
// slotOf), for insertFrom. The record is for reading: a writer that changes it marks it
// first (cacheContext.mark). Writer only.
func (t *table) locate(key uint64) (pos uint64, inPrev bool, idx uint32, rec []uint64, ok bool) {
	p := t.prev.Load()
	if pos, idx, rec, ok = t.slotOf(key); ok || p == nil {
		return pos, false, idx, rec, ok
	}
	free := pos
	if ppos, pidx, prec, pok := p.slotOf(key); pok {
		return ppos, true, pidx, prec, true
	}
	return free, false, 0, nil, false
}

// slotOf returns the entry position, record index and record of key in this table
// alone. When key is absent (ok false), pos is the first free position on its probe path
// (a tombstone, or the empty entry that ended the probe): where insertNew would put it.
// Writer only.
func (t *table) slotOf(key uint64) (pos uint64, idx uint32, rec []uint64, ok bool) {
	h := mix(key)
	fp := h &^ 0xFFFFFFFF
	pos = h >> t.shift
	free, tomb := uint64(0), false
	for {
		e := t.entries[pos]
		if e == 0 {
			if tomb {
				pos = free
			}
			return pos, 0, nil, false
		}
		if e == tombEntry {
			if !tomb {
				free, tomb = pos, true
			}
		} else if e&^0xFFFFFFFF == fp {
			idx = uint32(e) - 1
			if rec = t.ar.Record(idx); rec[recKey] == key {
				return pos, idx, rec, true
			}
		}
		pos = (pos + 1) & t.mask
	}
}

// remove tombstones the entries of key, in this table and in prev. Writer only.
func (t *table) remove(key uint64) {
	if pos, _, _, ok := t.slotOf(key); ok {
		t.removeAt(key, pos, false)
		return
	}
	if p := t.prev.Load(); p != nil {
		if pos, _, _, ok := p.slotOf(key); ok {
			atomic.StoreUint64(&p.entries[pos], tombEntry)
		}
	}
}

// removeAt tombstones the entries of key, found by locate at (pos, inPrev). An entry
// found in this table may also be in prev (when it was migrated from there): prev is
// probed too. One found in prev only is not in this table. Writer only.
func (t *table) removeAt(key, pos uint64, inPrev bool) {
	p := t.prev.Load()
	if inPrev {
		atomic.StoreUint64(&p.entries[pos], tombEntry)
		return
	}
	atomic.StoreUint64(&t.entries[pos], tombEntry)
	t.live--
	t.tombs++
	if p != nil {
		if pos, _, _, ok := p.slotOf(key); ok {
			atomic.StoreUint64(&p.entries[pos], tombEntry)
		}
	}
}

// prefetch touches the first probe entry of every key, in this table and in prev, before
// a batch is applied: the loads are independent, so their cache misses overlap instead of
// being paid one by one inside the dependent probe loop. Writer only.
func (t *table) prefetch(keys []uint64) {
	if len(keys) < 4 {
		return
	}
	var sink uint64
	for _, k := range keys {
		sink += t.entries[mix(k)>>t.shift]
	}
	// During a migration a key not moved yet (or absent) is probed in prev too.
	if p := t.prev.Load(); p != nil {
		for _, k := range keys {
			sink += p.entries[mix(k)>>p.shift]
		}
	}
	t.sink = sink
}

// insertNew adds an entry for key (known absent from this table and prev) pointing at
// idx, reusing the first tombstone on its probe path. The caller has made room (full
// false). Writer only.
func (t *table) insertNew(key uint64, idx uint32) {
	h := mix(key)
	t.insertAt(h>>t.shift, h&^0xFFFFFFFF|uint64(idx+1))
}

// insertFrom adds an entry for key (known absent from this table and prev) pointing at
// idx, from pos on: pos is where a probe of key that missed stopped (slotOf), and the
// table has only gained entries since (a migration step), so every position from key's
// home to pos is still taken and key's probe path goes on from pos. It saves probing the
// path again. Writer only.
func (t *table) insertFrom(key uint64, pos uint64, idx uint32) {
	t.insertAt(pos, mix(key)&^0xFFFFFFFF|uint64(idx+1))
}

// insertAt stores entry e at the first empty or tombstoned position from pos on (its
// probe path). Writer only.
func (t *table) insertAt(pos, e uint64) {
	for {
		cur := t.entries[pos]
		if cur == 0 || cur == tombEntry {
			if cur == tombEntry {
				t.tombs--
			}
			atomic.StoreUint64(&t.entries[pos], e)
			t.live++
			return
		}
		pos = (pos + 1) & t.mask
	}
}

// migrate moves one bounded step of prev's live entries into t and reports whether the
// migration is complete. Writer only.
func (t *table) migrate() bool {
	p := t.prev.Load()
	scan, moves := migrateScan+t.quota, t.quota
	for ; t.moved < len(p.entries) && scan > 0 && moves > 0; t.moved++ {
		scan--
		e := p.entries[t.moved]
		if e == 0 || e == tombEntry {
			continue
		}
		if t.shift >= 32 {
			t.insertAt(e>>t.shift, e) // the fingerprint holds the position's bits
		} else {
			idx := uint32(e) - 1 // a table of over 2^32 entries: from the key
			t.insertNew(t.ar.Record(idx)[recKey], idx)
		}
		moves--
	}
	return t.moved == len(p.entries)
}

// full reports whether one more insert would push the used entries (live and tombstones)
// past 13/16 of the capacity; linear probing with fingerprints stays cheap below that.
func (t *table) full() bool {
	return (t.live+t.tombs+1)*16 > len(t.entries)*13
}

// sizeFor returns the capacity a new table should have for live entries: doubling
// once live reaches 5/8, so a new table takes many inserts before the next one.
func sizeFor(live int) int {
	c := minTableCap
	for (live+1)*8 > c*5 {
		c <<= 1
	}
	return c
}

// mix spreads a block key over the table. Real keys are SHA-256 bits already, but an
// xor-shift before the multiply keeps structured keys (arithmetic progressions, which a
// bare multiplicative hash maps onto a few clustered runs) from degrading the probes.
func mix(key uint64) uint64 {
	return (key ^ key>>32) * hashMul
}
