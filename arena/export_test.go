package arena

// Test-only views of an arena, kept out of the package API (nothing outside the tests uses
// them).

// Cap returns the number of records the allocated slabs can hold. Writer only.
func (a *Arena) Cap() int { return len(*a.dir.Load()) << a.chunkShift }

// Word returns a pointer to word w of record idx, for sync/atomic access. Safe for
// concurrent use; idx and w must be in range.
func (a *Arena) Word(idx uint32, w int) *uint64 {
	d := *a.dir.Load()
	return &d[idx>>a.chunkShift][int(idx&a.chunkMask)*a.recWords+w]
}

// Range calls fn for every index below the allocation high-water mark, in increasing
// order, including freed ones (the caller's records say which are live). It stops early
// when fn returns false. Writer only.
func (a *Arena) Range(fn func(idx uint32, rec []uint64) bool) {
	d := *a.dir.Load()
	n := a.next
	for idx := uint32(0); idx < n; idx++ {
		c := d[idx>>a.chunkShift]
		off := int(idx&a.chunkMask) * a.recWords
		if !fn(idx, c[off:off+a.recWords:off+a.recWords]) {
			return
		}
	}
}
