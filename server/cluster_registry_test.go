package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/snapshot"
)

// startReplicaWith is startReplica with the App's configuration adjusted by appMod; it
// waits until the replica is ready.
func startReplicaWith(t *testing.T, srv *etcdtest.Server, prefix string, mod func(*cluster.Config), appMod func(*AppConfig)) *App {
	t.Helper()
	app := startReplicaConfig(t, srv, prefix, mod, appMod)
	if !app.WaitReady(20 * time.Second) {
		t.Fatal("replica not ready")
	}
	return app
}

// registryIDs lists the service ids the registry under prefix holds, sorted.
func registryIDs(t *testing.T, srv *etcdtest.Server, prefix string) []string {
	t.Helper()
	g, err := srv.Client().Get(context.Background(), prefix+"services/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range g.Kvs {
		out = append(out, strings.TrimPrefix(string(kv.Key), prefix+"services/"))
	}
	sort.Strings(out)
	return out
}

// localIDs lists the dynamic services of a replica as registry ids (escaped), sorted.
func localIDs(a *App) []string {
	var out []string
	for _, c := range a.Service.DynamicServices() {
		out = append(out, escID(registryID(c.ID())))
	}
	sort.Strings(out)
	return out
}

// deadEndpoint is a loopback endpoint nobody listens on (registrations only need a
// well-formed endpoint; libzmq keeps trying in the background).
func deadEndpoint(i int) string { return "tcp://127.0.0.1:" + strconv.Itoa(40000+i) }

// TestClusterMaxServicesAcrossReplicas: max_services holds across replicas. Twenty
// registrations on each of two replicas at once (max_services 20): at most 20 are
// acknowledged, the registry holds exactly those, and both replicas end with exactly the
// registry's services, none unapplied. Before, each replica checked only its own count:
// 21 were acknowledged and each replica lacked one the other had.
func TestClusterMaxServicesAcrossReplicas(t *testing.T) {
	const limit = 20
	srv := etcdtest.Start(t)
	prefix := "/maxsvc/"
	lim := func(c *AppConfig) { c.Limits.MaxServices = limit }
	long := func(c *cluster.Config) { c.DialTimeout = 30 * time.Second }
	a := startReplicaWith(t, srv, prefix, long, lim)
	b := startReplicaWith(t, srv, prefix, long, lim)
	var wg sync.WaitGroup
	codes := make([]int, 2*limit)
	bodies := make([]map[string]any, 2*limit)
	start := make(chan struct{})
	for i := range 2 * limit {
		app := a
		if i%2 == 1 {
			app = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			codes[i], bodies[i] = msgpackPost(t, app, "/register", registerBody(deadEndpoint(i), "svc-"+strconv.Itoa(i), 0))
		}()
	}
	close(start)
	wg.Wait()
	var acked []string
	for i, code := range codes {
		switch {
		case code == http.StatusOK:
			acked = append(acked, escID("svc-"+strconv.Itoa(i)+"|default|0"))
		case code == http.StatusBadRequest && strings.Contains(fmt.Sprint(bodies[i]["error"]), "too many services"):
		default:
			t.Fatalf("registration %d: %d %v", i, code, bodies[i])
		}
	}
	sort.Strings(acked)
	if len(acked) > limit {
		t.Fatalf("%d registrations acknowledged, limit %d", len(acked), limit)
	}
	reg := registryIDs(t, srv, prefix)
	if strings.Join(reg, ",") != strings.Join(acked, ",") {
		t.Fatalf("registry holds %v, acknowledged %v", reg, acked)
	}
	converge(t, srv, a, b)
	for name, app := range map[string]*App{"a": a, "b": b} {
		if got := localIDs(app); strings.Join(got, ",") != strings.Join(reg, ",") {
			t.Fatalf("replica %s holds %v, registry %v", name, got, reg)
		}
		if n := app.clusterSync.unappliedN.Load(); n != 0 {
			t.Fatalf("replica %s: %d unapplied", name, n)
		}
	}
}

// TestClusterUnappliedEntryVisibleAndRetried: a registry entry a replica cannot apply
// (here its own max_services is lower than the writer's) is reported (metric, /readyz
// detail) and retried: once an unregistration frees a slot, the replica applies it.
func TestClusterUnappliedEntryVisibleAndRetried(t *testing.T) {
	srv := etcdtest.Start(t)
	prefix := "/unapplied/"
	a := startReplicaWith(t, srv, prefix, nil, nil)
	b := startReplicaWith(t, srv, prefix, nil, func(c *AppConfig) { c.Limits.MaxServices = 2 })
	for i := range 3 {
		mustRegister(t, a, "", registerBody(deadEndpoint(100+i), "u"+strconv.Itoa(i), 0))
	}
	converge(t, srv, a, b)
	if n := len(b.Service.Services()); n != 2 {
		t.Fatalf("b holds %d services, want 2 (its limit)", n)
	}
	if v := gaugeValue(t, b, "conductor_registry_unapplied_services"); v != 1 {
		t.Fatalf("unapplied gauge %v, want 1", v)
	}
	if code, body := httpGet(t, b, "/readyz"); code != http.StatusOK || !strings.Contains(body, `"registry_unapplied":{"u2|default|0":"too many services`) {
		t.Fatalf("readyz %d %s", code, body)
	}
	if code, r := msgpackPost(t, a, "/unregister", mp("instance_id", "u0", "dp_rank", 0)); code != http.StatusOK {
		t.Fatalf("unregister: %d %v", code, r)
	}
	converge(t, srv, a, b)
	eventually(t, "b applies the entry once a slot is free", func() error {
		if got := strings.Join(localIDs(b), ","); got != "u1%7Cdefault%7C0,u2%7Cdefault%7C0" {
			return errf("b holds %s", got)
		}
		if v := gaugeValue(t, b, "conductor_registry_unapplied_services"); v != 0 {
			return errf("unapplied gauge %v", v)
		}
		return nil
	})
}

// TestClusterRepeatedRegistrationReachesRegistry: a registration repeated identically on
// a replica that already holds it is written to the registry again. Here etcd lost it
// (restarted with an empty data directory) and the replica has not noticed yet (its
// reset check is an hour away): before, the repeat answered 200 and wrote nothing, so an
// acknowledged registration was missing from the registry.
func TestClusterRepeatedRegistrationReachesRegistry(t *testing.T) {
	srv := etcdtest.Start(t)
	prefix := "/repeat/"
	a := startReplicaWith(t, srv, prefix, func(c *cluster.Config) { c.ResetCheckInterval = time.Hour }, nil)
	body := registerBody(deadEndpoint(200), "r", 0)
	mustRegister(t, a, "", body)
	srv.Stop()
	srv.RestartEmpty()
	eventually(t, "repeated registration answered", func() error {
		if code, r := msgpackPost(t, a, "/register", body); code != http.StatusOK {
			return errf("%d %v", code, r)
		}
		return nil
	})
	if got := registryIDs(t, srv, prefix); strings.Join(got, ",") != "r%7Cdefault%7C0" {
		t.Fatalf("registry after the repeated registration: %v", got)
	}
}

// TestClusterEtcdResetRepublishes: etcd restarted with an empty data directory (same
// cluster id, revisions from 1). Each replica notices, counts it, writes back the
// registrations it holds, lists the registry again, and follows the registrations made
// after the reset (before, one replica's watch waited for a revision the new etcd had not
// reached and never saw them, both kept services etcd no longer had, and nothing was
// logged).
func TestClusterEtcdResetRepublishes(t *testing.T) {
	srv := etcdtest.Start(t)
	prefix := "/reset/"
	fast := func(c *cluster.Config) { c.ResetCheckInterval = 50 * time.Millisecond }
	a := startReplicaWith(t, srv, prefix, fast, nil)
	b := startReplicaWith(t, srv, prefix, fast, nil)
	for i, app := range []*App{a, b, a} {
		mustRegister(t, app, "", registerBody(deadEndpoint(300+i), "p"+strconv.Itoa(i), 0))
	}
	converge(t, srv, a, b)
	before := registryIDs(t, srv, prefix)
	srv.Stop()
	srv.RestartEmpty()
	eventually(t, "both replicas found the reset and wrote back", func() error {
		for name, app := range map[string]*App{"a": a, "b": b} {
			if app.registry.Resets() != 1 {
				return errf("replica %s: %d resets", name, app.registry.Resets())
			}
		}
		if got := registryIDs(t, srv, prefix); strings.Join(got, ",") != strings.Join(before, ",") {
			return errf("registry holds %v, want %v", got, before)
		}
		return nil
	})
	if v := a.clusterSync.republished.Load() + b.clusterSync.republished.Load(); v != uint64(len(before)) {
		t.Fatalf("%d written back, want %d (each once)", v, len(before))
	}
	// A registration after the reset reaches the other replica.
	mustRegister(t, b, "", registerBody(deadEndpoint(310), "after", 0))
	want := strings.Join(registryIDs(t, srv, prefix), ",")
	eventually(t, "both replicas hold the registry", func() error {
		for name, app := range map[string]*App{"a": a, "b": b} {
			if got := strings.Join(localIDs(app), ","); got != want {
				return errf("replica %s holds %s, registry %s", name, got, want)
			}
		}
		return nil
	})
}

func escID(id string) string { return url.PathEscape(id) }

// TestClusterSnapshotMatchesRegistry: a replica accepts only snapshots signed with its
// cluster's key (from the registry; one signed with a single node's token key is 403),
// applies a service's entries only where its registration here has the endpoint the
// snapshot names and the snapshot has that service's sequence cut, and refuses (409) a
// snapshot whose context has another hash profile than the registry's.
func TestClusterSnapshotMatchesRegistry(t *testing.T) {
	const token = "s3cret"
	srv := etcdtest.Start(t)
	a := startReplicaWith(t, srv, "/snapmatch/", nil, func(c *AppConfig) { c.AdminToken = token })
	pub := newPublisher(t, false)
	mustRegister(t, a, token, registerBody(pub.Endpoint(), "x", 0))
	info, ok := a.registry.Info()
	if !ok {
		t.Fatal("no cluster key")
	}
	tokens := seqTokens(64, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	ctxKey := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	slot := engine.Slot{InstanceID: "x"}
	snap := func(key []byte, p hashing.Profile, src snapshot.Source) []byte {
		var buf bytes.Buffer
		w := snapshot.NewWriter(&buf, key)
		if err := w.Context(&snapshot.Header{Key: ctxKey, Profile: p, Sources: []snapshot.Source{src}}); err != nil {
			t.Fatal(err)
		}
		ch := &engine.SnapshotChunk{Slots: []engine.Slot{slot}}
		for _, k := range keys[:3] {
			ch.Entries = append(ch.Entries, engine.SnapshotEntry{Key: k, Tiers: engine.MaskDevice})
		}
		if err := w.Chunk(ch); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	good := snapshot.Source{Endpoint: pub.Endpoint(), Slot: slot, Seq: 5, HasSeq: true}
	noCut := good
	noCut.HasSeq = false
	otherEP := good
	otherEP.Endpoint = "tcp://127.0.0.1:1"
	for _, c := range []struct {
		name string
		body []byte
		code int
		want string
	}{
		{"token key", snap(snapshot.KeyFromToken(token), vllmP(t, "0"), good), http.StatusForbidden, "not signed"},
		{"no cut", snap(info.Key(), vllmP(t, "0"), noCut), http.StatusOK, "no sequence cut in the snapshot"},
		{"other endpoint", snap(info.Key(), vllmP(t, "0"), otherEP), http.StatusOK, "registered here with another endpoint"},
		{"other profile", snap(info.Key(), vllmP(t, "7"), good), http.StatusConflict, "another hash profile"},
	} {
		code, body := snapshotRequest(t, a, http.MethodPost, token, c.body)
		if code != c.code || !strings.Contains(string(body), c.want) {
			t.Fatalf("%s: %d %s, want %d %q", c.name, code, body, c.code, c.want)
		}
		if n := a.Engine.TotalBlocks(); n != 0 {
			t.Fatalf("%s: %d blocks applied", c.name, n)
		}
	}
	code, body := snapshotRequest(t, a, http.MethodPost, token, snap(info.Key(), vllmP(t, "0"), good))
	if code != http.StatusOK || !strings.Contains(string(body), `"applied":3`) {
		t.Fatalf("matching snapshot: %d %s", code, body)
	}
}
