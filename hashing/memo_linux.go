package hashing

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// hugePage is the size of a transparent huge page on amd64 and arm64 (4 KiB base pages):
// the mapping starts on one, and Grow populates and copies in steps of one.
const hugePage = 2 << 20

// allocEntries maps the memo table (n entries and their record hints) outside the Go heap:
// it holds no pointers, so the collector has nothing to scan, and off-heap it does not
// raise the heap goal (a 128 MiB table on the heap lets garbage grow by as much again
// before a collection). The mapping is asked to use transparent huge pages (where THP is
// "madvise", as on Debian): lookups and inserts land at random in hundreds of MiB, and
// with 4 KiB pages nearly each pays a TLB miss, and the first write to each page a fault.
// It starts on a huge page boundary, and so do the hints after the entries, so that a
// table's first sets share as few huge pages as they can. Only address space is taken
// (MAP_NORESERVE): pages are zero and become resident as entries are written, or as they
// are populated (Memo.Populate, Grow); owner's cleanup unmaps them once it is
// unreachable. It falls back to the heap if the mapping fails (region nil).
func allocEntries(n int, owner *Memo) (ents []memoEntry, hints []uint32, region []byte, entsOff, hintsOff int) {
	entBytes := alignUp(n*memoLineBytes, hugePage)
	size := entBytes + alignUp(n*memoRun*4, hugePage) + hugePage // + slack to align the start
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return make([]memoEntry, n), make([]uint32, n*memoRun), nil, 0, 0
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // only speed depends on it
	runtime.AddCleanup(owner, func(b []byte) { _ = syscall.Munmap(b) }, b)
	entsOff = alignUp(int(uintptr(unsafe.Pointer(&b[0]))), hugePage) - int(uintptr(unsafe.Pointer(&b[0])))
	hintsOff = entsOff + entBytes
	return unsafe.Slice((*memoEntry)(unsafe.Pointer(&b[entsOff])), n),
		unsafe.Slice((*uint32)(unsafe.Pointer(&b[hintsOff])), n*memoRun), b, entsOff, hintsOff
}

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14): fault in every page of a range
// as if written, without changing its contents.
const madvPopulateWrite = 23

// populateRange makes the pages of region[off:off+n] resident now (whole pages: those
// it shares with neighbours too). MADV_POPULATE_WRITE writes nothing, so it is safe while
// queries use the memo.
func (m *Memo) populateRange(off, n int) error {
	if m.region == nil {
		return errors.New("the memo is on the Go heap (its mapping failed)")
	}
	if n <= 0 {
		return nil
	}
	// The region starts on a page; madvise wants page-aligned ranges.
	ps := syscall.Getpagesize()
	from, to := off&^(ps-1), min(alignUp(off+n, ps), len(m.region))
	for {
		err := syscall.Madvise(m.region[from:to], madvPopulateWrite)
		if err == syscall.EINTR {
			continue // the kernel was interrupted: again (pages already in stay in)
		}
		if err != nil {
			return fmt.Errorf("madvise(MADV_POPULATE_WRITE): %w", err)
		}
		return nil
	}
}
