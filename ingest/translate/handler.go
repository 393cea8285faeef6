// Package translate turns the decoded KV-event batches of one registered source into
// engine operations and applies them: the vLLM, SGLang and Mooncake master rules of
// reference notes §5.2–5.4 (block size, LoRA, cache group, medium to tier, Mooncake
// object keys and contexts), retraction when the source goes stale or its publisher
// restarts. An engine source may feed several contexts, one per LoRA adapter, each
// event going to the context of its lora_name; each context's profile is checked
// against the hashes its engine publishes (hashing.ProfileCheck). It has no socket:
// ingest's subscriber hands it ordered payloads through the ingest.Handler interface,
// which EventHandler implements.
package translate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/objectkey"
	"github.com/conductor-go/conductor/wire/publisher"
)

// Source is the registered service whose events an EventHandler applies.
type Source struct {
	// Name is the service key, for logs.
	Name string
	Kind publisher.Kind
	// Endpoint identifies the source's contributions (Mooncake bindings are keyed by it).
	Endpoint string
	// Context is the registration's context. Engine events whose lora_name is its
	// LoraName go there; AddContext adds the contexts of other adapters of the same
	// engine. Mooncake events carry their own context, which must exist with Profile.
	Context engine.ContextKey
	// Slot is the engine registration's (instance, rank); unused for Mooncake.
	Slot    engine.Slot
	Profile hashing.Profile
	// Media is what an engine source indexes (a registration's index_media, see
	// ParseIndexMedia); the zero value is the contract's default.
	Media MediaSet
	// Check configures the profile self-check of engine sources (zero: the defaults);
	// CheckOff turns it off.
	Check    hashing.CheckConfig
	CheckOff bool
	// CheckLogInterval is the least time between two mismatch warnings of one context
	// (0: DefaultCheckLogInterval).
	CheckLogInterval time.Duration
	// Adapters are more contexts of an engine source from the start, as AddContext adds
	// them (a multi-LoRA registration restored whole): routed before the first batch.
	Adapters []AdapterContext
	// BeforeApply, in tests, runs when routed ops of vLLM or SGLang batches are about to
	// be applied (Flush), their contexts chosen: the point where registration changes
	// can interleave with a batch in flight.
	BeforeApply func()
}

// AdapterContext is one more context of a multi-LoRA engine source: the context of its
// lora_name and that context's profile.
type AdapterContext struct {
	Key     engine.ContextKey
	Profile hashing.Profile
}

// DefaultCheckLogInterval is how often, at most, a context whose profile does not match
// its engine's hashes is logged.
const DefaultCheckLogInterval = time.Minute

// HandlerStats are an EventHandler's counters, read atomically.
type HandlerStats struct {
	Batches        uint64 // payloads handed to the handler
	BatchesDropped uint64 // envelope failures: the whole payload was dropped
	EventsApplied  uint64 // events that reached the index (including idempotent no-ops)
	EventsRejected uint64 // events skipped as invalid (decoding or a field rule)
	EventsIgnored  uint64 // events valid but not indexed (a medium the source does not index)
	BlocksApplied  uint64 // block hashes stored or removed
	// BurstBatches counts the batches handed over through HandleBatchDeferred (the
	// subscriber's burst path); BurstFlushes the context-writer requests that applied
	// the deferred ops of one or more of them. Their ratio is the mean burst size.
	BurstBatches uint64
	BurstFlushes uint64
	// EventsMapForm and EventsArrayForm count decoded engine events by encoding: tagged
	// maps, and tagged positional arrays (vLLM <= 0.23, SGLang <= 0.5.19).
	EventsMapForm, EventsArrayForm uint64
	// HashVerified, HashMismatched and HashUnverifiable sum the self-check of every
	// context (CheckStats has each one's): events verified, those whose hashes the
	// registered profile does not reproduce, and events of checked batches that could
	// not be verified.
	HashVerified, HashMismatched, HashUnverifiable uint64
}

// route is one context an engine source feeds: the context of one lora_name.
type route struct {
	key   engine.ContextKey
	check *hashing.ProfileCheck // nil: no self-check
	// unmarked: an SGLang adapter context without lora_path, registered as earlier
	// releases registered one: alone on its source, it takes the stores that name no
	// adapter (SGLang <= 0.5.21 never names one), as it did before multi-LoRA routing.
	unmarked bool
	// lastLog is when this context's last mismatch warning was logged (stream goroutine).
	lastLog time.Time
}

// routes are an engine source's contexts by lora name, replaced whole (copy on write)
// by AddContext and RemoveContext while the stream goroutine reads them.
type routes struct {
	byLora map[string]*route
	list   []*route // in the order they were added
}

// EventHandler decodes the batches of one source and applies them, in order, through the
// context writers of the engine. It implements ingest.Handler; one subscriber goroutine
// drives it.
type EventHandler struct {
	src Source
	eng *engine.Engine
	log *slog.Logger
	dec kvevent.Decoder
	ops []engine.Op
	// opRoutes[i] is the context of ops[i]; opDup[i] marks a copy of the previous op for
	// another context (a removal or clear goes to every context), not counted again.
	opRoutes []*route
	opDup    []bool
	// The engine ops of a burst of batches wait here until Flush (burst.go).
	burst burstBuf

	// routes of an engine source; mu serialises their writers.
	routes atomic.Pointer[routes]
	mu     sync.Mutex
	// checked: the current batch is one the self-check of some context verifies.
	checked bool
	logGap  time.Duration

	// Mooncake: the context of the pending ops, and a one-entry cache of the last
	// event context so a steady stream does not build key strings per event.
	opsKey     engine.ContextKey
	ctxScratch []byte
	lastCtxRaw []byte
	lastCtx    engine.ContextKey
	// lastBackend: a master stream names one backend over and over; reusing its string
	// saves an allocation per event.
	lastBackend string

	batches, batchesDropped, applied, rejected, ignored, blocks atomic.Uint64
	burstBatches, burstFlushes                                  atomic.Uint64
	mapForm, arrayForm                                          atomic.Uint64
}

// NewEventHandler builds the handler of one registered source. An engine source starts
// with one context, src.Context.
func NewEventHandler(src Source, eng *engine.Engine, log *slog.Logger) *EventHandler {
	if log == nil {
		log = slog.Default()
	}
	h := &EventHandler{src: src, eng: eng, log: log.With("service", src.Name), logGap: src.CheckLogInterval}
	if h.logGap <= 0 {
		h.logGap = DefaultCheckLogInterval
	}
	// No index rule reads token ids (blocks are indexed by the hashes the engine sent);
	// they are still checked, so a batch is accepted or rejected as when they are read.
	// Batches the self-check verifies decode them (HandleBatchDeferred).
	h.dec.SkipTokenIDs = true
	rs := &routes{byLora: map[string]*route{}}
	h.routes.Store(rs)
	if src.Kind != publisher.Mooncake {
		r := h.newRoute(src.Context, src.Profile)
		rs.byLora[src.Context.LoraName] = r
		rs.list = []*route{r}
		for _, a := range src.Adapters {
			if err := h.AddContext(a.Key, a.Profile); err != nil {
				h.log.Error("adapter context not routed", "lora_name", a.Key.LoraName, "err", err)
			}
		}
	}
	return h
}

func (h *EventHandler) newRoute(key engine.ContextKey, p hashing.Profile) *route {
	r := &route{key: key, unmarked: h.src.Kind == publisher.SGLang && key.LoraName != "" && p.LoraPath == ""}
	if !h.src.CheckOff {
		r.check = hashing.NewProfileCheck(p, int(key.BlockSize), key.LoraName, h.src.Check)
	}
	return r
}

// ErrContext is the refusal of AddContext.
var ErrContext = errors.New("context cannot be added to this source")

// AddContext makes the events whose lora_name is key.LoraName go to key, with p its
// profile for the self-check: a multi-LoRA engine publishes the blocks of every adapter
// on one stream, and each adapter is registered as its own context. key must differ
// from the source's context in its LoraName alone, and that name must not have a
// context yet. Safe to call while the stream is handled; the service registers the
// source's slot in the context first.
func (h *EventHandler) AddContext(key engine.ContextKey, p hashing.Profile) error {
	if h.src.Kind == publisher.Mooncake {
		return fmt.Errorf("%w: Mooncake events name their own contexts", ErrContext)
	}
	base := h.src.Context
	if key.TenantID != base.TenantID || key.ModelName != base.ModelName || key.BlockSize != base.BlockSize {
		return fmt.Errorf("%w: %s/%s/%d is not the source's tenant, model and block size %s/%s/%d",
			ErrContext, key.TenantID, key.ModelName, key.BlockSize, base.TenantID, base.ModelName, base.BlockSize)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.routes.Load()
	if _, dup := old.byLora[key.LoraName]; dup {
		return fmt.Errorf("%w: lora_name %q already has a context", ErrContext, key.LoraName)
	}
	rs := &routes{byLora: make(map[string]*route, len(old.byLora)+1), list: append([]*route(nil), old.list...)}
	for k, v := range old.byLora {
		rs.byLora[k] = v
	}
	r := h.newRoute(key, p)
	rs.byLora[key.LoraName] = r
	rs.list = append(rs.list, r)
	h.routes.Store(rs)
	return nil
}

// RemoveContext stops routing the events of loraName (unregistering one adapter of a
// multi-LoRA engine leaves the others); its events are then rejected as of an
// unregistered adapter. It reports whether there was such a context. What the context
// holds is the service's to retract (its slot's unregistration).
func (h *EventHandler) RemoveContext(loraName string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.routes.Load()
	if _, ok := old.byLora[loraName]; !ok {
		return false
	}
	rs := &routes{byLora: make(map[string]*route, len(old.byLora))}
	for _, r := range old.list {
		if r.key.LoraName != loraName {
			rs.byLora[r.key.LoraName] = r
			rs.list = append(rs.list, r)
		}
	}
	h.routes.Store(rs)
	return true
}

// Contexts returns the contexts the source feeds, in the order they were added.
func (h *EventHandler) Contexts() []engine.ContextKey {
	rs := h.routes.Load()
	out := make([]engine.ContextKey, len(rs.list))
	for i, r := range rs.list {
		out[i] = r.key
	}
	return out
}

// CheckStats returns the self-check of the context of loraName (false: no such context,
// or the check is off). Its String is the hash_check a view shows.
func (h *EventHandler) CheckStats(loraName string) (hashing.CheckStats, bool) {
	r, ok := h.routes.Load().byLora[loraName]
	if !ok || r.check == nil {
		return hashing.CheckStats{}, false
	}
	return r.check.Stats(), true
}

// Stats returns the handler's counters.
func (h *EventHandler) Stats() HandlerStats {
	st := HandlerStats{
		Batches: h.batches.Load(), BatchesDropped: h.batchesDropped.Load(),
		EventsApplied: h.applied.Load(), EventsRejected: h.rejected.Load(),
		EventsIgnored: h.ignored.Load(), BlocksApplied: h.blocks.Load(),
		BurstBatches: h.burstBatches.Load(), BurstFlushes: h.burstFlushes.Load(),
		EventsMapForm: h.mapForm.Load(), EventsArrayForm: h.arrayForm.Load(),
	}
	for _, r := range h.routes.Load().list {
		if r.check != nil {
			cs := r.check.Stats()
			st.HashVerified += cs.Verified
			st.HashMismatched += cs.Mismatched
			st.HashUnverifiable += cs.Unverifiable
		}
	}
	return st
}

// ErrDPRankConflict is the batch-level rejection of a batch whose dp_rank is not the
// registered one: the source is marked stale.
var ErrDPRankConflict = errors.New("batch data_parallel_rank conflicts with trusted registration")

// HandleBatch decodes and applies one payload. A malformed envelope drops the payload
// (logged, counted; not stale, as upstream). A dp_rank conflict is returned: the
// subscriber marks the source stale. Invalid events are skipped; the rest apply in order.
func (h *EventHandler) HandleBatch(seq uint64, payload []byte) error {
	err := h.handleBatch(seq, payload, false)
	h.Flush()
	return err
}

// HandleBatchDeferred is HandleBatch, except that the engine ops of a vLLM or SGLang
// batch may wait, in order, for Flush (or for the next batch that cannot wait), so that
// the batches of a burst reach the context writer in one request. It implements
// ingest.BurstHandler.
func (h *EventHandler) HandleBatchDeferred(seq uint64, payload []byte) error {
	h.burstBatches.Add(1)
	return h.handleBatch(seq, payload, true)
}

// handleBatch decodes one payload; the ops of a vLLM or SGLang batch wait for Flush
// (deferred: they are part of a burst).
func (h *EventHandler) handleBatch(seq uint64, payload []byte, deferred bool) error {
	h.batches.Add(1)
	var rs *routes
	if h.src.Kind != publisher.Mooncake {
		rs = h.routes.Load()
		h.checked = false
		for _, r := range rs.list {
			if r.check != nil && r.check.BeginBatch() {
				h.checked = true
			}
		}
		// The self-check needs the token ids; other batches only scan them.
		h.dec.SkipTokenIDs = !h.checked
	}
	b, err := h.dec.Decode(h.src.Kind, payload)
	if err != nil {
		h.batchesDropped.Add(1)
		h.log.Warn("kv event batch dropped", "seq", seq, "err", err)
		return nil
	}
	h.mapForm.Add(uint64(b.MapEvents))
	h.arrayForm.Add(uint64(b.ArrayEvents))
	if h.src.Kind == publisher.Mooncake {
		h.Flush()
		h.handleMooncake(seq, b)
		return nil
	}
	if b.HasDPRank && b.DPRank != int64(h.src.Slot.DPRank) {
		return fmt.Errorf("%w: batch dp_rank %d, registered %d", ErrDPRankConflict, b.DPRank, h.src.Slot.DPRank)
	}
	first := len(h.ops)
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Err != nil {
			h.reject(seq, ev.Err)
			continue
		}
		op, ok, rerr := h.engineOp(ev)
		if rerr != nil {
			h.reject(seq, fmt.Errorf("event %d (%s): %w", i, ev.Type, rerr))
			continue
		}
		if ev.Type != kvevent.EventBlockStored {
			// Removals and clears name no adapter: every context of the engine gets them
			// (a hash only one of them holds is a no-op in the others).
			if !ok {
				h.ignored.Add(1)
				continue
			}
			for j, r := range rs.list {
				h.addOp(op, r, j > 0)
			}
			continue
		}
		r := rs.byLora[string(ev.LoraName.Bytes)]
		if r == nil && len(ev.LoraName.Bytes) == 0 && len(rs.list) == 1 && rs.list[0].unmarked {
			// An SGLang source registered for one adapter alone, without lora_path: its
			// unnamed pages are that registration's, as before issue 25. A store naming
			// another adapter is still refused (SGLang >= 0.5.22 names them).
			r = rs.list[0]
		}
		if r == nil {
			h.reject(seq, fmt.Errorf("event %d (%s): %w %q", i, ev.Type, errLoraName, ev.LoraName.Bytes))
			continue
		}
		if h.checked && r.check != nil {
			h.check(seq, r, ev)
		}
		if !ok {
			h.ignored.Add(1)
			continue
		}
		h.addOp(op, r, false)
	}
	h.deferOps(seq, first, deferred)
	return nil
}

// addOp queues op for r's context; dup marks a copy of the previous op (not counted).
func (h *EventHandler) addOp(op engine.Op, r *route, dup bool) {
	h.ops = append(h.ops, op)
	h.opRoutes = append(h.opRoutes, r)
	h.opDup = append(h.opDup, dup)
}

// check runs r's self-check on a BlockStored event of a checked batch, and warns, at
// most once per logGap per context, when the profile does not reproduce its hashes.
// The blocks are indexed by the engine's hashes whatever the outcome.
func (h *EventHandler) check(seq uint64, r *route, ev *kvevent.Event) {
	se := hashing.StoredEvent{Hashes: ev.BlockHashes, Parent: ev.ParentBlockHash.Uint,
		HasParent: ev.ParentBlockHash.Valid, Tokens: ev.TokenIDs, Pairs: ev.TokenPairs,
		BlockSize: int(ev.BlockSize.Int), LoraName: r.key.LoraName,
		Lookahead: ev.LookaheadTokenIDs, LookaheadPerBlock: ev.LookaheadPerBlock, HasLookahead: ev.HasLookahead}
	if h.src.Kind == publisher.VLLM {
		salt, hasSalt, ok := kvevent.TextExtraKeys(ev.ExtraKeys, ev.LoraName.Bytes)
		se.Opaque = !ok
		if hasSalt {
			se.Salt = string(salt)
		}
	} else {
		se.LoraName = string(ev.LoraName.Bytes)
		if ev.CacheSalt.Valid {
			se.Salt = string(ev.CacheSalt.Bytes)
		}
	}
	if r.check.Check(&se) != hashing.CheckMismatch {
		return
	}
	if now := time.Now(); r.lastLog.IsZero() || now.Sub(r.lastLog) >= h.logGap {
		r.lastLog = now
		st := r.check.Stats()
		h.log.Warn("registered hash profile does not reproduce the engine's block hashes: queries of this context miss",
			"seq", seq, "lora_name", r.key.LoraName, "hash_check", st.String(),
			"mismatched_events", st.Mismatched, "verified_events", st.Verified)
	}
}

func (h *EventHandler) reject(seq uint64, err error) {
	h.rejected.Add(1)
	h.log.Warn("kv event rejected", "seq", seq, "err", err)
}

var (
	errBlockSize   = errors.New("block_size does not match the registration")
	errLoraID      = errors.New("lora_id requires a positive id and a non-empty lora_name")
	errLoraName    = errors.New("no context is registered for lora_name")
	errGroup       = errors.New("only cache group 0 is supported")
	errSpecKind    = errors.New("unsupported kv_cache_spec_kind")
	errSliding     = errors.New("sliding-window KV cache groups are not indexed")
	errSGLangLora  = errors.New("SGLang lora_id must be nil")
	errSGLangMedia = errors.New("unsupported SGLang medium")
)

// engineOp turns a vLLM or SGLang event into an op on the source's slot: a clear of the
// engine's tiers the source indexes, or a store or removal checked by the engine's rules
// (vllmRules, sglangRules). ok false: valid but not indexed (a medium the source does not
// index).
func (h *EventHandler) engineOp(ev *kvevent.Event) (engine.Op, bool, error) {
	op := engine.Op{Slot: h.src.Slot}
	switch ev.Type {
	case kvevent.EventAllBlocksCleared:
		op.Kind, op.ClearTiers = engine.OpClear, h.src.Media.clearMask(h.src.Kind)
		return op, true, nil
	case kvevent.EventBlockStored:
		op.Kind = engine.OpStore
	case kvevent.EventBlockRemoved:
		op.Kind = engine.OpRemove
	default:
		return op, false, fmt.Errorf("unexpected event type %s", ev.Type)
	}
	var m medium
	var err error
	if h.src.Kind == publisher.VLLM {
		m, err = h.vllmRules(ev)
	} else {
		m, err = h.sglangRules(ev)
	}
	if err != nil {
		return op, false, err
	}
	if m == 0 || m&h.src.Media.effective(h.src.Kind) == 0 {
		return op, false, nil
	}
	op.Tier = tierOf(m)
	op.Hashes = ev.BlockHashes
	return op, true, nil
}

// vllmRules applies the BlockStored/BlockRemoved rules of reference notes §5.2 (the
// context, by lora_name, is the caller's) and returns the event's medium (0: one no
// source indexes). Media: GPU → device, CPU → cpu_local, STORAGE → disk. An offloading
// connector's placeholder store (block_size 0) is taken for CPU and STORAGE.
func (h *EventHandler) vllmRules(ev *kvevent.Event) (medium, error) {
	m := vllmMedium(ev.Medium)
	if ev.Type == kvevent.EventBlockStored {
		// Offloading connectors publish placeholders of block_size 0 for blocks they hold
		// without their request's metadata: the hash is still the block's.
		placeholder := ev.BlockSize.Int == 0 && m != mediumGPU
		if ev.BlockSize.Int != h.src.Context.BlockSize && !placeholder {
			return 0, errBlockSize
		}
		if ev.LoraID.Valid && (ev.LoraID.Int <= 0 || len(ev.LoraName.Bytes) == 0) {
			return 0, errLoraID
		}
		if ev.KVCacheSpecKind.Valid && !kvevent.SupportedSpecKind(ev.KVCacheSpecKind) {
			return 0, errSpecKind
		}
		if ev.KVCacheSpecSlidingWindow.Valid {
			return 0, errSliding
		}
	}
	if ev.GroupIdx.Valid && ev.GroupIdx.Int != 0 {
		return 0, errGroup
	}
	return m, nil
}

// sglangRules applies the SGLang BlockStored/BlockRemoved rules of reference notes §5.3
// and returns the event's medium: a partial last page may be shorter than the
// registered page size; media map to the engine's three local tiers.
func (h *EventHandler) sglangRules(ev *kvevent.Event) (medium, error) {
	if ev.Type == kvevent.EventBlockStored {
		if ev.BlockSize.Int < 1 || ev.BlockSize.Int > h.src.Context.BlockSize {
			return 0, errBlockSize
		}
		if ev.LoraID.Valid {
			return 0, errSGLangLora
		}
	}
	m := sglangMedium(ev.Medium)
	if m == 0 {
		return 0, fmt.Errorf("%w %q", errSGLangMedia, ev.Medium.Bytes)
	}
	return m, nil
}

// OnStale retracts everything the source contributed: an engine's local tiers, or every
// Mooncake binding from this endpoint.
func (h *EventHandler) OnStale(reason string) {
	h.Flush()
	h.forgetChecks()
	h.log.Error("source marked stale; its entries are retracted until it is registered again",
		"endpoint", h.src.Endpoint, "reason", reason)
	h.retract()
}

// OnPublisherRestart retracts what the source published before it restarted: a restarted
// engine starts with an empty cache, so its old entries would be hits that are not there.
// The subscriber re-baselines the sequence (and replays what the new process buffers).
func (h *EventHandler) OnPublisherRestart(lastSeq, firstSeq uint64) {
	h.Flush()
	h.forgetChecks()
	h.log.Warn("publisher restarted; retracting its previous entries", "endpoint", h.src.Endpoint,
		"last_seq", lastSeq, "first_seq", firstSeq)
	h.retract()
}

func (h *EventHandler) retract() {
	if h.src.Kind == publisher.Mooncake {
		h.eng.RetractSource(h.src.Endpoint)
		return
	}
	for _, r := range h.routes.Load().list {
		ops := []engine.Op{{Kind: engine.OpClear, Slot: h.src.Slot, ClearTiers: engine.MaskAllEngine}}
		if err := h.eng.Apply(r.key, ops); err != nil {
			h.log.Warn("retraction not applied", "lora_name", r.key.LoraName, "err", err)
		}
	}
}

// forgetChecks drops the digests the self-checks remembered: the engine's blocks from
// before a restart (or a gap) are gone.
func (h *EventHandler) forgetChecks() {
	for _, r := range h.routes.Load().list {
		if r.check != nil {
			r.check.Forget()
		}
	}
}

var (
	errMooncakeGroup   = errors.New("group_id must be empty or 0")
	errMooncakeIDs     = errors.New("backend_id and object_key must be non-empty")
	errMooncakeCtx     = errors.New("event context needs non-empty tenant_id and model_name and a positive block_size")
	errMooncakeProfile = errors.New("event context is not registered with this source's hash profile")
	errMooncakeSeq     = errors.New("seq_hashes must be empty or the block's projected hash")
	errMooncakeHash    = errors.New("connector_block_hash does not match the object key")
	errMooncakeSGLCtx  = errors.New("SGLang Mooncake events must carry the registration's context")
)

// handleMooncake applies a Mooncake master batch (reference notes §5.4). Each event names
// its own context; runs of events in one context are applied together, in order.
func (h *EventHandler) handleMooncake(seq uint64, b *kvevent.Batch) {
	h.ops = h.ops[:0]
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Err != nil {
			h.reject(seq, ev.Err)
			continue
		}
		if ev.Type == kvevent.EventAllBlocksCleared {
			h.flushMooncake(seq)
			if len(ev.BackendID) == 0 || len(ev.TenantID) == 0 {
				h.reject(seq, fmt.Errorf("event %d (cleared): backend_id and tenant_id must be non-empty", i))
				continue
			}
			h.eng.ClearShared(h.src.Endpoint, string(ev.BackendID), string(ev.TenantID))
			h.applied.Add(1)
			continue
		}
		key, op, ok, err := h.mooncakeOp(ev)
		if err != nil {
			h.reject(seq, fmt.Errorf("event %d (%s): %w", i, ev.Type, err))
			continue
		}
		if !ok {
			h.ignored.Add(1)
			h.log.Warn("mooncake event ignored", "seq", seq, "event", i, "medium", string(ev.Medium.Bytes))
			continue
		}
		if len(h.ops) > 0 && key != h.opsKey {
			h.flushMooncake(seq)
		}
		h.opsKey = key
		h.ops = append(h.ops, op)
	}
	h.flushMooncake(seq)
}

func (h *EventHandler) flushMooncake(seq uint64) {
	if len(h.ops) == 0 {
		return
	}
	if err := h.eng.Apply(h.opsKey, h.ops); err != nil {
		h.rejected.Add(uint64(len(h.ops)))
		h.log.Warn("mooncake events not applied", "seq", seq, "events", len(h.ops), "err", err)
		h.ops = h.ops[:0]
		return
	}
	for i := range h.ops {
		if h.ops[i].Err != nil {
			h.reject(seq, h.ops[i].Err)
			continue
		}
		h.applied.Add(1)
		h.blocks.Add(1)
	}
	h.ops = h.ops[:0]
}

// eventContext returns the event's context key, reusing the previous one when the raw
// fields are unchanged. Each field is length-prefixed: with a separator byte instead, a
// tenant "a\x00b" and model "c" would read the same as tenant "a" and model "b\x00c",
// and the cache would apply one context's events to the other.
func (h *EventHandler) eventContext(ev *kvevent.Event) engine.ContextKey {
	raw := h.ctxScratch[:0]
	raw = binary.AppendUvarint(raw, uint64(len(ev.TenantID)))
	raw = append(raw, ev.TenantID...)
	raw = binary.AppendUvarint(raw, uint64(len(ev.ModelName.Bytes)))
	raw = append(raw, ev.ModelName.Bytes...)
	raw = binary.AppendUvarint(raw, uint64(len(ev.LoraName.Bytes)))
	raw = append(raw, ev.LoraName.Bytes...)
	h.ctxScratch = raw
	if bytes.Equal(raw, h.lastCtxRaw) && h.lastCtx.BlockSize == ev.BlockSize.Int && h.lastCtx.ModelName != "" {
		return h.lastCtx
	}
	h.lastCtxRaw = append(h.lastCtxRaw[:0], raw...)
	h.lastCtx = engine.ContextKey{TenantID: string(ev.TenantID), ModelName: string(ev.ModelName.Bytes),
		LoraName: string(ev.LoraName.Bytes), BlockSize: ev.BlockSize.Int}
	return h.lastCtx
}

func (h *EventHandler) mooncakeOp(ev *kvevent.Event) (engine.ContextKey, engine.Op, bool, error) {
	var op engine.Op
	m := ev.Medium.Bytes
	switch {
	case ev.Medium.Valid && (kvevent.MediumIs(m, "cpu") || kvevent.MediumIs(m, "cpu_pinned")):
		op.SharedTier = engine.SharedCPU
	case ev.Medium.Valid && kvevent.MediumIs(m, "disk"):
		op.SharedTier = engine.SharedDisk
	default:
		return engine.ContextKey{}, op, false, nil
	}
	if len(ev.BackendID) == 0 || len(ev.ObjectKey.Bytes) == 0 {
		return engine.ContextKey{}, op, false, errMooncakeIDs
	}
	if len(ev.TenantID) == 0 || len(ev.ModelName.Bytes) == 0 || ev.BlockSize.Int <= 0 {
		return engine.ContextKey{}, op, false, errMooncakeCtx
	}
	key := h.eventContext(ev)
	prof, ok := h.eng.ContextProfile(key)
	if !ok || !prof.Equal(h.src.Profile) {
		return key, op, false, fmt.Errorf("%w (%s/%s/%s/%d)", errMooncakeProfile, key.TenantID, key.ModelName, key.LoraName, key.BlockSize)
	}
	objKey := ev.ObjectKey.Bytes
	var hash uint64
	if h.src.Profile.Strategy == hashing.StrategyVLLMV1 {
		if g := ev.GroupID.Bytes; ev.GroupID.Valid && len(g) > 0 && string(g) != "0" {
			return key, op, false, errMooncakeGroup
		}
		if ev.ConnectorBlockHash.Valid {
			ch, err := objectkey.ParseConnectorBlockHash(ev.ConnectorBlockHash.Bytes)
			if err != nil {
				return key, op, false, err
			}
			hash = ch.Low64
		} else {
			var err error
			if hash, err = objectkey.ParseVLLM(objKey); err != nil {
				return key, op, false, err
			}
		}
		op.ObjectKey = string(objKey)
	} else {
		if key != h.src.Context {
			return key, op, false, errMooncakeSGLCtx
		}
		first, logicalLen, err := objectkey.ParseSGLang(objKey)
		if err != nil {
			return key, op, false, err
		}
		if ev.ConnectorBlockHash.Valid {
			ch, cerr := objectkey.ParseConnectorBlockHash(ev.ConnectorBlockHash.Bytes)
			if cerr != nil || !objectkey.HexEqualFold(ch.Hex, objKey[logicalLen-64:logicalLen]) {
				return key, op, false, errMooncakeHash
			}
		}
		hash = first
		op.ObjectKey = string(objKey[:logicalLen])
		op.Component = string(objKey[logicalLen:])
	}
	if len(ev.SeqHashes) > 1 || (len(ev.SeqHashes) == 1 && ev.SeqHashes[0] != hash) {
		return key, op, false, errMooncakeSeq
	}
	op.Source = h.src.Endpoint
	if string(ev.BackendID) != h.lastBackend {
		h.lastBackend = string(ev.BackendID)
	}
	op.Backend = h.lastBackend
	op.Hash = hash
	if ev.Type == kvevent.EventBlockStored {
		op.Kind = engine.OpSharedStore
	} else {
		op.Kind = engine.OpSharedRemove
	}
	return key, op, true, nil
}
