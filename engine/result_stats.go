package engine

// BlocksHashed is the number of blocks the last Query into r hashed: the walk stops at the
// first block that no queried slot can use, and hashes at most two windows of blocks
// ahead of it (overlapped probes, probe.go), so this is the query's hashing cost. It is 0
// after a query that hashed nothing (unknown context or filter) and after QueryKeys.
func (r *Result) BlocksHashed() int { return r.hashed }

// BlocksFromMemo is how many of those blocks the last Query took from the key memo
// instead of hashing them.
func (r *Result) BlocksFromMemo() int { return r.fromMemo }
