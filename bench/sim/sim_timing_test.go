package sim

import (
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// BenchmarkHasherKeys measures hashing one 2K-token prompt into block keys (bs 16).
func BenchmarkHasherKeys(b *testing.B) {
	for _, algo := range []string{"sha256", "sha256_cbor"} {
		b.Run(algo, func(b *testing.B) {
			h, err := NewHasher(VLLMHash(algo, "0"), 16, "", "")
			if err != nil {
				b.Fatal(err)
			}
			toks := AppendPrompt(nil, 1, []uint32{1, 2, 3, 4}, 2048, 0)
			keys := make([]uint64, 0, 128)
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(toks)))
			for b.Loop() {
				keys, _ = h.AppendKeys(keys[:0], toks)
			}
		})
	}
}

// BenchmarkRankStore measures landing a 128-block prompt on a full rank (half of it a
// hit, half new blocks evicting old ones) including event encoding.
func BenchmarkRankStore(b *testing.B) {
	for _, kind := range []publisher.Kind{publisher.VLLM, publisher.SGLang} {
		b.Run(kind.String(), func(b *testing.B) {
			r, err := newRank(0, 0, kind, 16, CacheConfig{Device: 1024, CPU: 1024, Disk: 1024}, &discardSink{}, StyleMinimal, "", 0)
			if err != nil {
				b.Fatal(err)
			}
			toks := tokensFor(128, 16)
			keys := make([]uint64, 128)
			i := uint64(0)
			b.ReportAllocs()
			for b.Loop() {
				for j := range keys {
					if j < 64 {
						keys[j] = uint64(j)
					} else {
						keys[j] = i<<32 | uint64(j)
					}
				}
				i++
				if _, err := r.Store(toks, keys, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPublish measures sending one 16 KiB batch through a real ZMQ PUB socket with
// no subscriber (the ring copy and three frames).
func BenchmarkPublish(b *testing.B) {
	pub := startTestPublisher(b, PublisherConfig{BufferSteps: 64})
	payload := make([]byte, 16<<10)
	b.ReportAllocs()
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		if err := pub.Publish(payload); err != nil {
			b.Fatal(err)
		}
	}
}
