package translate

// Socket-free tests of the handler: payloads are encoded here as vLLM publishes them and
// handed to the handler directly; the index is a real engine. The end-to-end tests over
// ZMQ (every field rule, SGLang tiers, Mooncake keys) are in package ingest.

import (
	"log/slog"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/publisher"
)

var testKey = engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}

// vllmBatch encodes a KVEventBatch [ts, events, nil] of one vLLM event per hash list:
// BlockStored on the GPU (block size 16), or BlockRemoved when remove is set. tokens
// token ids are attached to each stored event, as vLLM does, in msgspec's widths.
func vllmBatch(remove bool, tokens int, hashLists ...[]uint64) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1757500000.25)
	b = msgp.AppendArrayHeader(b, uint32(len(hashLists)))
	for _, hs := range hashLists {
		if remove {
			b = msgp.AppendMapHeader(b, 3)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockRemoved")
		} else {
			b = msgp.AppendMapHeader(b, 8)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockStored")
			b = msgp.AppendString(b, "parent_block_hash")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "token_ids")
			b = msgp.AppendArrayHeader(b, uint32(tokens))
			// Token ids as bench/sim sends them: well mixed ids of a 100,000 vocabulary
			// in msgspec's smallest unsigned width (a random mix of uint16 and uint32),
			// not a predictable run.
			for i := range tokens {
				x := uint64(i+1) * 0x9e3779b97f4a7c15
				x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
				x = (x ^ x>>27) * 0x94d049bb133111eb
				b = msgp.AppendUint64(b, (x^x>>31)%100_000)
			}
			b = msgp.AppendString(b, "block_size")
			b = msgp.AppendInt(b, 16)
			b = msgp.AppendString(b, "lora_id")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "lora_name")
			b = msgp.AppendNil(b)
		}
		b = msgp.AppendString(b, "block_hashes")
		b = msgp.AppendArrayHeader(b, uint32(len(hs)))
		for _, h := range hs {
			b = msgp.AppendUint64(b, h)
		}
		b = msgp.AppendString(b, "medium")
		b = msgp.AppendString(b, "GPU")
	}
	return msgp.AppendNil(b)
}

func hashRange(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}

func newHandler(t testing.TB, slots int) (*engine.Engine, []*EventHandler) {
	t.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	eng := engine.New(engine.Config{Logger: log})
	t.Cleanup(eng.Close)
	var hs []*EventHandler
	for i := range slots {
		slot := engine.Slot{InstanceID: "e" + string(rune('a'+i))}
		if _, err := eng.RegisterSlot(testKey, p, slot); err != nil {
			t.Fatal(err)
		}
		hs = append(hs, NewEventHandler(Source{Name: slot.InstanceID, Kind: publisher.VLLM,
			Context: testKey, Slot: slot, Profile: p}, eng, log))
	}
	return eng, hs
}

func blocks(t testing.TB, eng *engine.Engine) int {
	t.Helper()
	st, ok := eng.Stats(testKey)
	if !ok {
		t.Fatal("no context")
	}
	return st.Blocks
}

// TestDeferredBatchesApplyAtFlush: deferred batches reach the index only at Flush, all of
// them, in order, each with its own hashes although the decoder reuses its buffers.
func TestDeferredBatchesApplyAtFlush(t *testing.T) {
	eng, hs := newHandler(t, 1)
	h := hs[0]
	steps := [][]byte{
		vllmBatch(false, 64, hashRange(100, 4)),
		vllmBatch(false, 64, hashRange(200, 4), hashRange(300, 2)),
		vllmBatch(true, 0, hashRange(100, 2)), // removes two of the first batch's blocks
	}
	for i, p := range steps {
		if err := h.HandleBatchDeferred(uint64(i), p); err != nil {
			t.Fatal(err)
		}
	}
	if n := blocks(t, eng); n != 0 {
		t.Fatalf("%d blocks indexed before Flush", n)
	}
	h.Flush()
	if n := blocks(t, eng); n != 8 {
		t.Fatalf("%d blocks after Flush, want 4+4+2-2 = 8", n)
	}
	if st := h.Stats(); st.EventsApplied != 4 || st.BlocksApplied != 12 || st.Batches != 3 ||
		st.BurstBatches != 3 || st.BurstFlushes != 1 {
		t.Fatalf("stats %+v", st)
	}
	h.Flush() // nothing left: a no-op
	if st := h.Stats(); st.EventsApplied != 4 || st.BurstFlushes != 1 {
		t.Fatalf("second Flush applied again: %+v", st)
	}
}

// TestHandleBatchAppliesAtOnce: the non-deferred entry point applies before it returns.
func TestHandleBatchAppliesAtOnce(t *testing.T) {
	eng, hs := newHandler(t, 1)
	if err := hs[0].HandleBatch(0, vllmBatch(false, 16, hashRange(1, 3))); err != nil {
		t.Fatal(err)
	}
	if n := blocks(t, eng); n != 3 {
		t.Fatalf("%d blocks, want 3", n)
	}
	// Not a burst: the burst counters stay at zero.
	if st := hs[0].Stats(); st.BurstBatches != 0 || st.BurstFlushes != 0 || st.Batches != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestStaleAndRestartFlushFirst: what a burst deferred is applied before a retraction,
// so that nothing from before the retraction survives it.
func TestStaleAndRestartFlushFirst(t *testing.T) {
	for _, tc := range []struct {
		name    string
		retract func(h *EventHandler)
	}{
		{"stale", func(h *EventHandler) { h.OnStale("test") }},
		{"restart", func(h *EventHandler) { h.OnPublisherRestart(5, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, hs := newHandler(t, 1)
			h := hs[0]
			if err := h.HandleBatchDeferred(0, vllmBatch(false, 16, hashRange(1, 5))); err != nil {
				t.Fatal(err)
			}
			tc.retract(h)
			h.Flush()
			if n := blocks(t, eng); n != 0 {
				t.Fatalf("%d blocks survive the retraction", n)
			}
			if st := h.Stats(); st.BlocksApplied != 5 {
				t.Fatalf("deferred batch not applied before the retraction: %+v", st)
			}
		})
	}
}

// TestDPRankConflictKeepsEarlierBatches: a batch rejected for its dp_rank does not drop
// the batches deferred before it.
func TestDPRankConflictKeepsEarlierBatches(t *testing.T) {
	eng, hs := newHandler(t, 1)
	h := hs[0]
	if err := h.HandleBatchDeferred(0, vllmBatch(false, 16, hashRange(1, 2))); err != nil {
		t.Fatal(err)
	}
	bad := vllmBatch(false, 16, hashRange(10, 2))
	bad = append(bad[:len(bad)-1], 0x07) // dp_rank 7, registered 0
	if err := h.HandleBatchDeferred(1, bad); err == nil {
		t.Fatal("dp_rank conflict accepted")
	}
	h.Flush()
	if n := blocks(t, eng); n != 2 {
		t.Fatalf("%d blocks, want the 2 of the batch before the conflict", n)
	}
}

// TestBurstIsBounded: a burst that reaches burstMaxHashes is applied without waiting for
// Flush, so one writer request stays bounded.
func TestBurstIsBounded(t *testing.T) {
	eng, hs := newHandler(t, 1)
	h := hs[0]
	per := uint64(512)
	n := burstMaxHashes/int(per) + 1
	for i := range n {
		if err := h.HandleBatchDeferred(uint64(i), vllmBatch(false, 0, hashRange(uint64(i)*per+1, per))); err != nil {
			t.Fatal(err)
		}
	}
	if got := blocks(t, eng); got != burstMaxHashes {
		t.Fatalf("%d blocks before Flush, want the first %d flushed by the bound", got, burstMaxHashes)
	}
	h.Flush()
	if got := blocks(t, eng); got != n*int(per) {
		t.Fatalf("%d blocks after Flush, want %d", got, n*int(per))
	}
	if st := h.Stats(); st.BurstBatches != uint64(n) || st.BurstFlushes != 2 {
		t.Fatalf("burst counters %+v, want %d batches in 2 flushes", st, n)
	}
}

// TestDeferredPathAllocatesNothing: a warm handler defers and flushes bursts without
// allocating.
func TestDeferredPathAllocatesNothing(t *testing.T) {
	_, hs := newHandler(t, 1)
	h := hs[0]
	store := vllmBatch(false, 64, hashRange(1, 16), hashRange(100, 16))
	remove := vllmBatch(true, 0, hashRange(1, 16), hashRange(100, 16))
	seq := uint64(0)
	burst := func() {
		for _, p := range [][]byte{store, remove, store, remove} {
			if err := h.HandleBatchDeferred(seq, p); err != nil {
				panic(err)
			}
			seq++
		}
		h.Flush()
	}
	burst()
	if n := testing.AllocsPerRun(50, burst); n != 0 {
		t.Fatalf("%v allocations per burst", n)
	}
}

// BenchmarkIndexFill decodes and applies, with no socket, what the spawned-binary ingest
// benchmark sends (conductor-bench load --blocks 1015808 --instances 8 --prompt-tokens
// 1024): 8 sources, batches of one BlockStored of 64 new blocks with their 1024 token
// ids, filling an empty index to 1,015,808 blocks; one batch per burst. Reported: process
// CPU per block (the context writer included). At -benchtime 1x a sixteenth of it.
func BenchmarkIndexFill(b *testing.B) {
	const sources, perEvent = 8, 64
	batches := 15872
	if b.N == 1 {
		batches /= 16
	}
	rng := rand.New(rand.NewPCG(1, 2))
	payloads := make([][]byte, batches)
	for i := range payloads {
		hs := make([]uint64, perEvent)
		for j := range hs {
			hs[j] = rng.Uint64()
		}
		payloads[i] = vllmBatch(false, perEvent*16, hs)
	}
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		eng, hs := newHandler(b, sources)
		c0 := procCPU(b)
		b.StartTimer()
		for i, p := range payloads {
			if err := hs[i%sources].HandleBatch(uint64(i/sources), p); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		cpu += procCPU(b) - c0
		if n := blocks(b, eng); n != batches*perEvent {
			b.Fatalf("%d blocks indexed, want %d", n, batches*perEvent)
		}
		eng.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N*batches*perEvent), "cpu-us/block")
}

func procCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
