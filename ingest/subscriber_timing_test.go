//go:build cgo

package ingest

import (
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/conductor-go/conductor/bench/sim"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/wire/publisher"
)

// vllmBatch builds a realistic vLLM KVEventBatch payload: one BlockStored event of 64
// block hashes (uint64) over 1024 token ids, about 5.7 KB of msgpack.
func vllmBatch() []byte {
	keys, toks := make([]uint64, 64), make([]int32, 1024)
	h := uint64(0x9e3779b97f4a7c15)
	for i := range keys {
		h = h*6364136223846793005 + 1442695040888963407
		keys[i] = h
	}
	for i := range toks {
		toks[i] = int32(100000 + i*37%50000)
	}
	enc := sim.NewBatchEncoder(publisher.VLLM, sim.StyleMinimal, 16, "")
	enc.Stored(keys, 0, false, toks, sim.TierDevice)
	return enc.Finish(1.7e9, 0)
}

// publishPaced publishes a vLLM batch b.N times, with at most maxInFlight of them not
// yet counted in received, and returns when it started (the timer reset then).
func publishPaced(b *testing.B, p *zmqtest.Publisher, received *atomic.Int64) time.Time {
	payload := vllmBatch()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		for int64(i)-received.Load() >= maxInFlight {
			time.Sleep(50 * time.Microsecond) // back-pressure: at most maxInFlight batches queued
		}
		if _, err := p.Publish(payload); err != nil {
			b.Fatal(err)
		}
	}
	return start
}

type benchHandler struct{ n atomic.Int64 }

func (h *benchHandler) HandleBatch(uint64, []byte) error { h.n.Add(1); return nil }
func (h *benchHandler) OnStale(string)                   {}

// maxInFlight keeps the publisher from queueing unbounded memory ahead of the subscriber,
// so the figure is sustained throughput.
const maxInFlight = 5000

// BenchmarkSubscriberThroughput: batches/s through one subscriber over tcp loopback, from
// publish to HandleBatch, with a trivial handler.
func BenchmarkSubscriberThroughput(b *testing.B) {
	p := zmqtest.NewForTest(b, zmqtest.Config{})
	h := &benchHandler{}
	s := startSub(b, SubscriberConfig{Name: "bench", Endpoint: p.Endpoint()}, h, p)
	start := publishPaced(b, p, &h.n)
	for h.n.Load() < int64(b.N) {
		time.Sleep(50 * time.Microsecond) // paces the wait for the last batches
	}
	b.StopTimer() // the deferred Stop and Close are not part of the figure
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "batches/s")
	if st := s.Stats(); st.Gaps != 0 || st.Stale {
		b.Fatalf("stats = %+v", st)
	}
}

// BenchmarkPebbeSubBaseline is the same stream read with pebbe/zmq4's RecvMessageBytes,
// for comparison with the subscriber's one-call receive shim.
func BenchmarkPebbeSubBaseline(b *testing.B) {
	p, err := zmqtest.NewPublisher(zmqtest.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var n atomic.Int64
	ready := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sub, err := zmq.NewSocket(zmq.SUB)
		if err == nil {
			err = sub.SetSubscribe("")
		}
		if err == nil {
			err = sub.SetRcvtimeo(100 * time.Millisecond)
		}
		if err == nil {
			err = sub.Connect(p.Endpoint())
		}
		ready <- err
		if err != nil {
			return
		}
		defer sub.Close()
		last := time.Now()
		for n.Load() < int64(b.N) && time.Since(last) < 5*time.Second {
			if msg, err := sub.RecvMessageBytes(0); err == nil && len(msg) == 3 {
				n.Add(1)
				last = time.Now()
			}
		}
	}()
	if err := <-ready; err != nil {
		b.Fatal(err)
	}
	if err := p.WaitSubscribers(1, 5*time.Second); err != nil {
		b.Fatal(err)
	}
	start := publishPaced(b, p, &n)
	<-done
	if n.Load() != int64(b.N) {
		b.Fatalf("received %d of %d", n.Load(), b.N)
	}
	b.StopTimer() // the deferred Stop and Close are not part of the figure
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "batches/s")
}
