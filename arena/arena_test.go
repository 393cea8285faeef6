package arena

import (
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestAllocSequentialThenReuseLIFO(t *testing.T) {
	a := New(Config{RecordWords: 3, ChunkRecords: 4})
	for i := uint32(0); i < 10; i++ {
		if got := a.Alloc(); got != i {
			t.Fatalf("alloc %d = %d", i, got)
		}
	}
	if a.Len() != 10 || a.HighWater() != 10 || a.Cap() != 12 {
		t.Fatalf("len %d hw %d cap %d", a.Len(), a.HighWater(), a.Cap())
	}
	a.Free(3)
	a.Free(7)
	if a.Len() != 8 {
		t.Fatalf("len after free = %d", a.Len())
	}
	if got := a.Alloc(); got != 7 {
		t.Fatalf("reuse = %d, want 7 (last freed)", got)
	}
	if got := a.Alloc(); got != 3 {
		t.Fatalf("reuse = %d, want 3", got)
	}
	if got := a.Alloc(); got != 10 {
		t.Fatalf("fresh = %d, want 10", got)
	}
}

// TestAllocContract checks the documented contents contract: a never-used record reads as
// zeros, and a freed record comes back from Alloc with its words as they were (the arena
// never writes a record; the caller clears what it must on reuse).
func TestAllocContract(t *testing.T) {
	a := New(Config{RecordWords: 3, ChunkRecords: 4})
	idx := a.Alloc()
	for w, v := range a.Record(idx) {
		if v != 0 {
			t.Fatalf("fresh record word %d = %d", w, v)
		}
	}
	rec := a.Record(idx)
	for w := range rec {
		atomic.StoreUint64(&rec[w], uint64(7+w))
	}
	a.Free(idx)
	for w, v := range a.Record(idx) {
		if v != uint64(7+w) {
			t.Fatalf("Free changed word %d to %d", w, v)
		}
	}
	if got := a.Alloc(); got != idx {
		t.Fatalf("reuse = %d, want %d", got, idx)
	}
	for w, v := range a.Record(idx) {
		if v != uint64(7+w) {
			t.Fatalf("reused record word %d = %d, want %d as freed", w, v, 7+w)
		}
	}
	for i := 0; i < 6; i++ {
		for w, v := range a.Record(a.Alloc()) {
			if v != 0 {
				t.Fatalf("fresh record word %d = %d", w, v)
			}
		}
	}
}

// TestRecordsNeverMove: words written before many slab additions read back unchanged,
// through Record and Word alike.
func TestRecordsNeverMove(t *testing.T) {
	a := New(Config{RecordWords: 5, ChunkRecords: 8})
	first := a.Alloc()
	rec := a.Record(first)
	for w := range rec {
		atomic.StoreUint64(&rec[w], uint64(100+w))
	}
	ptr := &rec[0]
	for i := 0; i < 5000; i++ {
		idx := a.Alloc()
		r := a.Record(idx)
		if len(r) != 5 || cap(r) != 5 {
			t.Fatalf("record %d len %d cap %d", idx, len(r), cap(r))
		}
		atomic.StoreUint64(&r[0], uint64(idx))
	}
	if &a.Record(first)[0] != ptr {
		t.Fatal("record moved")
	}
	for w := 0; w < 5; w++ {
		if got := atomic.LoadUint64(a.Word(first, w)); got != uint64(100+w) {
			t.Fatalf("word %d = %d", w, got)
		}
	}
	for idx := uint32(1); idx < 5001; idx++ {
		if got := a.Record(idx)[0]; got != uint64(idx) {
			t.Fatalf("record %d = %d", idx, got)
		}
	}
}

func TestRangeVisitsEveryAllocatedIndex(t *testing.T) {
	a := New(Config{RecordWords: 2})
	for i := 0; i < 3000; i++ {
		a.Record(a.Alloc())[1] = uint64(i)
	}
	a.Free(5)
	n := 0
	a.Range(func(idx uint32, rec []uint64) bool {
		if rec[1] != uint64(idx) {
			t.Fatalf("record %d holds %d", idx, rec[1])
		}
		n++
		return true
	})
	if n != 3000 {
		t.Fatalf("visited %d", n)
	}
	n = 0
	a.Range(func(uint32, []uint64) bool { n++; return n < 10 })
	if n != 10 {
		t.Fatalf("early stop visited %d", n)
	}
}

func TestInvalidConfigPanics(t *testing.T) {
	for _, cfg := range []Config{{RecordWords: 0}, {RecordWords: 1, ChunkRecords: 3}, {RecordWords: 1, ChunkRecords: -4}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("config %+v did not panic", cfg)
				}
			}()
			New(cfg)
		}()
	}
}

// TestConcurrentReadersDuringGrowth: readers follow the writer's allocations (published
// through a shared high-water mark) and always read what was stored, through Record and
// through a Dir taken per pass (Record where the Dir predates the record's slab); run
// with -race.
func TestConcurrentReadersDuringGrowth(t *testing.T) {
	a := New(Config{RecordWords: 2, ChunkRecords: 16})
	var published atomic.Uint32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 4; r++ {
		viaDir := r%2 == 1
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := published.Load()
				d := a.Dir()
				for idx := uint32(0); idx < n; idx += 7 {
					w := &a.Record(idx)[1]
					if p, ok := d.Words(idx); ok && viaDir {
						w = &(*[2]uint64)(p)[1]
					}
					if got := atomic.LoadUint64(w); got != uint64(idx)*3 {
						t.Errorf("record %d = %d (through a Dir: %v)", idx, got, viaDir)
						return
					}
				}
			}
		})
	}
	for i := 0; i < 20000; i++ {
		idx := a.Alloc()
		atomic.StoreUint64(a.Word(idx, 1), uint64(idx)*3)
		published.Store(idx + 1)
	}
	close(stop)
	wg.Wait()
}

func TestRecordAllocatesNothing(t *testing.T) {
	a := New(Config{RecordWords: 4})
	idx := a.Alloc()
	var sink uint64
	if n := testing.AllocsPerRun(100, func() { sink += a.Record(idx)[0] + *a.Word(idx, 3) }); n != 0 {
		t.Fatalf("Record allocates %.1f", n)
	}
	_ = sink
}

// TestFreeStackSpansChunks: freed indices are reused most recently freed first across
// several chunks of the free stack, and Len counts them.
func TestFreeStackSpansChunks(t *testing.T) {
	a := New(Config{RecordWords: 1, ChunkRecords: 1024})
	const n = 3*freeChunk + 17
	for i := 0; i < n; i++ {
		if got := a.Alloc(); got != uint32(i) {
			t.Fatalf("alloc %d = %d", i, got)
		}
	}
	for i := 0; i < n; i++ {
		a.Free(uint32(i))
	}
	if a.Len() != 0 {
		t.Fatalf("Len after freeing all = %d", a.Len())
	}
	for i := n - 1; i >= 0; i-- {
		if got := a.Alloc(); got != uint32(i) {
			t.Fatalf("reuse: got %d, want %d", got, i)
		}
	}
	if a.Len() != n || len(a.free) > 1 {
		t.Fatalf("Len %d, %d free chunks kept", a.Len(), len(a.free))
	}
	if got := a.Alloc(); got != n {
		t.Fatalf("after the free stack: %d, want %d", got, n)
	}
}

// TestAllocFreshTellsNeverAllocatedRecords: AllocFresh says fresh exactly for indices
// never handed out before (their words are zero), not for freed ones handed out again
// (their words as their last owner left them), also after Adopt.
func TestAllocFreshTellsNeverAllocatedRecords(t *testing.T) {
	a := New(Config{RecordWords: 2, ChunkRecords: 4})
	for i := 0; i < 6; i++ {
		idx, fresh := a.AllocFresh()
		if idx != uint32(i) || !fresh {
			t.Fatalf("alloc %d = %d, fresh %v", i, idx, fresh)
		}
		if w := a.Record(idx); w[0] != 0 || w[1] != 0 {
			t.Fatalf("fresh record %d = %v", idx, w)
		}
		a.Record(idx)[1] = uint64(i) + 1
	}
	a.Free(4)
	if idx, fresh := a.AllocFresh(); idx != 4 || fresh || a.Record(4)[1] != 5 {
		t.Fatalf("reused = %d, fresh %v, word %d; want 4, false, 5", idx, fresh, a.Record(4)[1])
	}
	b := New(Config{RecordWords: 3, ChunkRecords: 4})
	a.Free(1)
	b.Adopt(a)
	for _, want := range []struct {
		idx   uint32
		fresh bool
	}{{1, false}, {6, true}} {
		if idx, fresh := b.AllocFresh(); idx != want.idx || fresh != want.fresh {
			t.Fatalf("after adopt: %d, fresh %v; want %d, %v", idx, fresh, want.idx, want.fresh)
		}
	}
}

// TestReserveAndAdopt: a wider arena filled index for index (Reserve, Record) takes over the
// allocation state of the one it copies: same length and high-water mark, the same freed
// records handed out in the same order, then fresh indices; the source's free list is gone.
func TestReserveAndAdopt(t *testing.T) {
	src := New(Config{RecordWords: 2, ChunkRecords: 4})
	for i := 0; i < 11; i++ {
		src.Alloc()
	}
	for _, idx := range []uint32{2, 9, 5} {
		src.Free(idx)
	}
	dst := New(Config{RecordWords: 5, ChunkRecords: 4})
	dst.Reserve(src.HighWater())
	if dst.Cap() < 11 {
		t.Fatalf("reserved cap %d", dst.Cap())
	}
	for idx := uint32(0); idx < src.HighWater(); idx++ {
		dst.Record(idx)[4] = uint64(idx) + 100
	}
	dst.Adopt(src)
	if dst.Len() != 8 || dst.HighWater() != 11 || src.Len() != 11 {
		t.Fatalf("after adopt: dst len %d hw %d, src len %d", dst.Len(), dst.HighWater(), src.Len())
	}
	for _, want := range []uint32{5, 9, 2, 11, 12} {
		if got := dst.Alloc(); got != want {
			t.Fatalf("alloc = %d, want %d", got, want)
		}
	}
	if got := dst.Record(9)[4]; got != 109 {
		t.Fatalf("copied record 9 = %d", got)
	}
}

// TestDirAddressesRecordsItWasTakenWith: a Dir gives the very words Record gives for
// every record in the slabs that existed when it was taken, records allocated later in
// those slabs included, and says false for records in slabs added after it.
func TestDirAddressesRecordsItWasTakenWith(t *testing.T) {
	a := New(Config{RecordWords: 3, ChunkRecords: 16})
	for range 40 { // slabs 0, 1, 2
		a.Alloc()
	}
	d := a.Dir()
	for range 40 { // into slabs 3, 4 (and 2's rest)
		a.Alloc()
	}
	for idx := uint32(0); idx < 80; idx++ {
		p, ok := d.Words(idx)
		if want := idx < 48; ok != want {
			t.Fatalf("record %d: ok %v, want %v", idx, ok, want)
		}
		if ok && p != unsafe.Pointer(&a.Record(idx)[0]) {
			t.Fatalf("record %d: Words %p, Record %p", idx, p, &a.Record(idx)[0])
		}
	}
	if _, ok := d.Words(1<<32 - 3); ok {
		t.Fatal("an index far past the directory")
	}
	if n := testing.AllocsPerRun(100, func() { d = a.Dir(); _, _ = d.Words(7) }); n != 0 {
		t.Fatalf("Dir and Words allocate %.1f", n)
	}
}
