package kvevent_test

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/kvevent"
	"github.com/conductor-go/conductor/wire/publisher"
	"github.com/tinylib/msgp/msgp"
)

// evBenchVLLM builds a vLLM batch as a busy engine sends it: each BlockStored covers
// 64 blocks of 16 tokens (64 hashes, 1024 token ids from a 152K vocabulary, encoded
// in the unsigned widths msgspec picks).
func evBenchVLLM(events int, binHashes bool) []byte {
	rng := rand.New(rand.NewSource(1))
	var evs [][]byte
	for e := 0; e < events; e++ {
		hashes := msgp.AppendArrayHeader(nil, 64)
		for i := 0; i < 64; i++ {
			if binHashes {
				h := make([]byte, 32)
				rng.Read(h)
				hashes = msgp.AppendBytes(hashes, h)
			} else {
				hashes = msgp.AppendUint64(hashes, rng.Uint64())
			}
		}
		tokens := msgp.AppendArrayHeader(nil, 1024)
		for i := 0; i < 1024; i++ {
			tokens = msgp.AppendUint64(tokens, uint64(rng.Intn(151936)))
		}
		extra := msgp.AppendArrayHeader(nil, 64)
		for i := 0; i < 64; i++ {
			extra = msgp.AppendNil(extra)
		}
		evs = append(evs, evVLLMStored().with("block_hashes", hashes).with("parent_block_hash", evU(rng.Uint64())).
			with("token_ids", tokens).with("extra_keys", extra).with("group_idx", evU(0)).
			with("kv_cache_spec_kind", evS("full_attention")).enc())
	}
	return evBatch(evF64(evTS), evU(0), evs...)
}

// evBenchSGLang: SGLang's radix cache sends one BlockStored per page (16 tokens).
func evBenchSGLang(events int) []byte {
	rng := rand.New(rand.NewSource(2))
	var evs [][]byte
	for e := 0; e < events; e++ {
		tokens := msgp.AppendArrayHeader(nil, 16)
		for i := 0; i < 16; i++ {
			tokens = msgp.AppendUint64(tokens, uint64(rng.Intn(151936)))
		}
		evs = append(evs, evSGLangStored().with("block_hashes", evArr(evI(int64(rng.Uint64())))).
			with("parent_block_hash", evI(int64(rng.Uint64()))).with("token_ids", tokens).
			with("block_size", evU(16)).with("medium", evS("GPU")).enc())
	}
	return evBatch(evF64(evTS), evU(0), evs...)
}

// evBenchMooncake: a full master batch (64 events) of stored objects with keys.
func evBenchMooncake(events int) []byte {
	var evs [][]byte
	for e := 0; e < events; e++ {
		evs = append(evs, evMooncakeStored().with("event_id", evU(uint64(e))).
			with("object_key", evS(strings.Replace(evVLLMKey, "tp_rank:0", "tp_rank:"+string(rune('0'+e%8)), 1))).
			with("group_id", evS("0")).enc())
	}
	return evBatch(evU(evMooncakeTS), evU(0), evs...)
}

func evBenchDecode(b *testing.B, kind publisher.Kind, payload []byte) {
	evBenchDecodeWith(b, &kvevent.Decoder{}, kind, payload)
}

func evBenchDecodeWith(b *testing.B, d *kvevent.Decoder, kind publisher.Kind, payload []byte) {
	batch, err := d.Decode(kind, payload)
	if err != nil {
		b.Fatal(err)
	}
	n := len(batch.Events)
	for i := range batch.Events {
		if batch.Events[i].Err != nil {
			b.Fatal(batch.Events[i].Err)
		}
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := d.Decode(kind, payload); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
}

func BenchmarkDecodeVLLM(b *testing.B) {
	b.Run("16x(64 hashes+1024 tokens)", func(b *testing.B) { evBenchDecode(b, publisher.VLLM, evBenchVLLM(16, false)) })
	b.Run("16x(64 bin32 hashes+1024 tokens)", func(b *testing.B) { evBenchDecode(b, publisher.VLLM, evBenchVLLM(16, true)) })
	// What the indexer runs: token ids checked, not stored.
	b.Run("16x(64 hashes+1024 tokens) SkipTokenIDs", func(b *testing.B) {
		evBenchDecodeWith(b, &kvevent.Decoder{SkipTokenIDs: true}, publisher.VLLM, evBenchVLLM(16, false))
	})
}

func BenchmarkDecodeSGLang(b *testing.B) {
	b.Run("64 pages of 16", func(b *testing.B) { evBenchDecode(b, publisher.SGLang, evBenchSGLang(64)) })
	b.Run("64 pages of 16 SkipTokenIDs", func(b *testing.B) {
		evBenchDecodeWith(b, &kvevent.Decoder{SkipTokenIDs: true}, publisher.SGLang, evBenchSGLang(64))
	})
}

func BenchmarkDecodeMooncake(b *testing.B) {
	b.Run("64 stored", func(b *testing.B) { evBenchDecode(b, publisher.Mooncake, evBenchMooncake(64)) })
}
