package engine

// BlocksHashed is the number of blocks the last Query into r hashed: the walk stops at the
// first block that no queried slot can use, so this is the query's hashing cost.
func (r *Result) BlocksHashed() int { return r.chain.Hashed() }

// BlocksFromMemo is how many of those blocks the last Query took from the key memo
// instead of hashing them (like BlocksHashed, it describes the last Query that hashed:
// one that returned before hashing, for an unknown context or filter, leaves it as it was).
func (r *Result) BlocksFromMemo() int { return r.chain.MemoHits() }
