package engine

import (
	"time"

	"github.com/conductor-go/conductor/hashing"
)

// The query key memo's size. A memo of fixed size (Config.MemoStartEntries at or above
// MemoEntries) is made whole in New, and populated there with Config.PopulateMemo. A
// growing one starts small and holds no resident memory until queries write to it; it
// asks to grow each time they have filled half of it (hashing.Memo.GrowRequests), and
// growMemo, a goroutine of the engine's that costs nothing while nobody asks, doubles it
// while it holds fewer than memoPerBlock times the blocks the engine indexes, up to
// MemoEntries. The memo's memory follows the cold prompts it remembers, and what the
// index could give them: an engine that is only fed events, or only asked the same
// prompts, keeps a small memo.

// memoPerBlock is how many memo blocks the grower allows per indexed block: the memo only
// remembers blocks that queries walked, which the index holds (or held until evicted),
// and with twice as many blocks as the index (4-way sets) few of them are lost to a full
// set.
const memoPerBlock = 2

// newMemo makes the engine's memo as cfg says (see above).
func (e *Engine) newMemo(cfg Config) {
	if cfg.MemoEntries <= 0 {
		return
	}
	start := cfg.MemoStartEntries
	if start <= 0 {
		start = hashing.DefaultMemoStart
	}
	e.memo = hashing.NewGrowingMemo(start, cfg.MemoEntries, cfg.PopulateMemo)
	if e.memo.GrowRequests() != nil {
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

// growMemoStep answers one request of the memo: it doubles the memo if it holds fewer
// than memoPerBlock times the blocks indexed (and is below its limit), logs the step,
// and logs the first failure to populate one (*warned; the memo grows anyway, its
// queries paying the page faults). It reports whether the memo grew.
func (e *Engine) growMemoStep(quit <-chan struct{}, warned *bool) bool {
	had := e.memo.Stats().Capacity
	want := min(2*had, int(min(e.total.Load(), int64(e.memo.Limit())))*memoPerBlock)
	t0 := time.Now()
	grew, err := e.memo.Grow(want, quit)
	if err != nil && !*warned {
		*warned = true
		e.log.Warn("query key memo growth not populated: queries pay the page faults of its first writes", "err", err)
	}
	if grew {
		e.log.Info("query key memo grew", "blocks", e.memo.Stats().Capacity, "bytes", e.memo.Bytes(),
			"indexed_blocks", e.total.Load(), "took", time.Since(t0).Round(time.Microsecond))
	}
	return grew
}
