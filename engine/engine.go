// Package engine is the KV-cache prefix index: contexts keyed by (tenant, model, LoRA,
// block size), the engine slots registered in each, the per-context prefix table and the
// query walk that turns a prompt into per-instance, per-rank, per-tier hit counts.
//
// Concurrency: each context has one writer goroutine that applies every mutation in order
// (registrations, engine and shared-store ops, clears, retractions). Queries never lock:
// they read an atomically published snapshot of the slot table and the prefix table, whose
// record words are read with sync/atomic.
package engine

import (
	"cmp"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/hashing"
)

// DefaultMaxBlocksPerContext is the capacity used when Config.MaxBlocksPerContext is 0.
const DefaultMaxBlocksPerContext = 10_000_000

// ContextKey identifies a cache-sharing group: blocks are comparable only within one.
type ContextKey struct {
	TenantID, ModelName, LoraName string
	BlockSize                     int64
}

// Slot is one registered engine publisher: an instance and one of its data-parallel ranks.
type Slot struct {
	InstanceID string
	DPRank     int
}

// Config configures an Engine.
type Config struct {
	// MaxBlocksPerContext bounds the blocks of one context, each shared (Mooncake)
	// binding counting as one more: every new block or binding past it evicts the
	// context's oldest-written block with all its owners and bindings (O(1) per
	// eviction). 0 means DefaultMaxBlocksPerContext; < 0 unlimited.
	MaxBlocksPerContext int
	// MaxBlocks bounds the blocks (and shared bindings) of all contexts together.
	// Past it, every new block or binding evicts the
	// engine's oldest-written block, whichever context holds it (write times compared
	// at microsecond resolution; the context that holds it evicts it on its own writer,
	// right after). 0 means no engine-wide bound.
	MaxBlocks int
	// MemoryLimitBytes bounds the memory of the index's own structures over all
	// contexts: each block is charged its record and table share (48 bytes for contexts
	// of up to 21 slots, 64 up to 64 slots, 88 up to 128) and each shared (Mooncake)
	// binding 72 bytes (its compact entry and index slots), plus 16 and its length for
	// an object key that is not 64 hex digits, and for each component past the 31 names
	// a context's bindings share at once.
	// Past it, every new block or binding evicts the engine's oldest-written block,
	// whichever context holds it, like MaxBlocks (up to two while the charge stays over
	// it). Process RSS is higher: the Go runtime, buffers, connections and the
	// slack of tables between growth steps come on top. 0 means no bound.
	MemoryLimitBytes int64
	// Logger receives eviction warnings. nil means slog.Default().
	Logger *slog.Logger
	// MemoEntries bounds the query key memo shared by every context (hashing.Memo): blocks
	// whose keys queries remember (in runs), so that a repeated prefix skips SHA-256. 0 or
	// less disables it; servers default to hashing.DefaultMemoEntries.
	MemoEntries int
	// MemoStartEntries is the memo's size at start, in blocks: 0 means
	// hashing.DefaultMemoStart. Below MemoEntries the memo grows, on a goroutine of the
	// engine's, ahead of the index once queries use it (one memo block per four indexed
	// blocks) and as queries fill it (up to two per indexed block), up to MemoEntries
	// (query_memo.go); at or above it, the memo has MemoEntries blocks from the start.
	MemoStartEntries int
	// PopulateMemo makes the memo's pages resident before queries use them, so that no
	// query pays the page faults of its first writes: each growth step's (the grower
	// populates them before the memo takes the step), or, for a memo of fixed size, all
	// of it in New (hashing.Memo.Populate). Where that fails the memo fills as before,
	// and the engine logs why.
	PopulateMemo bool
	// MemoSecondSight makes the memo remember a prompt's runs only from the second time
	// its first run is asked (hashing.Memo.SetSecondSight): a prompt asked once costs
	// what it would without a memo.
	MemoSecondSight bool

	// manualMemoGrowth (tests) starts no grower: the test answers the memo's requests
	// itself (growMemoStep), at chosen points.
	manualMemoGrowth bool
}

// Errors returned by the engine. Callers compare with errors.Is. Those of the engine and
// its contexts:
var (
	// ErrProfileConflict: a registration's profile differs from its context's profile.
	ErrProfileConflict = errors.New("registration conflicts with the context hash profile")
	// ErrUnknownContext: Apply on a context that no engine registration created.
	ErrUnknownContext = errors.New("context is not registered")
	// ErrClosed: the engine was closed.
	ErrClosed = errors.New("engine is closed")
)

// Those of one op (Op.Err):
var (
	// ErrSlotNotRegistered: an engine store for an (instance, rank) not registered in the context.
	ErrSlotNotRegistered = errors.New("engine owner instance/rank is not registered")
	// ErrBindingConflict: a shared store whose binding already exists with another hash.
	ErrBindingConflict = errors.New("object binding conflicts with an existing binding of another hash")
	// ErrBindingMismatch: a shared remove whose hash differs from the binding's hash.
	ErrBindingMismatch = errors.New("object binding hash does not match the removed hash")
	// ErrInvalidOp: an op with an unknown kind or tier.
	ErrInvalidOp = errors.New("invalid engine op")
)

// EngineTier is a tier owned by one engine slot.
type EngineTier uint8

// Engine tiers, in walk order.
const (
	TierDevice   EngineTier = iota // accelerator memory (vLLM gpu, SGLang gpu)
	TierCPULocal                   // engine host memory (SGLang cpu / cpu_pinned)
	TierDisk                       // engine-local disk (SGLang disk)
)

// TierMask selects engine tiers, bit i for EngineTier i.
type TierMask uint8

// Tier masks for OpClear.
const (
	MaskDevice   TierMask = 1 << TierDevice
	MaskCPULocal TierMask = 1 << TierCPULocal
	MaskDisk     TierMask = 1 << TierDisk
	// MaskAllEngine is what SGLang AllBlocksCleared and stale retraction clear.
	MaskAllEngine = MaskDevice | MaskCPULocal | MaskDisk
)

// SharedTier is a tier of the shared store (Mooncake), visible to every slot of a context.
type SharedTier uint8

// Shared tiers.
const (
	SharedCPU  SharedTier = iota // Mooncake cpu / cpu_pinned: cpu_share
	SharedDisk                   // Mooncake disk
)

// OpKind says what an Op does.
type OpKind uint8

// Op kinds.
const (
	OpStore        OpKind = iota // engine slot stores Hashes in Tier
	OpRemove                     // engine slot drops Hashes from Tier
	OpClear                      // engine slot drops everything in ClearTiers
	OpSharedStore                // shared binding (Source, Backend, ObjectKey, SharedTier) -> Hash
	OpSharedRemove               // drops Component of that binding; the binding goes with its last component
)

// Op is one mutation of a context. Engine ops use Slot, Tier, ClearTiers and Hashes;
// shared ops use Source, Backend, ObjectKey, Component, SharedTier and Hash.
type Op struct {
	Kind       OpKind
	Slot       Slot
	Tier       EngineTier
	ClearTiers TierMask
	Hashes     []uint64
	// Source, Backend, ObjectKey and SharedTier identify a shared binding within the
	// context. Several bindings may hold the same Hash (K/V parts, TP/PP ranks, layers):
	// the block stays shared-visible until the last of them goes.
	Source, Backend, ObjectKey string
	// Component is the physical component suffix of an SGLang HiCache key ("_0_k"), ""
	// otherwise. The binding is per logical ObjectKey and disappears with its last component.
	Component  string
	SharedTier SharedTier
	Hash       uint64
	// Err is set by Apply when this op failed; the other ops of the batch still apply.
	Err error
}

// Engine holds every context. Create it with New; all methods are safe for concurrent use.
type Engine struct {
	maxBlocks int
	maxTotal  int          // Config.MaxBlocks; 0 none
	total     atomic.Int64 // blocks of every context
	memLimit  int64        // Config.MemoryLimitBytes; 0 none
	bytes     atomic.Int64 // memory charged for the blocks and bindings of every context
	debts     atomic.Int64 // blocks contexts were asked to evict and have not yet (evictForBudget)
	start     time.Time    // epochs are microseconds since start
	log       *slog.Logger
	memo      *hashing.Memo // nil: no memo
	memoQuit  chan struct{} // closed by Close: stops growMemo
	// memoAheadAt is the indexed blocks (total) past which a query asks the grower to
	// grow the memo ahead of the index (query_memo.go).
	memoAheadAt atomic.Int64

	// ctxs is an immutable map replaced (copy on write) when a context is created, so
	// queries look contexts up without locking.
	ctxs atomic.Pointer[map[ContextKey]*cacheContext]

	mu     sync.Mutex // serialises context creation and Close
	closed bool
	wg     sync.WaitGroup

	// reqFree recycles requests so that Apply allocates nothing; a channel rather than a
	// sync.Pool, which the garbage collector empties.
	reqFree chan *request

	hooks *testHooks // nil outside tests
}

// New returns an empty engine.
func New(cfg Config) *Engine {
	e := &Engine{maxBlocks: cfg.MaxBlocksPerContext, maxTotal: max(cfg.MaxBlocks, 0), memLimit: max(cfg.MemoryLimitBytes, 0),
		log: cfg.Logger, start: time.Now()}
	if e.maxBlocks == 0 {
		e.maxBlocks = DefaultMaxBlocksPerContext
	}
	if e.maxBlocks < 0 {
		e.maxBlocks = 0 // unlimited
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.newMemo(cfg)
	m := map[ContextKey]*cacheContext{}
	e.ctxs.Store(&m)
	e.reqFree = make(chan *request, 64)
	return e
}

// Close stops every context writer and waits for them. Later mutations return ErrClosed;
// queries keep answering from the last state. Idempotent.
func (e *Engine) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	for _, c := range *e.ctxs.Load() {
		close(c.quit)
	}
	if e.memoQuit != nil {
		close(e.memoQuit)
	}
	e.mu.Unlock()
	e.wg.Wait()
}

func (e *Engine) lookup(key ContextKey) *cacheContext {
	return (*e.ctxs.Load())[key]
}

// getOrCreate returns the context of key, creating it with profile p if it does not exist.
func (e *Engine) getOrCreate(key ContextKey, p hashing.Profile) (*cacheContext, error) {
	if c := e.lookup(key); c != nil {
		return c, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	old := *e.ctxs.Load()
	if c := old[key]; c != nil {
		return c, nil
	}
	c := newContext(e, key, p)
	m := make(map[ContextKey]*cacheContext, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[key] = c
	e.ctxs.Store(&m)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		c.run()
	}()
	return c, nil
}

// RegisterSlot registers slot in the context of key, creating the context with profile p
// on first use. isNew is false for a repeated registration. A profile that is not Equal
// to the context's gives ErrProfileConflict and changes nothing.
func (e *Engine) RegisterSlot(key ContextKey, p hashing.Profile, slot Slot) (isNew bool, err error) {
	for {
		c, err := e.getOrCreate(key, p)
		if err != nil {
			return false, err
		}
		if !c.profile.Equal(p) {
			return false, ErrProfileConflict
		}
		r := e.getReq()
		r.kind = reqRegister
		r.slot = slot
		err = c.do(r)
		isNew, dropped := r.isNew, r.dropped || err == errDropped
		e.putReq(r)
		if !dropped {
			return isNew, err
		}
		// DropEmptyContext removed the context meanwhile: create it anew.
	}
}

// DropEmptyContext removes the context of key if it holds no slot, no block and no shared
// binding, and reports whether it did. It lets a registration that created a context and
// then failed (its subscriber could not start) leave nothing behind, not even the hash
// profile the context would otherwise pin until restart.
func (e *Engine) DropEmptyContext(key ContextKey) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	old := *e.ctxs.Load()
	c := old[key]
	if c == nil {
		return false
	}
	r := e.getReq()
	r.kind = reqDropIfEmpty
	err := c.do(r)
	dropped := err == nil && r.dropped
	e.putReq(r)
	if !dropped {
		return false
	}
	m := make(map[ContextKey]*cacheContext, len(old))
	for k, v := range old {
		if k != key {
			m[k] = v
		}
	}
	e.ctxs.Store(&m)
	c.gone.Store(true)
	close(c.quit)
	return true
}

// CheckProfile reports whether a registration with profile p may bind to the context of
// key (Mooncake registrations, which create no context): nil when the context is unknown
// or its profile is Equal to p, ErrProfileConflict otherwise.
func (e *Engine) CheckProfile(key ContextKey, p hashing.Profile) error {
	c := e.lookup(key)
	if c == nil || c.profile.Equal(p) {
		return nil
	}
	return ErrProfileConflict
}

// UnregisterSlot removes slot from the context and drops its entries in every engine
// tier; shared bindings stay. Unknown contexts or slots are a no-op.
func (e *Engine) UnregisterSlot(key ContextKey, slot Slot) {
	c := e.lookup(key)
	if c == nil {
		return
	}
	r := e.getReq()
	r.kind = reqUnregister
	r.slot = slot
	_ = c.do(r) // only ErrClosed is possible, and then there is nothing left to do
	e.putReq(r)
}

// ContextProfile returns the hash profile of the context of key.
func (e *Engine) ContextProfile(key ContextKey) (hashing.Profile, bool) {
	c := e.lookup(key)
	if c == nil {
		return hashing.Profile{}, false
	}
	return c.profile, true
}

// Apply hands ops to the context writer and returns once they are applied, so the caller
// may reuse the Hashes buffers afterwards. Per-op failures are reported in ops[i].Err and do
// not stop the batch. The error is ErrUnknownContext or ErrClosed. A context replaced
// (Stage.Commit) before the ops reached its writer hands them to its successor.
func (e *Engine) Apply(key ContextKey, ops []Op) error {
	c := e.lookup(key)
	for {
		if c == nil {
			return ErrUnknownContext
		}
		r := e.getReq()
		r.kind = reqApply
		r.ops = ops
		err := c.do(r)
		dropped := r.dropped
		e.putReq(r)
		if !dropped && err != errDropped {
			return err
		}
		next := e.lookup(key)
		if next == c {
			return ErrUnknownContext
		}
		c = next
	}
}

// ClearShared removes every shared binding of source and backend in every context of
// tenantID, in both shared tiers (Mooncake `cleared`). It returns once all are applied.
// Each context detaches the bindings at once (stores and removes that follow are not
// affected by the clear) and removes them a bounded number per writer step, applying
// other requests in between; queries see them go over those steps.
func (e *Engine) ClearShared(source, backend, tenantID string) {
	for _, c := range e.sortedContexts() {
		if c.key.TenantID != tenantID {
			continue
		}
		r := e.getReq()
		r.kind = reqClearShared
		r.source, r.backend = source, backend
		_ = c.do(r) // only ErrClosed, when nothing can change any more
		e.putReq(r)
	}
}

// RetractSource removes every shared binding whose Source is source, in every context
// (a Mooncake source gone stale). It returns once all are applied.
func (e *Engine) RetractSource(source string) {
	for _, c := range e.sortedContexts() {
		r := e.getReq()
		r.kind = reqRetractSource
		r.source = source
		_ = c.do(r)
		e.putReq(r)
	}
}

func (e *Engine) sortedContexts() []*cacheContext {
	m := *e.ctxs.Load()
	out := make([]*cacheContext, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *cacheContext) int { return compareKeys(a.key, b.key) })
	return out
}

func compareKeys(a, b ContextKey) int {
	if c := cmp.Compare(a.TenantID, b.TenantID); c != 0 {
		return c
	}
	if c := cmp.Compare(a.ModelName, b.ModelName); c != 0 {
		return c
	}
	if c := cmp.Compare(a.LoraName, b.LoraName); c != 0 {
		return c
	}
	return cmp.Compare(a.BlockSize, b.BlockSize)
}

func (e *Engine) getReq() *request {
	select {
	case r := <-e.reqFree:
		return r
	default:
		return &request{done: make(chan struct{}, 1)}
	}
}

func (e *Engine) putReq(r *request) {
	done := r.done
	*r = request{done: done}
	select {
	case e.reqFree <- r:
	default:
	}
}

// InstanceRanks lists the registered ranks of one instance, ascending.
type InstanceRanks struct {
	InstanceID string
	Ranks      []int
}

// ContextView describes one context for /global_view.
type ContextView struct {
	Key     ContextKey
	Profile hashing.Profile
	// PrefixCount is the number of distinct block keys with at least one owner; a block
	// a query can find is already counted (also while the writer is still applying the
	// rest of its request), so a reader that sees the last block of a burst reads a count
	// that holds the whole burst. Right
	// after a slot clear or an unregistration it also counts, until the writer's sweep
	// (a few hundred records per step) reaches them, blocks whose only owner was
	// cleared; queries never report those.
	PrefixCount uint64
	// Instances are the registered engine slots, sorted by InstanceID (Mooncake
	// registrations hold no slot and never appear).
	Instances []InstanceRanks
}

// GlobalView returns every context sorted by (tenant, model, lora, block size).
func (e *Engine) GlobalView() []ContextView {
	cs := e.sortedContexts()
	out := make([]ContextView, 0, len(cs))
	for _, c := range cs {
		st := c.state.Load().slots
		cv := ContextView{
			Key:         c.key,
			Profile:     c.profile,
			PrefixCount: uint64(c.blocks.Load()),
			Instances:   make([]InstanceRanks, 0, len(st.insts)),
		}
		for _, in := range st.insts {
			ir := InstanceRanks{InstanceID: in.id, Ranks: make([]int, len(in.ranks))}
			for i, rs := range in.ranks {
				ir.Ranks[i] = rs.rank
			}
			cv.Instances = append(cv.Instances, ir)
		}
		out = append(out, cv)
	}
	return out
}

// TotalBlocks returns the blocks of all contexts together (what Config.MaxBlocks bounds).
func (e *Engine) TotalBlocks() int64 { return e.total.Load() }

// IndexBytes returns the memory charged for every block and binding (what
// Config.MemoryLimitBytes bounds).
func (e *Engine) IndexBytes() int64 { return e.bytes.Load() }

// ContextStats are the figures of one context exported as metrics.
type ContextStats struct {
	Blocks, Slots            int
	Evictions, EvictedBlocks uint64
}

// Stats returns the figures of the context of key.
func (e *Engine) Stats(key ContextKey) (ContextStats, bool) {
	c := e.lookup(key)
	if c == nil {
		return ContextStats{}, false
	}
	return ContextStats{
		Blocks:        int(c.blocks.Load()),
		Slots:         c.state.Load().slots.count,
		Evictions:     c.evictions.Load(),
		EvictedBlocks: c.evictedBlocks.Load(),
	}, true
}

// MemoStats returns the query key memo's counters (all zero without a memo).
func (e *Engine) MemoStats() hashing.MemoStats { return e.memo.Stats() }
