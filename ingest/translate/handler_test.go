package translate

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/publisher"
)

// kvs is an ordered msgpack map of test values (strings, ints, nil, slices as []any).
type kvs []any

func (m kvs) enc() []byte {
	b := msgp.AppendMapHeader(nil, uint32(len(m)/2))
	for i := 0; i < len(m); i += 2 {
		b = msgp.AppendString(b, m[i].(string))
		v, err := msgp.AppendIntf(b, m[i+1])
		if err != nil {
			panic(err)
		}
		b = v
	}
	return b
}

// with returns m with key k set to v (replaced, or appended).
func (m kvs) with(k string, v any) kvs {
	out := slices.Clone(m)
	for i := 0; i < len(out); i += 2 {
		if out[i] == k {
			out[i+1] = v
			return out
		}
	}
	return append(out, k, v)
}

func anyList[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// batchOf is a KVEventBatch [ts, events, nil].
func batchOf(events ...[]byte) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1757500000.25)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, e := range events {
		b = append(b, e...)
	}
	return msgp.AppendNil(b)
}

// chainOf is the engine's blocks of toks under p: keys and tokens per block.
func chainOf(t testing.TB, p hashing.Profile, bs int, lora, salt string, toks []int32) []uint64 {
	t.Helper()
	var ch hashing.Chain
	ch.Reset(&p, bs, lora, salt, toks)
	var keys []uint64
	for {
		k, err := ch.Next()
		if errors.Is(err, hashing.ErrChainEnd) {
			return keys
		}
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
}

func promptOf(n int, seed int32) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = seed + int32(i*37)%150000
	}
	return toks
}

// vStoredOf is a vLLM BlockStored of blocks [a, b) of a prompt.
func vStoredOf(keys []uint64, toks []int32, a, b int, lora string) kvs {
	var parent any
	if a > 0 {
		parent = keys[a-1]
	}
	var ln any
	if lora != "" {
		ln = lora
	}
	return kvs{"type", "BlockStored", "block_hashes", anyList(keys[a:b]), "parent_block_hash", parent,
		"token_ids", anyList(toks[a*16 : b*16]), "block_size", 16, "lora_id", nil, "medium", "GPU", "lora_name", ln}
}

func vRemovedOf(keys []uint64, medium string) kvs {
	return kvs{"type", "BlockRemoved", "block_hashes", anyList(keys), "medium", medium}
}

type testRig struct {
	t    *testing.T
	eng  *engine.Engine
	slot engine.Slot
	log  *slog.Logger
	logs *logCounter
}

func newTestRig(t *testing.T) *testRig {
	lc := &logCounter{}
	log := slog.New(lc)
	eng := engine.New(engine.Config{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(eng.Close)
	return &testRig{t: t, eng: eng, slot: engine.Slot{InstanceID: "e"}, log: log, logs: lc}
}

func (r *testRig) register(key engine.ContextKey, p hashing.Profile) {
	r.t.Helper()
	if _, err := r.eng.RegisterSlot(key, p, r.slot); err != nil {
		r.t.Fatal(err)
	}
}

// tiers answers a query of the given keys (a prompt's block keys) for the slot.
func (r *testRig) tiers(key engine.ContextKey, keys []uint64) engine.Tiers {
	r.t.Helper()
	var res engine.Result
	if err := r.eng.QueryKeys(key, keys, 16*len(keys), "", &res); err != nil {
		r.t.Fatal(err)
	}
	for _, in := range res.Instances {
		if in.InstanceID == r.slot.InstanceID {
			return in.Tiers
		}
	}
	r.t.Fatalf("%s missing from the answer", r.slot.InstanceID)
	return engine.Tiers{}
}

func (r *testRig) handle(h *EventHandler, events ...[]byte) {
	r.t.Helper()
	if err := h.HandleBatch(1, batchOf(events...)); err != nil {
		r.t.Fatal(err)
	}
}

// logCounter counts warning records by message.
type logCounter struct {
	mu   sync.Mutex
	msgs []string
	attr []string
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, rec slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, rec.Message)
	var b strings.Builder
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(a.Key + "=" + a.Value.String() + " ")
		return true
	})
	l.attr = append(l.attr, b.String())
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }

func (l *logCounter) count(prefix string) (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, last := 0, ""
	for i, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
			last = l.attr[i]
		}
	}
	return n, last
}

// vllmSource is a handler of the rig's slot for key, registered there under the
// sha256_cbor seed-0 profile, with a prompt of n tokens and its keys.
func (r *testRig) vllmSource(key engine.ContextKey, n int, seed int32, mut func(*Source)) (*EventHandler, hashing.Profile, []int32, []uint64) {
	r.t.Helper()
	p, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	r.register(key, p)
	toks := promptOf(n, seed)
	src := Source{Kind: publisher.VLLM, Context: key, Slot: r.slot, Profile: p}
	if mut != nil {
		mut(&src)
	}
	return NewEventHandler(src, r.eng, r.log), p, toks, chainOf(r.t, p, int(key.BlockSize), "", "", toks)
}

func tier(d, loc, dsk int64) engine.Tiers {
	return engine.Tiers{Device: d, CPULocal: loc, CPUShare: loc, Disk: dsk}
}

// TestMultiLoRA: one vLLM stream, three adapters' contexts (base, a, b); each stored
// event goes to its lora_name's context, removals and clears to all of them.
func TestMultiLoRA(t *testing.T) {
	r := newTestRig(t)
	p, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	base := testKey
	ka, kb := base, base
	ka.LoraName, kb.LoraName = "lora-a", "lora-b"
	for _, k := range []engine.ContextKey{base, ka, kb} {
		r.register(k, p)
	}
	h := NewEventHandler(Source{Name: "e", Kind: publisher.VLLM, Context: base, Slot: r.slot, Profile: p}, r.eng, r.log)
	for _, k := range []engine.ContextKey{ka, kb} {
		if err := h.AddContext(k, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.AddContext(ka, p); !errors.Is(err, ErrContext) {
		t.Fatalf("second context for lora-a: %v", err)
	}
	other := ka
	other.ModelName = "m2"
	other.LoraName = "lora-c"
	if err := h.AddContext(other, p); !errors.Is(err, ErrContext) {
		t.Fatalf("context of another model: %v", err)
	}
	if got := h.Contexts(); !slices.Equal(got, []engine.ContextKey{base, ka, kb}) {
		t.Fatalf("contexts %v", got)
	}
	toks := promptOf(64, 1000)
	kBase := chainOf(t, p, 16, "", "", toks)
	kA := chainOf(t, p, 16, "lora-a", "", toks)
	kB := chainOf(t, p, 16, "lora-b", "", toks)
	r.handle(h, vStoredOf(kBase, toks, 0, 4, "").enc(), vStoredOf(kA, toks, 0, 2, "lora-a").with("lora_id", 3).enc(),
		vStoredOf(kB, toks, 0, 3, "lora-b").enc(), vStoredOf(kA, toks, 0, 4, "lora-z").enc())
	if got := [3]engine.Tiers{r.tiers(base, kBase), r.tiers(ka, kA), r.tiers(kb, kB)}; got != [3]engine.Tiers{tier(64, 64, 64), tier(32, 32, 32), tier(48, 48, 48)} {
		t.Fatalf("tiers %+v", got)
	}
	// Another adapter's keys are misses in a context (no cross-talk).
	if got := r.tiers(ka, kB); got != (engine.Tiers{}) {
		t.Fatalf("lora-b's blocks in lora-a's context: %+v", got)
	}
	st := h.Stats()
	if st.EventsApplied != 3 || st.EventsRejected != 1 || st.BlocksApplied != 9 {
		t.Fatalf("stats %+v", st)
	}
	// A removal names no adapter: it reaches every context and counts once.
	r.handle(h, vRemovedOf(kB[2:3], "GPU").enc(), vRemovedOf(kBase[3:4], "GPU").enc())
	if got := [2]engine.Tiers{r.tiers(base, kBase), r.tiers(kb, kB)}; got != [2]engine.Tiers{tier(48, 48, 48), tier(32, 32, 32)} {
		t.Fatalf("after removals %+v", got)
	}
	if st := h.Stats(); st.EventsApplied != 5 || st.BlocksApplied != 11 {
		t.Fatalf("removals counted per context: %+v", st)
	}
	// Unregistering one adapter leaves the others.
	if !h.RemoveContext("lora-b") || h.RemoveContext("lora-b") {
		t.Fatal("RemoveContext")
	}
	r.handle(h, vStoredOf(kB, toks, 3, 4, "lora-b").enc(), vStoredOf(kA, toks, 2, 4, "lora-a").enc())
	if got := r.tiers(ka, kA); got != tier(64, 64, 64) {
		t.Fatalf("lora-a after lora-b left: %+v", got)
	}
	if st := h.Stats(); st.EventsRejected != 2 {
		t.Fatalf("lora-b's event after its removal: %+v", st)
	}
	// A clear empties every remaining context; staleness retracts them all.
	r.handle(h, kvs{"type", "AllBlocksCleared"}.enc())
	if got := [2]engine.Tiers{r.tiers(base, kBase), r.tiers(ka, kA)}; got != [2]engine.Tiers{} {
		t.Fatalf("after clear %+v", got)
	}
	r.handle(h, vStoredOf(kBase, toks, 0, 1, "").enc(), vStoredOf(kA, toks, 0, 1, "lora-a").enc())
	h.OnStale("test")
	if got := [2]engine.Tiers{r.tiers(base, kBase), r.tiers(ka, kA)}; got != [2]engine.Tiers{} {
		t.Fatalf("after stale %+v", got)
	}
	// Mooncake sources name their contexts in their events.
	mh := NewEventHandler(Source{Name: "m", Kind: publisher.Mooncake, Profile: p}, r.eng, r.log)
	if err := mh.AddContext(ka, p); !errors.Is(err, ErrContext) {
		t.Fatalf("Mooncake AddContext: %v", err)
	}
}

// TestIndexMedia: vLLM CPU and STORAGE reach cpu_local and disk when the source indexes
// them, and are ignored by default; SGLang indexes what its list names.
func TestIndexMedia(t *testing.T) {
	r := newTestRig(t)
	def, p, toks, k := r.vllmSource(testKey, 64, 7, nil)
	r.handle(def, vStoredOf(k, toks, 0, 2, "").enc(), vStoredOf(k, toks, 2, 4, "").with("medium", "CPU").enc())
	if got := r.tiers(testKey, k); got != tier(32, 32, 32) {
		t.Fatalf("default media: %+v", got)
	}
	if st := def.Stats(); st.EventsIgnored != 1 {
		t.Fatalf("stats %+v", st)
	}
	r.handle(def, kvs{"type", "AllBlocksCleared"}.enc())

	all, err := ParseIndexMedia(publisher.VLLM, []string{"gpu", "CPU", "Storage"})
	if err != nil {
		t.Fatal(err)
	}
	if got := all.Names(publisher.VLLM); !slices.Equal(got, []string{"GPU", "CPU", "STORAGE"}) {
		t.Fatalf("names %v", got)
	}
	h := NewEventHandler(Source{Kind: publisher.VLLM, Context: testKey, Slot: r.slot, Profile: p, Media: all}, r.eng, r.log)
	placeholder := kvs{"type", "BlockStored", "block_hashes", []any{k[3]}, "parent_block_hash", nil, "token_ids", []any{},
		"block_size", 0, "lora_id", nil, "medium", "STORAGE", "lora_name", nil}
	r.handle(h, vStoredOf(k, toks, 0, 1, "").enc(), vStoredOf(k, toks, 1, 3, "").with("medium", "CPU").enc(), placeholder.enc())
	// device: block 0; cpu_local: blocks 0-2; disk: 0-3.
	if got := r.tiers(testKey, k); got != tier(16, 48, 64) {
		t.Fatalf("offloaded media: %+v", got)
	}
	// A GPU placeholder is still a block size mismatch.
	r.handle(h, placeholder.with("medium", "GPU").enc())
	if st := h.Stats(); st.EventsRejected != 1 {
		t.Fatalf("GPU placeholder: %+v", st)
	}
	r.handle(h, vRemovedOf(k[2:3], "CPU").enc())
	if got := r.tiers(testKey, k); got != tier(16, 32, 32) { // block 2 was in CPU only
		t.Fatalf("after the CPU removal: %+v", got)
	}
	// A clear empties every tier the source indexes.
	r.handle(h, kvs{"type", "AllBlocksCleared"}.enc())
	if got := r.tiers(testKey, k); got != (engine.Tiers{}) {
		t.Fatalf("after clear: %+v", got)
	}

	// SGLang: only the GPU when so listed.
	sp, _ := hashing.Resolve("sglang", "sha256_raw", "", "first64_be")
	sk := engine.ContextKey{TenantID: "default", ModelName: "s", BlockSize: 16}
	r.register(sk, sp)
	gpu, _ := ParseIndexMedia(publisher.SGLang, []string{"GPU"})
	sh := NewEventHandler(Source{Kind: publisher.SGLang, Context: sk, Slot: r.slot, Profile: sp, Media: gpu}, r.eng, r.log)
	keys := chainOf(t, sp, 16, "", "", toks)
	page := func(i int, medium string) []byte {
		var parent any
		if i > 0 {
			parent = int64(keys[i-1])
		}
		return kvs{"type", "BlockStored", "block_hashes", []any{int64(keys[i])}, "parent_block_hash", parent,
			"token_ids", anyList(toks[16*i : 16*i+16]), "block_size", 16, "lora_id", nil, "medium", medium}.enc()
	}
	r.handle(sh, page(0, "GPU"), page(1, "CPU_PINNED"), page(2, "DISK"), page(3, "EXTERNAL"))
	if got := r.tiers(sk, keys); got != tier(16, 16, 16) {
		t.Fatalf("SGLang GPU only: %+v", got)
	}
	if st := sh.Stats(); st.EventsIgnored != 2 || st.EventsRejected != 1 {
		t.Fatalf("SGLang stats %+v", st)
	}
}

func TestParseIndexMedia(t *testing.T) {
	for _, c := range []struct {
		kind  publisher.Kind
		names []string
		want  []string // nil: an error
	}{
		{publisher.VLLM, nil, []string{"GPU"}},
		{publisher.SGLang, nil, []string{"GPU", "CPU_PINNED", "DISK"}},
		{publisher.VLLM, []string{"CPU"}, []string{"CPU"}},
		{publisher.VLLM, []string{"gpu", "GPU"}, []string{"GPU"}},
		{publisher.SGLang, []string{"disk", "gpu"}, []string{"GPU", "DISK"}},
		{publisher.VLLM, []string{}, nil},
		{publisher.VLLM, []string{"CPU_PINNED"}, nil},
		{publisher.SGLang, []string{"STORAGE"}, nil},
		{publisher.SGLang, []string{"EXTERNAL"}, nil},
		{publisher.VLLM, []string{"HBM"}, nil},
		{publisher.Mooncake, []string{"GPU"}, nil},
	} {
		s, err := ParseIndexMedia(c.kind, c.names)
		if c.want == nil {
			if !errors.Is(err, ErrIndexMedia) {
				t.Errorf("%s %v: %v, want ErrIndexMedia", c.kind, c.names, err)
			}
			continue
		}
		if err != nil || !slices.Equal(s.Names(c.kind), c.want) {
			t.Errorf("%s %v: %v %v", c.kind, c.names, s.Names(c.kind), err)
		}
	}
}

// TestSelfCheck: a context whose profile matches the engine reads ok; one that does
// not reads mismatch with the profile that would match, warns once per interval, and
// still indexes the engine's hashes.
func TestSelfCheck(t *testing.T) {
	r := newTestRig(t)
	engineProfile, _ := hashing.ResolveSpec(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be"})
	wrong, _ := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	good := testKey
	bad := testKey
	bad.ModelName = "other"
	r.register(good, engineProfile)
	r.register(bad, wrong)
	toks := promptOf(128, 3)
	k := chainOf(t, engineProfile, 16, "", "salt", toks)
	hGood := NewEventHandler(Source{Kind: publisher.VLLM, Context: good, Slot: r.slot, Profile: engineProfile}, r.eng, r.log)
	hBad := NewEventHandler(Source{Kind: publisher.VLLM, Context: bad, Slot: r.slot, Profile: wrong}, r.eng, r.log)
	for _, h := range []*EventHandler{hGood, hBad} {
		if st, ok := h.CheckStats(""); !ok || st.String() != "unverified" {
			t.Fatalf("before any event: %v %v", st, ok)
		}
		first := vStoredOf(k, toks, 0, 2, "").with("extra_keys", []any{[]any{"salt"}, nil})
		r.handle(h, first.enc())
		r.handle(h, vStoredOf(k, toks, 2, 5, "").enc(), vStoredOf(k, toks, 5, 8, "").enc())
	}
	if st, _ := hGood.CheckStats(""); st.String() != "ok" || st.Agreed != 3 {
		t.Fatalf("matching profile: %+v", st)
	}
	st, _ := hBad.CheckStats("")
	// The continuations of a mismatching block cannot be verified: their parent's
	// digest under the registered profile is not the engine's.
	if st.String() != `mismatch (engine hashes match python_hash_seed "unset")` || st.Mismatched != 1 || st.Unverifiable != 2 {
		t.Fatalf("wrong seed: %+v (%s)", st, st)
	}
	if hs := hBad.Stats(); hs.HashMismatched != 1 || hs.HashVerified != 1 || hs.HashUnverifiable != 2 {
		t.Fatalf("handler stats %+v", hs)
	}
	// Indexed by the engine's hashes all the same.
	if got := r.tiers(bad, k[:8]); got != tier(128, 128, 128) {
		t.Fatalf("mismatching context's blocks: %+v", got)
	}
	// One warning for several mismatches (the interval is a minute).
	r.handle(hBad, vStoredOf(k, toks, 0, 1, "").with("extra_keys", []any{[]any{"salt"}}).enc())
	if n, attrs := r.logs.count("registered hash profile does not reproduce"); n != 1 || !strings.Contains(attrs, `python_hash_seed \"unset\"`) && !strings.Contains(attrs, `python_hash_seed "unset"`) {
		t.Fatalf("%d warnings, last %q", n, attrs)
	}
	// Off: no check, no token ids decoded.
	off := NewEventHandler(Source{Kind: publisher.VLLM, Context: good, Slot: r.slot, Profile: engineProfile, CheckOff: true}, r.eng, r.log)
	r.handle(off, vStoredOf(k, toks, 0, 2, "").enc())
	if _, ok := off.CheckStats(""); ok || !off.dec.SkipTokenIDs {
		t.Fatal("check off still checks")
	}
}

// TestEventForms: the handler counts map and array events and applies both.
func TestEventForms(t *testing.T) {
	r := newTestRig(t)
	h, _, toks, k := r.vllmSource(testKey, 32, 9, nil)
	arr, err := msgp.AppendIntf(nil, []any{"BlockStored", []any{k[1]}, k[0], anyList(toks[16:32]), 16, nil, "GPU", nil})
	if err != nil {
		t.Fatal(err)
	}
	r.handle(h, vStoredOf(k, toks, 0, 1, "").enc(), arr)
	if got := r.tiers(testKey, k); got != tier(32, 32, 32) {
		t.Fatalf("tiers %+v", got)
	}
	if st := h.Stats(); st.EventsMapForm != 1 || st.EventsArrayForm != 1 || st.EventsApplied != 2 || st.HashVerified != 2 || st.HashMismatched != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// A warm multi-LoRA handler whose batches are checked allocates nothing per batch.
func TestCheckedPathAllocatesNothing(t *testing.T) {
	r := newTestRig(t)
	p, _ := hashing.ResolveSpec(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0",
		IndexProjection: "low64_be", ExtraKeys: "tagged", LoraPath: "/a"})
	base, _ := hashing.ResolveSpec(hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0",
		IndexProjection: "low64_be", ExtraKeys: "tagged"})
	ka := testKey
	ka.LoraName = "a"
	r.register(testKey, base)
	r.register(ka, p)
	h := NewEventHandler(Source{Kind: publisher.VLLM, Context: testKey, Slot: r.slot, Profile: base,
		Check: hashing.CheckConfig{Warmup: 1 << 30}}, r.eng, r.log)
	if err := h.AddContext(ka, p); err != nil {
		t.Fatal(err)
	}
	toks := promptOf(256, 5)
	kb, kl := chainOf(t, base, 16, "", "", toks), chainOf(t, p, 16, "a", "", toks)
	batches := [][]byte{
		batchOf(vStoredOf(kb, toks, 0, 8, "").enc(), vStoredOf(kl, toks, 0, 8, "a").
			with("extra_keys", []any{[]any{"a"}, []any{"a"}, []any{"a"}, []any{"a"}, []any{"a"}, []any{"a"}, []any{"a"}, []any{"a"}}).enc()),
		batchOf(vStoredOf(kb, toks, 8, 16, "").enc(), vRemovedOf(kl[:8], "GPU").enc()),
		batchOf(vRemovedOf(kb[:16], "GPU").enc()),
	}
	run := func() {
		for i, b := range batches {
			if err := h.HandleBatchDeferred(uint64(i), b); err != nil {
				panic(err)
			}
		}
		h.Flush()
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Fatalf("%v allocations per burst", n)
	}
	if st, _ := h.CheckStats("a"); st.String() != "ok" {
		t.Fatalf("lora context check: %+v", st)
	}
	if st, _ := h.CheckStats(""); st.String() != "ok" || st.Agreed < 100 {
		t.Fatalf("base context check: %+v", st)
	}
}

// BenchmarkSelfCheck is the ingest cost of the profile self-check: vLLM batches of one
// BlockStored (16 blocks of 16 ids, a quarter of a prompt, as a scheduler step stores
// them) decoded and applied by two handlers, one with the check at its defaults and one
// without, in alternating chunks of batches so that the machine's load drifts over both
// alike. Reported: process CPU per block of each (decode, check, apply, the context
// writer included), the check's overhead in percent (the bound is 5%) and the
// share of batches the check verified.
func BenchmarkSelfCheck(b *testing.B) {
	p, _ := hashing.Resolve("vllm_v1", "sha256", "0", "low64_be")
	const prompts, perEvent, events = 64, 16, 4 // events per prompt
	const chunk = 1024                          // batches per turn
	var payloads [][]byte
	for i := range prompts {
		toks := promptOf(16*perEvent*events, int32(1000+i*7919))
		keys := chainOf(b, p, 16, "", "", toks)
		for e := range events {
			payloads = append(payloads, batchOf(vStoredOf(keys, toks, e*perEvent, (e+1)*perEvent, "").enc()))
		}
	}
	var hs [2]*EventHandler // on, off
	for j := range hs {
		eng := engine.New(engine.Config{Logger: slog.New(slog.DiscardHandler)})
		defer eng.Close()
		slot := engine.Slot{InstanceID: "e"}
		if _, err := eng.RegisterSlot(testKey, p, slot); err != nil {
			b.Fatal(err)
		}
		hs[j] = NewEventHandler(Source{Kind: publisher.VLLM, Context: testKey, Slot: slot, Profile: p, CheckOff: j == 1},
			eng, slog.New(slog.DiscardHandler))
	}
	var spent [2]time.Duration
	var n [2]int
	checked := 0
	b.ReportAllocs()
	for turn := 0; b.Loop(); turn++ {
		j := turn % 2
		c0 := procCPU(b)
		for k := range chunk {
			i := n[j] + k
			if err := hs[j].HandleBatch(uint64(i), payloads[i%len(payloads)]); err != nil {
				b.Fatal(err)
			}
			if j == 0 && hs[0].checked {
				checked++
			}
		}
		spent[j] += procCPU(b) - c0
		n[j] += chunk
	}
	if n[1] == 0 {
		return // one turn: nothing to compare
	}
	on := float64(spent[0].Nanoseconds()) / float64(n[0]*perEvent)
	off := float64(spent[1].Nanoseconds()) / float64(n[1]*perEvent)
	b.ReportMetric(on, "on-cpu-ns/block")
	b.ReportMetric(off, "off-cpu-ns/block")
	b.ReportMetric(100*(on-off)/off, "overhead-%")
	b.ReportMetric(100*float64(checked)/float64(n[0]), "checked-%")
	if st, ok := hs[0].CheckStats(""); !ok || st.String() != "ok" {
		b.Fatalf("check %+v", st)
	}
}

// Contexts are added and removed while the stream goroutine handles batches (the
// service registers adapters at any time): each batch routes by the contexts it loaded
// at its start, and -race checks that nothing is shared unsynchronised.
func TestContextsChangeWhileHandling(t *testing.T) {
	r := newTestRig(t)
	p, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	ka := testKey
	ka.LoraName = "a"
	r.register(testKey, p)
	r.register(ka, p)
	h := NewEventHandler(Source{Kind: publisher.VLLM, Context: testKey, Slot: r.slot, Profile: p}, r.eng, r.log)
	toks := promptOf(32, 11)
	kA := chainOf(t, p, 16, "a", "", toks)
	batch := batchOf(vStoredOf(kA, toks, 0, 2, "a").enc(), vRemovedOf(kA, "GPU").enc())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 200 {
			if err := h.HandleBatch(uint64(i), batch); err != nil {
				panic(err)
			}
			_ = h.Stats()
		}
	}()
	for range 50 {
		if err := h.AddContext(ka, p); err != nil {
			t.Fatal(err)
		}
		_, _ = h.CheckStats("a")
		h.RemoveContext("a")
	}
	<-done
	st := h.Stats()
	if st.EventsApplied+st.EventsRejected != 400 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSGLangUnmarkedPages: an SGLang source registered for one adapter alone without
// lora_path takes the pages that name no adapter (SGLang <= 0.5.21 names none), as
// before multi-LoRA routing; a store naming another adapter never lands there, and once
// the source has another context, or the adapter has a lora_path (SGLang >= 0.5.23
// names and namespaces its pages), unnamed pages go only to the base model's context.
func TestSGLangUnmarkedPages(t *testing.T) {
	p, _ := hashing.Resolve("sglang", "sha256_raw", "0", "first64_be")
	withPath, _ := hashing.ResolveSpec(hashing.Spec{Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be", LoraPath: "/a"})
	ka := testKey
	ka.LoraName = "a"
	stored := func(hash uint64, lora any) []byte {
		return kvs{"type", "BlockStored", "block_hashes", []any{int64(hash)}, "parent_block_hash", nil,
			"token_ids", anyList(promptOf(16, 1)), "block_size", 16, "lora_id", nil, "lora_name", lora}.enc()
	}
	for _, c := range []struct {
		name     string
		prof     hashing.Profile
		base     bool // the base model registered too
		unnamed  bool // the unnamed page lands in a's context
		rejected uint64
	}{
		{"alone, no path", p, false, true, 1},
		{"alone, with path", withPath, false, false, 2},
		{"beside the base model", p, true, false, 1},
	} {
		r := newTestRig(t)
		r.register(ka, c.prof)
		h := NewEventHandler(Source{Kind: publisher.SGLang, Context: ka, Slot: r.slot, Profile: c.prof, CheckOff: true}, r.eng, r.log)
		if c.base {
			r.register(testKey, p)
			if err := h.AddContext(testKey, p); err != nil {
				t.Fatal(err)
			}
		}
		r.handle(h, stored(1, nil), stored(2, "b"))
		if got := r.tiers(ka, []uint64{1}).Device == 16; got != c.unnamed {
			t.Errorf("%s: unnamed page in a's context: %v", c.name, got)
		}
		if r.tiers(ka, []uint64{2}).Device != 0 || (c.base && r.tiers(testKey, []uint64{2}).Device != 0) {
			t.Errorf("%s: adapter b's page landed in another context", c.name)
		}
		if c.base && r.tiers(testKey, []uint64{1}).Device != 16 {
			t.Errorf("%s: the unnamed page missed the base context", c.name)
		}
		if st := h.Stats(); st.EventsRejected != c.rejected {
			t.Errorf("%s: %d rejected, want %d", c.name, st.EventsRejected, c.rejected)
		}
	}
}
