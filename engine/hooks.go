package engine

// testHooks are interleaving points that tests use to stop a goroutine at an exact place
// and let the writer run; production engines have none (New never sets them), and each
// point costs one predictable nil check.
type testHooks struct {
	// beforeDo runs on the caller's goroutine before a request is handed to a context
	// writer (after the caller looked the context up).
	beforeDo func(c *cacheContext, r *request)
	// walkLoad runs on the query goroutine before the walk loads word w (recKey,
	// recMeta, recBits+...) of the record it found for block i.
	walkLoad func(i, w int)
	// step runs on the writer goroutine before (begin true) and after every writer step
	// (one request applied), for benchmarks that time steps.
	step func(begin bool)
	// noIdleMigration stops writers from migrating tables and sweeping clears between
	// requests, so that a test sees them advance only with requests.
	noIdleMigration bool
	// dropDeferred runs on the writer after a step that left a ClearShared or
	// RetractSource request waiting for its bindings to be removed (dropStep).
	dropDeferred func()
	// sweepChunk, when > 0, replaces defaultSweepChunk (records a sweep step visits).
	sweepChunk int
	// stalled runs on the writer when a request stalls waiting for a clear stamp.
	stalled func()
	// widenChunk, when > 0, replaces defaultWidenChunk (records a widening step copies).
	widenChunk int
	// widenSmall, when > 0, replaces widenSmall (the most records widened at once).
	widenSmall int
	// widening runs on the writer when a registration starts waiting for a widening.
	widening func()
	// widened runs on the writer at a widening's switch with the number of records
	// whose copy differs from the original (a full comparison: tests only).
	widened func(mismatches int)
	// now replaces the clock of write epochs (microseconds since the engine started).
	now func() uint64
	// deleting runs on the writer while it deletes the record of key: after the record
	// is marked free, before the key leaves the table.
	deleting func(key uint64)
	// memoGrew runs on the memo's grower after each request it handled, with whether the
	// memo grew.
	memoGrew func(grew bool)
	// created runs on the writer right after the record of a new key entered the table
	// (from then on a query can find it).
	created func(key uint64)
	// bindSets, when > 0, replaces maxSets (the component sets a context's bindings
	// intern before the rest keep their own lists).
	bindSets int
}

func (e *Engine) walkHook() func(int, int) {
	if e.hooks == nil {
		return nil
	}
	return e.hooks.walkLoad
}
