package main

import (
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/httpclient"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// TestMeasureQueryDuringPeerBootstrap measures, against real binaries, the /query_by_hash
// latency on a replica holding REPLICA_BLOCKS blocks (default 1M; 4 instances) while
// another replica bootstraps from it, against the same replica idle. Each of
// REPLICA_ROUNDS rounds (default 3) starts a new replica, waits until it is ready and
// kills it. One client sends queries back to back (128 keys, all held by one instance).
// It asserts only correctness (every answer is the expected hit, the new replica holds
// every block) and prints the figures; it runs only when CONDUCTOR_REPLICA_MEASURE=1:
//
//	CONDUCTOR_REPLICA_MEASURE=1 [REPLICA_BLOCKS=1000000] [REPLICA_ROUNDS=3] \
//	  go test -run TestMeasureQueryDuringPeerBootstrap -v ./cmd/mooncake_conductor/
func TestMeasureQueryDuringPeerBootstrap(t *testing.T) {
	if os.Getenv("CONDUCTOR_REPLICA_MEASURE") != "1" {
		t.Skip("set CONDUCTOR_REPLICA_MEASURE=1 to run the bootstrap latency measurement")
	}
	n, rounds := envInt("REPLICA_BLOCKS", 1_000_000), envInt("REPLICA_ROUNDS", 3)
	etcd := etcdtest.Start(t)
	a := startReplicas(t, etcd, 1)[0]

	// The index: n synthetic block keys over 4 instances, published by 4 real publishers
	// (so that a snapshot carries each source's sequence cut, which a joiner requires).
	keyOf := func(i int) uint64 { return uint64(i+1) * 0x9E3779B97F4A7C15 }
	for inst := range 4 {
		pub, err := zmqtest.NewPublisher(zmqtest.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		e := vllmEntry(pub.Endpoint())
		e["instance_id"] = fmt.Sprintf("engine-%d", inst)
		if code, raw, err := postRaw(a.base, "/register", mp(flatten(e)...)); err != nil || code != http.StatusOK {
			t.Fatalf("register on A: %d %v %s", code, err, raw)
		}
		if err := pub.WaitSubscribers(1, time.Minute); err != nil {
			t.Fatal(err)
		}
		hs := make([]uint64, 0, 4096)
		for i := inst; i < n; i += 4 {
			hs = append(hs, keyOf(i))
			if len(hs) == cap(hs) || i+4 >= n {
				if _, err := pub.Publish(vllmBatch(hs)); err != nil {
					t.Fatal(err)
				}
				hs = hs[:0]
			}
		}
	}
	waitFor(t, 5*time.Minute, func() string { return "A indexing the published blocks" }, func() bool {
		v, err := a.cl.GlobalView()
		return err == nil && len(v.Contexts) == 1 && v.Contexts[0].PrefixCount == int64(n)
	})

	hashes := make([]uint64, 128)
	for j := range hashes {
		hashes[j] = keyOf(4 * j) // engine-0's first 128 blocks
	}
	body := httpclient.AppendQueryByHashRequest(nil, &httpclient.QueryByHashRequest{Model: "m", BlockSize: 16, BlockHashes: hashes})
	var res httpclient.QueryResult
	one := func() time.Duration {
		t0 := time.Now()
		code, raw, err := postRaw(a.base, "/query_by_hash", body)
		d := time.Since(t0)
		if err != nil || code != http.StatusOK {
			t.Fatalf("query: %d %v %s", code, err, raw)
		}
		if err := httpclient.DecodeQueryResult(&res, raw); err != nil {
			t.Fatal(err)
		}
		if h := res.Instance("engine-0"); h == nil || h.Device != 128*16 {
			t.Fatalf("answer %+v, want engine-0 with 2048 device tokens", res)
		}
		return d
	}
	measure := func(until func() bool) []time.Duration {
		var ds []time.Duration
		for !until() {
			ds = append(ds, one())
		}
		return ds
	}
	report := func(name string, ds []time.Duration) {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		if len(ds) == 0 {
			t.Logf("%s: no samples", name)
			return
		}
		q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
		t.Logf("%s: %d queries, p50 %v, p99 %v, max %v", name, len(ds), q(0.50), q(0.99), ds[len(ds)-1])
	}
	var idle, during []time.Duration
	took := regexp.MustCompile(`cluster: peer snapshot loaded.*bytes=(\d+).*`)
	for round := 0; round < rounds; round++ {
		deadline := time.Now().Add(2 * time.Second)
		idle = append(idle, measure(func() bool { return time.Now().After(deadline) })...)
		port := freePort(t)
		t0 := time.Now()
		b := startReplica(t, fmt.Sprintf("joiner-%d", round), writeReplicaConfig(t, etcd, port, 2000), port)
		during = append(during, measure(b.ready)...)
		readyAfter := time.Since(t0)
		_, stale, bt, ok := b.bootstrapLineAfterReady()
		m := took.FindStringSubmatch(b.c.out.String())
		if !ok || stale != 0 || m == nil {
			t.Fatalf("joiner did not bootstrap from A:\n%s", b.c.out.String())
		}
		if v, err := b.cl.GlobalView(); err != nil || len(v.Contexts) != 1 || v.Contexts[0].PrefixCount != int64(n) {
			t.Fatalf("joiner holds %+v %v, want %d blocks", v, err, n)
		}
		t.Logf("round %d: joiner ready %v after start; snapshot %s bytes, bootstrap took %s", round, readyAfter.Round(time.Millisecond), m[1], bt)
		b.kill9()
	}
	report("A idle", idle)
	report("A while a peer bootstraps from it", during)
}
