package engine

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/conductor-go/conductor/internal/prefetch"
)

// Overlapped probes. A walk that knows the keys of the blocks ahead finds their records in
// a batch before it reads them: the table loads of a batch are independent of each other,
// so their cache misses overlap instead of being paid one after the other inside the
// walk's dependent loop. Keys ahead come from the key source when it has them without
// work (precomputed keys, key-memo hits: hashing.Chain.KeysAhead, which hashes the next
// block itself when the memo lacks it, as the walk's Next would); otherwise, once the
// walk has passed hashAfter blocks, the batch hashes a window of blocks ahead itself.
//
// A batch only moves the lookup (table.find1) earlier; the walk still reads every record
// with the version check, the key check and the clear masks, exactly as a record it found
// itself, so what a batch found can go stale without changing an answer (a record freed
// or reused since reads as torn or as another key and is looked up again, see reread).
//
// Batches start at probeFirst blocks (hashed windows at 2) and double up to probeMax, and
// a batch's probes end at the first key the table lacks and, for walk1, after the first
// record that no slot still alive on disk can continue through (read without the version
// check, only to bound the batch): a walk that stops probes at most one block past its
// stop (walkN: a batch), and hashes at most the rest of its window and the next one past
// it (a hashing batch hashes the window after its own before it probes, hashAhead, so
// that the table's misses land while the core hashes).
const (
	probeFirst = 4
	probeMax   = 16
	// hashAfter is the number of blocks the walk goes through before it hashes ahead: a
	// miss in the first blocks (the common miss) hashes no block it does not use.
	hashAfter = 4
	// probeMinEntries: walk1 probes ahead only in tables with more entries than this.
	// A smaller table (256 KiB of entries, and at most 3/4 as many records) stays in
	// the core's caches, where there are no misses to overlap and a batch's
	// bookkeeping made walks slower.
	probeMinEntries = 1 << 15
	// leanBlocks and probeAboveNs: in a larger table walk1 times its first leanBlocks
	// blocks without probes and probes the rest only when they took probeAboveNs or
	// more per block, which records in the caches never do (BenchmarkQueryWalk's hot
	// walks) and cache misses (BenchmarkQueryWalkCold) or hashing always do.
	leanBlocks   = 32
	probeAboveNs = 60 * time.Nanosecond
)

// probeBuf holds the batch being walked: recs[j] is the record of block base+j, for j < n;
// keys[j] the key of block base+j for j < kn when the batch hashed them (kn is 0 when the
// walk takes its keys from the source).
type probeBuf struct {
	recs [probeMax][]uint64
	keys [probeMax]uint64
	// vals[j] is walk1's read of recs[j] (meta, device, cpu_local, disk bits) made by the
	// batch, valid when good[j] (both meta loads equal, neither busy nor free, the key
	// block base+j's): the walk takes it instead of reading the record again.
	vals [probeMax][4]uint64
	good [probeMax]bool
	// read is set when the batch reads records for walk1 (no hook, no pending clears).
	read    bool
	base, n int
	kn      int
	// end is the first block after the batch: the walk starts the next batch there.
	end int
	// stop is a block at which no new batch starts: the batch before it ended early
	// (a key missing from the table, or no slot left), so the walk probably stops there.
	stop          int
	batch, hbatch int
	// probed counts the keys the walk's batches looked up, ran the blocks sameRun went
	// through and loaded the blocks it took ahead (their table entries loaded, or their
	// records' hints taken), all per query (tests check the early stop and which way the
	// walk went).
	probed, ran, loaded int
	sink                uint64
	// akeys[:an] are the keys of the an blocks from end on, hashed ahead by a hashing
	// batch (hashAhead) with their table entries prefetched: the next batch takes them.
	akeys [probeMax]uint64
	an    int
	addrs [probeMax]uintptr // prefetchEntries' and prefetchRecords' addresses
	// src is the walk's key source; err its error at the block where fetch ended the walk.
	src keySource
	err error
}

// reset readies pb for a walk that takes its keys from src.
func (pb *probeBuf) reset(src keySource) {
	pb.src = src
	pb.base, pb.n, pb.kn, pb.end, pb.stop, pb.an = 0, 0, 0, 0, -1, 0
	pb.batch, pb.hbatch = probeFirst, 2
	pb.err = nil
}

// A walk (walk1Loop, walkN) takes the key and record of its block i in up to three steps:
// ahead serves the blocks a batch found, without a call (it is inlined; a function that
// also called fetch would be too large to be), fetch the others, and missed the blocks
// that the walk's table lacks.

// ahead returns the key of block i and its record when the batch found them, else no
// record.
func (pb *probeBuf) ahead(i int) (uint64, []uint64) {
	if j := i - pb.base; uint(j) < uint(pb.n) {
		return pb.keys[j], pb.recs[j]
	}
	return 0, nil
}

// fetch returns the key of block i, hashed ahead by the batch or the source's next, and
// its record in tab, nil when tab lacks it or the key could not be hashed (the error is
// kept in pb.err).
func (pb *probeBuf) fetch(tab *table, i int) (uint64, []uint64) {
	var key uint64
	if j := i - pb.base; uint(j) < uint(pb.kn) {
		key = pb.keys[j]
	} else {
		k, err := pb.src.Next()
		if err != nil {
			pb.err = err
			return 0, nil
		}
		key = k
	}
	rec, _ := tab.find1(key)
	return key, rec
}

// missed looks key up after fetch found no record for it in tab: in tab's predecessor
// and, if tab was retired, in the latest table (findMissed), whose tables the walk goes
// on with. No record ends the walk at the block: the key is not indexed, or (pb.err) it
// could not be hashed.
func (pb *probeBuf) missed(tab, prev *table, key uint64) (*table, *table, []uint64) {
	if pb.err != nil {
		return tab, prev, nil
	}
	return tab.findMissed(prev, key)
}

// next starts a batch at block i if src knows keys ahead, or hashes a window ahead when it
// does not and the walk has passed hashAfter blocks. The walk calls it when the previous
// batch is used up (i >= end) and i is not its stop; a walk whose last batch hashed ahead
// (an > 0) is at that batch's end, and takes no keys from src but through next. alive is
// the walk's disk alive set (walk1) or 0 (walkN: no bound but the table's). No batch goes
// past block limit.
func (pb *probeBuf) next(t *table, i, limit int, alive uint64) {
	if pb.an > 0 {
		// The window the last batch hashed ahead: its entries were prefetched a window
		// of hashing ago, so its records can be prefetched now, and their misses land
		// while this batch hashes the next window.
		n := copy(pb.keys[:], pb.akeys[:pb.an])
		pb.an = 0
		pb.base, pb.n, pb.kn, pb.end = i, 0, n, i+n
		t.prefetchRecords(pb.keys[:n], &pb.addrs)
		pb.hashAhead(t, pb.end, limit)
		pb.n = pb.probe(t, pb.keys[:n], alive)
		return
	}
	src := pb.src
	pb.base, pb.n, pb.kn, pb.end = i, 0, 0, i
	if ahead := src.KeysAhead(); len(ahead) >= 2 {
		n := copy(pb.keys[:min(len(ahead), pb.batch)], ahead)
		pb.batch = min(2*pb.batch, probeMax)
		pb.sink += t.touch(pb.keys[:n]) // the home entries' misses overlap
		pb.n = pb.probe(t, pb.keys[:n], alive)
		// The walk takes the keys of the blocks found from the batch (no call of Next
		// per block); the block after them, if the batch ended early, from src.
		pb.kn = pb.n
		src.Advance(pb.n)
		pb.end = i + pb.n
		if pb.n < n {
			pb.stop = pb.end
		}
		return
	}
	if i < hashAfter {
		return
	}
	// A hashing batch: SHA-256 of its window, then of the next (hashAhead), before it
	// probes its own. Each window's table entries are prefetched as soon as its keys
	// are known and its records once the entries have arrived, so that the misses of
	// two dependent loads a block land while the core hashes, not while the walk waits.
	n := min(limit-i, pb.hbatch)
	pb.hbatch = min(2*pb.hbatch, probeMax)
	for pb.kn < n {
		k, err := src.Next()
		if err != nil {
			break // the walk's own Next at this block returns it again (errors stick)
		}
		pb.keys[pb.kn] = k
		pb.kn++
	}
	pb.end = i + pb.kn
	t.prefetchEntries(pb.keys[:pb.kn], &pb.addrs)
	if pb.kn == n {
		pb.hashAhead(t, pb.end, limit)
	}
	t.prefetchRecords(pb.keys[:pb.kn], &pb.addrs)
	pb.n = pb.probe(t, pb.keys[:pb.kn], alive)
}

// hashAhead hashes the window of blocks from block from (up to limit) into akeys and
// prefetches their table entries; the next batch (next) probes them. A walk that stops
// has hashed at most this window past its batch.
func (pb *probeBuf) hashAhead(t *table, from, limit int) {
	n := min(limit-from, pb.hbatch)
	pb.hbatch = min(2*pb.hbatch, probeMax)
	for pb.an < n {
		k, err := pb.src.Next()
		if err != nil {
			break // the walk meets it again at this block (errors stick)
		}
		pb.akeys[pb.an] = k
		pb.an++
	}
	t.prefetchEntries(pb.akeys[:pb.an], &pb.addrs)
}

// prefetchEntries prefetches the home entry of each key in t (at most probeMax keys).
func (t *table) prefetchEntries(keys []uint64, addrs *[probeMax]uintptr) {
	for j, k := range keys {
		addrs[j] = uintptr(unsafe.Pointer(&t.entries[mix(k)>>(t.shift&63)]))
	}
	prefetch.Lines(addrs[:len(keys)])
}

// prefetchRecords prefetches the record that each key's home entry in t points at, when
// the entry's fingerprint is the key's (at most probeMax keys). The entries should be in
// the caches by then (prefetchEntries); the loads of the ones that are not wait.
func (t *table) prefetchRecords(keys []uint64, addrs *[probeMax]uintptr) {
	n := 0
	for _, k := range keys {
		h := mix(k)
		e := atomic.LoadUint64(&t.entries[h>>(t.shift&63)])
		if e == 0 || e == tombEntry || e&^0xFFFFFFFF != h&^0xFFFFFFFF {
			continue
		}
		addrs[n] = uintptr(unsafe.Pointer(&t.ar.Record(uint32(e) - 1)[recKey]))
		n++
	}
	prefetch.Lines(addrs[:n])
}

// probe finds the records of keys in t alone (a key t lacks ends the batch; the walk's own
// lookup then goes on to the previous or latest table) and returns how many it found. The
// caller has loaded every key's home entry already (touch, or prefetchRecords for a
// hashing batch: independent loads, whose misses overlap); probe then probes
// each key, which loads its record (independent of the other keys' records). With alive
// set it also ends the batch after the first record that holds none of alive's slots in
// any tier and is not shared (no slot could be alive on disk after it).
func (pb *probeBuf) probe(t *table, keys []uint64, alive uint64) int {
	for j, k := range keys {
		pb.probed++
		rec, ok := t.find1(k)
		if !ok {
			return j
		}
		pb.recs[j] = rec
		if alive == 0 {
			continue
		}
		// walk1's read (see walk1), or, with a hook or pending clears, a read that only
		// bounds the batch.
		var meta, dev, loc, dsk uint64
		var good bool
		if t.w == 0 {
			meta, dev, loc, dsk, good = readPacked1(rec, k)
		} else {
			meta, dev, loc, dsk, good = readWide1(rec, k)
		}
		if pb.read {
			pb.vals[j] = [4]uint64{meta, dev, loc, dsk}
			pb.good[j] = good
		}
		if meta&metaFlags == 0 {
			if alive &= dev | loc | dsk; alive == 0 {
				return j + 1
			}
		}
	}
	return len(keys)
}
