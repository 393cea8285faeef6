package ingest_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/server"
	"github.com/conductor-go/conductor/service"
)

// serviceApplied is the subscriber's applied-batch counter of one registered service.
func serviceApplied(app *server.App, key string) uint64 {
	for _, s := range app.Service.Stats() {
		if s.Key == key {
			return s.Stats.Applied
		}
	}
	return 0
}

// TestUnregisterDuringTraffic unregisters an engine and a Mooncake master while both
// publishers stream and readers query: afterwards nothing they stored is left, nothing
// panics, and a fresh registration of the same endpoint indexes again.
func TestUnregisterDuringTraffic(t *testing.T) {
	app, err := server.Start(server.AppConfig{HTTPPort: 0, RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Stop)
	enginePub := newPublisher(t, zmqtest.Config{ReplayEndpoint: "tcp://127.0.0.1:*"})
	masterPub := newPublisher(t, zmqtest.Config{})
	reg := func(r service.Registration) string {
		t.Helper()
		r.ModelName, r.BlockSize = "m", 16
		r.Strategy, r.Algorithm, r.PythonHashSeed, r.IndexProjection = "vllm_v1", "sha256_cbor", "0", "low64_be"
		cfg, _, serr := app.Service.RegisterInput(&r)
		if serr != nil {
			t.Fatalf("register %s: %v", r.InstanceID, serr)
		}
		return cfg.Key()
	}
	engineReg := service.Registration{Endpoint: enginePub.Endpoint(), ReplayEndpoint: enginePub.ReplayEndpoint(),
		Type: "vLLM", InstanceID: "vllm-a"}
	engineKey := reg(engineReg)
	masterKey := reg(service.Registration{Endpoint: masterPub.Endpoint(), Type: "Mooncake", InstanceID: "master"})
	for _, p := range []*zmqtest.Publisher{enginePub, masterPub} {
		if err := p.WaitSubscribers(1, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}

	key := vllmKey()
	toks := tokens(256)
	blocks := hashBlocks(t, vllmProfile(t), 16, "", toks)
	k := keysOf(blocks)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // engine: store the prefix, trim it, store it again...
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			n := 1 + i%len(k)
			payload := engineBatch(0, vStored(k[:n]))
			if i%3 == 2 {
				payload = engineBatch(0, vRemoved(k[n-1:n]))
			}
			if _, err := enginePub.Publish(payload); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Microsecond) // paces the traffic
		}
	}()
	go func() { // master: store shared copies of every block, then remove them
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			b := blocks[i%len(blocks)]
			kind := "stored"
			if (i/len(blocks))%2 == 1 {
				kind = "removed"
			}
			ev := mcEvent(kind, key, "cpu", "m@tp_rank:0@pcp0@dcp0@pp_rank:0@"+b.hex)
			if _, err := masterPub.Publish(mooncakeBatch(ev)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(100 * time.Microsecond) // paces the traffic
		}
	}()
	go func() { // a reader that queries all along
		defer wg.Done()
		var res engine.Result
		for !stop.Load() {
			if err := app.Engine.Query(&engine.Query{Key: key, Tokens: toks}, &res); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	stopAll := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer stopAll()

	waitFor(t, "both streams indexing", func() bool {
		return serviceApplied(app, engineKey) >= 30 && serviceApplied(app, masterKey) >= 30
	})
	if _, serr := app.Service.Unregister("vllm-a", "", 0); serr != nil {
		t.Fatal(serr)
	}
	if _, serr := app.Service.Unregister("master", "default", 0); serr != nil {
		t.Fatal(serr)
	}
	// Unregistering closed both subscriptions (each publisher sees its subscriber
	// unsubscribe); the publishers keep sending into the void a while longer.
	for _, p := range []*zmqtest.Publisher{enginePub, masterPub} {
		if err := p.WaitUnsubscribes(1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		sent := p.Sent()
		waitFor(t, "traffic after the unregistration", func() bool { return p.Sent() >= sent+10 })
	}
	stopAll()

	if got := r0hits(t, app, key, toks); len(got) != 0 {
		t.Fatalf("after unregister the answer still lists %v", got)
	}
	if st, ok := app.Engine.Stats(key); !ok || st.Blocks != 0 || st.Slots != 0 {
		t.Fatalf("context after unregister = %+v (found %v), want empty", st, ok)
	}
	if n := len(app.Service.Services()); n != 0 {
		t.Fatalf("%d services left", n)
	}

	// The same endpoint registers again and indexes from the new subscription. (A new
	// subscription may first catch up on what the replay ring still holds, so the engine
	// resets its cache before storing two blocks.)
	reg(engineReg)
	if err := enginePub.WaitSubscribers(2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]byte{engineBatch(0, allCleared), engineBatch(0, vStored(k[:2]))} {
		if _, err := enginePub.Publish(p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "re-registered stream indexes", func() bool {
		in := r0hits(t, app, key, toks)
		return len(in) == 1 && in[0].Device == 32
	})
}

func r0hits(t *testing.T, app *server.App, key engine.ContextKey, toks []int32) []engine.InstanceHit {
	t.Helper()
	var res engine.Result
	if err := app.Engine.Query(&engine.Query{Key: key, Tokens: toks}, &res); err != nil {
		t.Fatal(err)
	}
	return res.Instances
}
