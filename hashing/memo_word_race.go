//go:build race

package hashing

import "sync/atomic"

// Under the race detector the memo's racy-by-design word accesses go through sync/atomic,
// so that the detector checks everything else (see memo_word.go).

func ldw(p *uint64) uint64    { return atomic.LoadUint64(p) }
func stw(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
