package engine

import (
	"errors"
	"testing"

	"github.com/conductor-go/conductor/hashing"
)

func otherProfile(t *testing.T) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDropEmptyContext: an empty context is removed with its profile binding, so a later
// registration with another profile is accepted; a context that holds anything stays.
func TestDropEmptyContext(t *testing.T) {
	p := vllmProfile(t)
	e := newTestEngine(t, Config{})
	s := Slot{"a", 0}
	mustRegister(t, e, ctxA, p, s)
	if e.DropEmptyContext(ctxA) {
		t.Fatal("dropped a context with a registered slot")
	}
	mustApply(t, e, ctxA, Op{Kind: OpStore, Slot: s, Tier: TierDevice, Hashes: []uint64{7}})
	e.UnregisterSlot(ctxA, s)
	if _, ok := e.ContextProfile(ctxA); !ok {
		t.Fatal("context gone after unregister")
	}
	// A shared binding keeps it too.
	ops := []Op{{Kind: OpSharedStore, Source: "mc", Backend: "b", ObjectKey: "k", SharedTier: SharedCPU, Hash: 9}}
	mustApply(t, e, ctxA, ops...)
	if e.DropEmptyContext(ctxA) {
		t.Fatal("dropped a context with a shared binding")
	}
	e.RetractSource("mc")
	if !e.DropEmptyContext(ctxA) {
		t.Fatal("empty context not dropped")
	}
	if _, ok := e.ContextProfile(ctxA); ok || len(e.GlobalView()) != 0 {
		t.Fatal("dropped context still visible")
	}
	if err := e.Apply(ctxA, []Op{{Kind: OpStore, Slot: s, Hashes: []uint64{1}}}); !errors.Is(err, ErrUnknownContext) {
		t.Fatalf("Apply on a dropped context: %v", err)
	}
	if e.DropEmptyContext(ctxA) {
		t.Fatal("dropped twice")
	}
	// The profile binding went with it.
	if _, err := e.RegisterSlot(ctxA, otherProfile(t), s); err != nil {
		t.Fatalf("register with another profile after drop: %v", err)
	}
	var res Result
	if err := e.Query(&Query{Key: ctxA, Tokens: seqTokens(32)}, &res); err != nil || len(res.Instances) != 1 {
		t.Fatalf("query after re-creation: %v %+v", err, res.Instances)
	}
}

// TestDropEmptyContextRacesRegistration: registrations racing with drops always end up in a
// live context (a registration that lands on a dropped context retries on a new one).
func TestDropEmptyContextRacesRegistration(t *testing.T) {
	p := vllmProfile(t)
	e := newTestEngine(t, Config{})
	for i := 0; i < 200; i++ {
		s := Slot{"a", i}
		mustRegister(t, e, ctxA, p, s)
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.UnregisterSlot(ctxA, s)
			e.DropEmptyContext(ctxA)
		}()
		s2 := Slot{"b", i}
		mustRegister(t, e, ctxA, p, s2)
		<-done
		views := e.GlobalView()
		if len(views) != 1 || len(views[0].Instances) != 1 || views[0].Instances[0].InstanceID != "b" {
			t.Fatalf("round %d: registration lost: %+v", i, views)
		}
		e.UnregisterSlot(ctxA, s2)
		e.DropEmptyContext(ctxA)
	}
}
