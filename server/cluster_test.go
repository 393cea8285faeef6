package server

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
)

// startReplica starts an App that is a member of the registry on srv under prefix; mod,
// if not nil, adjusts its cluster configuration.
func startReplica(t *testing.T, srv *etcdtest.Server, prefix string, mod func(*cluster.Config)) *App {
	t.Helper()
	return startReplicaConfig(t, srv, prefix, mod, nil)
}

// startReplicaConfig is startReplica whose App configuration appMod, if not nil, adjusts.
func startReplicaConfig(t *testing.T, srv *etcdtest.Server, prefix string, mod func(*cluster.Config), appMod func(*AppConfig)) *App {
	t.Helper()
	cc := &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: prefix, DialTimeout: 2 * time.Second}
	if mod != nil {
		mod(cc)
	}
	cfg := AppConfig{RPCPort: -1, Cluster: cc}
	if appMod != nil {
		appMod(&cfg)
	}
	return startWith(t, cfg)
}

// registryHead is the registry's current revision.
func registryHead(t *testing.T, srv *etcdtest.Server) int64 {
	t.Helper()
	g, err := srv.Client().Get(context.Background(), "conductor-test-head")
	if err != nil {
		t.Fatal(err)
	}
	return g.Header.Revision
}

// converge waits until every app applied the registry's current revision.
func converge(t *testing.T, srv *etcdtest.Server, apps ...*App) {
	t.Helper()
	rev := registryHead(t, srv)
	for i, a := range apps {
		if !a.WaitRegistryRevision(rev, 10*time.Second) {
			t.Fatalf("replica %d applied revision %d, want %d", i, a.RegistryRevision(), rev)
		}
	}
}

func serviceKeys(a *App) string {
	var ks []string
	for _, c := range a.Service.Services() {
		ks = append(ks, c.Key()+"@"+c.Endpoint)
	}
	return strings.Join(ks, ",")
}

// waitReady waits until every app is ready (its registry loaded).
func waitReady(t *testing.T, apps ...*App) {
	t.Helper()
	eventually(t, "replicas ready", func() error {
		for i, app := range apps {
			if !app.Ready() {
				return errf("replica %d not ready", i)
			}
		}
		return nil
	})
}

// startReplicaPair starts two replicas on srv under prefix and waits until both are ready.
func startReplicaPair(t *testing.T, srv *etcdtest.Server, prefix string) (*App, *App) {
	t.Helper()
	a := startReplica(t, srv, prefix, nil)
	b := startReplica(t, srv, prefix, nil)
	waitReady(t, a, b)
	return a, b
}

// TestClusterRegistrationReplicates: a registration on one replica is registered on the
// other (which then indexes the publisher's events and answers the same); an
// unregistration on the other is gone from both.
func TestClusterRegistrationReplicates(t *testing.T) {
	srv := etcdtest.Start(t)
	a, b := startReplicaPair(t, srv, "/c1/")
	pub := newPublisher(t, false)
	code, resp := msgpackPost(t, a, "/register", registerBody(pub.Endpoint(), "engine-a", 0))
	if code != http.StatusOK {
		t.Fatalf("register on a: %d %v", code, resp)
	}
	converge(t, srv, a, b)
	if serviceKeys(b) != "engine-a|default|0@"+pub.Endpoint() {
		t.Fatalf("replica b services: %q", serviceKeys(b))
	}
	waitSub(t, pub, 2)
	tokens := seqTokens(64, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, stored(keys[:3], "GPU")))
	for _, app := range []*App{a, b} {
		waitDevice(t, app, tokens, "engine-a", 48) // 3 blocks on each replica
	}
	code, resp = msgpackPost(t, b, "/unregister", mp("instance_id", "engine-a", "dp_rank", 0))
	if code != http.StatusOK {
		t.Fatalf("unregister on b: %d %v", code, resp)
	}
	converge(t, srv, a, b)
	for name, app := range map[string]*App{"a": a, "b": b} {
		if k := serviceKeys(app); k != "" {
			t.Fatalf("replica %s still has %q", name, k)
		}
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
		if len(hits(t, r)) != 0 {
			t.Fatalf("replica %s still answers %v", name, r)
		}
	}
}

// TestClusterConflictingRegistrationsOneWins: two replicas validate conflicting
// registrations against the same registry state before either commits (held there by
// the commit hook); the first to commit is acknowledged, the other is refused with the
// single-node conflict (400) and rolled back, and both replicas end with the winner only.
func TestClusterConflictingRegistrationsOneWins(t *testing.T) {
	srv := etcdtest.Start(t)
	pub1, pub2 := newPublisher(t, false), newPublisher(t, false)
	for _, tc := range []struct {
		name       string
		bodyA      []byte
		bodyB      []byte
		wantErr    string
		winnerKeys string
	}{
		{"same endpoint", registerBody(pub1.Endpoint(), "x", 0), registerBody(pub1.Endpoint(), "y", 0),
			"endpoint " + pub1.Endpoint() + " is already used by service x|default|0", "x|default|0@" + pub1.Endpoint()},
		{"same key", registerBody(pub1.Endpoint(), "x", 0), registerBody(pub2.Endpoint(), "x", 0),
			"conflicting registration for service key x|default|0", "x|default|0@" + pub1.Endpoint()},
		{"profile", registerBody(pub1.Endpoint(), "x", 0),
			registerBody(pub2.Endpoint(), "y", 0, "hash_profile", profileMap("vllm_v1", "sha256_cbor", "7", "low64_be")),
			"registration conflicts with the ContextKey hash profile", "x|default|0@" + pub1.Endpoint()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "/conflict-" + strings.ReplaceAll(tc.name, " ", "-") + "/"
			validated := make(chan string, 4)
			releaseA, releaseB := make(chan struct{}), make(chan struct{})
			hook := func(tag string, release chan struct{}) func(string, int) {
				return func(_ string, attempt int) {
					if attempt == 0 {
						validated <- tag
						<-release
					}
				}
			}
			a := startReplica(t, srv, prefix, func(c *cluster.Config) { c.BeforeCommit = hook("a", releaseA) })
			b := startReplica(t, srv, prefix, func(c *cluster.Config) { c.BeforeCommit = hook("b", releaseB) })
			waitReady(t, a, b)
			type result struct {
				code int
				resp map[string]any
			}
			var ra, rb result
			var wg sync.WaitGroup
			wg.Add(2)
			doneA := make(chan struct{})
			go func() {
				defer wg.Done()
				defer close(doneA)
				ra.code, ra.resp = msgpackPost(t, a, "/register", tc.bodyA)
			}()
			go func() { defer wg.Done(); rb.code, rb.resp = msgpackPost(t, b, "/register", tc.bodyB) }()
			<-validated
			<-validated // both validated against the same (empty) registry
			close(releaseA)
			<-doneA // a committed and answered
			close(releaseB)
			wg.Wait()
			if ra.code != http.StatusOK {
				t.Fatalf("first: %d %v", ra.code, ra.resp)
			}
			if rb.code != http.StatusBadRequest || !strings.Contains(rb.resp["error"].(string), tc.wantErr) {
				t.Fatalf("second: %d %v, want 400 %q", rb.code, rb.resp, tc.wantErr)
			}
			converge(t, srv, a, b)
			for name, app := range map[string]*App{"a": a, "b": b} {
				if k := serviceKeys(app); k != tc.winnerKeys {
					t.Fatalf("replica %s services %q, want %q", name, k, tc.winnerKeys)
				}
			}
			// Clean up for the next case (its prefix differs, but the publishers are shared).
			if code, r := msgpackPost(t, a, "/unregister", mp("instance_id", "x", "dp_rank", 0)); code != http.StatusOK {
				t.Fatalf("unregister: %d %v", code, r)
			}
			converge(t, srv, a, b)
		})
	}
}

// TestClusterEtcdOutage: with etcd down, queries keep working, registrations and
// unregistrations fail with 500 and change nothing; once etcd is back, registrations work
// again and reach the other replica.
func TestClusterEtcdOutage(t *testing.T) {
	srv := etcdtest.Start(t)
	a, b := startReplicaPair(t, srv, "/outage/")
	pub1, pub2 := newPublisher(t, false), newPublisher(t, false)
	mustRegister(t, a, "", registerBody(pub1.Endpoint(), "one", 0))
	converge(t, srv, a, b)
	before := serviceKeys(a)

	srv.Stop()
	code, r := msgpackPost(t, a, "/register", registerBody(pub2.Endpoint(), "two", 0))
	if code != http.StatusInternalServerError || !strings.Contains(r["error"].(string), "Failed to persist registration") {
		t.Fatalf("register with etcd down: %d %v", code, r)
	}
	code, r = msgpackPost(t, b, "/unregister", mp("instance_id", "one", "dp_rank", 0))
	if code != http.StatusInternalServerError {
		t.Fatalf("unregister with etcd down: %d %v", code, r)
	}
	if serviceKeys(a) != before || serviceKeys(b) != before {
		t.Fatalf("half-applied: a %q b %q, want %q", serviceKeys(a), serviceKeys(b), before)
	}
	if code, _ := msgpackPost(t, b, "/query", queryBody("m", 16, seqTokens(32, 1))); code != http.StatusOK {
		t.Fatalf("query with etcd down: %d", code)
	}
	if !a.Ready() {
		t.Fatal("a loaded replica stays ready while etcd is away")
	}

	srv.Restart()
	eventually(t, "registration once etcd is back", func() error {
		code, r := msgpackPost(t, a, "/register", registerBody(pub2.Endpoint(), "two", 0))
		if code != http.StatusOK {
			return errf("%d %v", code, r)
		}
		return nil
	})
	converge(t, srv, a, b)
	want := "one|default|0@" + pub1.Endpoint() + ",two|default|0@" + pub2.Endpoint()
	if serviceKeys(a) != want || serviceKeys(b) != want {
		t.Fatalf("after reconnect: a %q b %q, want %q", serviceKeys(a), serviceKeys(b), want)
	}
}

// TestClusterNotReadyUntilRegistryLoaded: a replica that cannot reach etcd at start
// answers /readyz 503 and becomes ready once it has loaded the registry.
func TestClusterNotReadyUntilRegistryLoaded(t *testing.T) {
	srv := etcdtest.Start(t)
	pub := newPublisher(t, false)
	a := startReplica(t, srv, "/ready/", nil)
	waitReady(t, a)
	mustRegister(t, a, "", registerBody(pub.Endpoint(), "one", 0))
	srv.Stop()
	b := startReplica(t, srv, "/ready/", nil)
	if code, _ := httpGet(t, b, "/readyz"); code != http.StatusServiceUnavailable || b.Ready() {
		t.Fatalf("readyz before the registry is loaded: %d", code)
	}
	srv.Restart()
	waitReady(t, b)
	if k := serviceKeys(b); k != "one|default|0@"+pub.Endpoint() {
		t.Fatalf("b loaded %q", k)
	}
}

// TestClusterConfigKey: the "cluster" key's fields, defaults and errors.
func TestClusterConfigKey(t *testing.T) {
	fc, err := LoadConfigFile(writeConfig(t, `{"cluster": {"etcd_endpoints": ["http://127.0.0.1:2379", "https://e2:2379"],
		"advertise_url": "http://10.0.0.5:13333", "dial_timeout_ms": 750}}`))
	if err != nil {
		t.Fatal(err)
	}
	c := fc.AppConfig().Cluster
	if c == nil || len(c.Endpoints) != 2 || c.KeyPrefix != cluster.DefaultKeyPrefix || c.AdvertiseURL != "http://10.0.0.5:13333" ||
		c.DialTimeout != 750*time.Millisecond {
		t.Fatalf("cluster config %+v", c)
	}
	fc, err = LoadConfigFile(writeConfig(t, `{"http_server_port": 13333}`))
	if err != nil || fc.Cluster != nil || fc.AppConfig().Cluster != nil {
		t.Fatalf("absent key: %+v %v", fc.Cluster, err)
	}
	for _, bad := range []struct{ text, want string }{
		{`{"cluster": {}}`, "etcd_endpoints must list"},
		{`{"cluster": {"etcd_endpoints": ["127.0.0.1:2379"]}}`, "is not an http(s)://host:port URL"},
		{`{"cluster": {"etcd_endpoints": ["http://e:1"], "key_prefix": "x/"}}`, "key_prefix must start with /"},
		{`{"cluster": {"etcd_endpoints": ["http://e:1"], "dial_timeout_ms": 0}}`, "dial_timeout_ms must be an integer in 1..600000"},
		{`{"cluster": {"etcd_endpoints": ["http://e:1"], "endpoints": 1}}`, `unknown key(s) "endpoints"`},
		{`{"cluster": [1]}`, "cluster must be an object"},
	} {
		_, err := LoadConfigFile(writeConfig(t, bad.text))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.text, err, bad.want)
		}
	}
}
