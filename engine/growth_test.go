package engine

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// writerTable reads writer-owned table state on the writer goroutine.
func writerTable(t testing.TB, e *Engine, k ContextKey) (migrating bool, entries, migrations int) {
	t.Helper()
	onWriter(t, e, k, func(c *cacheContext) {
		migrating, entries, migrations = c.tab.prev.Load() != nil, len(c.tab.entries), c.migrations
	})
	return
}

// TestIncrementalGrowthKeepsBlocksVisible grows a context to 16,384 blocks in batches and,
// while a migration is running across requests, checks that every block (old table, new
// table, moved or not) answers, that removes and re-stores of blocks still in the old table
// take effect, and that the table ends up migrated.
func TestIncrementalGrowthKeepsBlocksVisible(t *testing.T) {
	a := Slot{"a", 0}
	e, _ := hookedEngineWith(t, Config{MaxBlocksPerContext: -1}, &testHooks{noIdleMigration: true}, a)
	const n, batch = 16_384, 64
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	sawMigrating := 0
	for done := 0; done < n; done += batch {
		mustApply(t, e, ctxA, store(a, TierDevice, keys[done:done+batch]...))
		migrating, _, _ := writerTable(t, e, ctxA)
		if !migrating {
			continue
		}
		sawMigrating++
		if sawMigrating%32 != 1 {
			continue
		}
		stored := keys[:done+batch]
		// Every stored block answers, in order (a 1-block query per sample of keys,
		// and one long walk over all of them).
		if got := rankTiers(t, qk(t, e, ctxA, stored, ""), "a", 0).Device; got != int64(len(stored))*16 {
			t.Fatalf("%d blocks stored, walk found %d during migration", len(stored), got/16)
		}
		// The oldest blocks are the last to be moved: remove and re-store one.
		old := keys[1]
		mustApply(t, e, ctxA, remove(a, TierDevice, old))
		wantTiers(t, e, "a", []uint64{old}, Tiers{}, "removed block still answers during migration")
		if got := prefixCount(e, ctxA); got != len(stored)-1 {
			t.Fatalf("prefix count %d, want %d", got, len(stored)-1)
		}
		mustApply(t, e, ctxA, store(a, TierDisk, old))
		wantTiers(t, e, "a", []uint64{old}, Tiers{0, 0, 0, 16}, "re-stored block during migration")
		mustApply(t, e, ctxA, remove(a, TierDisk, old), store(a, TierDevice, old))
	}
	if sawMigrating < 10 {
		t.Fatalf("migrations never spanned requests (%d observations)", sawMigrating)
	}
	// Requests finish the last migration even without inserts.
	for i := 0; i < 100_000; i++ {
		if m, _, _ := writerTable(t, e, ctxA); !m {
			break
		}
	}
	migrating, entries, migrations := writerTable(t, e, ctxA)
	if migrating || entries > sizeFor(n)*2 || migrations < 10 {
		t.Fatalf("after growth: migrating %v, %d entries, %d migrations", migrating, entries, migrations)
	}
	if got := rankTiers(t, qk(t, e, ctxA, keys, ""), "a", 0).Device; got != n*16 {
		t.Fatalf("after growth the walk found %d of %d blocks", got/16, n)
	}
	if got := prefixCount(e, ctxA); got != n {
		t.Fatalf("prefix count %d", got)
	}
}

// TestWalkSurvivesTableReleasedUnderIt: a query stops in the middle of its walk while the
// writer grows the table through whole migrations, so that the table the query loaded is
// retired and its memory released (it reads as zeros). The query must still find the rest
// of the prompt, in the latest table, instead of a false miss.
func TestWalkSurvivesTableReleasedUnderIt(t *testing.T) {
	a := Slot{"a", 0}
	e, hooks := hookedEngine(t, Config{MaxBlocksPerContext: -1}, a)
	keys := make([]uint64, 100)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, keys...))
	_, before, _ := writerTable(t, e, ctxA)
	more := make([]uint64, 5000)
	for i := range more {
		more[i] = benchKey(1<<20 + i)
	}
	fired := false
	hooks.walkLoad = func(i, _ int) {
		if i == 50 && !fired {
			fired = true
			for j := 0; j < len(more); j += 100 {
				mustApply(t, e, ctxA, store(a, TierDisk, more[j:j+100]...))
			}
		}
	}
	hits := qk(t, e, ctxA, keys, "")
	hooks.walkLoad = nil
	migrating, after, _ := writerTable(t, e, ctxA)
	if !fired || after < 8*before {
		t.Fatalf("interleaving did not happen: fired %v, table %d -> %d entries (migrating %v)", fired, before, after, migrating)
	}
	if got := rankTiers(t, hits, "a", 0); got.Device != 100*16 {
		t.Fatalf("walk lost blocks when its table was released: %+v", got)
	}
}

// TestIdleWriterFinishesMigration: a context that stops receiving requests in the middle
// of a migration finishes it on its own (and gives the old table's memory back).
func TestIdleWriterFinishesMigration(t *testing.T) {
	a := Slot{"a", 0}
	var e *Engine
	migratingAfterStep := false
	h := &testHooks{step: func(begin bool) {
		if !begin && e != nil { // on the writer goroutine, which owns c.tab
			migratingAfterStep = e.lookup(ctxA).tab.prev.Load() != nil
		}
	}}
	e, _ = hookedEngineWith(t, Config{MaxBlocksPerContext: -1}, h, a)
	keys := make([]uint64, 1<<13)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	// One request stores enough blocks to leave a migration running at its end (the
	// table fills at 6656 entries; moving them takes longer than the 1536 inserts left).
	mustApply(t, e, ctxA, store(a, TierDevice, keys...))
	if !migratingAfterStep {
		t.Fatal("no migration was running after the request")
	}
	c := e.lookup(ctxA)
	for i := 0; c.state.Load().tab.prev.Load() != nil; i++ {
		if i == 10_000_000 {
			t.Fatal("idle writer did not finish the migration")
		}
		runtime.Gosched()
	}
	if got := rankTiers(t, qk(t, e, ctxA, keys, ""), "a", 0).Device; got != int64(len(keys))*16 {
		t.Fatalf("after the idle migration the walk found %d blocks", got/16)
	}
}

// TestReadersDuringGrowthNeverMiss: readers walk a stored prompt over and over while one
// writer grows the context through many migrations: every answer must cover the whole
// prompt, since its blocks never change. Bounded (12K blocks, a few migrations).
func TestReadersDuringGrowthNeverMiss(t *testing.T) {
	a := Slot{"a", 0}
	e := setup(t, Config{MaxBlocksPerContext: -1}, a)
	prompt := make([]uint64, 256)
	for i := range prompt {
		prompt[i] = benchKey(i)
	}
	mustApply(t, e, ctxA, store(a, TierDevice, prompt...))
	const readers, n, batch = 2, 12_288, 64
	var stop atomic.Bool
	var wg sync.WaitGroup
	var answers atomic.Int64
	var up sync.WaitGroup
	up.Add(readers)
	for r := 0; r < readers; r++ {
		wg.Go(func() {
			var res Result
			first := true
			defer func() {
				if first {
					up.Done()
				}
			}()
			for !stop.Load() {
				if err := e.QueryKeys(ctxA, prompt, len(prompt)*16, "a", &res); err != nil {
					t.Error(err)
					return
				}
				if len(res.Instances) != 1 || res.Instances[0].Device != int64(len(prompt))*16 {
					t.Errorf("answer during growth: %s", formatHits(res.Instances))
					return
				}
				answers.Add(1)
				if first {
					first = false
					up.Done()
				}
			}
		})
	}
	up.Wait()
	hs := make([]uint64, batch)
	for done := 0; done < n && !t.Failed(); done += batch {
		for j := range hs {
			hs[j] = benchKey(1<<30 + done + j)
		}
		mustApply(t, e, ctxA, store(a, TierDisk, hs...))
	}
	stop.Store(true)
	wg.Wait()
	if answers.Load() == 0 {
		t.Fatal("no answers")
	}
}

// TestPrefaultPacedOverInserts: the table the next migration fills is written ahead, page
// by page (prepareNext), spread over the inserts that fill the current table from 11/16 to
// 13/16: a step of 64 inserts writes a few pages, not one per insert (64 page faults in
// one step), and every page is written before the migration takes the
// table (else the migration faults them, hundreds per step). Stepped writer.
func TestPrefaultPacedOverInserts(t *testing.T) {
	a := Slot{"a", 0}
	hooks := &testHooks{noIdleMigration: true}
	e, _ := hookedEngineWith(t, Config{MaxBlocksPerContext: -1}, hooks, a)
	c := e.lookup(ctxA)
	maxFaulted := maxStepGrowth(hooks, func() int { return c.nextFaulted })
	const n, batch = 1 << 15, 64 // tables of up to 64K entries (128 pages)
	keys := make([]uint64, batch)
	for done := 0; done < n; done += batch {
		for j := range keys {
			keys[j] = benchKey(done + j)
		}
		mustApply(t, e, ctxA, store(a, TierDevice, keys...))
	}
	var migrations, unfaulted int
	onWriter(t, e, ctxA, func(c *cacheContext) { migrations, unfaulted = c.migrations, c.unfaulted })
	if migrations < 8 {
		t.Fatalf("%d migrations: the test checks little", migrations)
	}
	if unfaulted != 0 {
		t.Fatalf("%d pages of prepared tables not written before their migration", unfaulted)
	}
	if maxPages := maxFaulted() / pageWords; maxPages > 8 {
		t.Fatalf("a step of %d inserts wrote %d pages of the next table", batch, maxPages)
	}
}
