package server

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/snapshot"
)

func startTokenApp(t *testing.T, token string) *App {
	t.Helper()
	return startWith(t, AppConfig{RPCPort: -1, AdminToken: token})
}

func snapshotRequest(t *testing.T, app *App, method, token string, body []byte) (int, []byte) {
	t.Helper()
	return snapshotDo(t, app, method, SnapshotPath, token, body)
}

// snapshotRequestPath POSTs body to path (with a query).
func snapshotRequestPath(t *testing.T, app *App, path, token string, body []byte) (int, []byte) {
	t.Helper()
	return snapshotDo(t, app, http.MethodPost, path, token, body)
}

func snapshotDo(t *testing.T, app *App, method, path, token string, body []byte) (int, []byte) {
	t.Helper()
	code, _, raw := httpRaw(t, app, method, path, body, "Authorization", bearer(token))
	return code, raw
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
	mustRegister(t, a, token, registerBody(pub.Endpoint(), "engine-a", 0))
	mustRegister(t, a, token, registerBody(pubB.Endpoint(), "engine-b", 0))
	waitSub(t, pub, 1)
	waitSub(t, pubB, 1)
	prompts := [][]int32{seqTokens(128, 1), seqTokens(96, 1000), seqTokens(64, 5000)}
	for i, p := range prompts {
		keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", p)
		mustPublish(t, pub, vllmBatch(0, stored(keys[:len(keys)-i], "GPU"), stored(keys[:2], "CPU")))
		mustPublish(t, pubB, vllmBatch(0, stored(keys[:1+i], "GPU")))
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
	mustRegister(t, b, token, registerBody(pub.Endpoint(), "engine-a", 0))
	mustRegister(t, b, token, registerBody(pubB.Endpoint(), "engine-b", 0))
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
	mustRegister(t, c, token, registerBody(pub.Endpoint(), "engine-a", 0))
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
	const token = "s3cret"
	app := startTokenApp(t, token)
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", "0", "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := snapshot.NewWriter(&buf, snapshot.KeyFromToken(token))
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
	code, body := snapshotRequest(t, app, http.MethodPost, token, buf.Bytes())
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"skipped":1000000`)) || !bytes.Contains(body, []byte(`"applied":0`)) {
		t.Fatalf("POST %d bytes: %d %s", buf.Len(), code, body)
	}
	if v := app.Engine.GlobalView(); len(v) != 0 {
		t.Fatalf("indexed %+v", v)
	}
}

// TestSnapshotLoadsOneAtATime: while a load is being applied (staged and swapped), a
// second one, received and verified meanwhile, is turned away with 503 and Retry-After.
func TestSnapshotLoadsOneAtATime(t *testing.T) {
	const token = "s3cret"
	app := startTokenApp(t, token)
	snap := signedSnapshot(t, token, nil)
	app.snapshotLoading.Lock() // a load being applied
	code, body := snapshotRequest(t, app, http.MethodPost, token, snap)
	app.snapshotLoading.Unlock()
	if code != http.StatusServiceUnavailable {
		t.Fatalf("POST during a load: %d %s", code, body)
	}
	if code, body := snapshotRequest(t, app, http.MethodPost, token, []byte("x")); code != http.StatusBadRequest {
		t.Fatalf("POST after the load: %d %s, want 400 (not a snapshot)", code, body)
	}
	if code, body := snapshotRequest(t, app, http.MethodPost, token, snap); code != http.StatusOK {
		t.Fatalf("POST after the load: %d %s", code, body)
	}
}

// snapCtx is one context of a hand-made snapshot: its key, profile, sources and the
// (slot, keys) it holds on the device tier.
type snapCtx struct {
	key     engine.ContextKey
	profile hashing.Profile
	sources []snapshot.Source
	slot    engine.Slot
	keys    []uint64
	journal []engine.SnapshotOp
}

// signedSnapshot writes a snapshot of ctxs signed with token's key.
func signedSnapshot(t *testing.T, token string, ctxs []snapCtx) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := snapshot.NewWriter(&buf, snapshot.KeyFromToken(token))
	for _, c := range ctxs {
		if err := w.Context(&snapshot.Header{Key: c.key, Profile: c.profile, Sources: c.sources}); err != nil {
			t.Fatal(err)
		}
		ch := &engine.SnapshotChunk{Slots: []engine.Slot{c.slot}, Journal: c.journal}
		for _, k := range c.keys {
			ch.Entries = append(ch.Entries, engine.SnapshotEntry{Key: k, Slot: 0, Tiers: engine.MaskDevice})
		}
		if err := w.Chunk(ch); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func vllmP(t *testing.T, seed string) hashing.Profile {
	t.Helper()
	p, err := hashing.Resolve("vllm_v1", "sha256_cbor", seed, "low64_be")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSnapshotPostNeedsToken: without an admin token a node refuses every snapshot load
// (403): anyone could otherwise replace what the engines' events built.
func TestSnapshotPostNeedsToken(t *testing.T) {
	app := startTokenApp(t, "")
	code, body := snapshotRequest(t, app, http.MethodPost, "", signedSnapshot(t, "", nil))
	if code != http.StatusForbidden || !bytes.Contains(body, []byte("admin_token")) {
		t.Fatalf("POST without a token set: %d %s", code, body)
	}
}

// TestSnapshotLoadAllOrNothing: a snapshot whose second context conflicts with the
// index (another hash profile for a registered context) is refused whole: 409, and the
// first context's blocks are not in the index (before: 500 {"applied":10} with them in
// place).
func TestSnapshotLoadAllOrNothing(t *testing.T) {
	const token = "s3cret"
	app := startTokenApp(t, token)
	pubA, pubB := newPublisher(t, false), newPublisher(t, false)
	mustRegister(t, app, token, registerBody(pubA.Endpoint(), "a", 0))
	mustRegister(t, app, token, registerBody(pubB.Endpoint(), "b", 0, "modelname", "n"))
	tokens := seqTokens(160, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	snap := signedSnapshot(t, token, []snapCtx{
		{key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}, profile: vllmP(t, "0"),
			sources: []snapshot.Source{{Endpoint: pubA.Endpoint(), Slot: engine.Slot{InstanceID: "a"}}},
			slot:    engine.Slot{InstanceID: "a"}, keys: keys},
		{key: engine.ContextKey{TenantID: "default", ModelName: "n", BlockSize: 16}, profile: vllmP(t, "7"),
			sources: []snapshot.Source{{Endpoint: pubB.Endpoint(), Slot: engine.Slot{InstanceID: "b"}}},
			slot:    engine.Slot{InstanceID: "b"}, keys: keys},
	})
	code, body := snapshotRequest(t, app, http.MethodPost, token, snap)
	if code != http.StatusConflict || !bytes.Contains(body, []byte(`"applied":0`)) {
		t.Fatalf("conflicting snapshot: %d %s", code, body)
	}
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if d := tierOf(t, hits(t, r), "a", "device"); d != 0 {
		t.Fatalf("the first context was applied: %v", r)
	}
	if n := app.Engine.TotalBlocks(); n != 0 {
		t.Fatalf("%d blocks charged after a refused load", n)
	}
}

// TestSnapshotLoadIsBootstrapOrRestore: into a node that serves an index a load is
// refused (409); with ?replace=true it is swapped in whole; a snapshot's entries for a
// slot this node registers with another endpoint are skipped (they came from another
// publisher).
func TestSnapshotLoadIsBootstrapOrRestore(t *testing.T) {
	const token = "s3cret"
	app := startTokenApp(t, token)
	pub := newPublisher(t, false)
	mustRegister(t, app, token, registerBody(pub.Endpoint(), "a", 0))
	waitSub(t, pub, 1)
	tokens := seqTokens(160, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, stored(keys[:2], "GPU")))
	device := func() int64 {
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
		return tierOf(t, hits(t, r), "a", "device")
	}
	eventually(t, "2 blocks indexed", func() error {
		if d := device(); d != 32 {
			return errf("device %d", d)
		}
		return nil
	})
	ctxKey := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	snap := signedSnapshot(t, token, []snapCtx{{key: ctxKey, profile: vllmP(t, "0"),
		sources: []snapshot.Source{{Endpoint: pub.Endpoint(), Slot: engine.Slot{InstanceID: "a"}}},
		slot:    engine.Slot{InstanceID: "a"}, keys: keys[:6]}})
	if code, body := snapshotRequest(t, app, http.MethodPost, token, snap); code != http.StatusConflict {
		t.Fatalf("load into a serving node: %d %s", code, body)
	}
	if d := device(); d != 32 {
		t.Fatalf("refused load changed the index: device %d", d)
	}
	code, body := snapshotRequestPath(t, app, SnapshotPath+"?replace=true", token, snap)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"replaced":true`)) {
		t.Fatalf("replace: %d %s", code, body)
	}
	if d := device(); d != 16*6 {
		t.Fatalf("after replace: device %d, want %d", d, 16*6)
	}
	// The node's live events keep applying to the swapped-in context.
	mustPublish(t, pub, vllmBatch(0, stored(keys[:8], "GPU")))
	eventually(t, "events after the swap", func() error {
		if d := device(); d != 16*8 {
			return errf("device %d", d)
		}
		return nil
	})
	// Another endpoint for the same slot: skipped.
	other := signedSnapshot(t, token, []snapCtx{{key: ctxKey, profile: vllmP(t, "0"),
		sources: []snapshot.Source{{Endpoint: "tcp://127.0.0.1:1", Slot: engine.Slot{InstanceID: "a"}}},
		slot:    engine.Slot{InstanceID: "a"}, keys: keys}})
	code, body = snapshotRequestPath(t, app, SnapshotPath+"?replace=true", token, other)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"applied":0`)) ||
		!bytes.Contains(body, []byte("registered here with another endpoint")) {
		t.Fatalf("other endpoint: %d %s", code, body)
	}
}

// TestSnapshotForgedRefused: a checksum-valid stream not signed with this node's key
// (another token: on a replica, another cluster's key) is refused with 403 whatever it
// holds: here a journal that would clear a live instance and entries the engine never
// published. Nothing changes.
func TestSnapshotForgedRefused(t *testing.T) {
	const token = "s3cret"
	app := startTokenApp(t, token)
	pub := newPublisher(t, false)
	mustRegister(t, app, token, registerBody(pub.Endpoint(), "a", 0))
	tokens := seqTokens(160, 1)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	forged := signedSnapshot(t, "guessed", []snapCtx{{key: engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16},
		profile: vllmP(t, "0"), sources: []snapshot.Source{{Endpoint: pub.Endpoint(), Slot: engine.Slot{InstanceID: "a"}, HasSeq: true}},
		slot: engine.Slot{InstanceID: "a"}, keys: keys,
		journal: []engine.SnapshotOp{{Op: engine.Op{Kind: engine.OpClear, Slot: engine.Slot{InstanceID: "a"}, ClearTiers: engine.MaskAllEngine}}}}})
	for _, path := range []string{SnapshotPath, SnapshotPath + "?replace=true"} {
		code, body := snapshotRequestPath(t, app, path, token, forged)
		if code != http.StatusForbidden {
			t.Fatalf("forged snapshot %s: %d %s", path, code, body)
		}
	}
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if d := tierOf(t, hits(t, r), "a", "device"); d != 0 {
		t.Fatalf("a forged snapshot made a never-published prompt match: %v", r)
	}
}

// TestSnapshotSlowPostBlocksNoOne: a POST whose body trickles in (held open here) does
// not hold up another load: that one is received, applied and answered meanwhile
// (before, the first held the only load slot for the whole read timeout).
func TestSnapshotSlowPostBlocksNoOne(t *testing.T) {
	const token = "s3cret"
	app := startTokenApp(t, token)
	snap := signedSnapshot(t, token, nil)
	pr, pw := io.Pipe()
	slowDone := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+app.HTTPAddr+SnapshotPath, pr)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			slowDone <- 0
			return
		}
		resp.Body.Close()
		slowDone <- resp.StatusCode
	}()
	if _, err := pw.Write(snap[:10]); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the slow POST is being received", func() error {
		if len(app.snapshotReceipts) != 1 {
			return errf("%d receipts", len(app.snapshotReceipts))
		}
		return nil
	})
	cl := &http.Client{Timeout: 20 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, "http://"+app.HTTPAddr+SnapshotPath, bytes.NewReader(snap))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("second POST while the first trickles: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("second POST: %d %s", resp.StatusCode, body)
	}
	if _, err := pw.Write(snap[10:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if code := <-slowDone; code != http.StatusOK {
		t.Fatalf("slow POST: %d", code)
	}
}

// TestSnapshotTooLarge: a body over max_snapshot_bytes is refused with 413, before it is
// read when its length is declared.
func TestSnapshotTooLarge(t *testing.T) {
	const token = "s3cret"
	app := startWith(t, AppConfig{RPCPort: -1, AdminToken: token,
		MaxSnapshotBytes: 1 << 20})
	big := append(signedSnapshot(t, token, nil), make([]byte, 2<<20)...)
	// A declared length over the limit is answered once fasthttp's first 8 KiB arrived,
	// without reading the rest.
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n",
		SnapshotPath, token, len(big))
	resp, _ := rawHTTP(t, app.HTTPAddr, head, big[:16<<10])
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared length over the limit: %d", resp.StatusCode)
	}
	// Chunked (no declared length): refused once the limit is passed. The server stops
	// reading there and closes the connection, so the client may see its write cut
	// rather than the 413; either way nothing was loaded.
	req, _ := http.NewRequest(http.MethodPost, "http://"+app.HTTPAddr+SnapshotPath, io.MultiReader(bytes.NewReader(big)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.ContentLength = -1
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked over the limit: %d", resp.StatusCode)
		}
	}
	if n := app.Engine.TotalBlocks(); n != 0 {
		t.Fatalf("%d blocks after refused loads", n)
	}
}

// TestSnapshotStreamFailureIsVisible: a snapshot that fails after its header went out
// (here a context changes by more than its journal holds between two steps) aborts the
// chunked body: the client's read fails instead of ending cleanly on a short 200.
func TestSnapshotStreamFailureIsVisible(t *testing.T) {
	app := startTokenApp(t, "")
	p := vllmP(t, "0")
	key := engine.ContextKey{TenantID: "default", ModelName: "m", BlockSize: 16}
	slot := engine.Slot{InstanceID: "a"}
	if _, err := app.Engine.RegisterSlot(key, p, slot); err != nil {
		t.Fatal(err)
	}
	hs := make([]uint64, 6*engine.DefaultSnapshotStep)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9E3779B97F4A7C15
	}
	if err := app.Engine.Apply(key, []engine.Op{{Kind: engine.OpStore, Slot: slot, Tier: engine.TierDevice, Hashes: hs}}); err != nil {
		t.Fatal(err)
	}
	churn := make([]uint64, engine.MaxSnapshotJournal+1)
	for i := range churn {
		churn[i] = uint64(i) | 1<<63
	}
	// At the stream's second write (the header and the first 64 KiB have gone out), a
	// change larger than a snapshot journal holds.
	var writes atomic.Int32
	var once sync.Once
	app.snapshotWriteHook = func() {
		if writes.Add(1) < 2 {
			return
		}
		once.Do(func() {
			if err := app.Engine.Apply(key, []engine.Op{{Kind: engine.OpRemove, Slot: slot, Tier: engine.TierDevice, Hashes: churn}}); err != nil {
				t.Error(err)
			}
		})
	}
	resp, err := http.Get("http://" + app.HTTPAddr + SnapshotPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil {
		t.Fatalf("a failed snapshot read as complete (%d bytes)", n)
	}
	if app.snapshotsFailed.Load() != 1 {
		t.Fatalf("failed snapshots %d", app.snapshotsFailed.Load())
	}
}
