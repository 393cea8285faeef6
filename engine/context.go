package engine

import (
	"errors"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/arena"
	"github.com/conductor-go/conductor/hashing"
)

// view is what a query reads: the slot table and the prefix table, published together so
// that slot numbers always fit the record width.
type view struct {
	slots *slotTable
	tab   *table
	// clr, when not nil, lists slot clears not yet applied to every record: a reader
	// masks every record it accepts with clr.apply (see clear.go).
	clr *clearSet
}

// slotTable is an immutable snapshot of the registered slots of a context.
type slotTable struct {
	insts []instSlots    // sorted by id
	byID  map[string]int // index into insts
	all   []uint64       // bitset of every registered slot, maskWords(tab.w) words
	count int            // registered slots
	// reuse is the context's slotReuse when this table was built: a query that finds
	// slotReuse changed after its walk may have read bits of a slot number that now
	// belongs to another registration, and walks again with the current table.
	reuse uint64
}

type instSlots struct {
	id    string
	ranks []rankSlot // ascending rank
	mask  []uint64   // bitset of this instance's slots, maskWords(tab.w) words
}

type rankSlot struct {
	rank int
	slot int
}

type reqKind uint8

const (
	reqApply reqKind = iota
	reqRegister
	reqUnregister
	reqClearShared
	reqRetractSource
	reqDropIfEmpty
	reqRetire // the context was replaced (stage.go): give back its charges and memory
	reqSync   // runs fn on the writer goroutine (snapshot steps, test hooks)
)

// request is one unit of work for a context writer; pooled so that Apply allocates nothing.
type request struct {
	kind            reqKind
	ops             []Op
	slot            Slot
	source, backend string
	fn              func(*cacheContext)
	isNew           bool
	// deferred: the writer hands the request back later (a shared drop, see dropShared).
	deferred bool
	// dropped reports that the context was dropped (reqDropIfEmpty) before this request:
	// nothing was done, and the caller looks the context up again.
	dropped bool
	// closed: the engine closed while the request waited on its writer (a clear waiting
	// for a stamp, a registration waiting for a widening): not (wholly) applied.
	closed bool
	// next is the first op of a reqApply not applied yet (a request stalled on a clear,
	// see cacheContext.stalled).
	next int
	// slotNum is the slot number reserved by a registration waiting for a widening.
	slotNum int
	done    chan struct{}
}

// cacheContext is one context (one cache-sharing group, named by a ContextKey) with its
// writer goroutine. (Not "context": that would shadow the standard package.)
type cacheContext struct {
	eng     *Engine
	key     ContextKey
	profile hashing.Profile
	// hintOwner names this context's records in the key memo's record hints
	// (hashing.Chain.SetHintOwner): a hash of its key, so that a context made again under
	// the same key (its records in a new arena) takes its old hints back and corrects
	// them, while other contexts sharing memo runs leave them alone.
	hintOwner uint32

	state atomic.Pointer[view]
	reqs  chan *request
	quit  chan struct{}

	blocks                   atomic.Int64
	evictions, evictedBlocks atomic.Uint64
	// slotReuse counts registrations that took a slot number freed by an unregistration,
	// and widening switches (widen.go: a query that walked the old arena, which the
	// writer stops updating and then releases, walks again with the new view).
	// It is bumped before the slot table naming the new owner is published, hence before
	// any bit of the new owner is stored.
	slotReuse atomic.Uint64
	// gone is set by DropEmptyContext before it closes quit, so that do tells a dropped
	// context (the caller looks the context up again) from a closed engine.
	gone atomic.Bool
	// Engine-wide budget (Config.MaxBlocks, MemoryLimitBytes; unused without one):
	// oldestAt is the write epoch of this context's oldest block (MaxUint64 when empty),
	// published after every step; debt is how many of its oldest blocks other contexts
	// asked it to evict, and wake tells its writer so.
	oldestAt atomic.Uint64
	debt     atomic.Int64
	wake     chan struct{}

	// Everything below is owned by the writer goroutine.
	tab        *table
	slots      map[Slot]int // registered slot -> slot number
	slotUsed   []bool       // slot number in use
	slotCounts [][3]int     // per slot number, per engine tier: blocks owning the bit
	// bs holds the shared bindings (bindings.go); nil while there are none.
	bs *bindStore
	// dropWaiters are the ClearShared / RetractSource requests whose bindings dropStep
	// is still removing (from binding index dropPos on).
	dropWaiters []*request
	dropPos     uint32
	epoch       uint64 // last write epoch handed out (microseconds since the engine started)
	now         uint64 // the current request's time, microseconds since the engine started
	// oldest and newest end the write-order list (record index + 1, 0 when empty).
	oldest, newest uint32
	// next is the table the next migration will fill, prepared ahead (prepareNext):
	// unpublished, its first nextFaulted entries' pages already written.
	next        *table
	nextFaulted int
	faultDebt   int // prepareNext's pacing: pages owed, in units of 1/(inserts left)
	unfaulted   int // pages of prepared tables not yet written when a migration took them (tests)
	// toRelease is memory of retired tables still to give back, a chunk per step.
	toRelease     [][]uint64
	migrations    int // incremental table migrations started (tests)
	evictLogged   time.Time
	evictUnlogged int
	// Pending slot clears (clear.go): stamp is the newest clear's, clears are oldest
	// first, clr is their published mask, sweepPos the sweep's next record index.
	stamp    uint64
	clears   []pendingClear
	clr      *clearSet
	sweepPos uint32
	swept    int // records visited by sweeps (tests)
	// stalled are requests waiting for a clear stamp (every stamp is taken by a pending
	// clear, see clear.go), oldest first: an Apply resumes at ops[r.next], an
	// unregistration from the start, each once the sweep has completed a clear.
	stalled []*request
	// wide is the running widening of the records (widen.go), nil when none; widenings
	// counts those started and widenCopied the records they copied (tests).
	wide        *widening
	widenings   int
	widenCopied int
	// dropped: removed by DropEmptyContext; later requests do nothing.
	dropped bool
	// snaps, while snapshots of this context are being copied, record every change
	// applied between their steps, one journal per snapshot (see snapshot.go).
	snaps []*snapJournal
	// chargedN and chargedB are what this context has charged to the engine-wide
	// counts (charge), given back when it is retired (a staged load replaced it).
	chargedN, chargedB int64
	// budgeted: the engine has a budget (Config.MaxBlocks, MemoryLimitBytes) that reads
	// the engine-wide counts on the event path; otherwise pendTotal and pendBytes are
	// changes to them not yet published (charge, flushCharges).
	budgeted             bool
	pendTotal, pendBytes int64
}

func newContext(e *Engine, key ContextKey, p hashing.Profile) *cacheContext {
	c := &cacheContext{
		eng:       e,
		key:       key,
		profile:   p,
		hintOwner: hintOwnerOf(key),
		reqs:      make(chan *request),
		quit:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		slots:     map[Slot]int{},
		// Immutable engine settings.
		budgeted: e.maxTotal > 0 || e.memLimit > 0,
	}
	c.tab = newTable(minTableCap, arena.New(arena.Config{RecordWords: recordWords(0)}), 0, &c.state)
	c.state.Store(&view{slots: c.buildSlotTable(), tab: c.tab})
	c.oldestAt.Store(math.MaxUint64)
	return c
}

// hintOwnerOf is a nonzero 32-bit FNV-1a hash of k (two keys sharing one only share
// their memo runs' hints, which their walks check).
func hintOwnerOf(k ContextKey) uint32 {
	h := uint32(2166136261)
	for _, s := range [...]string{k.TenantID, k.ModelName, k.LoraName} {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint32(s[i])) * 16777619
		}
		h = (h ^ 0xff) * 16777619 // a separator: ("ab", "") is not ("a", "b")
	}
	for i := 0; i < 64; i += 8 {
		h = (h ^ uint32(uint64(k.BlockSize)>>i&0xff)) * 16777619
	}
	return h | 1
}

// do hands r to the writer and waits until it is done.
func (c *cacheContext) do(r *request) error {
	if h := c.eng.hooks; h != nil && h.beforeDo != nil {
		h.beforeDo(c, r)
	}
	select {
	case c.reqs <- r:
	case <-c.quit:
		if c.gone.Load() {
			return errDropped
		}
		return ErrClosed
	}
	<-r.done
	if r.closed {
		return ErrClosed
	}
	return nil
}

// errDropped: the context was dropped by DropEmptyContext before the request reached its
// writer. Callers retry on a new context (registration) or report it unknown (Apply).
var errDropped = errors.New("context was dropped")

func (c *cacheContext) run() {
	// Only an engine budget asks a writer to evict for another context (evictForBudget):
	// without one the writer does not wait on wake (a nil channel, left out of select).
	wake := c.wake
	if !c.budgeted {
		wake = nil
	}
	for {
		if !c.dropped && (c.tab.prev.Load() != nil || len(c.toRelease) > 0 || len(c.clears) > 0 || len(c.dropWaiters) > 0 || c.wide != nil) && (c.eng.hooks == nil || !c.eng.hooks.noIdleMigration) {
			// A migration or a sweep is running: between requests, move it on in
			// bounded steps, so that an idle context soon holds one table (and its
			// memory) again and its clears are applied to every record.
			select {
			case r := <-c.reqs:
				c.serve(r)
			case <-wake:
				c.payDebt()
			case <-c.quit:
				c.endWaiters()
				return
			default:
				for i := 0; i < idleMigrateSteps && c.tab.prev.Load() != nil; i++ {
					c.migrateStep()
				}
				c.backgroundSteps()
				c.flushCharges()
			}
			continue
		}
		select {
		case r := <-c.reqs:
			c.serve(r)
		case <-wake:
			c.payDebt()
		case <-c.quit:
			c.endWaiters() // closing: nothing changes any more
			return
		}
	}
}

// idleMigrateSteps is how many migration steps an idle writer takes between two looks
// at its request channel: each step moves a bounded number of entries, so a request
// that arrives meanwhile waits for at most this many.
const idleMigrateSteps = 64

// backgroundSteps advances the writer's bounded background work by one step each, after
// a request or while idle: releasing retired tables, sweeping clears, resuming stalled
// requests, deferred drops, and a widening (charges flushed before its switch hands
// registrations back).
func (c *cacheContext) backgroundSteps() {
	c.releaseStep()
	c.sweepStep()
	c.resumeStalled()
	c.dropStep()
	c.flushCharges()
	c.widenStep()
}

// serve applies one request (a writer step) and hands it back.
func (c *cacheContext) serve(r *request) {
	c.now = uint64(time.Since(c.eng.start).Microseconds())
	if h := c.eng.hooks; h != nil && h.now != nil {
		c.now = h.now()
	}
	stepHook := c.eng.hooks != nil && c.eng.hooks.step != nil
	if stepHook {
		c.eng.hooks.step(true)
	}
	c.handle(r)
	deferred := r.deferred // r may be handed back (and reused) by dropStep below
	// A retired context's memory is gone: nothing is left to move on.
	if !c.dropped {
		c.migrateStep()
		c.backgroundSteps()
	}
	if stepHook {
		c.eng.hooks.step(false)
	}
	if c.budgeted {
		c.payDebt() // debts and oldestAt serve the engine budget alone
	}
	c.blocks.Store(int64(c.tab.ar.Len()))
	if h := c.eng.hooks; h != nil && h.dropDeferred != nil && deferred && len(c.dropWaiters) > 0 {
		h.dropDeferred()
	}
	c.flushCharges()
	if !deferred {
		r.done <- struct{}{}
	}
}

func (c *cacheContext) handle(r *request) {
	if c.dropped {
		r.dropped = true
		return
	}
	switch r.kind {
	case reqApply:
		if !c.applyOps(r) {
			c.stall(r)
		}
		return // journaled by applyOps
	case reqRegister:
		if c.register(r) {
			r.deferred = true // handed back at the widening's switch
			return
		}
	case reqUnregister:
		if !c.unregister(r.slot) {
			c.stall(r)
			return // journaled (not at all, like any unregistration) when resumed
		}
	case reqClearShared:
		r.deferred = c.dropShared(r, true)
	case reqRetractSource:
		r.deferred = c.dropShared(r, false)
	case reqDropIfEmpty:
		// Without slots and bindings no record holds a visible bit: whatever records
		// remain hold only bits of unregistered slots that pending clears mask. A
		// stalled request is not done yet: the context is not empty until it is.
		// Nor is it while a registration waits for a widening.
		if len(c.slots) == 0 && c.bs == nil && len(c.stalled) == 0 && c.wide == nil {
			c.dropped = true
			r.dropped = true
			c.eng.total.Add(-int64(c.tab.ar.Len()))
			c.eng.bytes.Add(-int64(c.tab.ar.Len()) * blockBytes(c.tab.w))
			c.eng.debts.Add(-c.debt.Swap(0))
			c.release()
		}
	case reqRetire:
		c.retire()
	case reqSync:
		r.fn(c)
	}
	if r.kind != reqSync {
		for _, j := range c.snaps {
			j.record(r)
		}
	}
}

// release gives the memory of a dropped context back to the kernel. Queries still holding
// its view read zeros (empty table, empty records), which answer as misses.
func (c *cacheContext) release() {
	c.tab.dead.Store(true)
	c.tab.ar.Release()
	if c.bs != nil {
		c.bs.release()
		c.bs = nil
	}
	arena.Release(c.tab.entries)
	if p := c.tab.prev.Load(); p != nil {
		p.dead.Store(true)
		arena.Release(p.entries)
	}
	if c.next != nil {
		arena.Release(c.next.entries)
		c.next = nil
	}
	for _, w := range c.toRelease {
		arena.Release(w)
	}
	c.toRelease = nil
}

// publish makes the current slot table and prefix table visible to queries.
func (c *cacheContext) publish() {
	c.state.Store(&view{slots: c.buildSlotTable(), tab: c.tab, clr: c.clr})
}

// publishTable swaps in a rebuilt prefix table, keeping the published slot table (whose
// masks are rebuilt only when the width changes).
func (c *cacheContext) publishTable() {
	old := c.state.Load()
	if old.tab.w == c.tab.w {
		c.state.Store(&view{slots: old.slots, tab: c.tab, clr: c.clr})
		return
	}
	c.publish()
}

func (c *cacheContext) buildSlotTable() *slotTable {
	w := maskWords(c.tab.w)
	st := &slotTable{byID: make(map[string]int), all: make([]uint64, w), count: len(c.slots), reuse: c.slotReuse.Load()}
	for s, n := range c.slots {
		i, ok := st.byID[s.InstanceID]
		if !ok {
			i = len(st.insts)
			st.byID[s.InstanceID] = i
			st.insts = append(st.insts, instSlots{id: s.InstanceID, mask: make([]uint64, w)})
		}
		in := &st.insts[i]
		in.ranks = append(in.ranks, rankSlot{rank: s.DPRank, slot: n})
		in.mask[n>>6] |= 1 << (n & 63)
		st.all[n>>6] |= 1 << (n & 63)
	}
	slices.SortFunc(st.insts, func(a, b instSlots) int { return strings.Compare(a.id, b.id) })
	for i := range st.insts {
		st.byID[st.insts[i].id] = i
		slices.SortFunc(st.insts[i].ranks, func(a, b rankSlot) int { return a.rank - b.rank })
	}
	return st
}

// register registers r.slot, setting r.isNew (false: it was registered already); it
// reports whether r waits for a widening of the records (widen.go), to be handed back at
// its switch.
func (c *cacheContext) register(r *request) bool {
	s := r.slot
	if c.registered(s) {
		r.isNew = false
		return false
	}
	if c.wide != nil && c.wide.waitingFor(s) != nil {
		r.isNew = false
		c.wide.waiters = append(c.wide.waiters, r)
		return true
	}
	r.isNew = true
	n := slices.Index(c.slotUsed, false)
	if n >= 0 {
		// A query may still hold a slot table that maps n to its previous owner.
		c.slotReuse.Add(1)
	} else {
		n = len(c.slotUsed)
		c.slotUsed = append(c.slotUsed, true)
		c.slotCounts = append(c.slotCounts, [3]int{})
	}
	c.slotUsed[n] = true
	if need := widthFor(n); need > c.tab.w {
		if c.registerWide(r, n, need) {
			return true
		}
	} else {
		c.slots[s] = n
	}
	c.publish()
	return false
}

// unregister removes s; it reports false, changing nothing, when the clear of its bits must
// wait for a stamp (the caller stalls the request).
func (c *cacheContext) unregister(s Slot) bool {
	n, ok := c.slots[s]
	if !ok {
		return true
	}
	if !c.stampFor(n, MaskAllEngine) {
		return false
	}
	delete(c.slots, s)
	// The view that stops reporting the slot also masks its bits (clearSlot publishes).
	c.publish()
	c.clearSlot(n, MaskAllEngine)
	// The number can be handed out again at once: records not yet swept hold its old
	// bits under stamps older than this clear, which every view masks; records a new
	// owner writes are cleaned first. Queries holding an older slot table see
	// slotReuse change (see Engine.query).
	c.slotUsed[n] = false
	c.maybeShrink()
	return true
}
