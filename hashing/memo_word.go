//go:build !race

package hashing

// ldw and stw are the memo's word accesses: plain loads and stores of aligned 64-bit words.
//
// Readers and writers of a memo entry race by design, and correctness does not rest on
// ordering: a reader accepts an entry only if the check word it read equals the keyed
// hash of the other words it read, so any mix of two writes, in any order, is rejected
// (up to a 64-bit check collision). All that is needed is that a word is never torn, which
// the Go memory model guarantees for racy reads of locations no larger than a machine word.
// Plain stores matter for speed: an atomic store is a locked exchange on amd64, a full
// barrier that waits for the line, where a plain store retires into the store buffer. Race
// builds use sync/atomic instead (memo_word_race.go), so the detector stays quiet.

func ldw(p *uint64) uint64    { return *p }
func stw(p *uint64, v uint64) { *p = v }
