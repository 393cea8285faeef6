// Package translate turns the decoded KV-event batches of one registered source into
// engine operations and applies them: the vLLM, SGLang and Mooncake master rules of
// reference notes §5.2–5.4 (block size, LoRA, cache group, medium to tier, Mooncake
// object keys and contexts), retraction when the source goes stale or its publisher
// restarts. It has no socket: ingest's subscriber hands it ordered payloads through the
// ingest.Handler interface, which EventHandler implements.
package translate

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

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
	// Context is the registration's context. Engine events always go there; Mooncake
	// events carry their own context, which must exist with Profile.
	Context engine.ContextKey
	// Slot is the engine registration's (instance, rank); unused for Mooncake.
	Slot    engine.Slot
	Profile hashing.Profile
}

// HandlerStats are an EventHandler's counters, read atomically.
type HandlerStats struct {
	Batches        uint64 // payloads handed to the handler
	BatchesDropped uint64 // envelope failures: the whole payload was dropped
	EventsApplied  uint64 // events that reached the index (including idempotent no-ops)
	EventsRejected uint64 // events skipped as invalid (decoding or a field rule)
	EventsIgnored  uint64 // events valid but not indexed (a medium the kind does not index)
	BlocksApplied  uint64 // block hashes stored or removed
	// BurstBatches counts the batches handed over through HandleBatchDeferred (the
	// subscriber's burst path); BurstFlushes the context-writer requests that applied
	// the deferred ops of one or more of them. Their ratio is the mean burst size.
	BurstBatches uint64
	BurstFlushes uint64
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
	// The engine ops of a burst of batches wait here until Flush (burst.go).
	burst burstBuf

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
}

// NewEventHandler builds the handler of one registered source.
func NewEventHandler(src Source, eng *engine.Engine, log *slog.Logger) *EventHandler {
	if log == nil {
		log = slog.Default()
	}
	h := &EventHandler{src: src, eng: eng, log: log.With("service", src.Name)}
	// No rule here reads token ids (blocks are indexed by the hashes the engine sent);
	// they are still checked, so a batch is accepted or rejected as when they are read.
	h.dec.SkipTokenIDs = true
	return h
}

// Stats returns the handler's counters.
func (h *EventHandler) Stats() HandlerStats {
	return HandlerStats{
		Batches: h.batches.Load(), BatchesDropped: h.batchesDropped.Load(),
		EventsApplied: h.applied.Load(), EventsRejected: h.rejected.Load(),
		EventsIgnored: h.ignored.Load(), BlocksApplied: h.blocks.Load(),
		BurstBatches: h.burstBatches.Load(), BurstFlushes: h.burstFlushes.Load(),
	}
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
	b, err := h.dec.Decode(h.src.Kind, payload)
	if err != nil {
		h.batchesDropped.Add(1)
		h.log.Warn("kv event batch dropped", "seq", seq, "err", err)
		return nil
	}
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
		var op engine.Op
		var ok bool
		var rerr error
		if h.src.Kind == publisher.VLLM {
			op, ok, rerr = h.vllmOp(ev)
		} else {
			op, ok, rerr = h.sglangOp(ev)
		}
		if rerr != nil {
			h.reject(seq, fmt.Errorf("event %d (%s): %w", i, ev.Type, rerr))
			continue
		}
		if !ok {
			h.ignored.Add(1)
			continue
		}
		h.ops = append(h.ops, op)
	}
	h.deferOps(seq, first, deferred)
	return nil
}

func (h *EventHandler) reject(seq uint64, err error) {
	h.rejected.Add(1)
	h.log.Warn("kv event rejected", "seq", seq, "err", err)
}

var (
	errBlockSize   = errors.New("block_size does not match the registration")
	errLoraID      = errors.New("lora_id requires a positive id and a non-empty lora_name")
	errLoraName    = errors.New("lora_name does not match the registration")
	errGroup       = errors.New("only cache group 0 is supported")
	errSpecKind    = errors.New("unsupported kv_cache_spec_kind")
	errSliding     = errors.New("sliding-window KV cache groups are not indexed")
	errSGLangLora  = errors.New("SGLang lora_id must be nil")
	errSGLangMedia = errors.New("unsupported SGLang medium")
)

// vllmOp applies the BlockStored/BlockRemoved/AllBlocksCleared rules of reference notes
// §5.2. ok false: valid but not indexed (a medium other than gpu).
func (h *EventHandler) vllmOp(ev *kvevent.Event) (engine.Op, bool, error) {
	op := engine.Op{Slot: h.src.Slot, Tier: engine.TierDevice}
	switch ev.Type {
	case kvevent.EventAllBlocksCleared:
		op.Kind, op.ClearTiers = engine.OpClear, engine.MaskDevice
		return op, true, nil
	case kvevent.EventBlockStored:
		if ev.BlockSize.Int != h.src.Context.BlockSize {
			return op, false, errBlockSize
		}
		if ev.LoraID.Valid && (ev.LoraID.Int <= 0 || len(ev.LoraName.Bytes) == 0) {
			return op, false, errLoraID
		}
		if string(ev.LoraName.Bytes) != h.src.Context.LoraName {
			return op, false, errLoraName
		}
		if ev.KVCacheSpecKind.Valid && !kvevent.SupportedSpecKind(ev.KVCacheSpecKind) {
			return op, false, errSpecKind
		}
		if ev.KVCacheSpecSlidingWindow.Valid {
			return op, false, errSliding
		}
		op.Kind = engine.OpStore
	case kvevent.EventBlockRemoved:
		op.Kind = engine.OpRemove
	default:
		return op, false, fmt.Errorf("unexpected event type %s", ev.Type)
	}
	if ev.GroupIdx.Valid && ev.GroupIdx.Int != 0 {
		return op, false, errGroup
	}
	if !kvevent.MediumIs(ev.Medium.Bytes, "gpu") {
		return op, false, nil
	}
	op.Hashes = ev.BlockHashes
	return op, true, nil
}

// sglangOp applies the SGLang rules of reference notes §5.3: a partial last page may be
// shorter than the registered page size; media map to the engine's three local tiers.
func (h *EventHandler) sglangOp(ev *kvevent.Event) (engine.Op, bool, error) {
	op := engine.Op{Slot: h.src.Slot}
	switch ev.Type {
	case kvevent.EventAllBlocksCleared:
		op.Kind, op.ClearTiers = engine.OpClear, engine.MaskAllEngine
		return op, true, nil
	case kvevent.EventBlockStored:
		if ev.BlockSize.Int < 1 || ev.BlockSize.Int > h.src.Context.BlockSize {
			return op, false, errBlockSize
		}
		if ev.LoraID.Valid {
			return op, false, errSGLangLora
		}
		op.Kind = engine.OpStore
	case kvevent.EventBlockRemoved:
		op.Kind = engine.OpRemove
	default:
		return op, false, fmt.Errorf("unexpected event type %s", ev.Type)
	}
	m := ev.Medium.Bytes
	switch {
	case !ev.Medium.Valid || kvevent.MediumIs(m, "gpu"):
		op.Tier = engine.TierDevice
	case kvevent.MediumIs(m, "cpu") || kvevent.MediumIs(m, "cpu_pinned"):
		op.Tier = engine.TierCPULocal
	case kvevent.MediumIs(m, "disk"):
		op.Tier = engine.TierDisk
	default:
		return op, false, fmt.Errorf("%w %q", errSGLangMedia, m)
	}
	op.Hashes = ev.BlockHashes
	return op, true, nil
}

// OnStale retracts everything the source contributed: an engine's local tiers, or every
// Mooncake binding from this endpoint.
func (h *EventHandler) OnStale(reason string) {
	h.Flush()
	h.log.Error("source marked stale; its entries are retracted until it is registered again",
		"endpoint", h.src.Endpoint, "reason", reason)
	h.retract()
}

// OnPublisherRestart retracts what the source published before it restarted: a restarted
// engine starts with an empty cache, so its old entries would be hits that are not there.
// The subscriber re-baselines the sequence (and replays what the new process buffers).
func (h *EventHandler) OnPublisherRestart(lastSeq, firstSeq uint64) {
	h.Flush()
	h.log.Warn("publisher restarted; retracting its previous entries", "endpoint", h.src.Endpoint,
		"last_seq", lastSeq, "first_seq", firstSeq)
	h.retract()
}

func (h *EventHandler) retract() {
	if h.src.Kind == publisher.Mooncake {
		h.eng.RetractSource(h.src.Endpoint)
		return
	}
	ops := []engine.Op{{Kind: engine.OpClear, Slot: h.src.Slot, ClearTiers: engine.MaskAllEngine}}
	if err := h.eng.Apply(h.src.Context, ops); err != nil {
		h.log.Warn("retraction not applied", "err", err)
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
