package ingest_test

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest"
	"github.com/conductor-go/conductor/ingest/translate"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/wire/publisher"
)

// vllmStepPayload encodes one vLLM KVEventBatch of `events` BlockStored events, each with
// 64 block hashes and their 1024 token ids, as current vLLM publishes a scheduler step
// (bench/sim's encoder, the one the load simulator sends).
func vllmStepPayload(rng *rand.Rand, events int) []byte {
	enc := sim.NewBatchEncoder(publisher.VLLM, sim.StyleCurrent, 16, "")
	keys, toks := make([]uint64, 64), make([]int32, 1024)
	for e := 0; e < events; e++ {
		for i := range keys {
			keys[i] = rng.Uint64() | 1<<63
		}
		parent := rng.Uint64() | 1<<63
		for i := range toks {
			toks[i] = int32(rng.IntN(150000))
		}
		enc.Stored(keys, parent, true, toks, sim.TierDevice)
	}
	return bytes.Clone(enc.Finish(1757500000.25, 0))
}

// BenchmarkIngestEndToEnd: 8 publishers over TCP loopback, each a vLLM engine (its own
// slot in one context) publishing steps of 4 BlockStored events x 64 blocks with token ids;
// 8 subscribers decode and apply through the context's single writer. Reported: blocks
// applied to the index per second, from the first publish to the last block applied.
func BenchmarkIngestEndToEnd(b *testing.B) {
	const pubs, eventsPerStep, blocksPerEvent = 8, 4, 64
	steps := 400
	if b.N == 1 {
		steps = 20 // -benchtime 1x: a smoke run
	}
	p := vllmProfile(b)
	key := engine.ContextKey{TenantID: "default", ModelName: "bench", BlockSize: 16}
	eng := engine.New(engine.Config{Logger: testLogger()})
	defer eng.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	type stream struct {
		pub      *zmqtest.Publisher
		sub      *ingest.Subscriber
		payloads [][]byte
	}
	streams := make([]*stream, pubs)
	for i := range streams {
		pub, err := zmqtest.NewPublisher(zmqtest.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		slot := engine.Slot{InstanceID: "engine-" + strconv.Itoa(i)}
		if _, err := eng.RegisterSlot(key, p, slot); err != nil {
			b.Fatal(err)
		}
		h := translate.NewEventHandler(translate.Source{Name: slot.InstanceID, Kind: publisher.VLLM,
			Endpoint: pub.Endpoint(), Context: key, Slot: slot, Profile: p}, eng, testLogger())
		sub, err := ingest.NewSubscriber(ingest.SubscriberConfig{Name: slot.InstanceID, Endpoint: pub.Endpoint(), Logger: testLogger()}, h)
		if err != nil {
			b.Fatal(err)
		}
		if err := sub.Start(); err != nil {
			b.Fatal(err)
		}
		defer sub.Stop()
		if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
			b.Fatal(err)
		}
		s := &stream{pub: pub, sub: sub}
		for j := 0; j < steps; j++ {
			s.payloads = append(s.payloads, vllmStepPayload(rng, eventsPerStep))
		}
		streams[i] = s
	}
	var payloadBytes int
	for _, pl := range streams[0].payloads {
		payloadBytes += len(pl)
	}
	b.ResetTimer()
	total := 0.0
	elapsed := time.Duration(0)
	for n := 0; n < b.N; n++ {
		before := make([]uint64, pubs)
		for i, s := range streams {
			before[i] = s.sub.Stats().Applied
		}
		start := time.Now()
		done := make(chan struct{}, pubs)
		for _, s := range streams {
			go func(s *stream) {
				for _, pl := range s.payloads {
					if _, err := s.pub.Publish(pl); err != nil {
						b.Error(err)
					}
				}
				done <- struct{}{}
			}(s)
		}
		for range streams {
			<-done
		}
		deadline := time.Now().Add(60 * time.Second)
		for i, s := range streams {
			for s.sub.Stats().Applied < before[i]+uint64(steps) {
				if st := s.sub.Stats(); st.Stale || time.Now().After(deadline) {
					b.Fatalf("stream %d: %+v", i, st)
				}
				time.Sleep(200 * time.Microsecond) // paces the polling (a benchmark: no verdict)
			}
		}
		elapsed += time.Since(start)
		total += float64(pubs * steps * eventsPerStep * blocksPerEvent)
	}
	b.StopTimer()
	b.ReportMetric(total/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(payloadBytes)/float64(steps), "bytes/step")
	st, _ := eng.Stats(key)
	b.ReportMetric(float64(st.Blocks), "indexed-blocks")
}
