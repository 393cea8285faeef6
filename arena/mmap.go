package arena

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Map returns n zeroed 64-bit words outside the Go heap: an anonymous private mapping,
// never scanned or moved by the garbage collector and not counted in its heap goal, whose
// pages cost resident memory only once written. Mappings are never unmapped (see Release),
// so a reader holding an old slice can never fault. It panics when the kernel refuses the
// mapping, like an out-of-memory make.
func Map(n int) []uint64 {
	if n <= 0 {
		return nil
	}
	if raceHeap {
		return make([]uint64, n)
	}
	b, err := syscall.Mmap(-1, 0, n*8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		panic(fmt.Sprintf("arena: mmap %d bytes: %v", n*8, err))
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// Release gives the pages of words back to the kernel (MADV_DONTNEED): resident memory
// drops at once, and the words stay mapped and read as zero afterwards. Readers that
// still hold the slice therefore read zeros, never fault; callers design their records so
// that all-zero words read as "absent". The words may be reused (they are zero again).
func Release(words []uint64) {
	if len(words) == 0 {
		return
	}
	if raceHeap {
		for i := range words {
			atomic.StoreUint64(&words[i], 0) // what readers see after MADV_DONTNEED
		}
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), len(words)*8)
	// Only whole pages can be released; Map'd slices start on a page boundary.
	if err := syscall.Madvise(b, syscall.MADV_DONTNEED); err != nil {
		panic(fmt.Sprintf("arena: madvise %d bytes: %v", len(b), err))
	}
}
