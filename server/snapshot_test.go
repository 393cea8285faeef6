package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"testing"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/snapshot"
)

func startTokenApp(t *testing.T, token string) *App {
	t.Helper()
	app, err := Start(AppConfig{HTTPPort: 0, RPCPort: -1, Logger: testLogger(), BindAddress: "127.0.0.1", AdminToken: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Stop)
	return app
}

func snapshotRequest(t *testing.T, app *App, method, token string, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+app.HTTPAddr+SnapshotPath, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, raw
}

func authPost(t *testing.T, app *App, path, token string, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+app.HTTPAddr+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/msgpack")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestSnapshotSaveLoad: a snapshot saved from one node and loaded into a fresh node with
// the same registrations answers every query the same; the route needs the admin token;
// a damaged snapshot loads nothing; blocks of a slot the loading node does not register
// are skipped.
func TestSnapshotSaveLoad(t *testing.T) {
	const token = "s3cret"
	a := startTokenApp(t, token)
	pub := newPublisher(t, false)
	pubB := newPublisher(t, false)
	if code := authPost(t, a, "/register", token, registerBody(pub.Endpoint(), "engine-a", 0)); code != http.StatusOK {
		t.Fatalf("register a: %d", code)
	}
	if code := authPost(t, a, "/register", token, registerBody(pubB.Endpoint(), "engine-b", 0)); code != http.StatusOK {
		t.Fatalf("register b: %d", code)
	}
	if err := pub.WaitSubscribers(1, 5e9); err != nil {
		t.Fatal(err)
	}
	if err := pubB.WaitSubscribers(1, 5e9); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int32{seqTokens(128, 1), seqTokens(96, 1000), seqTokens(64, 5000)}
	for i, p := range prompts {
		keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", p)
		if _, err := pub.Publish(vllmBatch(0, stored(keys[:len(keys)-i], "GPU"), stored(keys[:2], "CPU"))); err != nil {
			t.Fatal(err)
		}
		if _, err := pubB.Publish(vllmBatch(0, stored(keys[:1+i], "GPU"))); err != nil {
			t.Fatal(err)
		}
	}
	answers := func(app *App) []map[string]any {
		var out []map[string]any
		for _, p := range prompts {
			_, r := msgpackPost(t, app, "/query", queryBody("m", 16, p))
			out = append(out, r)
		}
		return out
	}
	eventually(t, "events indexed", func() error {
		got := answers(a)
		if d := tierOf(t, hits(t, got[2]), "engine-a", "device"); d != 16*2 {
			return errf("last prompt device = %d", d)
		}
		if d := tierOf(t, hits(t, got[2]), "engine-b", "device"); d != 16*3 {
			return errf("last prompt b device = %d", d)
		}
		return nil
	})
	want := answers(a)

	if code, _ := snapshotRequest(t, a, http.MethodGet, "", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET without token: %d", code)
	}
	code, snap := snapshotRequest(t, a, http.MethodGet, token, nil)
	if code != http.StatusOK || len(snap) < 20 {
		t.Fatalf("GET snapshot: %d, %d bytes", code, len(snap))
	}

	b := startTokenApp(t, token)
	if code := authPost(t, b, "/register", token, registerBody(pub.Endpoint(), "engine-a", 0)); code != http.StatusOK {
		t.Fatalf("register a on b: %d", code)
	}
	if code := authPost(t, b, "/register", token, registerBody(pubB.Endpoint(), "engine-b", 0)); code != http.StatusOK {
		t.Fatalf("register b on b: %d", code)
	}
	if code, _ := snapshotRequest(t, b, http.MethodPost, "", snap); code != http.StatusUnauthorized {
		t.Fatalf("POST without token: %d", code)
	}
	bad := bytes.Clone(snap)
	bad[len(bad)/2] ^= 1
	if code, body := snapshotRequest(t, b, http.MethodPost, token, bad); code != http.StatusBadRequest {
		t.Fatalf("POST damaged: %d %s", code, body)
	}
	if got := answers(b); tierOf(t, hits(t, got[0]), "engine-a", "device") != 0 {
		t.Fatalf("damaged snapshot applied something: %v", got[0])
	}
	code, body := snapshotRequest(t, b, http.MethodPost, token, snap)
	if code != http.StatusOK {
		t.Fatalf("POST snapshot: %d %s", code, body)
	}
	if got := answers(b); !reflect.DeepEqual(got, want) {
		t.Fatalf("answers after load differ:\n got %v\nwant %v", got, want)
	}

	// A node that registers only engine-a loads only engine-a's blocks (engine-b's 1+2+3
	// entries are skipped).
	c := startTokenApp(t, token)
	if code := authPost(t, c, "/register", token, registerBody(pub.Endpoint(), "engine-a", 0)); code != http.StatusOK {
		t.Fatalf("register a on c: %d", code)
	}
	code, body = snapshotRequest(t, c, http.MethodPost, token, snap)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"skipped":6`)) {
		t.Fatalf("POST to c: %d %s", code, body)
	}
	got := answers(c)
	for i := range prompts {
		if _, ok := hits(t, got[i])["engine-b"]; ok {
			t.Fatalf("engine-b appears on c: %v", got[i])
		}
		if fmt.Sprint(hits(t, got[i])["engine-a"]) != fmt.Sprint(hits(t, want[i])["engine-a"]) {
			t.Fatalf("engine-a on c: %v want %v", got[i], want[i])
		}
	}
}

// TestSnapshotLoadLargeBody: a 13 MB snapshot (far above the 1 MiB admin body limit) is
// loaded whole; its blocks belong to no registered slot, so all are skipped and nothing
// is indexed.
func TestSnapshotLoadLargeBody(t *testing.T) {
	app := startTokenApp(t, "")
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := snapshot.NewWriter(&buf)
	if err := w.Context(&snapshot.Header{Key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, Profile: p}); err != nil {
		t.Fatal(err)
	}
	ch := &engine.SnapshotChunk{Slots: []engine.Slot{{InstanceID: "nobody"}}}
	for i := 0; i < 1_000_000; i++ {
		ch.Entries = append(ch.Entries, engine.SnapshotEntry{Key: uint64(i + 1), Slot: 0, Tiers: engine.MaskDevice})
		if len(ch.Entries) == 4096 {
			if err := w.Chunk(ch); err != nil {
				t.Fatal(err)
			}
			ch.Entries = ch.Entries[:0]
		}
	}
	if err := w.Chunk(ch); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	code, body := snapshotRequest(t, app, http.MethodPost, "", buf.Bytes())
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"skipped":1000000`)) || !bytes.Contains(body, []byte(`"applied":0`)) {
		t.Fatalf("POST %d bytes: %d %s", buf.Len(), code, body)
	}
	if v := app.Engine.GlobalView(); len(v) != 0 {
		t.Fatalf("indexed %+v", v)
	}
}

// TestSnapshotLoadsOneAtATime: a snapshot POST holds up to MaxSnapshotBytes, so a second
// one while a load runs is turned away with 503 and Retry-After instead of doubling that.
func TestSnapshotLoadsOneAtATime(t *testing.T) {
	app := startTokenApp(t, "")
	app.snapshotLoading.Lock() // a load in progress
	code, body := snapshotRequest(t, app, http.MethodPost, "", []byte("x"))
	app.snapshotLoading.Unlock()
	if code != http.StatusServiceUnavailable {
		t.Fatalf("POST during a load: %d %s", code, body)
	}
	if code, body := snapshotRequest(t, app, http.MethodPost, "", []byte("x")); code != http.StatusBadRequest {
		t.Fatalf("POST after the load: %d %s, want 400 (not a snapshot)", code, body)
	}
}
