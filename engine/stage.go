package engine

import (
	"errors"
	"fmt"
	"sort"

	"github.com/conductor-go/conductor/hashing"
)

// ErrIndexNotEmpty: a stage committed without replace over a context that holds blocks or
// shared bindings.
var ErrIndexNotEmpty = errors.New("engine: the context already holds an index")

// Stage builds contexts apart from the engine's published ones, so that a load (a peer's
// snapshot) applies whole or not at all: chunks go into the stage's own contexts, which no
// query sees, and Commit swaps them in, each context at once (one atomic publication of
// the context map), or Discard drops them. The stage's contexts have their own writers
// and are charged to the engine's counts like any context. A Stage is used by one
// goroutine.
type Stage struct {
	e    *Engine
	ctxs map[ContextKey]*cacheContext
	// sources are the shared-binding sources loaded into each context.
	sources map[ContextKey]map[string]bool
	done    bool
}

// NewStage returns an empty stage.
func (e *Engine) NewStage() *Stage {
	return &Stage{e: e, ctxs: map[ContextKey]*cacheContext{}, sources: map[ContextKey]map[string]bool{}}
}

// profile is the staged context's profile, or else the published one's: a chunk whose
// profile differs from either is ErrProfileConflict.
func (s *Stage) profile(key ContextKey) (hashing.Profile, bool) {
	if c := s.ctxs[key]; c != nil {
		return c.profile, true
	}
	return s.e.ContextProfile(key)
}

// context returns the staged context of key, creating it (its writer running, not
// published) with profile p.
func (s *Stage) context(key ContextKey, p hashing.Profile) (*cacheContext, error) {
	if c := s.ctxs[key]; c != nil {
		return c, nil
	}
	if s.done {
		return nil, errors.New("engine: stage already committed or discarded")
	}
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if s.e.closed {
		return nil, ErrClosed
	}
	c := newContext(s.e, key, p)
	s.ctxs[key] = c
	s.e.wg.Add(1)
	go func() {
		defer s.e.wg.Done()
		c.run()
	}()
	return c, nil
}

// LoadSnapshotChunk applies a snapshot chunk to the stage's context of key, as
// Engine.LoadSnapshotChunk does to a published one.
func (s *Stage) LoadSnapshotChunk(key ContextKey, p hashing.Profile, ch *SnapshotChunk,
	allowSlot func(Slot) bool, allowSource func(string) bool) (applied, skipped int, err error) {
	for _, b := range ch.Bindings {
		if allowSource == nil || allowSource(b.Source) {
			s.noteSource(key, b.Source)
		}
	}
	for i := range ch.Journal {
		if op := &ch.Journal[i]; op.Kind == OpSharedStore && (allowSource == nil || allowSource(op.Source)) {
			s.noteSource(key, op.Source)
		}
	}
	return loadChunk(s, key, p, ch, allowSlot, allowSource)
}

func (s *Stage) noteSource(key ContextKey, source string) {
	if s.sources[key] == nil {
		s.sources[key] = map[string]bool{}
	}
	s.sources[key][source] = true
}

// Keys lists the staged contexts, in order.
func (s *Stage) Keys() []ContextKey {
	out := make([]ContextKey, 0, len(s.ctxs))
	for k := range s.ctxs {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return compareKeys(out[i], out[j]) < 0 })
	return out
}

// Commit swaps the staged contexts in. First each staged context is brought to the
// registrations of now: a slot of the published context of the same key that the stage
// lacks is registered (empty), a staged slot for which keepSlot is false is unregistered
// (its blocks go), and the staged bindings of a source for which keepSource is false are
// retracted. Without replace, a published context that holds blocks or bindings refuses
// the whole commit (ErrIndexNotEmpty, nothing swapped; the stage is kept for a Commit
// with replace or a Discard). Then one publication replaces the context map: queries see
// every staged context at once, and each replaced context gives its memory and charges
// back. Requests already queued on a replaced context apply there and are lost; an Apply
// issued after the swap goes to the new context. The caller holds off registrations
// (they change published slots) while it commits.
func (s *Stage) Commit(replace bool, keepSlot func(ContextKey, Slot) bool, keepSource func(ContextKey, string) bool) error {
	if s.done {
		return errors.New("engine: stage already committed or discarded")
	}
	keys := s.Keys()
	for _, key := range keys {
		if live := s.e.lookup(key); live != nil && !replace {
			has, err := live.holdsData()
			if err != nil {
				return err
			}
			if has {
				return fmt.Errorf("%w: %s/%s/%s/%d", ErrIndexNotEmpty, key.TenantID, key.ModelName, key.LoraName, key.BlockSize)
			}
		}
	}
	for _, key := range keys {
		if err := s.align(key, keepSlot, keepSource); err != nil {
			return err
		}
	}
	s.e.mu.Lock()
	if s.e.closed {
		s.e.mu.Unlock()
		return ErrClosed
	}
	old := *s.e.ctxs.Load()
	m := make(map[ContextKey]*cacheContext, len(old)+len(s.ctxs))
	for k, v := range old {
		m[k] = v
	}
	var retired []*cacheContext
	for k, c := range s.ctxs {
		if prev := old[k]; prev != nil {
			retired = append(retired, prev)
		}
		m[k] = c
	}
	s.e.ctxs.Store(&m)
	for _, c := range retired {
		s.e.retireLocked(c)
	}
	s.e.mu.Unlock()
	s.done = true
	return nil
}

// align brings the staged context of key to the registrations of now (see Commit).
func (s *Stage) align(key ContextKey, keepSlot func(ContextKey, Slot) bool, keepSource func(ContextKey, string) bool) error {
	c := s.ctxs[key]
	var want []Slot
	if live := s.e.lookup(key); live != nil {
		err := live.request(reqSync, func(r *request) {
			r.fn = func(lc *cacheContext) {
				for sl := range lc.slots {
					want = append(want, sl)
				}
			}
		})
		if err != nil && !errors.Is(err, errDropped) {
			return err
		}
	}
	var have []Slot
	err := c.request(reqSync, func(r *request) {
		r.fn = func(sc *cacheContext) {
			for sl := range sc.slots {
				have = append(have, sl)
			}
		}
	})
	if err != nil {
		return err
	}
	held := map[Slot]bool{}
	for _, sl := range have {
		held[sl] = true
		if keepSlot != nil && !keepSlot(key, sl) {
			if err := c.request(reqUnregister, func(r *request) { r.slot = sl }); err != nil {
				return err
			}
		}
	}
	for _, sl := range want {
		if !held[sl] {
			if err := c.request(reqRegister, func(r *request) { r.slot = sl }); err != nil {
				return err
			}
		}
	}
	for src := range s.sources[key] {
		if keepSource != nil && !keepSource(key, src) {
			if err := c.request(reqRetractSource, func(r *request) { r.source = src }); err != nil {
				return err
			}
		}
	}
	return nil
}

// Discard drops the staged contexts (their memory and charges given back). Idempotent;
// a no-op after Commit.
func (s *Stage) Discard() {
	if s.done {
		return
	}
	s.done = true
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	for _, c := range s.ctxs {
		s.e.retireLocked(c)
	}
}

// retireLocked ends a context no longer published (replaced, or a discarded stage's):
// its writer gives back the context's charges and memory, then stops; requests that
// reach it afterwards find it dropped. With e.mu held (Close cannot run meanwhile).
func (e *Engine) retireLocked(c *cacheContext) {
	if e.closed {
		return
	}
	_ = c.request(reqRetire, func(*request) {})
	c.gone.Store(true)
	close(c.quit)
}

// retire is reqRetire on the writer: the context is dropped (later requests do nothing
// and say so), its charges to the engine-wide counts and its debts are given back, and
// its memory released.
func (c *cacheContext) retire() {
	// Requests waiting on this writer (stalled behind a clear, on a widening, on a shared
	// drop) are handed back now, as at Close: their context is gone.
	c.endWaiters()
	c.dropped = true
	c.charge(-c.chargedN, -c.chargedB)
	c.flushCharges()
	c.eng.debts.Add(-c.debt.Swap(0))
	c.release()
}

// holdsData reports whether the context holds any block or shared binding.
func (c *cacheContext) holdsData() (bool, error) {
	has := false
	err := c.request(reqSync, func(r *request) {
		r.fn = func(c *cacheContext) { has = c.tab.ar.Len() > 0 || c.bs != nil }
	})
	if errors.Is(err, errDropped) {
		return false, nil
	}
	return has, err
}

// HoldsData reports whether any published context holds a block or a shared binding: an
// engine that serves an index.
func (e *Engine) HoldsData() (bool, error) {
	for _, c := range e.sortedContexts() {
		has, err := c.holdsData()
		if err != nil || has {
			return has, err
		}
	}
	return false, nil
}
