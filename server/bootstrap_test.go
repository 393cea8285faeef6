package server

import (
	"encoding/binary"
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

// proxiedPeer is a cluster member (a) with one engine publisher registered, advertised
// through a proxy that answers snapshot requests with an older copy while one is set
// (old; with once, to the next request only), and three prompts of 4 blocks to index.
type proxiedPeer struct {
	a       *App
	pub     *zmqtest.Publisher
	prompts [][]int32
	direct  string // a's own address, past the proxy
	old     atomic.Pointer[[]byte]
}

func startProxiedPeer(t *testing.T, srv *etcdtest.Server, prefix string, replay, once bool) *proxiedPeer {
	t.Helper()
	port := freeTCPPort(t)
	p := &proxiedPeer{direct: "http://127.0.0.1:" + strconv.Itoa(port),
		prompts: [][]int32{seqTokens(64, 1), seqTokens(64, 2000), seqTokens(64, 4000)}}
	target, err := url.Parse(p.direct)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == SnapshotPath {
			b := p.old.Load()
			if once {
				b = p.old.Swap(nil)
			}
			if b != nil {
				_, _ = w.Write(*b)
				return
			}
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	p.a = startWith(t, AppConfig{HTTPPort: port, RPCPort: -1,
		Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: prefix, DialTimeout: 2 * time.Second,
			AdvertiseURL: proxy.URL}})
	waitReady(t, p.a)
	p.pub = newPublisher(t, replay)
	body := registerBody(p.pub.Endpoint(), "engine-a", 0)
	if replay {
		body = registerBody(p.pub.Endpoint(), "engine-a", 0, "replay_endpoint", p.pub.ReplayEndpoint())
	}
	mustRegister(t, p.a, "", body)
	waitSub(t, p.pub, 1)
	return p
}

// device is app's device-tier hit for prompt i on engine-a (-1: none).
func (p *proxiedPeer) device(t *testing.T, app *App, i int) int64 {
	t.Helper()
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, p.prompts[i]))
	if inst, ok := hits(t, r)["engine-a"].(map[string]any); ok {
		return asInt(t, inst["device"])
	}
	return -1
}

// publishAndWait publishes prompt i's blocks as one batch and waits until a indexed it.
func (p *proxiedPeer) publishAndWait(t *testing.T, i int) {
	t.Helper()
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", p.prompts[i])
	mustPublish(t, p.pub, vllmBatch(0, stored(keys, "GPU")))
	eventually(t, "peer indexed", func() error {
		if d := p.device(t, p.a, i); d != 64 {
			return errf("prompt %d device %d", i, d)
		}
		return nil
	})
}

// snapshot returns a copy of a's index taken now, past the proxy.
func (p *proxiedPeer) snapshot(t *testing.T) []byte {
	t.Helper()
	resp, err := http.Get(p.direct + SnapshotPath)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("snapshot of a: %d %v", resp.StatusCode, err)
	}
	return snap
}

// TestClusterBootstrapRefetchesBehindSnapshot: a joining replica whose peer's snapshot
// was cut before the first batch it holds (the peer lagged) discards that copy unapplied
// and fetches it again, instead of loading it and marking the source stale. The peer is
// reached through a proxy that answers the first snapshot request with a copy taken two
// batches earlier; b holds only the batch published after it subscribed.
func TestClusterBootstrapRefetchesBehindSnapshot(t *testing.T) {
	srv := etcdtest.Start(t)
	p := startProxiedPeer(t, srv, "/behind/", false, true)
	p.publishAndWait(t, 0)
	snap := p.snapshot(t)
	p.publishAndWait(t, 1) // in a, not in the old copy, and published before b subscribed
	p.old.Store(&snap)

	var behind atomic.Int32
	hook := func(stage string) {
		switch stage {
		case "subscribed":
			if secondSubscriber(t, p.pub) {
				p.publishAndWait(t, 2) // b holds this one only
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
	if p.old.Load() != nil {
		t.Fatal("the old copy was never asked for")
	}
	for _, st := range b.Service.Stats() {
		if st.Stats.Stale {
			t.Fatalf("%s stale after bootstrap", st.Config.Endpoint)
		}
	}
	for i := range p.prompts {
		if d := p.device(t, b, i); d != 64 {
			t.Fatalf("b prompt %d device %d, want 64", i, d)
		}
	}
}

// TestClusterBootstrapHoleHeldBySnapshot: a batch the joining replica can get neither
// live nor from the replay ring (the publisher's ring no longer has it when asked), but
// which the peer applied, does not make the source stale: the peer's snapshot, cut after
// it, holds it. b's catch-up replays the ring without batch 1; it loads a's copy, cut
// at batch 2, and answers as a does, with the hole counted. A copy cut before the hole
// (the proxy keeps serving one taken after batch 0) is fetched again and, on the last
// attempt, loaded with the source marked stale (in b's stats, as a subscriber's).
func TestClusterBootstrapHoleHeldBySnapshot(t *testing.T) {
	for _, behind := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "peer cut before the hole"}[behind], func(t *testing.T) {
			srv := etcdtest.Start(t)
			p := startProxiedPeer(t, srv, "/hole/", true, false)
			var oldSnap []byte
			for i := range p.prompts { // batches 0, 1, 2
				p.publishAndWait(t, i)
				if i == 0 {
					oldSnap = p.snapshot(t)
				}
			}
			if behind {
				p.old.Store(&oldSnap)
			}
			// The ring without batch 1, as a publisher's whose ring moved past it.
			p.pub.SetResponder(func(from uint64, send func(frames ...[]byte) error) {
				p.pub.ReplayFromRing(from, func(frames ...[]byte) error {
					if len(frames) >= 3 && binary.BigEndian.Uint64(frames[len(frames)-2]) == 1 {
						return nil
					}
					return send(frames...)
				})
			})
			var discarded atomic.Int32
			b := startMember(t, srv, "/hole/", func(stage string) {
				if stage == "behind" {
					discarded.Add(1)
				}
			})
			waitReady(t, b)
			st := b.Service.Stats()
			if len(st) != 1 {
				t.Fatalf("%d services on b", len(st))
			}
			if behind {
				if !st[0].Stats.Stale || discarded.Load() != PeerSnapshotAttempts-1 {
					t.Fatalf("b: stale %v after %d copies discarded; want stale after %d (no copy held the lost batch)",
						st[0].Stats.Stale, discarded.Load(), PeerSnapshotAttempts-1)
				}
				// The next batch tells b's subscriber that its gate made the source stale:
				// it closes its sockets (the publisher sees b unsubscribe; a stays).
				p.publishAndWait(t, 0)
				if err := p.pub.WaitUnsubscribes(1, time.Minute); err != nil {
					t.Fatalf("b's stale source kept its subscription: %v", err)
				}
				return
			}
			if st[0].Stats.Stale || st[0].Stats.HolesTaken != 1 || discarded.Load() != 0 {
				t.Fatalf("b: stale %v, holes taken %d, %d copies discarded; want fresh, 1, 0",
					st[0].Stats.Stale, st[0].Stats.HolesTaken, discarded.Load())
			}
			for i := range p.prompts {
				if d := p.device(t, b, i); d != 64 {
					t.Fatalf("b prompt %d device %d, want 64", i, d)
				}
			}
		})
	}
}
