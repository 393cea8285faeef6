package engine

import (
	"runtime"
	"sync/atomic"
)

// readPacked1 and readWide1 are walk1's versioned read of rec (meta, key, bitsets, meta)
// in packed and in wide records: ok is false when the read was torn or the record is
// busy, free or another key's, and the caller goes to readSlow1.
func readPacked1(rec []uint64, key uint64) (meta, dev, loc, dsk uint64, ok bool) {
	meta = atomic.LoadUint64(&rec[recMeta])
	k := atomic.LoadUint64(&rec[recKey])
	x := atomic.LoadUint64(&rec[recBits])
	ok = atomic.LoadUint64(&rec[recMeta]) == meta && meta&(metaBusy|metaFree) == 0 && k == key
	return meta, x & packedMask, x >> packedSlots & packedMask, x >> (2 * packedSlots) & packedMask, ok
}

func readWide1(rec []uint64, key uint64) (meta, dev, loc, dsk uint64, ok bool) {
	meta = atomic.LoadUint64(&rec[recMeta])
	k := atomic.LoadUint64(&rec[recKey])
	dev = atomic.LoadUint64(&rec[recBits])
	loc = atomic.LoadUint64(&rec[recBits+1])
	dsk = atomic.LoadUint64(&rec[recBits+2])
	ok = atomic.LoadUint64(&rec[recMeta]) == meta && meta&(metaBusy|metaFree) == 0 && k == key
	return meta, dev, loc, dsk, ok
}

// readSlow1 is walk1's read of rec (found for key) after a torn fast read, with the
// test hook or with pending clears: one read (hooked if a hook is set), rereads while it
// is torn, then the mask of the pending clears (clear.go) that the record does not
// reflect yet.
func (r *walker) readSlow1(tab *table, rec []uint64, key uint64, i int) (meta, dev, loc, dsk uint64, ok bool) {
	switch {
	case r.hook != nil:
		var k, m2 uint64
		meta, k, m2, dev, loc, dsk = hookedRead1(rec, tab.w == 0, r.hook, i)
		ok = m2 == meta && meta&(metaBusy|metaFree) == 0 && k == key
	case tab.w == 0:
		meta, dev, loc, dsk, ok = readPacked1(rec, key)
	default:
		meta, dev, loc, dsk, ok = readWide1(rec, key)
	}
	if !ok {
		var buf [3]uint64
		if meta, ok = reread(tab, r.hook, i, key, buf[:bitWords(tab.w)]); !ok {
			return 0, 0, 0, 0, false
		}
		dev, loc, dsk = tierBits(buf[:], tab.w, 0, 0), tierBits(buf[:], tab.w, 1, 0), tierBits(buf[:], tab.w, 2, 0)
	}
	if r.clr != nil {
		if m := r.clr.mask(meta); m != nil {
			dev &^= tierBits(m, tab.w, 0, 0)
			loc &^= tierBits(m, tab.w, 1, 0)
			dsk &^= tierBits(m, tab.w, 2, 0)
		}
	}
	return meta, dev, loc, dsk, true
}

// hookedRead1 is walk1's record read with the test hook before every load.
func hookedRead1(rec []uint64, packed bool, hook func(int, int), i int) (meta, k, m2, dev, loc, dsk uint64) {
	hook(i, recMeta)
	meta = atomic.LoadUint64(&rec[recMeta])
	hook(i, recKey)
	k = atomic.LoadUint64(&rec[recKey])
	hook(i, recBits)
	if packed {
		x := atomic.LoadUint64(&rec[recBits])
		dev, loc, dsk = x&packedMask, x>>packedSlots&packedMask, x>>(2*packedSlots)&packedMask
	} else {
		dev = atomic.LoadUint64(&rec[recBits])
		hook(i, recBits+1)
		loc = atomic.LoadUint64(&rec[recBits+1])
		hook(i, recBits+2)
		dsk = atomic.LoadUint64(&rec[recBits+2])
	}
	hook(i, recMeta)
	m2 = atomic.LoadUint64(&rec[recMeta])
	return
}

// maxRereads bounds how often a walk reads one block's record again after a torn read.
const maxRereads = 16

// reread reads the record of key again after a torn read (meta changed or busy, or the
// record holds another key): it looks key up anew, since the record may have been freed or
// reused, and copies the bitsets into words once one read sees the same meta before and
// after. It reports false when key is gone, or after maxRereads torn reads, which answers
// as a missing block: an under-report, never a hit that did not exist.
func reread(tab *table, hook func(int, int), i int, key uint64, words []uint64) (meta uint64, ok bool) {
	for try := 0; try < maxRereads; try++ {
		if try >= 4 {
			runtime.Gosched() // the writer may be descheduled in the middle of a change
		}
		rec, found := tab.find(key)
		if !found {
			if tab, rec, found = tab.retryMiss(key); !found {
				return 0, false
			}
		}
		if hook != nil {
			hook(i, recMeta)
		}
		m1 := atomic.LoadUint64(&rec[recMeta])
		if m1&(metaBusy|metaFree) != 0 {
			continue
		}
		if hook != nil {
			hook(i, recKey)
		}
		k := atomic.LoadUint64(&rec[recKey])
		for j := range words {
			if hook != nil {
				hook(i, recBits+j)
			}
			words[j] = atomic.LoadUint64(&rec[recBits+j])
		}
		if hook != nil {
			hook(i, recMeta)
		}
		if atomic.LoadUint64(&rec[recMeta]) == m1 && k == key {
			return m1, true
		}
	}
	return 0, false
}

// readN is walkN's versioned read of rec: meta, key, the bitsets into words, meta again.
// Not inlined: in walkN's body, with its many live values, the copy loop kept its counter
// on the stack (a store and a load per word); here it has the registers to itself, which
// made walkN faster despite the call (BenchmarkQueryWalk, slots=256).
//
//go:noinline
func readN(rec, words []uint64) (meta, k, m2 uint64) {
	meta = atomic.LoadUint64(&rec[recMeta])
	k = atomic.LoadUint64(&rec[recKey])
	bw := rec[recBits : recBits+len(words)]
	for j := range words {
		words[j] = atomic.LoadUint64(&bw[j])
	}
	m2 = atomic.LoadUint64(&rec[recMeta])
	return meta, k, m2
}

// hookedReadN is walkN's record read with the test hook before every load.
func hookedReadN(rec []uint64, hook func(int, int), i int, words []uint64) (meta, k, m2 uint64) {
	hook(i, recMeta)
	meta = atomic.LoadUint64(&rec[recMeta])
	hook(i, recKey)
	k = atomic.LoadUint64(&rec[recKey])
	for j := range words {
		hook(i, recBits+j)
		words[j] = atomic.LoadUint64(&rec[recBits+j])
	}
	hook(i, recMeta)
	m2 = atomic.LoadUint64(&rec[recMeta])
	return
}
