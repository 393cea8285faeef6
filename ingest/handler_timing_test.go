package ingest_test

import (
	"fmt"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/wire/publisher"
)

// BenchmarkHandleBatch measures decode + apply of one batch (no ZMQ): a vLLM step that
// stores then removes 16 blocks, and a Mooncake master batch of 16 object events.
func BenchmarkHandleBatch(b *testing.B) {
	p := vllmProfile(b)
	key := vllmKey()
	eng := engine.New(engine.Config{Logger: testLogger()})
	defer eng.Close()
	if _, err := eng.RegisterSlot(key, p, engine.Slot{InstanceID: "e"}); err != nil {
		b.Fatal(err)
	}
	blocks := hashBlocks(b, p, 16, "", tokens(256))
	k := keysOf(blocks)

	b.Run("vLLM", func(b *testing.B) {
		h := translate.NewEventHandler(translate.Source{Kind: publisher.VLLM, Context: key,
			Slot: engine.Slot{InstanceID: "e"}, Profile: p}, eng, testLogger())
		batches := [][]byte{engineBatch(0, vStored(k)), engineBatch(0, vRemoved(k))}
		b.ReportAllocs()
		b.SetBytes(int64(len(batches[0])+len(batches[1])) / 2)
		for i := 0; b.Loop(); i++ {
			if err := h.HandleBatch(uint64(i), batches[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Mooncake", func(b *testing.B) {
		h := translate.NewEventHandler(translate.Source{Name: "master", Kind: publisher.Mooncake,
			Endpoint: "tcp://master", Context: key, Profile: p}, eng, testLogger())
		var st, rm []any
		for _, blk := range blocks {
			objKey := fmt.Sprintf("m@tp_rank:0@pcp0@dcp0@pp_rank:0@%s", blk.hex)
			st = append(st, mcEvent("stored", key, "cpu", objKey))
			rm = append(rm, mcEvent("removed", key, "cpu", objKey))
		}
		batches := [][]byte{mooncakeBatch(st...), mooncakeBatch(rm...)}
		b.ReportAllocs()
		b.SetBytes(int64(len(batches[0])+len(batches[1])) / 2)
		for i := 0; b.Loop(); i++ {
			if err := h.HandleBatch(uint64(i), batches[i%2]); err != nil {
				b.Fatal(err)
			}
		}
		if st := h.Stats(); st.EventsRejected != 0 {
			b.Fatalf("stats = %+v", st)
		}
	})
}
