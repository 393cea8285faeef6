//go:build !linux

package hashing

import "errors"

// hugePage is the step in which Grow populates and copies.
const hugePage = 2 << 20

// allocEntries allocates the memo table and its record hints on the heap where mmap is
// not used.
func allocEntries(n int, _ *Memo) ([]memoEntry, []uint32, []byte, int, int) {
	return make([]memoEntry, n), make([]uint32, n*memoRun), nil, 0, 0
}

// populateRange needs Linux's MADV_POPULATE_WRITE.
func (m *Memo) populateRange(off, n int) error {
	return errors.New("populating the memo needs Linux")
}
