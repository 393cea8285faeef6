package sim

import (
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// discardSink accepts payloads without keeping them.
type discardSink struct{ n int }

func (d *discardSink) Publish(p []byte) error { d.n += len(p); return nil }

// TestStoreAllocs: a warmed-up rank caches prompts, evicts, demotes and encodes batches
// without allocating.
func TestStoreAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	for _, kind := range []publisher.Kind{publisher.VLLM, publisher.SGLang} {
		r, err := newRank(0, 0, kind, 16, CacheConfig{Device: 64, CPU: 64, Disk: 64}, &discardSink{}, StyleCurrent, "", 32)
		if err != nil {
			t.Fatal(err)
		}
		toks := tokensFor(40, 16)
		prompts := make([][]uint64, 8)
		for i := range prompts {
			prompts[i] = keysOf(uint64(i)<<32, 40)
		}
		i := 0
		step := func() {
			if _, err := r.Store(toks, prompts[i%len(prompts)], 1); err != nil {
				t.Fatal(err)
			}
			i++
		}
		for range 64 {
			step()
		}
		if a := testing.AllocsPerRun(50, step); a != 0 {
			t.Errorf("%s Store: %v allocs per call, want 0", kind, a)
		}
	}
}

// TestHasherAllocs: hashing a prompt into a reused key slice allocates nothing.
func TestHasherAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	h, err := NewHasher(VLLMHash("sha256_cbor", "0"), 16, "", "")
	if err != nil {
		t.Fatal(err)
	}
	toks := AppendPrompt(nil, 1, []uint32{1, 2, 3, 4}, 2048, 0)
	keys := make([]uint64, 0, 128)
	run := func() {
		var err error
		if keys, err = h.AppendKeys(keys[:0], toks); err != nil || len(keys) != 128 {
			t.Fatalf("%d keys, err %v", len(keys), err)
		}
	}
	run()
	if a := testing.AllocsPerRun(20, run); a != 0 {
		t.Errorf("AppendKeys: %v allocs, want 0", a)
	}
	buf := make([]int32, 0, 2048)
	if a := testing.AllocsPerRun(20, func() { buf = AppendPrompt(buf[:0], 1, []uint32{1, 2, 3, 4}, 2048, 0) }); a != 0 {
		t.Errorf("AppendPrompt: %v allocs, want 0", a)
	}
}
