package hashing

import (
	"errors"
	"fmt"
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
// resident as entries are written (or all at once: Memo.Populate); owner's cleanup
// unmaps them once it is unreachable. It falls back to the heap if the mapping fails
// (region nil).
func allocEntries(n int, owner *Memo) (ents []memoEntry, hints []uint32, region []byte) {
	size := n * MemoEntryBytes
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]memoEntry, n), make([]uint32, n*memoRun), nil
	}
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE) // only speed depends on it
	runtime.AddCleanup(owner, func(b []byte) { _ = syscall.Munmap(b) }, b)
	// The entries first (the mapping is page-aligned, so they are line-aligned), then the
	// hints.
	return unsafe.Slice((*memoEntry)(unsafe.Pointer(&b[0])), n),
		unsafe.Slice((*uint32)(unsafe.Pointer(&b[n*memoLineBytes])), n*memoRun), b
}

// madvPopulateWrite is MADV_POPULATE_WRITE (Linux 5.14): fault in every page of a range
// as if written, without changing its contents.
const madvPopulateWrite = 23

// populate makes every page of the memo's mapping resident now. MADV_POPULATE_WRITE
// writes nothing, so it is safe while queries use the memo.
func (m *Memo) populate() error {
	if m.region == nil {
		return errors.New("the memo is on the Go heap (its mapping failed)")
	}
	// One call per 64 MiB, so that a call the kernel interrupts (EINTR) is retried for
	// its chunk only.
	const chunk = 64 << 20
	for off := 0; off < len(m.region); off += chunk {
		part := m.region[off:min(off+chunk, len(m.region))]
		for {
			err := syscall.Madvise(part, madvPopulateWrite)
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				return fmt.Errorf("madvise(MADV_POPULATE_WRITE): %w", err)
			}
			break
		}
	}
	return nil
}
