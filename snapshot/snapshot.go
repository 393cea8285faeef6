package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/conductor-go/conductor/engine"
)

// MaxBytes bounds a snapshot loaded by Load (it is held in memory whole while its
// checksum is verified, before anything is applied): about 75M blocks.
const MaxBytes = 1 << 30

// Write writes the snapshot stream of every context of eng to w: each context is copied
// by its own writer in steps of engine.DefaultSnapshotStep records, so that no writer
// pauses longer than one step. sequences returns, per source endpoint, the last batch
// applied; it is read before each context's first step. It returns the stream's size.
func Write(w io.Writer, eng *engine.Engine, sequences func() map[string]uint64) (int64, error) {
	sw := NewWriter(w)
	for _, cv := range eng.GlobalView() {
		// Read before the context's first step: every batch counted here was applied
		// before it, so the copy (as of its last step) holds it.
		hdr := Header{Key: cv.Key, Profile: cv.Profile, Sequences: sequences()}
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

// Owned says what of a snapshot this node may apply: the engine slots and the Mooncake
// sources (endpoints) its registrations own, per context. The rest could not be kept
// current by this node's subscriptions, so it is skipped.
type Owned struct {
	Slots   map[engine.ContextKey]map[engine.Slot]bool
	Sources map[engine.ContextKey]map[string]bool
}

// AddSlot marks an engine registration's slot as owned.
func (o *Owned) AddSlot(ctx engine.ContextKey, slot engine.Slot) {
	if o.Slots == nil {
		o.Slots = map[engine.ContextKey]map[engine.Slot]bool{}
	}
	if o.Slots[ctx] == nil {
		o.Slots[ctx] = map[engine.Slot]bool{}
	}
	o.Slots[ctx][slot] = true
}

// AddSource marks a Mooncake registration's endpoint as owned.
func (o *Owned) AddSource(ctx engine.ContextKey, endpoint string) {
	if o.Sources == nil {
		o.Sources = map[engine.ContextKey]map[string]bool{}
	}
	if o.Sources[ctx] == nil {
		o.Sources[ctx] = map[string]bool{}
	}
	o.Sources[ctx][endpoint] = true
}

// Loaded reports what Load applied.
type Loaded struct {
	Stats
	// Applied counts the block entries and bindings applied; Skipped those of slots or
	// sources this node does not own.
	Applied, Skipped int64
}

// Load verifies a whole snapshot stream (version, checksum, structure) and then applies
// it to eng: the blocks of owned engine slots and the bindings of owned Mooncake
// sources, through the engine's normal write path. A stream that does not verify applies
// nothing. It also returns, per source endpoint, the lowest last applied sequence number
// over the snapshot's contexts (where a bootstrapping replica's live batches resume).
func Load(r io.Reader, eng *engine.Engine, owned Owned) (Loaded, map[string]uint64, error) {
	l := &loader{seqs: map[string]uint64{}, eng: eng, owned: owned}
	// First pass: verify everything; second: apply.
	data, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return Loaded{}, nil, fmt.Errorf("read snapshot: %w", err)
	}
	if _, err := Read(bytes.NewReader(data), MaxBytes, nopVisitor{}); err != nil {
		return Loaded{}, nil, err
	}
	st, err := Read(bytes.NewReader(data), MaxBytes, l)
	out := Loaded{Stats: st, Applied: l.applied, Skipped: l.skipped}
	if err != nil {
		return out, nil, err
	}
	return out, l.seqs, nil
}

type nopVisitor struct{}

func (nopVisitor) Context(*Header) error                      { return nil }
func (nopVisitor) Chunk(*Header, *engine.SnapshotChunk) error { return nil }

// loader applies a verified stream (the second pass of Load).
type loader struct {
	eng              *engine.Engine
	owned            Owned
	seqs             map[string]uint64
	applied, skipped int64
}

func (l *loader) Context(c *Header) error {
	for ep, seq := range c.Sequences {
		if cur, ok := l.seqs[ep]; !ok || seq < cur {
			l.seqs[ep] = seq
		}
	}
	return nil
}

func (l *loader) Chunk(c *Header, ch *engine.SnapshotChunk) error {
	slots, sources := l.owned.Slots[c.Key], l.owned.Sources[c.Key]
	applied, skipped, err := l.eng.LoadSnapshotChunk(c.Key, c.Profile, ch,
		func(s engine.Slot) bool { return slots[s] }, func(src string) bool { return sources[src] })
	l.applied += int64(applied)
	l.skipped += int64(skipped)
	if err != nil {
		return fmt.Errorf("load snapshot context %s/%s: %w", c.Key.TenantID, c.Key.ModelName, err)
	}
	return nil
}
