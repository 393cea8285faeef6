//go:build !linux

package hashing

import "errors"

// allocEntries allocates the memo table and its record hints on the heap where mmap is
// not used.
func allocEntries(n int, _ *Memo) ([]memoEntry, []uint32, []byte) {
	return make([]memoEntry, n), make([]uint32, n*memoRun), nil
}

// populate needs Linux's MADV_POPULATE_WRITE.
func (m *Memo) populate() error {
	return errors.New("populating the memo needs Linux")
}
