package hashing

import (
	"runtime"
	"syscall"
	"unsafe"
)

// allocEntries maps the memo table (entries and their record hints) outside the Go heap: it holds no pointers, so the
// collector has nothing to scan, and off-heap it does not raise the heap goal (a 128 MiB
// table on the heap lets garbage grow by as much again before a collection). The mapping
// is asked to use transparent huge pages (where THP is "madvise", as on Debian): lookups
// and inserts land at random in hundreds of MiB, and with 4 KiB pages nearly each pays a
// TLB miss, and the first write to each page a fault. The pages are zero and become
// resident as entries are written; owner's cleanup unmaps them once it is unreachable.
// It falls back to the heap if the mapping fails.
func allocEntries(n int, owner *Memo) ([]memoEntry, []uint32) {
	size := n * MemoEntryBytes
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]memoEntry, n), make([]uint32, n*memoRun)
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // only speed depends on it
	runtime.AddCleanup(owner, func(b []byte) { _ = syscall.Munmap(b) }, b)
	// The entries first (the mapping is page-aligned, so they are line-aligned), then the
	// hints.
	return unsafe.Slice((*memoEntry)(unsafe.Pointer(&b[0])), n),
		unsafe.Slice((*uint32)(unsafe.Pointer(&b[n*memoLineBytes])), n*memoRun)
}
