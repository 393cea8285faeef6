//go:build !linux

package hashing

// allocEntries allocates the memo table and its record hints on the heap where mmap is
// not used.
func allocEntries(n int, _ *Memo) ([]memoEntry, []uint32) {
	return make([]memoEntry, n), make([]uint32, n*memoRun)
}
