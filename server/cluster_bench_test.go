package server

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/publisher"
)

var snapshotBlocks = flag.Int("snapshot-blocks", 100_000, "blocks indexed by BenchmarkSnapshot")

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// BenchmarkClusterPropagation: three replicas on one etcd; each op registers a service on
// replica 1 over HTTP and waits until all three have applied it. Reports the p50 and p99
// of the time from sending the registration to the last replica applying it.
//
//	go test -run '^$' -bench ClusterPropagation -benchtime 200x ./server/
func BenchmarkClusterPropagation(b *testing.B) {
	srv := etcdtest.Start(b)
	var apps []*App
	for range 3 {
		apps = append(apps, startWith(b, AppConfig{RPCPort: -1, Logger: quietLogger(),
			Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: "/bench/"}}))
	}
	for _, a := range apps {
		if !a.WaitReady(time.Minute) {
			b.Fatal("replica not ready")
		}
	}
	cli := srv.Client()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		body := registerBody(fmt.Sprintf("tcp://127.0.0.1:%d", 20000+i), fmt.Sprintf("inst-%d", i), 0)
		start := time.Now()
		if code, _, raw := httpRaw(b, apps[0], http.MethodPost, "/register", body, "Content-Type", "application/msgpack"); code != http.StatusOK {
			b.Fatalf("register %d: %d %x", i, code, raw)
		}
		g, err := cli.Get(b.Context(), "/bench/services/", clientv3.WithPrefix())
		if err != nil {
			b.Fatal(err)
		}
		for _, a := range apps {
			if !a.WaitRegistryRevision(g.Header.Revision, 10*time.Second) {
				b.Fatal("replica did not apply the registration")
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkSnapshot: an index of -snapshot-blocks blocks (one context, 4 instances, two
// tiers) is written as a snapshot and loaded into a fresh node; reports the stream's size
// and both times.
//
//	go test -run '^$' -bench 'Snapshot$' -benchtime 1x ./server/ -args -snapshot-blocks=1000000
func BenchmarkSnapshot(b *testing.B) {
	p, _ := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	src := startBenchApp(b)
	key := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	n := *snapshotBlocks
	register := func(app *App) {
		for inst := range 4 {
			cfg := service.Config{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 21000+inst), Kind: publisher.VLLM, ModelName: "m",
				TenantID: "default", InstanceID: fmt.Sprintf("engine-%d", inst), BlockSize: 16, Profile: p}
			if _, err := app.Service.Register(&cfg); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The snapshot names each slot's registration: the loading node registers the same.
	register(src)
	for inst := range 4 {
		s := engine.Slot{InstanceID: fmt.Sprintf("engine-%d", inst)}
		hs := make([]uint64, 0, 4096)
		for i := inst; i < n; i += 4 {
			hs = append(hs, uint64(i+1)*0x9E3779B97F4A7C15)
			if len(hs) == cap(hs) || i+4 >= n {
				ops := []engine.Op{{Kind: engine.OpStore, Slot: s, Tier: engine.TierDevice, Hashes: hs},
					{Kind: engine.OpStore, Slot: s, Tier: engine.TierCPULocal, Hashes: hs}}
				if err := src.Engine.Apply(key, ops); err != nil {
					b.Fatal(err)
				}
				hs = hs[:0]
			}
		}
	}
	var buf bytes.Buffer
	b.ResetTimer()
	for range b.N {
		buf.Reset()
		t0 := time.Now()
		size, err := src.WriteSnapshot(&buf)
		if err != nil {
			b.Fatal(err)
		}
		save := time.Since(t0)
		b.StopTimer()
		dst := startBenchApp(b)
		register(dst)
		b.StartTimer()
		t1 := time.Now()
		res, err := dst.LoadSnapshot(bytes.NewReader(buf.Bytes()))
		if err != nil || res.Applied != int64(n) {
			b.Fatalf("load: %+v %v", res, err)
		}
		load := time.Since(t1)
		b.StopTimer()
		dst.Stop()
		b.StartTimer()
		b.ReportMetric(float64(size), "snapshot-bytes")
		b.ReportMetric(float64(save.Milliseconds()), "save-ms")
		b.ReportMetric(float64(load.Milliseconds()), "load-ms")
	}
}

func startBenchApp(b *testing.B) *App {
	return startWith(b, AppConfig{RPCPort: -1, Logger: quietLogger(), AdminToken: "bench"})
}

// BenchmarkClusterBootstrap: replica A holds an index of -snapshot-blocks blocks (4
// registered instances); each op starts replica B on the same etcd and measures the time
// until B is ready, having loaded A's snapshot.
//
//	go test -run '^$' -bench ClusterBootstrap -benchtime 1x ./server/ -args -snapshot-blocks=1000000
func BenchmarkClusterBootstrap(b *testing.B) {
	srv := etcdtest.Start(b)
	member := func() *App {
		ln := freeTCPPort(b)
		app, err := Start(AppConfig{HTTPPort: ln, RPCPort: -1, Logger: quietLogger(), BindAddress: "127.0.0.1",
			Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: "/bootbench/", AdvertiseURL: fmt.Sprintf("http://127.0.0.1:%d", ln)}})
		if err != nil {
			b.Fatal(err)
		}
		return app
	}
	a := member()
	b.Cleanup(a.Stop)
	if !a.WaitReady(time.Minute) {
		b.Fatal("replica A not ready")
	}
	n := *snapshotBlocks
	// The index comes from real publishers' batches, so that the snapshot carries each
	// source's sequence cut, which a replica requires.
	for inst := range 4 {
		pub := newPublisher(b, false)
		body := registerBody(pub.Endpoint(), fmt.Sprintf("engine-%d", inst), 0)
		if code, _, raw := httpRaw(b, a, http.MethodPost, "/register", body, "Content-Type", "application/msgpack"); code != http.StatusOK {
			b.Fatalf("register: %d %x", code, raw)
		}
		waitSub(b, pub, 1)
		hs := make([]uint64, 0, 4096)
		for i := inst; i < n; i += 4 {
			hs = append(hs, uint64(i+1)*0x9E3779B97F4A7C15)
			if len(hs) == cap(hs) || i+4 >= n {
				mustPublish(b, pub, vllmBatch(0, stored(hs, "GPU")))
				hs = hs[:0]
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Minute); ; {
		if v := a.Engine.GlobalView(); len(v) == 1 && v[0].PrefixCount == uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("replica A indexed %+v, want %d blocks", a.Engine.GlobalView(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		r := member()
		if !r.WaitReady(10 * time.Minute) {
			b.Fatal("replica B not ready")
		}
		took := time.Since(t0)
		b.StopTimer()
		if got := r.Engine.GlobalView(); len(got) != 1 || got[0].PrefixCount != uint64(n) {
			b.Fatalf("replica holds %+v", got)
		}
		r.Stop()
		b.StartTimer()
		b.ReportMetric(float64(took.Milliseconds()), "bootstrap-ms")
	}
}
