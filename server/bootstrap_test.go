package server

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/ingest/zmqtest"
)

// freeTCPPort returns a loopback port free at the time of the call.
func freeTCPPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startMember starts a replica that advertises its own HTTP address.
func startMember(t *testing.T, srv *etcdtest.Server, prefix string, hook func(string)) *App {
	t.Helper()
	port := freeTCPPort(t)
	return startWith(t, AppConfig{HTTPPort: port, RPCPort: -1, ClusterTestHook: hook,
		Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: prefix, DialTimeout: 2 * time.Second,
			AdvertiseURL: "http://127.0.0.1:" + strconv.Itoa(port)}})
}

// secondSubscriber waits until the joining replica's subscription has reached pub (in
// its "subscribed" hook, on the replica's goroutine: a failure is reported with t.Error).
func secondSubscriber(t *testing.T, pub *zmqtest.Publisher) bool {
	if err := pub.WaitSubscribers(2, 5e9); err != nil {
		t.Error(err)
		return false
	}
	return true
}

// TestClusterBootstrapFromPeer: a replica that starts after a peer has indexed events
// loads the peer's snapshot and then continues with the live stream, with events
// published while it subscribed (held, and already in the snapshot) and while it loaded
// (held, not in the snapshot) each applied once: at the end it answers exactly as the
// peer, including for blocks published before it existed.
func TestClusterBootstrapFromPeer(t *testing.T) {
	srv := etcdtest.Start(t)
	a := startMember(t, srv, "/boot/", nil)
	waitReady(t, a)
	pub := newPublisher(t, false)
	mustRegister(t, a, "", registerBody(pub.Endpoint(), "engine-a", 0))
	waitSub(t, pub, 1)
	prompts := [][]int32{seqTokens(128, 1), seqTokens(128, 2000), seqTokens(128, 4000)}
	keys := make([][]uint64, len(prompts))
	for i, p := range prompts {
		keys[i] = blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", p)
	}
	device := func(app *App, i int) int64 {
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, prompts[i]))
		if inst, ok := hits(t, r)["engine-a"].(map[string]any); ok {
			return asInt(t, inst["device"])
		}
		return -1
	}
	publishAndWait := func(batch []byte, i int, want int64) {
		t.Helper()
		mustPublish(t, pub, batch)
		eventually(t, "peer indexed", func() error {
			if d := device(a, i); d != want {
				return errf("prompt %d device %d, want %d", i, d, want)
			}
			return nil
		})
	}
	// Before b exists: all 8 blocks of prompt 0.
	publishAndWait(vllmBatch(0, stored(keys[0], "GPU")), 0, 128)

	hook := func(stage string) {
		switch stage {
		case "subscribed":
			// b's subscription is connected and holding batches: this one reaches both,
			// and a has applied it before b asks for the snapshot.
			if secondSubscriber(t, pub) {
				publishAndWait(vllmBatch(0, stored(keys[1][:5], "GPU")), 1, 80)
			}
		case "loaded":
			// Published after the snapshot: b must apply it from its buffer or live.
			if _, err := pub.Publish(vllmBatch(0, stored(keys[2][:3], "GPU"), removed(keys[0][4:], "GPU"))); err != nil {
				t.Error(err)
			}
		}
	}
	b := startMember(t, srv, "/boot/", hook)
	waitReady(t, b)
	eventually(t, "both at the last batch", func() error {
		for _, app := range []*App{a, b} {
			if d := device(app, 2); d != 48 {
				return errf("prompt 2 device %d", d)
			}
		}
		return nil
	})
	for i := range prompts {
		_, ra := msgpackPost(t, a, "/query", queryBody("m", 16, prompts[i]))
		_, rb := msgpackPost(t, b, "/query", queryBody("m", 16, prompts[i]))
		if !reflect.DeepEqual(ra, rb) {
			t.Fatalf("prompt %d: b %v, a %v", i, rb, ra)
		}
	}
	if d := device(b, 0); d != 64 {
		t.Fatalf("b prompt 0 device %d, want 64 (8 blocks stored before it started, 4 removed after)", d)
	}
	if d := device(b, 1); d != 80 {
		t.Fatalf("b prompt 1 device %d, want 80", d)
	}
}

// TestClusterBootstrapRefetchesBehindSnapshot: a joining replica whose peer's snapshot
// was cut before the first batch it holds (the peer lagged) discards that copy unapplied
// and fetches it again, instead of loading it and marking the source stale. The peer is
// reached through a proxy that answers the first snapshot request with a copy taken two
// batches earlier; b holds only the batch published after it subscribed.
func TestClusterBootstrapRefetchesBehindSnapshot(t *testing.T) {
	srv := etcdtest.Start(t)
	port := freeTCPPort(t)
	direct := "http://127.0.0.1:" + strconv.Itoa(port)
	target, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var old atomic.Pointer[[]byte] // served once, to the first snapshot request
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == SnapshotPath {
			if b := old.Swap(nil); b != nil {
				_, _ = w.Write(*b)
				return
			}
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	a := startWith(t, AppConfig{HTTPPort: port, RPCPort: -1,
		Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: "/behind/", DialTimeout: 2 * time.Second,
			AdvertiseURL: proxy.URL}})
	waitReady(t, a)
	pub := newPublisher(t, false)
	mustRegister(t, a, "", registerBody(pub.Endpoint(), "engine-a", 0))
	waitSub(t, pub, 1)
	prompts := [][]int32{seqTokens(64, 1), seqTokens(64, 2000), seqTokens(64, 4000)}
	device := func(app *App, i int) int64 {
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, prompts[i]))
		if inst, ok := hits(t, r)["engine-a"].(map[string]any); ok {
			return asInt(t, inst["device"])
		}
		return -1
	}
	publishAndWait := func(i int) {
		t.Helper()
		keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", prompts[i])
		mustPublish(t, pub, vllmBatch(0, stored(keys, "GPU")))
		eventually(t, "peer indexed", func() error {
			if d := device(a, i); d != 64 {
				return errf("prompt %d device %d", i, d)
			}
			return nil
		})
	}
	publishAndWait(0)
	resp, err := http.Get(direct + SnapshotPath)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("snapshot of a: %d %v", resp.StatusCode, err)
	}
	publishAndWait(1) // in a, not in the old copy, and published before b subscribed
	old.Store(&snap)

	var behind atomic.Int32
	hook := func(stage string) {
		switch stage {
		case "subscribed":
			if secondSubscriber(t, pub) {
				publishAndWait(2) // b holds this one only
			}
		case "behind":
			behind.Add(1)
		}
	}
	b := startMember(t, srv, "/behind/", hook)
	waitReady(t, b)
	if n := behind.Load(); n != 1 {
		t.Fatalf("%d copies discarded as cut before the held batches, want 1", n)
	}
	if old.Load() != nil {
		t.Fatal("the old copy was never asked for")
	}
	for _, st := range b.Service.Stats() {
		if st.Stats.Stale {
			t.Fatalf("%s stale after bootstrap", st.Config.Endpoint)
		}
	}
	for i := range prompts {
		if d := device(b, i); d != 64 {
			t.Fatalf("b prompt %d device %d, want 64", i, d)
		}
	}
}
