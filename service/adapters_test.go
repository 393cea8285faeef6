package service

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
)

// Multi-LoRA through the service layer, with the real event handler fed by the test
// (no socket), so that each interleaving of registration changes with a batch in
// flight is chosen, not hoped for.

// handlerSub is a Subscription over a translate.EventHandler the test drives.
type handlerSub struct {
	h       *translate.EventHandler
	stopped bool
}

func (s *handlerSub) Stop()                         { s.stopped = true }
func (s *handlerSub) Stats() ingest.SubscriberStats { return ingest.SubscriberStats{} }
func (s *handlerSub) AddContext(k engine.ContextKey, p hashing.Profile) error {
	return s.h.AddContext(k, p)
}
func (s *handlerSub) RemoveContext(l string) bool { return s.h.RemoveContext(l) }
func (s *handlerSub) CheckStats(l string) (hashing.CheckStats, bool) {
	return s.h.CheckStats(l)
}

// loraRig is a service whose subscriptions are handlerSubs (the last one started is
// sub); beforeApply, when set, runs as the handler's BeforeApply hook.
type loraRig struct {
	t           *testing.T
	eng         *engine.Engine
	svc         *Service
	store       *memStore
	mu          sync.Mutex
	sub         *handlerSub
	beforeApply func()
}

func newLoraRig(t *testing.T) *loraRig {
	t.Helper()
	r := &loraRig{t: t, eng: engine.New(engine.Config{}), store: &memStore{puts: map[ID]Config{}}}
	t.Cleanup(r.eng.Close)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.svc = New(Options{Engine: r.eng, Logger: log, Store: r.store,
		Subscribe: func(cfg *Config, eng *engine.Engine, log *slog.Logger) (Subscription, error) {
			spec := SourceSpec(cfg)
			spec.CheckOff = true
			spec.BeforeApply = func() {
				if r.beforeApply != nil {
					r.beforeApply()
				}
			}
			s := &handlerSub{h: translate.NewEventHandler(spec.Source, eng, log)}
			r.mu.Lock()
			r.sub = s
			r.mu.Unlock()
			return s, nil
		}})
	return r
}

// memStore records the last stored configuration of each service.
type memStore struct {
	mu   sync.Mutex
	puts map[ID]Config
	fail bool
}

func (m *memStore) Put(cfg *Config) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk full")
	}
	m.puts[cfg.ID()] = *cfg
	return nil
}

func (m *memStore) Delete(id ID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("disk full")
	}
	delete(m.puts, id)
	return nil
}

func (m *memStore) stored(id ID) (Config, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.puts[id]
	return c, ok
}

// register registers lora on engine "e" (vLLM, untagged, model m, block size 4).
func (r *loraRig) register(lora string) (bool, *Error) {
	r.t.Helper()
	reg := Registration{Endpoint: "tcp://127.0.0.1:5557", Type: "vLLM", ModelName: "m", LoraName: lora, InstanceID: "e",
		BlockSize: 4, Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be"}
	_, isNew, err := r.svc.RegisterInput(&reg)
	return isNew, err
}

func (r *loraRig) handler() *translate.EventHandler {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sub.h
}

// device is the device-tier count of instance e for keys in lora's context.
func (r *loraRig) device(lora string, keys ...uint64) int64 {
	r.t.Helper()
	var res engine.Result
	key := engine.ContextKey{TenantID: "default", ModelName: "m", LoraName: lora, BlockSize: 4}
	if err := r.eng.QueryKeys(key, keys, len(keys)*4, "", &res); err != nil {
		r.t.Fatal(err)
	}
	for _, in := range res.Instances {
		if in.InstanceID == "e" {
			return in.Tiers.Device
		}
	}
	return 0
}

// batch is a vLLM payload of events, each "store:<lora>:<hash>" or "remove:<hash>".
func batch(events ...any) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 0)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, e := range events {
		switch ev := e.(type) {
		case stored:
			b = appendEventHead(b, 8, "BlockStored", ev.hash)
			b = msgp.AppendString(b, "parent_block_hash")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "token_ids")
			b = msgp.AppendArrayHeader(b, 4)
			for i := range 4 {
				b = msgp.AppendInt(b, i+1)
			}
			b = msgp.AppendString(b, "block_size")
			b = msgp.AppendInt(b, 4)
			b = msgp.AppendString(b, "lora_id")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, "GPU")
			b = msgp.AppendString(b, "lora_name")
			if ev.lora == "" {
				b = msgp.AppendNil(b)
			} else {
				b = msgp.AppendString(b, ev.lora)
			}
		case removed:
			b = appendEventHead(b, 3, "BlockRemoved", uint64(ev))
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, "GPU")
		}
	}
	return msgp.AppendInt(b, 0)
}

// appendEventHead appends the start of an event map of fields keys: its type and its one
// block hash.
func appendEventHead(b []byte, fields uint32, typ string, hash uint64) []byte {
	b = msgp.AppendMapHeader(b, fields)
	b = msgp.AppendString(b, "type")
	b = msgp.AppendString(b, typ)
	b = msgp.AppendString(b, "block_hashes")
	b = msgp.AppendArrayHeader(b, 1)
	return msgp.AppendUint64(b, hash)
}

type stored struct {
	lora string
	hash uint64
}

type removed uint64

// TestMultiLoraRegistrations: one engine, registered once per adapter, is one service
// with one subscription; each adapter's events reach its context; unregistering one
// adapter leaves the others; unregistering the last stops the subscription.
func TestMultiLoraRegistrations(t *testing.T) {
	r := newLoraRig(t)
	for _, lora := range []string{"", "a", "b"} {
		if isNew, err := r.register(lora); err != nil || !isNew {
			t.Fatalf("register %q: %v %v", lora, isNew, err)
		}
	}
	first := r.sub
	if isNew, err := r.register("a"); err != nil || isNew {
		t.Fatalf("register a again: %v %v (want idempotent)", isNew, err)
	}
	if svcs := r.svc.Services(); len(svcs) != 1 || len(svcs[0].Adapters) != 2 || r.sub != first {
		t.Fatalf("services %+v (one service, one subscription wanted)", svcs)
	}
	if st, ok := r.store.stored(ID{InstanceID: "e", TenantID: "default"}); !ok || len(st.Loras()) != 3 {
		t.Fatalf("stored %+v", st)
	}
	if err := r.handler().HandleBatch(0, batch(stored{"", 1}, stored{"a", 2}, stored{"b", 3}, stored{"c", 4})); err != nil {
		t.Fatal(err)
	}
	if r.device("", 1) != 4 || r.device("a", 2) != 4 || r.device("b", 3) != 4 || r.device("a", 1) != 0 || r.device("", 2) != 0 {
		t.Fatalf("routing: base %d a %d b %d", r.device("", 1), r.device("a", 2), r.device("b", 3))
	}
	if st := r.handler().Stats(); st.EventsRejected != 1 { // adapter c is not registered
		t.Fatalf("stats %+v", st)
	}
	// One adapter goes; the others keep what they hold, and its events are refused.
	if key, err := r.svc.UnregisterAdapter("e", "", 0, "a"); err != nil || key != "e|default|0" {
		t.Fatalf("unregister a: %q %v", key, err)
	}
	if r.device("a", 2) != 0 || r.device("", 1) != 4 || r.device("b", 3) != 4 || first.stopped {
		t.Fatal("unregistering adapter a touched the others or stopped the subscription")
	}
	if err := r.handler().HandleBatch(1, batch(stored{"a", 5})); err != nil || r.device("a", 5) != 0 {
		t.Fatalf("an unregistered adapter's store was indexed (%v)", err)
	}
	if st, _ := r.store.stored(ID{InstanceID: "e", TenantID: "default"}); len(st.Loras()) != 2 {
		t.Fatalf("stored after unregistering a: %+v", st.Loras())
	}
	if _, err := r.svc.UnregisterAdapter("e", "", 0, "a"); err == nil || err.Code != CodeNotFound {
		t.Fatalf("unregister a twice: %v", err)
	}
	// The base model's adapter may go too: b is the registration's own then.
	if _, err := r.svc.UnregisterAdapter("e", "", 0, ""); err != nil {
		t.Fatal(err)
	}
	if svcs := r.svc.Services(); len(svcs) != 1 || svcs[0].LoraName != "b" || len(svcs[0].Adapters) != 0 {
		t.Fatalf("services %+v", svcs)
	}
	if _, err := r.svc.UnregisterAdapter("e", "", 0, "b"); err != nil {
		t.Fatal(err)
	}
	if !first.stopped || len(r.svc.Services()) != 0 || r.device("b", 3) != 0 {
		t.Fatal("the last adapter's unregistration did not stop and retract the service")
	}
	if _, ok := r.store.stored(ID{InstanceID: "e", TenantID: "default"}); ok {
		t.Fatal("the service is still stored")
	}
}

// TestMultiLoraRefusals: what another adapter's registration must match, and that a
// store failure leaves the registration as it was.
func TestMultiLoraRefusals(t *testing.T) {
	r := newLoraRig(t)
	if _, err := r.register(""); err != nil {
		t.Fatal(err)
	}
	other := Registration{Endpoint: "tcp://127.0.0.1:5557", Type: "vLLM", ModelName: "other", LoraName: "a", InstanceID: "e",
		BlockSize: 4, Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be"}
	if _, _, err := r.svc.RegisterInput(&other); err == nil || !strings.Contains(err.Msg, "conflicting registration") {
		t.Fatalf("another model: %v", err)
	}
	other.ModelName, other.PythonHashSeed = "m", "1"
	if _, _, err := r.svc.RegisterInput(&other); err == nil || !strings.Contains(err.Msg, "conflicting registration") {
		t.Fatalf("another seed: %v", err)
	}
	r.store.fail = true
	if _, err := r.register("a"); err == nil || err.Code != CodeInternal {
		t.Fatalf("store failure: %v", err)
	}
	r.store.fail = false
	if svcs := r.svc.Services(); len(svcs) != 1 || len(svcs[0].Adapters) != 0 {
		t.Fatalf("a failed adapter registration left %+v", svcs)
	}
	if _, ok := r.eng.ContextProfile(engine.ContextKey{TenantID: "default", ModelName: "m", LoraName: "a", BlockSize: 4}); ok {
		t.Fatal("a failed adapter registration left its context")
	}
	if err := r.handler().HandleBatch(0, batch(stored{"a", 9})); err != nil || r.device("a", 9) != 0 {
		t.Fatal("a failed adapter registration routes its events")
	}
}

// TestMultiLoraChurnInterleavings: a batch whose contexts were chosen before an
// adapter's unregistration (and, in the second case, its registration anew) is applied
// after it. The adapter's context never keeps a block the engine's events removed, and
// what it holds afterwards is only what the engine's later events say.
func TestMultiLoraChurnInterleavings(t *testing.T) {
	for _, reregister := range []bool{false, true} {
		r := newLoraRig(t)
		for _, lora := range []string{"", "b"} {
			if _, err := r.register(lora); err != nil {
				t.Fatal(err)
			}
		}
		h := r.handler()
		if err := h.HandleBatch(0, batch(stored{"b", 7})); err != nil || r.device("b", 7) != 4 {
			t.Fatal("setup")
		}
		chosen, release := make(chan struct{}), make(chan struct{})
		r.beforeApply = func() {
			r.beforeApply = nil // once: later batches run through
			close(chosen)
			<-release
		}
		done := make(chan error, 1)
		go func() { done <- h.HandleBatch(1, batch(stored{"b", 8}, stored{"", 9})) }()
		<-chosen // the batch routed its store to b's context, not applied yet
		if _, err := r.svc.UnregisterAdapter("e", "", 0, "b"); err != nil {
			t.Fatal(err)
		}
		if r.device("b", 7) != 0 {
			t.Fatal("unregistering b left its blocks")
		}
		if reregister {
			if isNew, err := r.register("b"); err != nil || !isNew {
				t.Fatalf("register b anew: %v %v", isNew, err)
			}
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Without b registered, its store found no slot: nothing. Registered anew, the
		// engine's store (a block it holds) is indexed, and its removal reaches it.
		want := int64(0)
		if reregister {
			want = 4
		}
		if got := r.device("b", 8); got != want || r.device("", 9) != 4 || r.device("b", 7) != 0 {
			t.Fatalf("reregister %v: b's block 8 at %d tokens, want %d", reregister, got, want)
		}
		if err := h.HandleBatch(2, batch(removed(8))); err != nil || r.device("b", 8) != 0 {
			t.Fatalf("reregister %v: a removal left block 8 in b's context", reregister)
		}
	}
}
