package server

import (
	"path/filepath"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/ingest/source"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
	"github.com/conductor-go/conductor/internal/fdtest"
	"github.com/conductor-go/conductor/service"
)

// Services restored from the state file while the process is out of descriptors are not
// lost: they are registered, marked waiting (metric conductor_service_waiting_for_resources),
// and subscribe once descriptors free up.
func TestRestoreOutOfDescriptorsWaitsAndSubscribes(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	pub := newPublisher(t, false)
	first, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, first, "", registerBody(pub.Endpoint(), "engine-a", 0))
	first.Stop()

	// The restore runs in a bare App (no listeners): while the descriptor limit is down,
	// a listener could hit it too, which is issue 12's listener item, not this test's.
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Config{Logger: testLogger()})
	svc := service.New(service.Options{Engine: eng, Logger: testLogger(), Subscribe: service.ZMQSubscriber(source.Options{Transport: tr})})
	app := &App{log: testLogger(), Engine: eng, Service: svc, zmq: tr}
	defer app.Stop()
	// The file is read first: what is under test is subscribing without descriptors.
	sf := &service.StateFile{Path: state, Log: testLogger()}
	loaded, lerr := sf.Load()
	if lerr != nil || len(loaded.Services) != 1 {
		t.Fatalf("state file: %+v, %v", loaded, lerr)
	}
	var restored int
	fdtest.WithRoom(t, 0, func() { restored = app.applyState(sf, loaded, lerr) })
	st := svc.Stats()
	if restored != 1 || len(st) != 1 || !st[0].Stats.Waiting || st[0].Stats.OpenFailures == 0 {
		t.Fatalf("restored %d, stats %+v", restored, st)
	}
	fams, err := NewMetrics(svc).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	waiting := -1.0
	for _, f := range fams {
		if f.GetName() == "conductor_service_waiting_for_resources" && len(f.GetMetric()) == 1 {
			waiting = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if waiting != 1 {
		t.Fatalf("conductor_service_waiting_for_resources = %v", waiting)
	}
	eventually(t, "subscribed", func() error {
		if s := svc.Stats(); s[0].Stats.Waiting {
			return errf("still waiting: %+v", s[0].Stats)
		}
		return nil
	})
	// The first app's subscription counted once already.
	waitSub(t, pub, 2)
	tokens := seqTokens(32, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, stored(keys, "GPU")))
	eventually(t, "events applied", func() error {
		if s := svc.Stats(); s[0].Handler.BlocksApplied != uint64(len(keys)) {
			return errf("blocks applied %d", s[0].Handler.BlocksApplied)
		}
		return nil
	})
	// The service was not rolled back, nor dropped from the state file.
	if got := svc.Services(); len(got) != 1 || got[0].Endpoint != pub.Endpoint() {
		t.Fatalf("services %+v", got)
	}
	if saved, err := (&service.StateFile{Path: state}).Load(); err != nil || len(saved.Services) != 1 {
		t.Fatalf("state file: %+v, %v", saved, err)
	}
}
