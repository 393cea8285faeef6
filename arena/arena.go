// Package arena provides slab memory for fixed-size records of 64-bit words.
//
// Records are addressed by uint32 indices and never move once allocated, so a reader that
// holds an index can keep using it while the single writer allocates more records. The
// words hold no pointers (the garbage collector never scans them) and are meant to be read
// and written with sync/atomic, so concurrent readers stay race-clean.
//
// Record contents are the caller's: the arena never writes a record's words. A record
// that was never allocated before reads as all zeros (fresh pages of Map); a record that
// was freed comes back from Alloc exactly as its last owner left it, because readers may
// still be reading it and only the caller's record layout can say when its words are
// stale. The engine, the one user, relies on this: it marks a record free in its meta word
// before it calls Free (markFree), and when Alloc hands the record out again it marks it
// busy before it rewrites the key and zeroes the bitset words (engine/mutate.go create).
//
// Concurrency: exactly one goroutine (the writer) may call Alloc, Free, Len, HighWater and
// Release; any goroutine may call Record at any time.
package arena

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// DefaultChunkRecords is the number of records per slab when Config leaves it zero. Slabs
// are mappings outside the Go heap (Map) whose pages cost memory only once written, so a
// large slab costs an almost empty arena little, and 10M records take a few hundred
// mappings.
const DefaultChunkRecords = 1 << 14

// MaxRecords is the largest number of records an arena can address. Index values
// 0xFFFFFFFE and 0xFFFFFFFF are kept free so that callers can encode "index + 1" and a
// sentinel in 32 bits.
const MaxRecords = 1<<32 - 2

// Config sizes an Arena.
type Config struct {
	// RecordWords is the number of 64-bit words per record (>= 1).
	RecordWords int
	// ChunkRecords is the number of records per slab; it must be a power of two.
	// 0 means DefaultChunkRecords.
	ChunkRecords int
}

// Arena is a growable set of fixed-size records stored in slabs that never move. The slabs
// live outside the Go heap (see Map), so the garbage collector neither scans them nor
// counts them in its heap goal.
type Arena struct {
	recWords   int
	chunkShift uint
	chunkMask  uint32
	chunkWords int

	// dir is the published slab directory. The writer appends within capacity (readers of
	// an older header never index past their own length) or publishes a larger copy.
	dir atomic.Pointer[[][]uint64]

	next uint32 // writer-only: first never-allocated index
	// free is a stack of freed indices (reused LIFO) kept in fixed chunks of freeChunk,
	// so that freeing never copies the stack (one Free costs O(1), not an occasional
	// copy of millions of indices). Writer-only.
	free  [][]uint32
	nfree int
}

// freeChunk is the number of freed indices per chunk of the free stack (16 KiB).
const freeChunk = 4096

// New returns an empty arena. It panics on an invalid Config, which is a programming error.
func New(cfg Config) *Arena {
	if cfg.RecordWords < 1 {
		panic(fmt.Sprintf("arena: RecordWords %d < 1", cfg.RecordWords))
	}
	cr := cfg.ChunkRecords
	if cr == 0 {
		cr = DefaultChunkRecords
	}
	if cr < 1 || cr&(cr-1) != 0 {
		panic(fmt.Sprintf("arena: ChunkRecords %d is not a power of two", cr))
	}
	shift := uint(0)
	for 1<<shift < cr {
		shift++
	}
	a := &Arena{
		recWords:   cfg.RecordWords,
		chunkShift: shift,
		chunkMask:  uint32(cr - 1),
		chunkWords: cr * cfg.RecordWords,
	}
	empty := make([][]uint64, 0, 4)
	a.dir.Store(&empty)
	return a
}

// RecordWords returns the number of words per record.
func (a *Arena) RecordWords() int { return a.recWords }

// Len returns the number of records currently allocated (allocated minus freed). Writer only.
func (a *Arena) Len() int { return int(a.next) - a.nfree }

// Alloc returns the index of a record. Writer only. It reuses freed records first (most
// recently freed first), with their words as they were when freed; otherwise it takes a
// never-used record, whose words are zero. It panics when MaxRecords records are live,
// which callers prevent by bounding their record count.
func (a *Arena) Alloc() uint32 {
	idx, _ := a.AllocFresh()
	return idx
}

// AllocFresh is Alloc, and also reports whether the record was never allocated before:
// then its words are zero and no reader can have its index, so the caller may write it
// without reading it first. Writing first matters for speed: the first access to a page
// of Map'd memory that is a read maps the kernel's shared zero page, and the write that
// follows must replace it (a second fault, and a TLB flush on every CPU that runs the
// process); a write first gets a zeroed page of its own in one fault. Writer only.
func (a *Arena) AllocFresh() (idx uint32, fresh bool) {
	if a.nfree > 0 {
		a.nfree--
		idx = a.free[a.nfree/freeChunk][a.nfree%freeChunk]
		if c := a.nfree / freeChunk; a.nfree%freeChunk == 0 && len(a.free) > c+1 {
			a.free[c+1] = nil // keep one spare chunk, not a run of them
			a.free = a.free[:c+1]
		}
		return idx, false
	}
	if a.next >= MaxRecords {
		panic("arena: out of record indices")
	}
	idx = a.next
	d := *a.dir.Load()
	if int(idx>>a.chunkShift) >= len(d) {
		a.grow(d)
	}
	a.next++
	return idx, true
}

// grow adds one slab and publishes the directory that includes it.
func (a *Arena) grow(d [][]uint64) {
	chunk := Map(a.chunkWords)
	if len(d) < cap(d) {
		// Readers holding the old header never look at index len(d), so writing it
		// before publishing the longer header is race-free.
		nd := append(d, chunk)
		a.dir.Store(&nd)
		return
	}
	nd := make([][]uint64, len(d)+1, 2*cap(d)+4)
	copy(nd, d)
	nd[len(d)] = chunk
	a.dir.Store(&nd)
}

// Reserve maps slabs until every record below n can be written: for a writer that fills
// this arena as a copy of another, index for index (through Record), before Adopt makes
// the copies its allocated records. Writer only.
func (a *Arena) Reserve(n uint32) {
	for d := *a.dir.Load(); len(d)<<a.chunkShift < int(n); d = *a.dir.Load() {
		a.grow(d)
	}
}

// Adopt takes over src's allocation state: the records of a below src's high-water mark
// are the caller's copies of src's, index for index, and from now on a allocates exactly
// as src would have (same high-water mark, same free records in the same order). src's
// free list goes with it: the writer must not allocate from or free into src afterwards
// (its slabs can be given back with Slabs and Release). Writer only.
func (a *Arena) Adopt(src *Arena) {
	a.Reserve(src.next)
	a.next, a.free, a.nfree = src.next, src.free, src.nfree
	src.free, src.nfree = nil, 0
}

// Release gives every slab back to the kernel; the arena must not be used by the writer
// afterwards. Readers that still hold an index read zero words, never fault. Writer only.
func (a *Arena) Release() {
	for _, c := range *a.dir.Load() {
		Release(c)
	}
	a.free, a.nfree = nil, 0 // the directory stays: readers index it
}

// Slabs returns the arena's slabs, for a writer that retires the arena and gives them
// back to the kernel itself (Release per slab, spread over time) instead of Release.
// Writer only; the arena must not be used by the writer afterwards.
func (a *Arena) Slabs() [][]uint64 {
	a.free, a.nfree = nil, 0
	return *a.dir.Load()
}

// Free returns a record to the arena for a later Alloc. It does not touch the record's
// words: readers may still be looking at it, so the caller marks it free in its own layout
// (the engine sets a flag in the record's meta word) and clears what it must when the
// record is allocated again. Writer only.
func (a *Arena) Free(idx uint32) {
	c := a.nfree / freeChunk
	if c == len(a.free) {
		a.free = append(a.free, make([]uint32, freeChunk))
	}
	a.free[c][a.nfree%freeChunk] = idx
	a.nfree++
}

// Record returns the words of record idx. The slice aliases arena memory: access its words
// with sync/atomic whenever another goroutine may touch them. idx must have been returned
// by Alloc on this arena; safe for concurrent use.
func (a *Arena) Record(idx uint32) []uint64 {
	d := *a.dir.Load()
	c := d[idx>>a.chunkShift]
	off := int(idx&a.chunkMask) * a.recWords
	return c[off : off+a.recWords : off+a.recWords]
}

// HighWater returns one past the largest index ever allocated. Writer only.
func (a *Arena) HighWater() uint32 { return a.next }

// Dir is a copy of an arena's slab directory as it was when taken (Arena.Dir): it
// addresses every record allocated by then, for a reader that looks up many records in
// a row without loading the published directory for each. Records allocated later may
// lie in slabs it lacks: Words says so, and the reader goes back to Arena.Record.
type Dir struct {
	slabs      [][]uint64
	chunkShift uint
	chunkMask  uint32
	recWords   int
}

// Dir returns the arena's current slab directory; safe for concurrent use.
func (a *Arena) Dir() Dir {
	return Dir{slabs: *a.dir.Load(), chunkShift: a.chunkShift, chunkMask: a.chunkMask, recWords: a.recWords}
}

// Words returns a pointer to the first word of record idx and true, or nil and false
// when idx lies in a slab the directory was taken without. The record's RecordWords
// words follow it; access them with sync/atomic as Record's.
func (d *Dir) Words(idx uint32) (unsafe.Pointer, bool) {
	c := uint(idx >> (d.chunkShift & 31))
	if c >= uint(len(d.slabs)) {
		return nil, false
	}
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(d.slabs[c])), uintptr(idx&d.chunkMask)*uintptr(d.recWords)*8), true
}
