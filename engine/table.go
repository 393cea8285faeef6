package engine

import (
	"sync/atomic"

	"github.com/conductor-go/conductor/arena"
)

// Record layout, in 64-bit words: key, meta, then three bitsets of w words each
// (device, cpu_local, engine disk), one bit per slot number.
//
// meta = epoch<<metaEpochShift | seq<<metaSeqShift | busy | free | sharedCPU | sharedDisk.
// The epoch is the write order (eviction drops the oldest first); the free bit marks a
// record on the arena free list. meta is also the record's version word (a seqlock): the
// writer sets busy before it changes the key or a bitset and ends every change with a meta
// value the record never held before (a fresh epoch, or the same epoch with seq bumped).
// A reader loads meta, then the key and bitsets, then meta again, and accepts what it read
// only when both meta loads are equal and neither is busy or free: then nothing changed in
// between, so what it read was one block at one moment, even if the record was freed and
// reused meanwhile (K → K2 → K).
const (
	recKey  = 0
	recMeta = 1
	recBits = 2

	metaSharedDisk = 1 << 0 // some shared disk binding owns the block
	metaSharedCPU  = 1 << 1 // some shared cpu binding owns the block
	metaFree       = 1 << 2 // record is on the arena free list
	metaBusy       = 1 << 3 // the writer is changing the key or bitsets
	metaSeqShift   = 4
	metaSeqMask    = 1<<12 - 1
	metaEpochShift = 16 // 48-bit epochs: 2.8e14 writes per context

	metaFlags = metaSharedCPU | metaSharedDisk
)

func recordWords(w int) int { return recBits + 3*w }

// Table entries: fingerprint<<32 | (record index + 1). 0 is empty; tombEntry marks a
// deleted entry (its low half cannot be a real index + 1, see arena.MaxRecords).
const (
	tombEntry   = uint64(0xFFFFFFFF)
	hashMul     = 0x9E3779B97F4A7C15 // Fibonacci hashing: the high bits pick the slot
	minTableCap = 16
)

// table is an open-addressing (linear probing) hash table from block key to record,
// published as part of a view. The writer mutates entries and records in place with
// atomic stores; growing, purging tombstones or widening records builds a new table.
type table struct {
	entries []uint64
	mask    uint64
	shift   uint8
	ar      *arena.Arena
	w       int // bitset words per tier

	// Writer-only counters.
	live, tombs int
	sink        uint64 // keeps prefetch loads from being optimised away
}

func newTable(capacity int, ar *arena.Arena, w int) *table {
	c := minTableCap
	shift := uint8(64 - 4)
	for c < capacity {
		c <<= 1
		shift--
	}
	return &table{entries: make([]uint64, c), mask: uint64(c - 1), shift: shift, ar: ar, w: w}
}

// find returns the record of key. Safe for concurrent use with the writer: the caller must
// re-check the record key after reading the words it needs, because the writer may free
// and reuse a record at any time.
func (t *table) find(key uint64) ([]uint64, bool) {
	h := mix(key)
	fp := uint64(uint32(h)) << 32
	pos := h >> t.shift
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

// slotOf returns the entry position and record index of key. Writer only.
func (t *table) slotOf(key uint64) (pos uint64, idx uint32, ok bool) {
	h := mix(key)
	fp := uint64(uint32(h)) << 32
	pos = h >> t.shift
	for {
		e := t.entries[pos]
		if e == 0 {
			return 0, 0, false
		}
		if e&^0xFFFFFFFF == fp && e != tombEntry {
			idx = uint32(e) - 1
			if t.ar.Record(idx)[recKey] == key {
				return pos, idx, true
			}
		}
		pos = (pos + 1) & t.mask
	}
}

// prefetch touches the first probe entry of every key before a batch is applied: the
// loads are independent, so their cache misses overlap instead of being paid one by one
// inside the dependent probe loop. Writer only.
func (t *table) prefetch(keys []uint64) {
	if len(keys) < 4 {
		return
	}
	var sink uint64
	for _, k := range keys {
		sink += t.entries[mix(k)>>t.shift]
	}
	t.sink = sink
}

// insertNew adds an entry for key (known absent) pointing at idx, reusing the first
// tombstone on its probe path. The caller has made room (needsRebuild false). Writer only.
func (t *table) insertNew(key uint64, idx uint32) {
	h := mix(key)
	e := uint64(uint32(h))<<32 | uint64(idx+1)
	pos := h >> t.shift
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

// deleteAt tombstones the entry at pos. Writer only.
func (t *table) deleteAt(pos uint64) {
	atomic.StoreUint64(&t.entries[pos], tombEntry)
	t.live--
	t.tombs++
}

// full reports whether one more insert would push the used entries (live and tombstones)
// past 13/16 of the capacity; linear probing with fingerprints stays cheap below that.
func (t *table) full() bool {
	return (t.live+t.tombs+1)*16 > len(t.entries)*13
}

// sizeFor returns the capacity a rebuilt table should have for live entries: doubling
// once live reaches 5/8, so a rebuild is followed by many inserts before the next one.
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
