package source

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/conductor-go/conductor/cluster/etcdtest"
)

func TestParseMasterLocator(t *testing.T) {
	ok := []struct {
		in      string
		etcd    []string
		cluster string
		port    int
		key     string
	}{
		{"etcd://127.0.0.1:2379/mooncake?event_port=5557", []string{"127.0.0.1:2379"}, "mooncake", 5557, "mooncake-store/mooncake/master_view"},
		{"etcd://a:1,b.example:65535/prod/eu-1?event_port=1", []string{"a:1", "b.example:65535"}, "prod/eu-1", 1, "mooncake-store/prod/eu-1/master_view"},
		{"etcd://[::1]:2379/c_1.x?event_port=65535", []string{"[::1]:2379"}, "c_1.x", 65535, "mooncake-store/c_1.x/master_view"},
	}
	for _, c := range ok {
		loc, err := ParseMasterLocator(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if strings.Join(loc.Etcd, " ") != strings.Join(c.etcd, " ") || loc.ClusterID != c.cluster || loc.EventPort != c.port || loc.Key() != c.key {
			t.Errorf("%s: got %+v key %s", c.in, loc, loc.Key())
		}
	}
	bad := map[string]string{
		"tcp://127.0.0.1:5557":                          "must start with",
		"etcd:///mooncake?event_port=1":                 "no etcd host",
		"etcd://127.0.0.1/mooncake?event_port=1":        "host:port",
		"etcd://:2379/mooncake?event_port=1":            "empty host",
		"etcd://h:0/mooncake?event_port=1":              "1..65535",
		"etcd://h:65536/mooncake?event_port=1":          "1..65535",
		"etcd://h:1,h:1/mooncake?event_port=1":          "twice",
		"etcd://h:1,/mooncake?event_port=1":             "host:port",
		"etcd://h:1?event_port=1":                       "no cluster id",
		"etcd://h:1/?event_port=1":                      "no cluster id",
		"etcd://h:1/a//b?event_port=1":                  "empty",
		"etcd://h:1/a/../b?event_port=1":                "\"..\"",
		"etcd://h:1/a/?event_port=1":                    "empty",
		"etcd://h:1/a*b?event_port=1":                   "only letters",
		"etcd://h:1/mooncake":                           "needs ?event_port",
		"etcd://h:1/mooncake?":                          "needs ?event_port",
		"etcd://h:1/mooncake?event_port=":               "1..65535",
		"etcd://h:1/mooncake?event_port=0":              "1..65535",
		"etcd://h:1/mooncake?event_port=05557":          "1..65535",
		"etcd://h:1/mooncake?event_port=+5":             "1..65535",
		"etcd://h:1/mooncake?event_port=70000":          "1..65535",
		"etcd://h:1/mooncake?event_port=1&event_port=2": "twice",
		"etcd://h:1/mooncake?event_port=1&tls=1":        "unknown parameter",
		"etcd://h:1/mooncake?event_port=1#x":            "'#'",
		"etcd://u@h:1/mooncake?event_port=1":            "'@'",
		"etcd://h:1/moon%20cake?event_port=1":           "'%'",
		"etcd://h:1/moon cake?event_port=1":             "printable",
		"etcd://h:1/mooncake?event_port=1\x00":          "printable",
	}
	for in, want := range bad {
		_, err := ParseMasterLocator(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", in, err, want)
		}
	}
}

func TestMasterEventEndpoint(t *testing.T) {
	loc := MasterLocator{EventPort: 5557}
	for in, want := range map[string]string{
		"10.0.0.7:50051":    "tcp://10.0.0.7:5557",
		"master-2:50051":    "tcp://master-2:5557",
		"[fd00::7]:50051":   "tcp://[fd00::7]:5557",
		"0.0.0.0:50051":     "",
		"[::]:50051":        "",
		"10.0.0.7":          "",
		":50051":            "",
		"":                  "",
		"10.0.0.7:1\n":      "",
		"{\"a\":1}:50051:x": "",
	} {
		got, err := loc.EventEndpoint(in)
		if want == "" {
			if err == nil {
				t.Errorf("%q: got %s, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%q: got %q %v, want %q", in, got, err, want)
		}
	}
}

// TestMasterViewWatcher follows the key through Mooncake's life cycle on a real etcd:
// absent at start, created by an election (create-if-absent, with a lease), the leader's
// lease revoked (key deleted), a new leader elected, and a compaction.
func TestMasterViewWatcher(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client()
	loc, err := ParseMasterLocator("etcd://" + strings.TrimPrefix(srv.Endpoint(), "http://") + "/test-c?event_port=5557")
	if err != nil {
		t.Fatal(err)
	}
	views := make(chan MasterView, 16)
	w, err := WatchMasterView(MasterViewConfig{Locator: loc, Logger: slog.New(slog.DiscardHandler), RetryDelay: 20 * time.Millisecond}, func(v MasterView) { views <- v })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	next := func() MasterView {
		t.Helper()
		select {
		case v := <-views:
			return v
		case <-time.After(10 * time.Second):
			t.Fatal("no master view reported")
		}
		return MasterView{}
	}
	if v := next(); v.Present {
		t.Fatalf("first view %+v, want absent", v)
	}
	ctx := context.Background()
	elect := func(addr string) (clientv3.LeaseID, int64) {
		t.Helper()
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(loc.Key()), "=", 0)).
			Then(clientv3.OpPut(loc.Key(), addr, clientv3.WithLease(l.ID))).Commit()
		if err != nil || !r.Succeeded {
			t.Fatalf("elect %s: %v %v", addr, r, err)
		}
		return l.ID, r.Header.Revision
	}
	l1, rev1 := elect("127.0.0.2:50051")
	if v := next(); !v.Present || v.Leader != "127.0.0.2:50051" || v.Version != rev1 {
		t.Fatalf("after election got %+v, want leader 127.0.0.2:50051 version %d", v, rev1)
	}
	if _, err := cli.Revoke(ctx, l1); err != nil {
		t.Fatal(err)
	}
	if v := next(); v.Present {
		t.Fatalf("after the lease was revoked got %+v, want absent", v)
	}
	_, rev2 := elect("127.0.0.3:50051")
	if v := next(); !v.Present || v.Leader != "127.0.0.3:50051" || v.Version != rev2 {
		t.Fatalf("after re-election got %+v, want 127.0.0.3:50051 version %d", v, rev2)
	}
	// Unrelated writes and a compaction past the watch's start: no spurious report.
	if _, err := cli.Put(ctx, "mooncake-store/other/master_view", "x:1"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Put(ctx, "unrelated", "y")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, r.Header.Revision); err != nil {
		t.Fatal(err)
	}
	// A new term at the same address is a new version.
	if _, err := cli.Delete(ctx, loc.Key()); err != nil {
		t.Fatal(err)
	}
	if v := next(); v.Present {
		t.Fatalf("after delete got %+v", v)
	}
	_, rev3 := elect("127.0.0.3:50051")
	if v := next(); v.Leader != "127.0.0.3:50051" || v.Version != rev3 {
		t.Fatalf("same-address term got %+v, want version %d", v, rev3)
	}
	select {
	case v := <-views:
		t.Fatalf("unexpected extra view %+v", v)
	default:
	}
}

// TestMasterViewWatcherEtcdDown: a watcher started while etcd is down reports nothing
// until etcd is back, then the current state.
func TestMasterViewWatcherEtcdDown(t *testing.T) {
	srv := etcdtest.Start(t)
	loc, _ := ParseMasterLocator("etcd://" + strings.TrimPrefix(srv.Endpoint(), "http://") + "/c?event_port=5557")
	if _, err := srv.Client().Put(context.Background(), loc.Key(), "127.0.0.2:50051"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	views := make(chan MasterView, 4)
	w, err := WatchMasterView(MasterViewConfig{Locator: loc, Logger: slog.New(slog.DiscardHandler), RetryDelay: 20 * time.Millisecond,
		DialTimeout: 200 * time.Millisecond}, func(v MasterView) { views <- v })
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	srv.Restart()
	select {
	case v := <-views:
		if !v.Present || v.Leader != "127.0.0.2:50051" {
			t.Fatalf("got %+v", v)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no view after etcd came back")
	}
}
