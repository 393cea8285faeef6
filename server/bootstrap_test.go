package server

import (
	"fmt"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/cluster/etcdtest"
)

// fakeInner records what a gate forwards.
type fakeInner struct {
	calls []string
	fail  uint64 // HandleBatch of this seq fails
}

func (f *fakeInner) HandleBatch(seq uint64, payload []byte) error {
	f.calls = append(f.calls, fmt.Sprintf("apply %d %s", seq, payload))
	if seq == f.fail {
		return fmt.Errorf("bad batch")
	}
	return nil
}
func (f *fakeInner) OnStale(reason string)                 { f.calls = append(f.calls, "stale") }
func (f *fakeInner) OnPublisherRestart(last, first uint64) { f.calls = append(f.calls, "restart") }

// TestGateOpen: the gate's decisions at open and on the first live batches after it.
func TestGateOpen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		buffered  []uint64
		threshold uint64
		have      bool
		restart   bool // publisher restart while closed, before the buffered batches
		live      []uint64
		fail      uint64
		want      []string
		stale     bool
	}{
		{name: "no snapshot: apply all", buffered: []uint64{5, 6}, live: []uint64{7},
			want: []string{"apply 5 b5", "apply 6 b6", "apply 7 b7"}},
		{name: "drop what the snapshot holds", buffered: []uint64{5, 6, 7, 8}, threshold: 6, have: true, live: []uint64{9},
			want: []string{"apply 7 b7", "apply 8 b8", "apply 9 b9"}},
		{name: "snapshot ahead of the buffer", buffered: []uint64{5, 6}, threshold: 9, have: true, live: []uint64{9, 10},
			want: []string{"apply 10 b10"}},
		{name: "nothing buffered, next live continues", threshold: 4, have: true, live: []uint64{3, 4, 5, 6},
			want: []string{"apply 5 b5", "apply 6 b6"}},
		{name: "gap in the buffer", buffered: []uint64{8, 9}, threshold: 6, have: true, live: []uint64{10},
			want: []string{"stale"}, stale: true},
		{name: "gap after open", threshold: 6, have: true, live: []uint64{8, 9},
			want: []string{"stale"}},
		{name: "restart while closed: retract, apply the new stream", restart: true, buffered: []uint64{1, 2}, threshold: 50, have: true,
			want: []string{"restart", "apply 1 b1", "apply 2 b2"}},
		{name: "rejected buffered batch", buffered: []uint64{7, 8}, threshold: 6, have: true, fail: 7,
			want: []string{"apply 7 b7", "stale"}, stale: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &fakeInner{fail: tc.fail}
			g := newGate(in, true)
			if tc.restart {
				_ = g.HandleBatch(40, []byte("old"))
				g.OnPublisherRestart(40, 1)
			}
			for _, s := range tc.buffered {
				if err := g.HandleBatch(s, []byte(fmt.Sprintf("b%d", s))); err != nil {
					t.Fatal(err)
				}
			}
			if len(in.calls) != 0 {
				t.Fatalf("closed gate forwarded %v", in.calls)
			}
			stale, _ := g.open(tc.threshold, tc.have)
			if stale != tc.stale {
				t.Fatalf("stale = %v", stale)
			}
			for _, s := range tc.live {
				_ = g.HandleBatch(s, []byte(fmt.Sprintf("b%d", s)))
			}
			if !reflect.DeepEqual(in.calls, tc.want) {
				t.Fatalf("calls %v, want %v", in.calls, tc.want)
			}
		})
	}
}

func freeTCPPort(t *testing.T) int {
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
	app, err := Start(AppConfig{HTTPPort: port, RPCPort: -1, Logger: testLogger(), BindAddress: "127.0.0.1",
		ClusterTestHook: hook,
		Cluster: &cluster.Config{Endpoints: srv.Endpoints(), KeyPrefix: prefix, DialTimeout: 2 * time.Second,
			AdvertiseURL: "http://127.0.0.1:" + strconv.Itoa(port)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Stop)
	return app
}

// TestClusterBootstrapFromPeer: a replica that starts after a peer has indexed events
// loads the peer's snapshot and then continues with the live stream, with events
// published while it subscribed (held, and already in the snapshot) and while it loaded
// (held, not in the snapshot) each applied once: at the end it answers exactly as the
// peer, including for blocks published before it existed.
func TestClusterBootstrapFromPeer(t *testing.T) {
	srv := etcdtest.Start(t)
	a := startMember(t, srv, "/boot/", nil)
	eventually(t, "a ready", func() error {
		if !a.Ready() {
			return errf("not ready")
		}
		return nil
	})
	pub := newPublisher(t, false)
	if code, r := msgpackPost(t, a, "/register", registerBody(pub.Endpoint(), "engine-a", 0)); code != http.StatusOK {
		t.Fatalf("register: %d %v", code, r)
	}
	if err := pub.WaitSubscribers(1, 5e9); err != nil {
		t.Fatal(err)
	}
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
		if _, err := pub.Publish(batch); err != nil {
			t.Fatal(err)
		}
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
			if err := pub.WaitSubscribers(2, 5e9); err != nil {
				t.Error(err)
				return
			}
			publishAndWait(vllmBatch(0, stored(keys[1][:5], "GPU")), 1, 80)
		case "loaded":
			// Published after the snapshot: b must apply it from its buffer or live.
			if _, err := pub.Publish(vllmBatch(0, stored(keys[2][:3], "GPU"), removed(keys[0][4:], "GPU"))); err != nil {
				t.Error(err)
			}
		}
	}
	b := startMember(t, srv, "/boot/", hook)
	eventually(t, "b ready", func() error {
		if !b.Ready() {
			return errf("not ready")
		}
		return nil
	})
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

type nopInner struct{}

func (nopInner) HandleBatch(uint64, []byte) error  { return nil }
func (nopInner) OnStale(string)                    {}
func (nopInner) OnPublisherRestart(uint64, uint64) {}

// BenchmarkGateHandleBatch: what the gate adds to every batch of an open subscription
// (the sequence bookkeeping snapshots read): a lock and two atomic stores.
func BenchmarkGateHandleBatch(b *testing.B) {
	g := newGate(nopInner{}, false)
	payload := make([]byte, 256)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = g.HandleBatch(uint64(i), payload)
	}
}

// TestGateOpenAllocatesNothing guards the open gate's path: no allocation per batch.
func TestGateOpenAllocatesNothing(t *testing.T) {
	g := newGate(nopInner{}, false)
	payload := make([]byte, 256)
	seq := uint64(0)
	if n := testing.AllocsPerRun(1000, func() { seq++; _ = g.HandleBatch(seq, payload) }); n != 0 {
		t.Fatalf("%v allocations per batch", n)
	}
}
