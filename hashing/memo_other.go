//go:build !linux

package hashing

// allocEntries allocates the memo table on the heap where mmap is not used.
func allocEntries(n int, _ *Memo) []memoEntry { return make([]memoEntry, n) }
