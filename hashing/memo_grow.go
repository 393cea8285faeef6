package hashing

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// A growing memo (NewGrowingMemo) starts small and grows as queries fill it, so that a
// conductor nobody asks holds none of it and one asked about a small index holds little:
// memory follows use, up to the limit. The memo only asks (GrowRequests); its owner
// decides the size (the engine bounds it by the blocks it indexes) and calls Grow, on a
// goroutine of its own, never a query's.
//
// Grow is safe beside lock-free readers and writers because queries only ever use a
// published table (Memo.tab, loaded once per prompt) and a table never changes size:
//
//  1. It populates the pages of the new sets and their hints (with prefault), in steps
//     of a huge page, so that no query pays their page faults.
//  2. It copies, set by set, every entry whose set changes at the new size into its new
//     set. Nothing else writes the new sets before the table is published, so the copy
//     places entries exactly as inserts would (Memo.insert's policy); entries are read as
//     a lookup reads them (check word last), so an entry a query replaces meanwhile is
//     either copied whole or not at all (a miss later, never a wrong run).
//  3. It publishes the new table. A query that loaded the old table goes on with it:
//     the old sets are the first sets of the new table, its inserts land there (an
//     insert whose set changed is unreachable at the new size: a lost run, which the next
//     query asking for it hashes and inserts again), and nothing is ever unmapped.
//
// An entry inserted into an old set after that set was copied, whose set changes, is
// lost the same way. Copied entries stay behind in their old sets, unreachable, until the
// clock evicts them.

// growStage names the points between Grow's steps where a test hook runs.
type growStage uint8

const (
	growPopulated growStage = iota // a step of pages populated (at: the entries done)
	growCopied                     // a step of sets copied (at: the old sets done)
	growPublish                    // the new table is about to be published (at: its entries)
)

// memoGrower is a growing memo's trigger and the serialisation of Grow.
type memoGrower struct {
	mu       sync.Mutex // serialises Grow
	prefault bool
	// filled counts the runs chains inserted (Done); at growAt the memo asks to grow.
	filled, growAt atomic.Uint64
	// The window of filled and of reasked lookups (MemoStats.Reasked) that Outgrown
	// judges starts at winFilled, winReasked (set with growAt).
	winFilled, winReasked atomic.Uint64
	// req carries the requests (capacity 1: one pending request stands for any number);
	// nil for a memo that cannot grow.
	req chan struct{}
	// hook, in tests, runs on Grow's goroutine at each stage (see growStage); setsStep,
	// when > 0, replaces growSetsStep.
	hook     func(stage growStage, at int)
	setsStep int
}

// growSetsStep is the number of sets Grow copies between two checks for stop (and a
// yield): one huge page of entries.
const growSetsStep = hugePage / (memoWays * memoLineBytes)

func (g *memoGrower) init(runs int, canGrow, prefault bool) {
	g.prefault = prefault
	if canGrow {
		g.req = make(chan struct{}, 1)
		g.growAt.Store(uint64(runs / 2))
	}
}

// noteInserts adds n runs inserted and asks to grow when they reach the mark.
func (m *Memo) noteInserts(n uint64) {
	g := &m.grower
	if g.req == nil {
		return
	}
	if g.filled.Add(n) >= g.growAt.Load() {
		m.RequestGrow()
	}
}

// GrowRequests delivers a value when queries have inserted runs for half the memo's
// current capacity since it was made or last grew (HalfFilled), or when RequestGrow asked
// for one: the owner then calls Grow. It is nil (never ready) for a nil memo and a memo
// that cannot grow.
func (m *Memo) GrowRequests() <-chan struct{} {
	if m == nil {
		return nil
	}
	return m.grower.req
}

// RequestGrow makes GrowRequests deliver a value (one, however often it is called before
// the owner takes it), for an owner whose own reasons to grow the memo arise on another
// goroutine (the engine's: its index grew). It does nothing for a memo that cannot grow.
func (m *Memo) RequestGrow() {
	if m == nil || m.grower.req == nil {
		return
	}
	select {
	case m.grower.req <- struct{}{}:
	default:
	}
}

// HalfFilled reports whether queries have inserted runs for half the memo's capacity since
// it was made or last grew (or since Grow last declined such a request): the reason it
// asks to grow.
func (m *Memo) HalfFilled() bool {
	return m != nil && m.grower.req != nil && m.grower.filled.Load() >= m.grower.growAt.Load()
}

// reaskedPer is the runs inserted per reasked lookup at or under which Outgrown holds:
// a prompt asked again after its runs were evicted misses its first run or two and
// inserts its runs again (64 for 8K tokens), so prompts that come back after eviction
// give one in 64 or more; prompts never seen before match a ghost about once in 2^28
// lookups, a handful of which a prompt makes.
const reaskedPer = 256

// Outgrown reports whether, since the memo was made or last grew (or Grow last declined a
// request), lookups missed runs the memo had evicted lately (MemoStats.Reasked) at least
// once per reaskedPer runs inserted: prompts come back after the memo lost them, so a
// larger memo would serve them. Prompts that are all new fill the memo without it: growing
// then would only make resident memory nobody reads.
func (m *Memo) Outgrown() bool {
	if m == nil {
		return false
	}
	g := &m.grower
	r := m.reasked() - g.winReasked.Load()
	return r > 0 && r*reaskedPer >= g.filled.Load()-g.winFilled.Load()
}

// reasked is MemoStats.Reasked, summed over the stripes.
func (m *Memo) reasked() uint64 {
	var n uint64
	for i := range m.stripes {
		n += m.stripes[i].reasked.Load()
	}
	return n
}

// Limit is the capacity in blocks that Grow can take the memo to.
func (m *Memo) Limit() int {
	if m == nil {
		return 0
	}
	return len(m.ents) * memoRun
}

// Grow makes the memo hold at least blocks blocks (rounded up to a power of two, at most
// Limit), keeping the entries it holds, and reports whether it grew. With prefault
// (NewGrowingMemo), the new part's pages are made resident first; where that is not
// possible the error says why, and the memo grows anyway (queries then pay the faults).
// When it grew, or when it was HalfFilled (the owner declined the request), the memo asks
// again once queries have inserted runs for half its capacity after this call. Grow works in steps of a huge page,
// yielding between them, and stops early, without growing, when stop is closed. It is
// safe while queries use the memo (see above); calls are serialised.
func (m *Memo) Grow(blocks int, stop <-chan struct{}) (grew bool, err error) {
	if m == nil {
		return false, nil
	}
	g := &m.grower
	g.mu.Lock()
	defer g.mu.Unlock()
	due := m.HalfFilled()
	defer func() {
		n := uint64(len(m.tab.Load().ents))
		switch {
		case int(n) == len(m.ents):
			g.growAt.Store(math.MaxUint64) // at the limit: no more requests
		case grew || due:
			f := g.filled.Load()
			g.growAt.Store(f + n/2)
			g.winFilled.Store(f)
			g.winReasked.Store(m.reasked())
		}
	}()
	old := m.tab.Load()
	n := min(memoRuns(blocks), len(m.ents))
	if n <= len(old.ents) {
		return false, nil
	}
	if g.prefault {
		var stopped bool
		if stopped, err = m.populateEntries(len(old.ents), n, stop); stopped {
			return false, err
		}
	}
	nt := m.table(n)
	oldSets := len(old.ents) / memoWays
	step := growSetsStep
	if g.setsStep > 0 {
		step = g.setsStep
	}
	for s := 0; s < oldSets; s += step {
		for i := s; i < min(s+step, oldSets); i++ {
			moveSet(old, nt, i)
		}
		if g.hook != nil {
			g.hook(growCopied, min(s+step, oldSets))
		}
		if stopped(stop) {
			return false, err
		}
		runtime.Gosched()
	}
	if g.hook != nil {
		g.hook(growPublish, n)
	}
	m.tab.Store(nt)
	return true, err
}

// alignUp rounds n up to a multiple of a (a power of two).
func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// populateEntries makes entries [from, to) and their hints resident, a huge page at a
// time, and reports whether stop ended it early.
func (m *Memo) populateEntries(from, to int, stop <-chan struct{}) (bool, error) {
	ranges := [2][2]int{
		{m.entsOff + from*memoLineBytes, m.entsOff + to*memoLineBytes},
		{m.hintsOff + from*memoRun*4, m.hintsOff + to*memoRun*4},
	}
	done := from
	for _, r := range ranges {
		for off := r[0]; off < r[1]; {
			n := min(alignUp(off+1, hugePage), r[1]) - off // to the next huge page boundary
			if err := m.populateRange(off, n); err != nil {
				return false, err
			}
			off += n
			if r == ranges[0] {
				done = from + (off-r[0])/memoLineBytes
			}
			if g := &m.grower; g.hook != nil {
				g.hook(growPopulated, done)
			}
			if stopped(stop) {
				return true, nil
			}
			runtime.Gosched()
		}
	}
	return false, nil
}

// moveSet copies the valid entries of set s of old whose set differs in nt into nt,
// with their record hints and the hints' owner.
func moveSet(old, nt *memoTable, s int) {
	for w := s * memoWays; w < s*memoWays+memoWays; w++ {
		e := &old.ents[w]
		var v memoRunVal
		v.a, v.b = ldw(&e.a), ldw(&e.b)
		if nt.set(v.a) == old.set(v.a) {
			continue // stays (empty entries too: their lanes are 0)
		}
		for j := range v.k {
			v.k[j] = ldw(&e.k[j])
		}
		for j := range v.d {
			v.d[j] = ldw(&e.d[j])
		}
		if c := ldw(&e.check); c == 0 || c != old.checkOf(&v) {
			continue // empty, or torn by a query replacing it: not copied
		}
		owner := old.hintOwner(w)
		to, wrote, _ := nt.place(&v)
		if !wrote {
			continue // already there (a torn copy of it cannot be: nothing else writes nt's new sets)
		}
		for j := 0; j < memoRun; j++ {
			atomic.StoreUint32(&nt.hints[to*memoRun+j], atomic.LoadUint32(&old.hints[w*memoRun+j]))
		}
		if owner != 0 {
			nt.claimHints(to, owner)
		}
	}
}

// populate is Populate's work: the current table's entries and hints.
func (m *Memo) populate() error {
	_, err := m.populateEntries(0, len(m.tab.Load().ents), nil)
	return err
}
