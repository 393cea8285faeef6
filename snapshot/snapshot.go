package snapshot

import (
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// DefaultMaxBytes is the default bound of a received snapshot (max_snapshot_bytes): about
// 75M blocks.
const DefaultMaxBytes = 1 << 30

// Write writes the snapshot stream of every context of eng to w, signed with key: each
// context is copied by its own writer in steps of engine.DefaultSnapshotStep records, so
// that no writer pauses longer than one step. sources returns a context's registered
// services with the last batch applied from each; it is read before the context's first
// step. It returns the stream's size.
func Write(w io.Writer, eng *engine.Engine, key []byte, sources func(engine.ContextKey) []Source) (int64, error) {
	sw := NewWriter(w, key)
	for _, cv := range eng.GlobalView() {
		// Read before the context's first step: every batch counted here was applied
		// before it, so the copy (as of its last step) holds it.
		hdr := Header{Key: cv.Key, Profile: cv.Profile, Sources: sources(cv.Key)}
		if err := sw.Context(&hdr); err != nil {
			return 0, err
		}
		err := eng.SnapshotContext(cv.Key, 0, sw.Chunk)
		if errors.Is(err, engine.ErrUnknownContext) {
			continue // dropped meanwhile: the header stands for an empty context
		}
		if err != nil {
			return 0, fmt.Errorf("snapshot context %s/%s: %w", cv.Key.TenantID, cv.Key.ModelName, err)
		}
	}
	return sw.Close()
}

// Owned says what of a snapshot this node may apply: its registrations, per context.
// An engine slot's entries are applied only where this node registers the slot with the
// endpoint the snapshot's context names for it, a shared source's bindings only where
// this node registers that source; with RequireCut (a cluster replica, whose live
// batches resume after the snapshot's cut), only for services the snapshot has a
// sequence cut for. The rest could not be kept current by this node's subscriptions, or
// came from another publisher: it is skipped.
type Owned struct {
	Slots    map[engine.ContextKey]map[engine.Slot]string
	Sources  map[engine.ContextKey]map[string]bool
	Profiles map[engine.ContextKey]hashing.Profile
	// RequireCut skips services without a sequence cut in the snapshot.
	RequireCut bool
}

// AddSlot marks an engine registration's slot, with its endpoint, as owned.
func (o *Owned) AddSlot(ctx engine.ContextKey, p hashing.Profile, slot engine.Slot, endpoint string) {
	if o.Slots == nil {
		o.Slots = map[engine.ContextKey]map[engine.Slot]string{}
	}
	if o.Slots[ctx] == nil {
		o.Slots[ctx] = map[engine.Slot]string{}
	}
	o.Slots[ctx][slot] = endpoint
	o.profile(ctx, p)
}

// AddSource marks a Mooncake registration's endpoint as owned.
func (o *Owned) AddSource(ctx engine.ContextKey, p hashing.Profile, endpoint string) {
	if o.Sources == nil {
		o.Sources = map[engine.ContextKey]map[string]bool{}
	}
	if o.Sources[ctx] == nil {
		o.Sources[ctx] = map[string]bool{}
	}
	o.Sources[ctx][endpoint] = true
	o.profile(ctx, p)
}

func (o *Owned) profile(ctx engine.ContextKey, p hashing.Profile) {
	if o.Profiles == nil {
		o.Profiles = map[engine.ContextKey]hashing.Profile{}
	}
	o.Profiles[ctx] = p
}

// Loaded reports what Load applied.
type Loaded struct {
	Stats
	// Applied counts the block entries and bindings applied; Skipped those of slots or
	// sources this node does not own (or owns from another endpoint, or without a cut).
	Applied, Skipped int64
	// SkippedServices names each service of the snapshot whose entries were skipped,
	// with why ("context/instance/rank: why"), sorted.
	SkippedServices []string
}

// ErrMismatch is a snapshot whose context this node registers with another hash
// profile: its block keys would not be this node's.
var ErrMismatch = errors.New("snapshot does not match this node's registrations")

// Load decodes a received stream into stage (nothing is published: the caller commits or
// discards the stage), applying what owned allows. It also returns, per source endpoint
// applied, the lowest last applied sequence number over the snapshot's contexts (where a
// bootstrapping replica's live batches resume). Any error leaves the stage to discard.
func Load(sp *Spool, stage *engine.Stage, owned Owned) (Loaded, map[string]uint64, error) {
	l := &loader{seqs: map[string]uint64{}, stage: stage, owned: owned, skippedSvc: map[string]bool{}}
	st, err := sp.Read(l)
	out := Loaded{Stats: st, Applied: l.applied, Skipped: l.skipped}
	for s := range l.skippedSvc {
		out.SkippedServices = append(out.SkippedServices, s)
	}
	sort.Strings(out.SkippedServices)
	if err != nil {
		return out, nil, err
	}
	return out, l.seqs, nil
}

type nopVisitor struct{}

func (nopVisitor) Context(*Header) error                      { return nil }
func (nopVisitor) Chunk(*Header, *engine.SnapshotChunk) error { return nil }

// loader applies a verified stream to a stage.
type loader struct {
	stage            *engine.Stage
	owned            Owned
	seqs             map[string]uint64
	applied, skipped int64
	// The current context: what of it may be applied.
	slots      map[engine.Slot]bool
	sources    map[string]bool
	skippedSvc map[string]bool
}

func (l *loader) Context(c *Header) error {
	l.slots, l.sources = map[engine.Slot]bool{}, map[string]bool{}
	name := fmt.Sprintf("%s/%s/%s/%d", c.Key.TenantID, c.Key.ModelName, c.Key.LoraName, c.Key.BlockSize)
	ownedSlots, ownedSources := l.owned.Slots[c.Key], l.owned.Sources[c.Key]
	for _, src := range c.Sources {
		id := name + "/" + src.Endpoint
		if !src.Shared {
			id = fmt.Sprintf("%s/%s/%d", name, src.Slot.InstanceID, src.Slot.DPRank)
		}
		var why string
		switch {
		case src.Shared && !ownedSources[src.Endpoint]:
			why = "not registered here"
		case !src.Shared && ownedSlots[src.Slot] == "":
			why = "not registered here"
		case !src.Shared && ownedSlots[src.Slot] != src.Endpoint:
			why = "registered here with another endpoint"
		case l.owned.RequireCut && !src.HasSeq:
			why = "no sequence cut in the snapshot"
		}
		if why != "" {
			l.skippedSvc[id+": "+why] = true
			continue
		}
		if src.Shared {
			l.sources[src.Endpoint] = true
		} else {
			l.slots[src.Slot] = true
		}
		if src.HasSeq {
			if cur, ok := l.seqs[src.Endpoint]; !ok || src.Seq < cur {
				l.seqs[src.Endpoint] = src.Seq
			}
		}
	}
	if len(l.slots)+len(l.sources) > 0 {
		if p, ok := l.owned.Profiles[c.Key]; ok && !p.Equal(c.Profile) {
			return fmt.Errorf("%w: context %s has another hash profile here", ErrMismatch, name)
		}
	}
	return nil
}

func (l *loader) Chunk(c *Header, ch *engine.SnapshotChunk) error {
	if len(l.slots)+len(l.sources) == 0 {
		// Nothing of this context is applied: not even a staged context is made (its
		// profile may differ from this node's, which would refuse the whole load).
		l.skipped += int64(len(ch.Entries) + len(ch.Bindings))
		return nil
	}
	applied, skipped, err := l.stage.LoadSnapshotChunk(c.Key, c.Profile, ch,
		func(s engine.Slot) bool { return l.slots[s] }, func(src string) bool { return l.sources[src] })
	l.applied += int64(applied)
	l.skipped += int64(skipped)
	if err != nil {
		return fmt.Errorf("load snapshot context %s/%s: %w", c.Key.TenantID, c.Key.ModelName, err)
	}
	return nil
}
