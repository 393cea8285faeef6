package server

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Services restored from the state file while the process is out of descriptors are not
// lost: they are registered, marked waiting (metric conductor_service_waiting_for_resources),
// and subscribe once descriptors free up, while the listeners keep serving.
func TestRestoreOutOfDescriptorsWaitsAndSubscribes(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	pub := newPublisher(t, false)
	first, err := Start(AppConfig{RPCPort: -1, BindAddress: "127.0.0.1", Logger: testLogger(), StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := msgpackPost(t, first, "/register", registerBody(pub.Endpoint(), "engine-a", 0)); code != 200 {
		t.Fatalf("register: %d %v", code, body)
	}
	first.Stop()

	app := startApp(t, false)
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := orig
	lim.Cur = uint64(len(ents) - 1) // no room for one more descriptor
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restored := app.restoreState(state)
	st := app.Service.Stats()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	if restored != 1 || len(st) != 1 || !st[0].Stats.Waiting || st[0].Stats.OpenFailures == 0 {
		t.Fatalf("restored %d, stats %+v", restored, st)
	}
	f := scrape(t, app)
	if v, ok := metricValue(f, "conductor_service_waiting_for_resources", "service", "engine-a|default|0"); !ok || v != 1 {
		t.Fatalf("waiting metric = %v (present %v)", v, ok)
	}
	eventually(t, "subscribed", func() error {
		if s := app.Service.Stats(); s[0].Stats.Waiting {
			return errf("still waiting: %+v", s[0].Stats)
		}
		return nil
	})
	// The first app's subscription counted once already.
	if err := pub.WaitSubscribers(2, 5e9); err != nil {
		t.Fatal(err)
	}
	tokens := seqTokens(32, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	if _, err := pub.Publish(vllmBatch(0, stored(keys, "GPU"))); err != nil {
		t.Fatal(err)
	}
	eventually(t, "events applied", func() error {
		if s := app.Service.Stats(); s[0].Stats.Applied != 1 {
			return errf("applied %d", s[0].Stats.Applied)
		}
		return nil
	})
	_, resp := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if got := tierOf(t, hits(t, resp), "engine-a", "device"); got != 32 {
		t.Fatalf("device hit = %d, want 32", got)
	}
}
