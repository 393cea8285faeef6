package engine

import (
	"math"
	"time"

	"github.com/conductor-go/conductor/hashing"
)

// The query key memo's size. A memo of fixed size (Config.MemoStartEntries at or above
// MemoEntries) is made whole in New, and populated there with Config.PopulateMemo. A
// growing one starts small, with nothing resident, and growMemo, a goroutine of the
// engine's that costs nothing while nobody asks, grows it on two signals:
//
//   - Ahead of the index: once queries hash blocks (the memo is in use), a query that
//     finds the engine indexing more than memoAhead blocks per memo block asks, and the
//     memo grows to one block per memoAhead indexed blocks. Its pages are populated by
//     the grower before queries use them, so a cold prompt never pays a page fault for
//     the memo (a fresh VM page costs microseconds to zero: writing a memo entry into one
//     was most of a cold query's cost).
//   - With reuse: when queries have filled half of it and prompts come back after it
//     evicted their runs (hashing.Memo.Outgrown), it doubles, up to memoPerBlock memo
//     blocks per indexed block. Prompts that are all new fill it without growing it:
//     their runs are never asked again, and a step's pages (zeroed, populated and the
//     moving runs copied) cost the process CPU while they come in.
//
// Both up to MemoEntries. A conductor nobody queries, or one with an empty index, holds
// none of it; one with N indexed blocks N/memoAhead to memoPerBlock*N (5 to 40 bytes an
// indexed block, 20 a memo block). It never shrinks.

const (
	// memoAhead is the indexed blocks per memo block that the grower keeps the memo at,
	// populated, ahead of the cold queries that fill it. At 4 (5 bytes an indexed block)
	// rather than 2, a burst's RSS growth per block stays under the index's own 48-56
	// bytes plus 16 (conductor-bench ingest, whose drain queries make the memo grow as a
	// router's would); reuse doubles it where prompts come back after their eviction.
	memoAhead = 4
	// memoPerBlock is the most memo blocks per indexed block that use may grow the memo
	// to: the memo only remembers blocks that queries walked, which the index holds (or
	// held until evicted), and at twice the blocks of the index (4-way sets) few are lost
	// to a full set.
	memoPerBlock = 2
)

// newMemo makes the engine's memo as cfg says (see above).
func (e *Engine) newMemo(cfg Config) {
	e.memoAheadAt.Store(math.MaxInt64)
	if cfg.MemoEntries <= 0 {
		return
	}
	start := cfg.MemoStartEntries
	if start <= 0 {
		start = hashing.DefaultMemoStart
	}
	e.memo = hashing.NewGrowingMemo(start, cfg.MemoEntries, cfg.PopulateMemo)
	e.memo.SetSecondSight(cfg.MemoSecondSight)
	if e.memo.GrowRequests() != nil {
		e.setMemoAhead()
		e.memoQuit = make(chan struct{})
		if !cfg.manualMemoGrowth {
			e.wg.Add(1)
			go e.growMemo(e.memoQuit)
		}
		return
	}
	if !cfg.PopulateMemo {
		return
	}
	t0 := time.Now()
	if err := e.memo.Populate(); err != nil {
		e.log.Warn("query key memo not populated: its pages become resident as queries fill it", "err", err)
		return
	}
	e.log.Info("query key memo populated", "bytes", e.memo.Bytes(), "blocks", e.memo.Stats().Capacity,
		"took", time.Since(t0).Round(time.Millisecond))
}

// setMemoAhead sets the indexed blocks past which a query asks the grower to grow the
// memo ahead of the index (memoAheadAt): more than memoAhead per memo block, or never
// once the memo is at its limit.
func (e *Engine) setMemoAhead() {
	c := e.memo.Stats().Capacity
	if c >= e.memo.Limit() {
		e.memoAheadAt.Store(math.MaxInt64)
		return
	}
	e.memoAheadAt.Store(int64(c) * memoAhead)
}

// memoAheadOfIndex asks the grower to grow the memo when a query hashed blocks (res) and
// the index has outgrown the memo (see above): one comparison per such query.
func (e *Engine) memoAheadOfIndex(res *Result) {
	if res.hashed > res.fromMemo && e.total.Load() > e.memoAheadAt.Load() {
		e.memo.RequestGrow()
	}
}

// growMemo grows the memo when it asks (see above) until quit is closed.
func (e *Engine) growMemo(quit <-chan struct{}) {
	defer e.wg.Done()
	warned := false
	for {
		select {
		case <-quit:
			return
		case <-e.memo.GrowRequests():
		}
		grew := e.growMemoStep(quit, &warned)
		if h := e.hooks; h != nil && h.memoGrew != nil {
			h.memoGrew(grew)
		}
	}
}

// growMemoStep answers one request of the memo (see above), logs the step and the first
// failure to populate one (*warned; the memo grows anyway, its queries paying the page
// faults), and reports whether the memo grew.
func (e *Engine) growMemoStep(quit <-chan struct{}, warned *bool) bool {
	had, limit := int64(e.memo.Stats().Capacity), int64(e.memo.Limit())
	indexed := e.total.Load()
	want := min(indexed/memoAhead, limit)
	if e.memo.HalfFilled() && e.memo.Outgrown() {
		want = max(want, min(2*had, indexed*memoPerBlock, limit))
	}
	t0 := time.Now()
	grew, err := e.memo.Grow(int(want), quit)
	e.setMemoAhead()
	if err != nil && !*warned {
		*warned = true
		e.log.Warn("query key memo growth not populated: queries pay the page faults of its first writes", "err", err)
	}
	if grew {
		e.log.Info("query key memo grew", "blocks", e.memo.Stats().Capacity, "bytes", e.memo.Bytes(),
			"indexed_blocks", indexed, "took", time.Since(t0).Round(time.Microsecond))
	}
	return grew
}
