package hashing

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel to back the memo table with transparent huge pages (where
// THP is "madvise", as on Debian): lookups and inserts land at random in a table of
// hundreds of MiB, and with 4 KiB pages nearly each one pays a TLB miss, and the first
// write to each page a fault. Failure only costs speed, so it is ignored.
func adviseHuge(ents []memoEntry) {
	if len(ents) == 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(&ents[0])), len(ents)*MemoEntryBytes)
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
}
