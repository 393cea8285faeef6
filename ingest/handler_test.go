package ingest_test

// End-to-end tests of event ingestion: a real zmqtest publisher on 127.0.0.1, a real
// ingest.Subscriber feeding an translate.EventHandler, a real engine.Engine, and answers read
// back with engine.Query over hashes computed by hashing.Chain (the same recipe the engines
// use, checked against the shared vectors in package hashing). Payloads are built here
// byte by byte the way vLLM, SGLang and the Mooncake master encode them.

import (
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/internal/enginevectors"
	"github.com/conductor-go/conductor/wire/publisher"
)

// ---- msgpack payload builders ------------------------------------------------------------

// kv is an ordered msgpack map: alternating string keys and values. Values may be kv,
// []any, []uint64, []int64, []int32, raw, or anything msgp.AppendIntf encodes.
type kv []any

// raw is a pre-encoded msgpack value, spliced in as is.
type raw []byte

// with returns a copy of m with the given pairs replacing existing keys or appended.
func (m kv) with(pairs ...any) kv {
	out := slices.Clone(m)
	for i := 0; i < len(pairs); i += 2 {
		found := false
		for j := 0; j < len(out); j += 2 {
			if out[j] == pairs[i] {
				out[j+1] = pairs[i+1]
				found = true
			}
		}
		if !found {
			out = append(out, pairs[i], pairs[i+1])
		}
	}
	return out
}

func enc(b []byte, v any) []byte {
	switch x := v.(type) {
	case kv:
		b = msgp.AppendMapHeader(b, uint32(len(x)/2))
		for i := 0; i < len(x); i += 2 {
			b = msgp.AppendString(b, x[i].(string))
			b = enc(b, x[i+1])
		}
	case raw:
		b = append(b, x...)
	case []any:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = enc(b, e)
		}
	case []uint64:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = msgp.AppendUint64(b, e)
		}
	case []int64:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = msgp.AppendInt64(b, e)
		}
	case []int32:
		b = msgp.AppendArrayHeader(b, uint32(len(x)))
		for _, e := range x {
			b = msgp.AppendInt32(b, e)
		}
	default:
		var err error
		if b, err = msgp.AppendIntf(b, v); err != nil {
			panic(fmt.Sprintf("enc %T: %v", v, err))
		}
	}
	return b
}

// engineBatch is a vLLM/SGLang KVEventBatch [ts float64, events, dp_rank|nil].
func engineBatch(dp any, events ...any) []byte {
	return enc(nil, []any{1757500000.25, events, dp})
}

// mcTS is the Mooncake batch timestamp (ms); every event repeats it.
const mcTS = int64(1757500000250)

// mooncakeBatch is a Mooncake master batch [ts_ms int, events, dp_rank].
func mooncakeBatch(events ...any) []byte {
	return enc(nil, []any{mcTS, events, 0})
}

// vStored is a current-vLLM BlockStored map (defaults omitted) on the GPU, block size 16.
func vStored(hashes []uint64) kv {
	return kv{"type", "BlockStored", "block_hashes", hashes, "parent_block_hash", nil, "token_ids", nil,
		"block_size", 16, "lora_id", nil, "medium", "GPU", "lora_name", nil}
}

func vRemoved(hashes []uint64) kv {
	return kv{"type", "BlockRemoved", "block_hashes", hashes, "medium", "GPU"}
}

var allCleared = kv{"type", "AllBlocksCleared"}

// signed converts projected keys to the signed int64 values SGLang publishes.
func signed(keys []uint64) []int64 {
	out := make([]int64, len(keys))
	for i, k := range keys {
		out[i] = int64(k)
	}
	return out
}

// sStored is an SGLang (map-encoded) BlockStored of one page.
func sStored(key uint64, pageLen int, medium any) kv {
	return kv{"type", "BlockStored", "block_hashes", signed([]uint64{key}), "parent_block_hash", nil,
		"token_ids", nil, "block_size", pageLen, "lora_id", nil, "medium", medium}
}

func sRemoved(key uint64, medium any) kv {
	return kv{"type", "BlockRemoved", "block_hashes", signed([]uint64{key}), "medium", medium}
}

const backendA = "pool-a"

// mcEvent is a Mooncake master event of ctx; stored and removed carry objectKey.
func mcEvent(eventType string, ctx engine.ContextKey, medium, objectKey string) kv {
	ev := kv{"event_id", uint64(7), "timestamp", mcTS, "event_type", eventType, "model_name", ctx.ModelName,
		"block_size", ctx.BlockSize, "additional_salt", nil, "lora_name", nil, "tenant_id", ctx.TenantID,
		"backend_id", backendA, "medium", medium, "dp_rank", 0}
	if eventType == "cleared" {
		return ev
	}
	ev = ev.with("group_id", nil, "seq_hashes", []uint64{}, "base_block_idx", nil, "object_key", objectKey)
	if eventType == "stored" {
		ev = ev.with("parent_hash", nil, "token_ids", nil)
	}
	return ev
}

// ---- rig: engine, publishers, subscribers, queries ---------------------------------------

func testLogger() *slog.Logger {
	if os.Getenv("CONDUCTOR_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func mustProfile(t testing.TB, strategy, algorithm, seed, projection string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve(strategy, algorithm, seed, projection)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func vllmProfile(t testing.TB) hashing.Profile {
	return mustProfile(t, "vllm_v1", "sha256_cbor", "0", "low64_be")
}

func sglangProfile(t testing.TB) hashing.Profile {
	return mustProfile(t, "sglang", "sha256_raw", "", "first64_be")
}

// block is one hashed block: its index key and the hex of its full digest (the hash
// Mooncake store keys carry).
type block struct {
	key uint64
	hex string
}

func hashBlocks(t testing.TB, p hashing.Profile, bs int, lora string, tokens []int32) []block {
	t.Helper()
	var c hashing.Chain
	c.Reset(&p, bs, lora, "", tokens)
	out := make([]block, 0, c.NumBlocks())
	for range c.NumBlocks() {
		k, err := c.Next()
		if err != nil {
			t.Fatal(err)
		}
		d := c.Digest()
		out = append(out, block{key: k, hex: hex.EncodeToString(d[:])})
	}
	return out
}

func keysOf(bs []block) []uint64 {
	out := make([]uint64, len(bs))
	for i, b := range bs {
		out[i] = b.key
	}
	return out
}

func tokens(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i + 1)
	}
	return out
}

type rig struct {
	t   *testing.T
	eng *engine.Engine
	log *slog.Logger
}

func newRig(t *testing.T) *rig {
	t.Helper()
	log := testLogger()
	eng := engine.New(engine.Config{Logger: log})
	t.Cleanup(eng.Close)
	return &rig{t: t, eng: eng, log: log}
}

func (r *rig) registerSlot(key engine.ContextKey, p hashing.Profile, inst string, rank int) {
	r.t.Helper()
	if _, err := r.eng.RegisterSlot(key, p, engine.Slot{InstanceID: inst, DPRank: rank}); err != nil {
		r.t.Fatalf("register %s/%d: %v", inst, rank, err)
	}
}

// stream is one publisher with the subscriber and handler consuming it.
type stream struct {
	t   *testing.T
	pub *zmqtest.Publisher
	sub *ingest.Subscriber
	h   *translate.EventHandler
}

// subConfig keeps every timer short so failure paths end quickly.
func subConfig(name, endpoint, replay string, log *slog.Logger) ingest.SubscriberConfig {
	return ingest.SubscriberConfig{
		Name: name, Endpoint: endpoint, ReplayEndpoint: replay,
		PollTimeout:           10 * time.Millisecond,
		ReplayTimeout:         150 * time.Millisecond,
		ReplayRecoveryTimeout: 800 * time.Millisecond,
		ReconnectDelay:        20 * time.Millisecond,
		Logger:                log,
	}
}

func newPublisher(t *testing.T, cfg zmqtest.Config) *zmqtest.Publisher {
	t.Helper()
	return zmqtest.NewForTest(t, cfg)
}

// attach starts a publisher (cfg) and a subscriber+handler for src, and waits until the
// publisher sees the subscription.
func (r *rig) attach(src translate.Source, cfg zmqtest.Config) *stream {
	r.t.Helper()
	pub := newPublisher(r.t, cfg)
	return r.attachTo(src, pub)
}

func (r *rig) attachTo(src translate.Source, pub *zmqtest.Publisher) *stream {
	r.t.Helper()
	src.Endpoint = pub.Endpoint()
	if src.Name == "" {
		src.Name = src.Slot.InstanceID
	}
	h := translate.NewEventHandler(src, r.eng, r.log)
	sub, err := ingest.NewSubscriber(subConfig(src.Name, pub.Endpoint(), pub.ReplayEndpoint(), r.log), h)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := sub.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(sub.Stop)
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		r.t.Fatal(err)
	}
	return &stream{t: r.t, pub: pub, sub: sub, h: h}
}

func (s *stream) publish(payloads ...[]byte) {
	s.t.Helper()
	for _, p := range payloads {
		if _, err := s.pub.Publish(p); err != nil {
			s.t.Fatal(err)
		}
	}
}

// handled is how many batches the subscriber has finished with (accepted or rejected).
func (s *stream) handled() uint64 {
	st := s.sub.Stats()
	return st.Applied + st.Rejected
}

// publishAndWait publishes and waits until every batch published so far is handled.
func (s *stream) publishAndWait(payloads ...[]byte) {
	s.t.Helper()
	want := s.handled() + uint64(len(payloads))
	s.publish(payloads...)
	waitFor(s.t, fmt.Sprintf("%d batches handled", want), func() bool { return s.handled() >= want })
}

// waitFor waits until cond holds (zmqtest.Await).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	zmqtest.Await(t, what, cond)
}

// hits queries the engine and returns the answer by instance (ranks copied).
func (r *rig) hits(key engine.ContextKey, toks []int32) map[string]engine.InstanceHit {
	r.t.Helper()
	var res engine.Result
	if err := r.eng.Query(&engine.Query{Key: key, Tokens: toks}, &res); err != nil {
		r.t.Fatalf("query: %v", err)
	}
	out := make(map[string]engine.InstanceHit, len(res.Instances))
	for _, in := range res.Instances {
		in.Ranks = slices.Clone(in.Ranks)
		out[in.InstanceID] = in
	}
	return out
}

// tiers returns an instance's tiers; a missing instance fails the test.
func (r *rig) tiers(key engine.ContextKey, toks []int32, inst string) engine.Tiers {
	r.t.Helper()
	in, ok := r.hits(key, toks)[inst]
	if !ok {
		r.t.Fatalf("instance %q missing from the answer", inst)
	}
	return in.Tiers
}

func (r *rig) rankTiers(key engine.ContextKey, toks []int32, inst string, rank int) engine.Tiers {
	r.t.Helper()
	in, ok := r.hits(key, toks)[inst]
	if !ok {
		r.t.Fatalf("instance %q missing from the answer", inst)
	}
	for _, rh := range in.Ranks {
		if rh.Rank == rank {
			return rh.Tiers
		}
	}
	r.t.Fatalf("rank %d of %q missing from the answer", rank, inst)
	return engine.Tiers{}
}

func (r *rig) wantTiers(key engine.ContextKey, toks []int32, inst string, want engine.Tiers) {
	r.t.Helper()
	if got := r.tiers(key, toks, inst); got != want {
		r.t.Fatalf("%s tiers = %+v, want %+v", inst, got, want)
	}
}

func (r *rig) blocks(key engine.ContextKey) int {
	st, ok := r.eng.Stats(key)
	if !ok {
		return -1
	}
	return st.Blocks
}

func device(n int64) engine.Tiers { return engine.Tiers{Device: n, CPULocal: n, CPUShare: n, Disk: n} }

func wantStats(t *testing.T, h *translate.EventHandler, applied, rejected, ignored uint64) {
	t.Helper()
	st := h.Stats()
	if st.EventsApplied != applied || st.EventsRejected != rejected || st.EventsIgnored != ignored {
		t.Fatalf("handler stats = %+v, want applied %d rejected %d ignored %d", st, applied, rejected, ignored)
	}
}

func vllmKey() engine.ContextKey {
	return engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
}

func sglangKey() engine.ContextKey {
	return engine.ContextKey{TenantID: "default", ModelName: "s", BlockSize: 4}
}

// vllmPrompt is a new rig, the vLLM context, the prompt 1..n and its block keys there.
func vllmPrompt(t *testing.T, n int) (r *rig, key engine.ContextKey, toks []int32, k []uint64) {
	t.Helper()
	toks = tokens(n)
	return newRig(t), vllmKey(), toks, keysOf(hashBlocks(t, vllmProfile(t), 16, "", toks))
}

// registeredPrompt is a new rig with inst's rank 0 registered in context key (profile
// p), and the prompt 1..n hashed there.
func registeredPrompt(t *testing.T, key engine.ContextKey, p hashing.Profile, inst string, n int) (*rig, []int32, []block) {
	t.Helper()
	r := newRig(t)
	r.registerSlot(key, p, inst, 0)
	toks := tokens(n)
	return r, toks, hashBlocks(t, p, int(key.BlockSize), "", toks)
}

// vllmStream registers inst/rank in the vLLM context and attaches a stream for it.
func (r *rig) vllmStream(inst string, rank int, cfg zmqtest.Config) *stream {
	r.t.Helper()
	p := vllmProfile(r.t)
	r.registerSlot(vllmKey(), p, inst, rank)
	return r.attach(translate.Source{Kind: publisher.VLLM, Context: vllmKey(),
		Slot: engine.Slot{InstanceID: inst, DPRank: rank}, Profile: p}, cfg)
}

// ---- happy paths -------------------------------------------------------------------------

func TestVLLMStoredRemovedCleared(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 64)
	r0 := r.vllmStream("vllm-a", 0, zmqtest.Config{})
	r1 := r.vllmStream("vllm-a", 1, zmqtest.Config{})

	r0.publishAndWait(engineBatch(0, vStored(k[:3])))
	r1.publishAndWait(engineBatch(1, vStored(k[:1]), vStored(k[1:2])))
	if got := r.rankTiers(key, toks, "vllm-a", 0); got != device(48) {
		t.Fatalf("rank 0 = %+v, want device 48", got)
	}
	if got := r.rankTiers(key, toks, "vllm-a", 1); got != device(32) {
		t.Fatalf("rank 1 = %+v, want device 32", got)
	}
	r.wantTiers(key, toks, "vllm-a", device(48)) // the max over ranks, never a concatenation

	r0.publishAndWait(engineBatch(0, vRemoved(k[1:2])))
	if got := r.rankTiers(key, toks, "vllm-a", 0); got != device(16) {
		t.Fatalf("rank 0 after remove = %+v, want 16", got)
	}
	// A repeated remove is a no-op.
	r0.publishAndWait(engineBatch(0, vRemoved(k[1:2])))

	r0.publishAndWait(engineBatch(0, allCleared))
	if got := r.rankTiers(key, toks, "vllm-a", 0); got != (engine.Tiers{}) {
		t.Fatalf("rank 0 after AllBlocksCleared = %+v, want zeros", got)
	}
	if got := r.rankTiers(key, toks, "vllm-a", 1); got != device(32) {
		t.Fatalf("rank 1 after rank 0 cleared = %+v, want 32 (clear is owner-scoped)", got)
	}
	wantStats(t, r0.h, 4, 0, 0)
	if st := r0.h.Stats(); st.BlocksApplied != 5 || st.BatchesDropped != 0 {
		t.Fatalf("rank 0 stats = %+v", st)
	}
	if st := r0.sub.Stats(); st.Stale || st.Gaps != 0 {
		t.Fatalf("rank 0 subscriber = %+v", st)
	}
}

func loadVectors(t *testing.T) *enginevectors.HashFile {
	t.Helper()
	return enginevectors.HashVectors(t, "..")
}

// TestVLLMVectorPayload feeds the exact payload current vLLM emits (shared vectors) through
// the pipeline of a sha256 (pickle) registration, and checks the vector's block hashes are
// the ones the query side computes.
func TestVLLMVectorPayload(t *testing.T) {
	v := loadVectors(t)
	var want []uint64
	for _, c := range v.VLLM.Cases {
		if c.Algo == "sha256" && c.BlockSize == 16 && c.Variant == "plain" {
			for _, b := range c.Blocks {
				want = append(want, b.EventU64)
			}
		}
	}
	payload, err := hex.DecodeString(v.Events["vllm_current_map_events_int_hashes"].PayloadHex)
	if err != nil || len(want) != 2 {
		t.Fatalf("vector missing: %v, %d blocks", err, len(want))
	}
	r := newRig(t)
	p := mustProfile(t, "vllm_v1", "sha256", "0", "low64_be")
	key := vllmKey()
	r.registerSlot(key, p, "vllm-a", 0)
	s := r.attach(translate.Source{Kind: publisher.VLLM, Context: key,
		Slot: engine.Slot{InstanceID: "vllm-a"}, Profile: p}, zmqtest.Config{Topic: "kv-events"})
	toks := tokens(40)
	got := keysOf(hashBlocks(t, p, 16, "", toks))
	if !slices.Equal(got, want) {
		t.Fatalf("query-side hashes %v, vector %v", got, want)
	}
	// The vector batch: stored {b0,b1}, removed {b0}, cleared.
	s.publishAndWait(payload)
	wantStats(t, s.h, 3, 0, 0)
	if st := s.h.Stats(); st.BlocksApplied != 3 {
		t.Fatalf("blocks applied = %d, want 3", st.BlocksApplied)
	}
	r.wantTiers(key, toks, "vllm-a", engine.Tiers{})
	s.publishAndWait(engineBatch(0, vStored(want)))
	r.wantTiers(key, toks, "vllm-a", device(32))
}

func TestSGLangTiers(t *testing.T) {
	r := newRig(t)
	key := sglangKey()
	p := sglangProfile(t)
	toks := tokens(16)
	k := keysOf(hashBlocks(t, p, 4, "", toks))
	for _, c := range loadVectors(t).SGLang.Cases {
		if c.PageSize == 4 && !c.Bigram && c.Variant == "unsalted" {
			for i := range 4 {
				if int64(k[i]) != c.Pages[i].EventI64 {
					t.Fatalf("page %d: key %d, vector event_i64 %d", i, int64(k[i]), c.Pages[i].EventI64)
				}
			}
		}
	}
	r.registerSlot(key, p, "sgl-a", 0)
	s := r.attach(translate.Source{Kind: publisher.SGLang, Context: key,
		Slot: engine.Slot{InstanceID: "sgl-a"}, Profile: p}, zmqtest.Config{})

	// The integration vector: GPU 1 block, CPU_PINNED 2, DISK 3 (page 4), one event per page.
	s.publishAndWait(engineBatch(0,
		sStored(k[0], 4, "GPU"),
		sStored(k[0], 4, "CPU_PINNED"), sStored(k[1], 4, "CPU_PINNED"),
		sStored(k[0], 4, "DISK"), sStored(k[1], 4, "DISK"), sStored(k[2], 4, "DISK")))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{Device: 4, CPULocal: 8, CPUShare: 8, Disk: 12})

	// A partial last page (2 of 4 tokens) on the GPU, medium nil meaning GPU: 10 tokens hit.
	short := tokens(10)
	ks := keysOf(hashBlocks(t, p, 4, "", short))
	if ks[0] != k[0] || ks[1] != k[1] || ks[2] == k[2] {
		t.Fatal("partial page should share the first two page hashes only")
	}
	s.publishAndWait(engineBatch(nil, sStored(ks[1], 4, "GPU"), sStored(ks[2], 2, nil)))
	r.wantTiers(key, short, "sgl-a", engine.Tiers{Device: 10, CPULocal: 10, CPUShare: 10, Disk: 10})
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{Device: 8, CPULocal: 8, CPUShare: 8, Disk: 12})

	// Invalid SGLang events leave no trace; the valid CPU event after them applies.
	s.publishAndWait(engineBatch(0,
		sStored(k[3], 5, "GPU"),                    // page longer than registered
		sStored(k[3], 4, "GPU").with("lora_id", 1), // SGLang lora_id must be nil
		sStored(k[3], 4, "EXTERNAL"),               // medium not indexed by an engine
		sStored(k[2], 4, "CPU")))                   // plain CPU is cpu_local too
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{Device: 8, CPULocal: 12, CPUShare: 12, Disk: 12})

	// Removal is per tier: dropping page 1 from the GPU leaves it in CPU and disk.
	s.publishAndWait(engineBatch(0, sRemoved(k[1], "GPU")))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{Device: 4, CPULocal: 12, CPUShare: 12, Disk: 12})
	s.publishAndWait(engineBatch(0, sRemoved(k[2], "DISK"), sRemoved(k[2], "CPU_PINNED")))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{Device: 4, CPULocal: 8, CPUShare: 8, Disk: 8})

	// AllBlocksCleared clears every local tier.
	s.publishAndWait(engineBatch(0, allCleared))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{})
	r.wantTiers(key, short, "sgl-a", engine.Tiers{})
	if n := r.blocks(key); n != 0 {
		t.Fatalf("blocks after clear = %d", n)
	}
	wantStats(t, s.h, 6+2+1+1+2+1, 3, 0)
}

func TestMooncakeVLLMKeys(t *testing.T) {
	key, p := vllmKey(), vllmProfile(t)
	r, toks, b := registeredPrompt(t, key, p, "engine-a", 64)
	r.registerSlot(key, p, "engine-b", 0)
	r.registerSlot(key, p, "engine-b", 1)
	s := r.attach(translate.Source{Name: "master", Kind: publisher.Mooncake, Context: key, Profile: p},
		zmqtest.Config{})
	s.pub.Skip(1) // the master numbers batches from 1
	objKey := func(tp, i int) string {
		return fmt.Sprintf("m@tp_rank:%d@pcp0@dcp0@pp_rank:0@%s", tp, b[i].hex)
	}
	everyone := func(want engine.Tiers) {
		t.Helper()
		hits := r.hits(key, toks)
		if len(hits) != 2 {
			t.Fatalf("instances = %v", hits)
		}
		for id, in := range hits {
			for _, rh := range in.Ranks {
				if rh.Tiers != want {
					t.Fatalf("%s rank %d = %+v, want %+v", id, rh.Rank, rh.Tiers, want)
				}
			}
		}
	}

	// Blocks 0 and 1 in memory (two TP ranks each), block 2 on disk.
	s.publishAndWait(mooncakeBatch(
		mcEvent("stored", key, "cpu", objKey(0, 0)), mcEvent("stored", key, "cpu", objKey(1, 0)),
		mcEvent("stored", key, "cpu", objKey(0, 1)), mcEvent("stored", key, "cpu_pinned", objKey(1, 1)),
		mcEvent("stored", key, "disk", objKey(0, 2))))
	everyone(engine.Tiers{CPUShare: 32, Disk: 48})

	// Block 1 stays until both TP ranks' objects are removed.
	s.publishAndWait(mooncakeBatch(mcEvent("removed", key, "cpu", objKey(0, 1))))
	everyone(engine.Tiers{CPUShare: 32, Disk: 48})
	s.publishAndWait(mooncakeBatch(mcEvent("removed", key, "cpu_pinned", objKey(1, 1))))
	everyone(engine.Tiers{CPUShare: 16, Disk: 16})

	// connector_block_hash names the block whatever the key looks like.
	s.publishAndWait(mooncakeBatch(mcEvent("stored", key, "cpu", "opaque-object-17").
		with("connector_block_hash", "0x"+b[1].hex)))
	everyone(engine.Tiers{CPUShare: 32, Disk: 48})

	// Rejected or ignored: unregistered context, group 1, unparsable key without a
	// connector hash, a gpu medium (not a shared tier). None may change the answer.
	other := key
	other.ModelName = "other"
	s.publishAndWait(mooncakeBatch(
		mcEvent("stored", other, "cpu", objKey(0, 3)),
		mcEvent("stored", key, "cpu", objKey(0, 3)).with("group_id", "1"),
		mcEvent("stored", key, "cpu", "not-a-vllm-key"),
		mcEvent("stored", key, "gpu", objKey(0, 3))))
	everyone(engine.Tiers{CPUShare: 32, Disk: 48})
	if _, ok := r.eng.ContextProfile(other); ok {
		t.Fatal("an event for an unregistered context created it")
	}

	// cleared is scoped to backend and tenant.
	s.publishAndWait(mooncakeBatch(mcEvent("cleared", key, "cpu", "").with("backend_id", "pool-b")))
	everyone(engine.Tiers{CPUShare: 32, Disk: 48})
	s.publishAndWait(mooncakeBatch(mcEvent("cleared", key, "cpu", "")))
	everyone(engine.Tiers{})
	if n := r.blocks(key); n != 0 {
		t.Fatalf("blocks after cleared = %d", n)
	}
	wantStats(t, s.h, 5+2+1+1+1, 3, 1)
	if st := s.sub.Stats(); st.Stale || st.Gaps != 0 {
		t.Fatalf("subscriber = %+v", st)
	}
}

func TestMooncakeSGLangKeys(t *testing.T) {
	key, p := sglangKey(), sglangProfile(t)
	r, toks, b := registeredPrompt(t, key, p, "sgl-a", 12)
	s := r.attach(translate.Source{Name: "master", Kind: publisher.Mooncake, Context: key, Profile: p},
		zmqtest.Config{})
	s.pub.Skip(1)
	k := func(i int, comp string) string { return b[i].hex + comp }

	s.publishAndWait(mooncakeBatch(
		mcEvent("stored", key, "cpu", k(0, "_0_k")), mcEvent("stored", key, "cpu", k(0, "_0_v")),
		mcEvent("stored", key, "cpu", k(1, "_0_k")), mcEvent("stored", key, "cpu", k(1, "_0_v")),
		// A namespaced key (model prefix) of page 2, on disk.
		mcEvent("stored", key, "disk", "s_"+k(2, "_0_k"))))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{CPUShare: 8, Disk: 12})

	// K and V are components of one block: it goes with the last of them.
	s.publishAndWait(mooncakeBatch(mcEvent("removed", key, "cpu", k(1, "_0_k"))))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{CPUShare: 8, Disk: 12})
	s.publishAndWait(mooncakeBatch(mcEvent("removed", key, "cpu", k(1, "_0_v"))))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{CPUShare: 4, Disk: 4})

	// connector_block_hash must be the key's own hash. An SGLang master registration
	// indexes only its own context, even into another registered context of the same
	// profile; an unregistered context is refused too.
	sibling := key
	sibling.ModelName = "s2"
	r.registerSlot(sibling, p, "sgl-b", 0)
	other := key
	other.BlockSize = 16
	s.publishAndWait(mooncakeBatch(
		mcEvent("stored", key, "cpu", k(1, "_0_k")).with("connector_block_hash", b[0].hex),
		mcEvent("stored", sibling, "cpu", k(0, "_0_k")),
		mcEvent("stored", other, "cpu", k(1, "_0_k")),
		mcEvent("stored", key, "cpu", k(1, "_0_v")).with("connector_block_hash", b[1].hex)))
	r.wantTiers(key, toks, "sgl-a", engine.Tiers{CPUShare: 8, Disk: 12})
	r.wantTiers(sibling, toks, "sgl-b", engine.Tiers{})
	wantStats(t, s.h, 5+1+1+1, 3, 0)
}

// ---- sequence, replay and stale ----------------------------------------------------------

func TestGapRecoveredByReplayExactlyOnce(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 64)
	s := r.vllmStream("vllm-a", 0, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*", ReplayWithTopic: true})
	s.publishAndWait(engineBatch(0, vStored(k[:1])))
	s.pub.Lose(engineBatch(0, vStored(k[1:3]))) // seq 1: only the replay ring has it
	// seq 2, the live boundary: applied after the replayed seq 1, so block 2 ends removed.
	s.publish(engineBatch(0, vRemoved(k[2:3])))
	waitFor(t, "3 batches", func() bool { return s.handled() >= 3 })
	r.wantTiers(key, toks, "vllm-a", device(32))
	st := s.sub.Stats()
	if st.Applied != 3 || st.ReplaysOK != 1 || st.Gaps != 1 || st.Dropped != 1 || st.Stale {
		t.Fatalf("subscriber = %+v", st)
	}
	if hs := s.h.Stats(); hs.Batches != 3 || hs.EventsApplied != 3 {
		t.Fatalf("handler = %+v (each batch exactly once)", hs)
	}
	if req := s.pub.ReplayRequests(); len(req) != 1 || req[0] != 1 {
		t.Fatalf("replay requests = %v", req)
	}
	s.publishAndWait(engineBatch(0, vStored(k[2:4])))
	r.wantTiers(key, toks, "vllm-a", device(64))
}

// stale publishes a store, opens a gap the way setup describes, and checks the source went
// stale, its entries were retracted, and later events are ignored.
func TestStale(t *testing.T) {
	cases := []struct {
		name   string
		replay bool
		setup  func(s *stream, k []uint64)
	}{
		{"gap without replay", false, func(s *stream, k []uint64) {
			s.pub.Skip(1)
			s.publish(engineBatch(0, vStored(k[1:2])))
		}},
		{"replay buffer misses the gap", true, func(s *stream, k []uint64) {
			s.pub.Skip(1) // burnt: the replay ring never had it
			s.publish(engineBatch(0, vStored(k[1:2])))
		}},
		{"replay never answers", true, func(s *stream, k []uint64) {
			s.pub.SetResponder(zmqtest.Silent)
			s.pub.Lose(engineBatch(0, vStored(k[1:2])))
			s.publish(engineBatch(0, vStored(k[2:3])))
		}},
		{"malformed replay", true, func(s *stream, k []uint64) {
			s.pub.SetResponder(zmqtest.Malformed)
			s.pub.Lose(engineBatch(0, vStored(k[1:2])))
			s.publish(engineBatch(0, vStored(k[2:3])))
		}},
		{"dp_rank conflict", false, func(s *stream, k []uint64) {
			s.publish(engineBatch(nil, vStored(k[1:2]))) // nil dp_rank: accepted
			s.publish(engineBatch(1, vStored(k[2:3])))   // rank 1 on a rank-0 registration
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, key, toks, k := vllmPrompt(t, 48)
			cfg := zmqtest.Config{}
			if tc.replay {
				cfg.ReplayEndpoint = "tcp://127.0.0.1:*"
			}
			s := r.vllmStream("vllm-a", 0, cfg)
			// A second instance's entries must survive the first one going stale.
			bystander := r.vllmStream("vllm-b", 0, zmqtest.Config{})
			bystander.publishAndWait(engineBatch(0, vStored(k[:2])))
			s.publishAndWait(engineBatch(0, vStored(k[:1])))
			r.wantTiers(key, toks, "vllm-a", device(16))
			tc.setup(s, k)
			waitFor(t, "stale", func() bool { return s.sub.Stats().Stale })
			r.wantTiers(key, toks, "vllm-a", engine.Tiers{})
			r.wantTiers(key, toks, "vllm-b", device(32))
			// Events after the stale mark are ignored until re-registration: the stale
			// subscriber closes its SUB socket (the publisher sees it unsubscribe) and
			// reads nothing more.
			before := s.h.Stats().Batches
			s.publish(engineBatch(0, vStored(k[:3])))
			if err := s.pub.WaitUnsubscribes(1, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			if got := s.h.Stats().Batches; got != before {
				t.Fatalf("stale source handled %d more batches", got-before)
			}
			r.wantTiers(key, toks, "vllm-a", engine.Tiers{})
		})
	}
}

func TestMooncakeGapRetractsSource(t *testing.T) {
	key, p := vllmKey(), vllmProfile(t)
	r, toks, b := registeredPrompt(t, key, p, "engine-a", 32)
	m1 := r.attach(translate.Source{Name: "m1", Kind: publisher.Mooncake, Context: key, Profile: p}, zmqtest.Config{})
	m2 := r.attach(translate.Source{Name: "m2", Kind: publisher.Mooncake, Context: key, Profile: p}, zmqtest.Config{})
	keyOf := func(i int) string { return "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + b[i].hex }
	m1.publishAndWait(mooncakeBatch(mcEvent("stored", key, "cpu", keyOf(0)), mcEvent("stored", key, "cpu", keyOf(1))))
	m2.publishAndWait(mooncakeBatch(mcEvent("stored", key, "cpu", keyOf(0))))
	r.wantTiers(key, toks, "engine-a", engine.Tiers{CPUShare: 32, Disk: 32})
	m1.pub.Skip(3) // the master's queue dropped batches: no replay exists
	m1.publish(mooncakeBatch(mcEvent("stored", key, "disk", keyOf(1))))
	waitFor(t, "stale", func() bool { return m1.sub.Stats().Stale })
	// Only m1's bindings went; m2 still holds block 0.
	r.wantTiers(key, toks, "engine-a", engine.Tiers{CPUShare: 16, Disk: 16})
}

func TestMalformedInputChangesNothing(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 48)
	s := r.vllmStream("vllm-a", 0, zmqtest.Config{Topic: "kv-events"})
	s.publishAndWait(engineBatch(0, vStored(k[:1])))

	good := engineBatch(0, vStored(k[1:3]))
	// Malformed messages: no sequence is consumed, nothing reaches the handler.
	next := zmqtest.SeqFrame(s.pub.NextSeq())
	for _, frames := range [][][]byte{
		{[]byte("kv-events"), next},                    // 2 frames
		{[]byte("kv-events"), next[:7], good},          // 7-byte sequence
		{[]byte("kv-events"), next, good, []byte("x")}, // an extra frame
		{[]byte("kv-events"), zmqtest.SeqFrame(1 << 63), good},
	} {
		if err := s.pub.SendRaw(frames...); err != nil {
			t.Fatal(err)
		}
	}
	// Malformed payloads: the sequence advances, the payload is dropped whole.
	truncated := engineBatch(0, vStored(k[1:3]))
	payloads := [][]byte{
		{},
		[]byte("not msgpack"),
		truncated[:len(truncated)-3],
		append(engineBatch(0, vStored(k[1:3])), 0xc0),                  // trailing bytes
		enc(nil, []any{1757500000.25, []any{vStored(k[1:3])}}),         // 2-element envelope
		enc(nil, []any{int64(1757500000), []any{vStored(k[1:3])}, 0}),  // integer timestamp
		enc(nil, []any{1757500000.25, []any{vStored(k[1:3])}, "zero"}), // dp_rank not an int
		// A valid first event followed by a broken one: the payload must not half-apply.
		enc(nil, []any{1757500000.25, []any{vStored(k[1:3]), raw{0x82}}, 0}),
	}
	for _, p := range payloads {
		s.publish(p)
	}
	waitFor(t, "malformed payloads handled", func() bool { return s.handled() >= uint64(1+len(payloads)) })
	r.wantTiers(key, toks, "vllm-a", device(16))
	hs := s.h.Stats()
	if hs.BatchesDropped != uint64(len(payloads)) || hs.EventsApplied != 1 {
		t.Fatalf("handler = %+v", hs)
	}
	st := s.sub.Stats()
	if st.ConsumeErrors != 4 || st.Stale || st.Gaps != 0 {
		t.Fatalf("subscriber = %+v", st)
	}
	// The stream goes on.
	s.publishAndWait(good)
	r.wantTiers(key, toks, "vllm-a", device(48))
}

func TestHandlerTopicIgnored(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 32)
	// The registered type picks the decoder, whatever the topic says.
	s := r.vllmStream("vllm-a", 0, zmqtest.Config{Topic: "sglang-mooncake-misleading"})
	s.publishAndWait(engineBatch(0, vStored(k[:1])))
	if err := s.pub.SendRaw(nil, zmqtest.SeqFrame(s.pub.NextSeq()), engineBatch(0, vStored(k[1:2]))); err != nil {
		t.Fatal(err)
	}
	s.pub.Skip(1) // the raw message above used this sequence
	waitFor(t, "2 batches", func() bool { return s.handled() >= 2 })
	r.wantTiers(key, toks, "vllm-a", device(32))
}

// TestSGLangRejectsMooncakeEnvelope: a master batch on an SGLang registration is dropped as
// an envelope failure; the native stream continues.
func TestSGLangRejectsMooncakeEnvelope(t *testing.T) {
	key, p := sglangKey(), sglangProfile(t)
	r, toks, b := registeredPrompt(t, key, p, "sgl-a", 8)
	s := r.attach(translate.Source{Kind: publisher.SGLang, Context: key,
		Slot: engine.Slot{InstanceID: "sgl-a"}, Profile: p}, zmqtest.Config{})
	s.publishAndWait(mooncakeBatch(mcEvent("stored", key, "cpu", b[0].hex+"_0_k")),
		engineBatch(0, sStored(b[0].key, 4, "GPU")))
	r.wantTiers(key, toks, "sgl-a", device(4))
	if hs := s.h.Stats(); hs.BatchesDropped != 1 || s.sub.Stats().Stale {
		t.Fatalf("handler = %+v", hs)
	}
}

func TestPublisherRestartRetractsOldEntries(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 48)
	s := r.vllmStream("vllm-a", 0, zmqtest.Config{})
	s.publishAndWait(engineBatch(0, vStored(k[:2])), engineBatch(0, vStored(k[2:3])))
	r.wantTiers(key, toks, "vllm-a", device(48))

	ep := s.pub.Endpoint()
	if err := s.pub.Close(); err != nil {
		t.Fatal(err)
	}
	var p2 *zmqtest.Publisher
	var err error
	for range 100 { // the port is free again once Close returns, but allow for TIME_WAIT quirks
		if p2, err = zmqtest.NewPublisher(zmqtest.Config{Endpoint: ep}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // paces the retries of the bind
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p2.Close() })
	if err := p2.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	s.pub = p2
	// The new process starts at seq 0 with an empty cache; it stores block 0 only.
	s.publishAndWait(engineBatch(0, vStored(k[:1])))
	r.wantTiers(key, toks, "vllm-a", device(16))
	if st := s.sub.Stats(); st.Restarts != 1 || st.Stale {
		t.Fatalf("subscriber = %+v", st)
	}
	s.publishAndWait(engineBatch(0, vStored(k[1:3])))
	r.wantTiers(key, toks, "vllm-a", device(48))
}

// ---- vLLM field rules --------------------------------------------------------------------

func TestVLLMFieldRules(t *testing.T) {
	r, key, toks, k := vllmPrompt(t, 64)
	s := r.vllmStream("vllm-a", 0, zmqtest.Config{})
	bad := vStored(k[3:4]) // block 3: any wrongly accepted store shows up as 64 tokens
	// Positional (vLLM <= 0.23) events are decoded like maps, then meet the same rules.
	arrayEvent := raw(enc(nil, []any{"BlockStored", k[3:4], nil, nil, 8, nil, "GPU", nil}))
	s.publishAndWait(engineBatch(0,
		vStored(k[:1]),
		vRemoved(k[:1]).with("group_idx", 2),                    // rejected: would empty block 0
		vRemoved(k[:1]).with("medium", "CPU"),                   // ignored: not the GPU copy
		bad.with("block_size", 8),                               // block size mismatch
		bad.with("lora_name", "other"),                          // LoRA not registered
		bad.with("lora_id", 3),                                  // lora_id without lora_name
		bad.with("lora_id", 0, "lora_name", ""),                 // lora_id must be positive
		bad.with("group_idx", 1),                                // only group 0
		bad.with("kv_cache_spec_kind", "mamba"),                 // unsupported spec
		bad.with("kv_cache_spec_sliding_window", 128),           // sliding window
		bad.with("medium", "CPU"),                               // ignored: not indexed
		bad.with("medium", nil),                                 // ignored: not indexed
		bad.with("block_hashes", "deadbeef"),                    // decoder: wrong type
		bad.with("surprise", kv{"x", 1}, "extra_keys", []any{}), // decoder: extra_keys count
		arrayEvent, // positional, block size mismatch
		vStored(k[1:3]).with("group_idx", 0, "kv_cache_spec_kind", "full_attention",
			"extra_keys", []any{nil, nil}, "future_field", "ignored"),
	))
	r.wantTiers(key, toks, "vllm-a", device(48))
	wantStats(t, s.h, 2, 11, 3)
	if s.sub.Stats().Stale {
		t.Fatal("invalid events must not make the source stale")
	}

	// A LoRA context: matching lora_name (with its adapter id) applies; hashes include it.
	lkey := key
	lkey.LoraName = "lora-a"
	p := vllmProfile(t)
	r.registerSlot(lkey, p, "vllm-l", 0)
	ls := r.attach(translate.Source{Kind: publisher.VLLM, Context: lkey,
		Slot: engine.Slot{InstanceID: "vllm-l"}, Profile: p}, zmqtest.Config{})
	lk := keysOf(hashBlocks(t, p, 16, "lora-a", toks))
	ls.publishAndWait(engineBatch(0,
		vStored(lk[:2]).with("lora_id", 7, "lora_name", "lora-a"),
		vStored(lk[2:3]).with("lora_name", nil))) // no LoRA: rejected in a LoRA context
	r.wantTiers(lkey, toks, "vllm-l", device(32))
	wantStats(t, ls.h, 1, 1, 0)
}

// ---- direct handler checks ---------------------------------------------------------------

// TestMooncakeContextsWithSeparatorBytes: two contexts whose fields differ only in where a
// NUL byte sits must never be confused by the handler's context cache.
func TestMooncakeContextsWithSeparatorBytes(t *testing.T) {
	r := newRig(t)
	p := vllmProfile(t)
	k1 := engine.ContextKey{TenantID: "a\x00b", ModelName: "c", BlockSize: 16}
	k2 := engine.ContextKey{TenantID: "a", ModelName: "b\x00c", BlockSize: 16}
	r.registerSlot(k1, p, "e1", 0)
	r.registerSlot(k2, p, "e2", 0)
	toks := tokens(16)
	b := hashBlocks(t, p, 16, "", toks)
	src := translate.Source{Name: "master", Kind: publisher.Mooncake, Endpoint: "tcp://master", Profile: p}
	h := translate.NewEventHandler(src, r.eng, r.log)
	objKey := "m@tp_rank:0@pcp0@dcp0@pp_rank:0@" + b[0].hex
	if err := h.HandleBatch(1, mooncakeBatch(mcEvent("stored", k1, "cpu", objKey))); err != nil {
		t.Fatal(err)
	}
	if err := h.HandleBatch(2, mooncakeBatch(mcEvent("stored", k2, "disk", objKey))); err != nil {
		t.Fatal(err)
	}
	r.wantTiers(k1, toks, "e1", engine.Tiers{CPUShare: 16, Disk: 16})
	r.wantTiers(k2, toks, "e2", engine.Tiers{Disk: 16})
}

// TestHandleBatchAllocatesNothing: the engine-event path of a warm handler allocates
// nothing per batch (decoder buffers and op slices are reused).
func TestHandleBatchAllocatesNothing(t *testing.T) {
	r := newRig(t)
	for _, tc := range []struct {
		name    string
		kind    publisher.Kind
		key     engine.ContextKey
		profile hashing.Profile
		store   []byte
		remove  []byte
	}{
		{name: "vLLM", kind: publisher.VLLM, key: vllmKey(), profile: vllmProfile(t)},
		{name: "SGLang", kind: publisher.SGLang, key: sglangKey(), profile: sglangProfile(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks := tokens(256)
			k := keysOf(hashBlocks(t, tc.profile, int(tc.key.BlockSize), "", toks))
			var store, remove []byte
			if tc.kind == publisher.VLLM {
				store, remove = engineBatch(0, vStored(k)), engineBatch(0, vRemoved(k))
			} else {
				var st, rm []any
				for _, x := range k {
					st = append(st, sStored(x, 4, "GPU"), sStored(x, 4, "CPU_PINNED"))
					rm = append(rm, sRemoved(x, "GPU"), sRemoved(x, "CPU_PINNED"))
				}
				store, remove = engineBatch(0, st...), engineBatch(0, rm...)
			}
			r.registerSlot(tc.key, tc.profile, "e", 0)
			h := translate.NewEventHandler(translate.Source{Kind: tc.kind, Context: tc.key,
				Slot: engine.Slot{InstanceID: "e"}, Profile: tc.profile}, r.eng, r.log)
			seq := uint64(0)
			step := func() {
				for _, p := range [][]byte{store, remove} {
					if err := h.HandleBatch(seq, p); err != nil {
						t.Fatal(err)
					}
					seq++
				}
			}
			step()
			if n := testing.AllocsPerRun(50, step); n != 0 {
				t.Fatalf("%v allocations per store+remove", n)
			}
			if st := h.Stats(); st.EventsRejected != 0 || st.BatchesDropped != 0 || st.EventsApplied == 0 {
				t.Fatalf("stats = %+v", st)
			}
			r.wantTiers(tc.key, toks, "e", engine.Tiers{})
		})
	}
}
