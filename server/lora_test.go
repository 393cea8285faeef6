package server

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/cluster/etcdtest"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
	"github.com/conductor-go/conductor/wire/publisher"
)

// loraStored is a vLLM BlockStored of an adapter's blocks, with their tokens so that the
// profile self-check can verify them.
func loraStored(hashes []uint64, tokens []int32, lora string) []byte {
	var name any
	if lora != "" {
		name = lora
	}
	return mp("type", "BlockStored", "block_hashes", anys(hashes), "parent_block_hash", nil, "token_ids", anys(tokens),
		"block_size", 16, "lora_id", nil, "medium", "GPU", "lora_name", name)
}

// servicesByLora reads /services into its entries by LoraName.
func servicesByLora(t *testing.T, app *App) map[string]map[string]any {
	t.Helper()
	code, resp := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	if code != http.StatusOK {
		t.Fatalf("/services: %d %v", code, resp)
	}
	out := map[string]map[string]any{}
	for _, s := range resp["services"].([]any) {
		m := s.(map[string]any)
		out[m["LoraName"].(string)] = m
	}
	if asInt(t, resp["count"]) != int64(len(out)) {
		t.Fatalf("count %v for %d entries", resp["count"], len(out))
	}
	return out
}

// TestMultiLoraOverHTTP: a vLLM >= 0.31 engine serving the base model and a tagged
// adapter, registered twice on one endpoint over HTTP: /services lists both adapters
// (the new profile fields, index_media and hash_check each), each adapter's prompts hit
// in their own context only, /unregister with lora_name removes one adapter, and the
// self-check reads ok for both.
func TestMultiLoraOverHTTP(t *testing.T) {
	app := startApp(t, false)
	pub := newPublisher(t, false)
	base := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
		"index_projection": "low64_be", "extra_keys": "tagged"}
	adapter := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
		"index_projection": "low64_be", "extra_keys": "tagged", "lora_path": "/adapters/sql"}
	for _, body := range [][]byte{
		registerBody(pub.Endpoint(), "e", 0, "hash_profile", base, "index_media", []any{"GPU", "CPU"}),
		registerBody(pub.Endpoint(), "e", 0, "hash_profile", adapter, "index_media", []any{"CPU", "gpu"}, "lora_name", "sql"),
	} {
		mustRegister(t, app, "", body)
	}
	// Refused: the adapter again with another path; the engine with other media.
	for _, c := range []struct {
		body []byte
		want string
	}{
		{registerBody(pub.Endpoint(), "e", 0, "hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "sha256",
			"python_hash_seed": "unset", "index_projection": "low64_be", "extra_keys": "tagged", "lora_path": "/other"},
			"index_media", []any{"GPU", "CPU"}, "lora_name", "sql"), "another lora_path"},
		{registerBody(pub.Endpoint(), "e", 0, "hash_profile", adapter, "lora_name", "x"), "conflicting registration"},
		{registerBody(pub.Endpoint(), "e", 0, "hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "sha256",
			"python_hash_seed": "unset", "index_projection": "low64_be", "extra_keys": "tagged"},
			"index_media", []any{"GPU", "CPU"}, "lora_name", "nopath"), "lora_path is required"},
	} {
		code, resp := msgpackPost(t, app, "/register", c.body)
		if msg, _ := resp["error"].(string); code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
			t.Fatalf("want 400 %q: %d %v", c.want, code, resp)
		}
	}
	svcs := servicesByLora(t, app)
	if len(svcs) != 2 {
		t.Fatalf("services %v", svcs)
	}
	hp := svcs["sql"]["HashProfile"].(map[string]any)
	if hp["extra_keys"] != "tagged" || hp["lora_path"] != "/adapters/sql" || hp["python_hash_seed"] != "unset" ||
		hp["lookahead_tokens"] != nil || svcs["sql"]["HashCheck"] != "unverified" {
		t.Fatalf("adapter entry %v", svcs["sql"])
	}
	if bp := svcs[""]["HashProfile"].(map[string]any); bp["lora_path"] != nil || bp["extra_keys"] != "tagged" ||
		strings.Join(anyStrings(svcs[""]["IndexMedia"]), ",") != "GPU,CPU" {
		t.Fatalf("base entry %v", svcs[""])
	}
	waitSub(t, pub, 1)
	tokens := seqTokens(64, 1)
	spec := hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be", ExtraKeys: "tagged"}
	baseKeys := specKeys(t, spec, 16, "", "", tokens)
	spec.LoraPath = "/adapters/sql"
	sqlKeys := specKeys(t, spec, 16, "sql", "", tokens)
	mustPublish(t, pub, vllmBatch(0, loraStored(baseKeys[:2], tokens[:32], ""), loraStored(sqlKeys, tokens, "sql")))
	eventually(t, "both contexts indexed", func() error {
		_, b := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
		_, l := msgpackPost(t, app, "/query", queryBody("m", 16, tokens, "lora_name", "sql"))
		if d, dl := tierOf(t, hits(t, b), "e", "device"), tierOf(t, hits(t, l), "e", "device"); d != 32 || dl != 64 {
			return errf("base %d sql %d", d, dl)
		}
		return nil
	})
	svcs = servicesByLora(t, app)
	if svcs[""]["HashCheck"] != "ok" || svcs["sql"]["HashCheck"] != "ok" {
		t.Fatalf("hash_check base %v sql %v", svcs[""]["HashCheck"], svcs["sql"]["HashCheck"])
	}
	// /global_view shows each context's profile with its fields.
	_, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	for _, c := range view["contexts"].([]any) {
		cm := c.(map[string]any)
		p := cm["hash_profile"].(map[string]any)
		if p["extra_keys"] != "tagged" || (cm["lora_name"] == "sql") != (p["lora_path"] == "/adapters/sql") {
			t.Fatalf("context %v", cm)
		}
	}
	// One adapter goes: the other keeps its hits.
	if code, resp := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0, "lora_name", "sql")); code != http.StatusOK {
		t.Fatalf("unregister sql: %d %v", code, resp)
	}
	if code, _ := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0, "lora_name", "sql")); code != http.StatusNotFound {
		t.Fatalf("unregister sql again: %d", code)
	}
	_, l := msgpackPost(t, app, "/query", queryBody("m", 16, tokens, "lora_name", "sql"))
	_, b := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if len(hits(t, l)) != 0 || tierOf(t, hits(t, b), "e", "device") != 32 {
		t.Fatalf("after unregistering sql: sql %v base %v", l, b)
	}
	if svcs := servicesByLora(t, app); len(svcs) != 1 || svcs[""] == nil {
		t.Fatalf("services %v", svcs)
	}
	if code, _ := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0)); code != http.StatusOK {
		t.Fatalf("unregister e: %d", code)
	}
	if svcs := servicesByLora(t, app); len(svcs) != 0 {
		t.Fatalf("services %v", svcs)
	}
}

func anyStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestMultiLoraClusterReplicates: in a cluster, an adapter registered on one replica is
// added on the other without re-registering the engine there (what its base context
// holds stays), and one unregistered on the other goes on both, the base context kept.
func TestMultiLoraClusterReplicates(t *testing.T) {
	srv := etcdtest.Start(t)
	a, b := startReplicaPair(t, srv, "/lora/")
	pub := newPublisher(t, false)
	mustRegister(t, a, "", registerBody(pub.Endpoint(), "e", 0))
	converge(t, srv, a, b)
	waitSub(t, pub, 2)
	tokens := seqTokens(48, 1)
	baseKeys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	loraKeys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "sql", "", tokens)
	device := func(app *App, lora string) int64 {
		_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens, "lora_name", lora))
		h := hits(t, r)
		if len(h) == 0 {
			return -1
		}
		return tierOf(t, h, "e", "device")
	}
	// indexedOnBoth waits until both replicas answer the whole prompt for adapter lora.
	indexedOnBoth := func(lora string) {
		t.Helper()
		for _, app := range []*App{a, b} {
			eventually(t, "adapter "+strconv.Quote(lora)+" indexed", func() error {
				if d := device(app, lora); d != 48 {
					return errf("device %d", d)
				}
				return nil
			})
		}
	}
	mustPublish(t, pub, vllmBatch(0, loraStored(baseKeys, tokens, "")))
	indexedOnBoth("")
	mustRegister(t, a, "", registerBody(pub.Endpoint(), "e", 0, "lora_name", "sql"))
	converge(t, srv, a, b)
	if d := device(b, ""); d != 48 {
		t.Fatalf("replica b re-registered the engine to add the adapter: base device %d", d)
	}
	mustPublish(t, pub, vllmBatch(0, loraStored(loraKeys, tokens, "sql")))
	indexedOnBoth("sql")
	if code, resp := msgpackPost(t, b, "/unregister", mp("instance_id", "e", "dp_rank", 0, "lora_name", "sql")); code != http.StatusOK {
		t.Fatalf("unregister sql on b: %d %v", code, resp)
	}
	converge(t, srv, a, b)
	for name, app := range map[string]*App{"a": a, "b": b} {
		if d, dl := device(app, ""), device(app, "sql"); d != 48 || dl != -1 {
			t.Fatalf("replica %s after unregistering sql: base %d sql %d", name, d, dl)
		}
		if n := len(app.Service.Views()); n != 1 {
			t.Fatalf("replica %s lists %d adapters", name, n)
		}
	}
}

// TestMultiLoraStateFileRestores: a multi-LoRA registration with the new profile fields
// and index_media comes back whole after a restart, every adapter routed from the
// first batch.
func TestMultiLoraStateFileRestores(t *testing.T) {
	path := filepath.Join(t.TempDir(), service.StateFileName)
	pub := newPublisher(t, false)
	app := startWithState(t, path)
	prof := func(path string) map[string]any {
		m := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
			"index_projection": "low64_be", "extra_keys": "tagged", "lookahead_tokens": 1}
		if path != "" {
			m["lora_path"] = path
		}
		return m
	}
	for _, lora := range []string{"", "a", "b"} {
		p := ""
		if lora != "" {
			p = "/adapters/" + lora
		}
		body := registerBody(pub.Endpoint(), "e", 0, "hash_profile", prof(p), "lora_name", lora, "index_media", []any{"GPU", "STORAGE"})
		mustRegister(t, app, "", body)
	}
	if code, _ := msgpackPost(t, app, "/unregister", mp("instance_id", "e", "dp_rank", 0, "lora_name", "a")); code != http.StatusOK {
		t.Fatal("unregister a")
	}
	before := app.Service.Services()
	app.Stop()

	app2 := startWithState(t, path)
	defer app2.Stop()
	after := app2.Service.Services()
	if len(after) != 1 || !after[0].Equal(&before[0]) || strings.Join(after[0].Media.Names(after[0].Kind), ",") != "GPU,STORAGE" {
		t.Fatalf("restored %+v\nwant %+v", after, before)
	}
	waitSub(t, pub, 1)
	tokens := seqTokens(33, 1) // lookahead 1: two blocks of 16 need 33 tokens
	spec := hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be",
		ExtraKeys: "tagged", LookaheadTokens: 1, LoraPath: "/adapters/b"}
	keys := specKeys(t, spec, 16, "b", "", tokens)
	eventually(t, "adapter b routed after restart", func() error {
		if _, err := pub.Publish(vllmBatch(0, loraStored(keys, tokens[:32], "b"))); err != nil {
			return err
		}
		_, r := msgpackPost(t, app2, "/query", queryBody("m", 16, tokens, "lora_name", "b"))
		h := hits(t, r)
		if len(h) == 0 {
			return errf("no instance in b's context")
		}
		if got := tierOf(t, h, "e", "device"); got != 32 {
			return errf("device = %d", got)
		}
		return nil
	})
}

// TestHashCheckMetrics: each adapter context of an engine service has its self-check
// series from its registration, at 0; events by form count as decoded; a profile that
// does not reproduce the engine's hashes counts mismatches for its context only; with
// hash_check off there are no check series and /services says off.
func TestHashCheckMetrics(t *testing.T) {
	app := startApp(t, false)
	pub := newPublisher(t, false)
	// The engine hashes with PYTHONHASHSEED unset; the adapter is registered with seed 0.
	unset := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset", "index_projection": "low64_be"}
	zero := map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "0", "index_projection": "low64_be"}
	mustRegister(t, app, "", registerBody(pub.Endpoint(), "e", 0, "hash_profile", unset))
	f := scrape(t, app)
	for _, name := range []string{"conductor_service_hash_verified_total", "conductor_service_hash_mismatch_total",
		"conductor_service_hash_unverifiable_total"} {
		if v, ok := metricValue(f, name, "service", "e|default|0", "type", "vLLM", "lora", ""); !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want a series at 0", name, v, ok)
		}
	}
	for _, form := range []string{"map", "array"} {
		if v, ok := metricValue(f, "conductor_service_events_by_form_total", "service", "e|default|0", "form", form); !ok || v != 0 {
			t.Errorf("events by form %s = %v (present %v)", form, v, ok)
		}
	}
	waitSub(t, pub, 1)
	tokens := seqTokens(32, 1)
	keys := specKeys(t, hashing.Spec{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be"},
		16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, loraStored(keys, tokens, "")))
	waitMetrics(t, app, "verified",
		metricWant{"conductor_service_hash_verified_total", []string{"lora", ""}, 1},
		metricWant{"conductor_service_events_by_form_total", []string{"form", "map"}, 1})
	// A second engine registered with the wrong seed: mismatch, counted, diagnosed.
	pub2 := newPublisher(t, false)
	mustRegister(t, app, "", registerBody(pub2.Endpoint(), "wrong", 0, "hash_profile", zero, "modelname", "m2"))
	waitSub(t, pub2, 1)
	mustPublish(t, pub2, vllmBatch(0, loraStored(keys, tokens, "")))
	waitMetrics(t, app, "mismatch, for the wrong profile only",
		metricWant{"conductor_service_hash_mismatch_total", []string{"service", "wrong|default|0"}, 1},
		metricWant{"conductor_service_hash_mismatch_total", []string{"service", "e|default|0"}, 0})
	_, resp := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	for _, s := range resp["services"].([]any) {
		m := s.(map[string]any)
		want := "ok"
		if m["InstanceID"] == "wrong" {
			want = `mismatch (engine hashes match python_hash_seed "unset")`
		}
		if m["HashCheck"] != want {
			t.Errorf("%v: HashCheck %q, want %q", m["InstanceID"], m["HashCheck"], want)
		}
	}

	off := startWith(t, AppConfig{RPCPort: -1, HashCheckOff: true})
	pub3 := newPublisher(t, false)
	mustRegister(t, off, "", registerBody(pub3.Endpoint(), "e", 0))
	if _, ok := metricValue(scrape(t, off), "conductor_service_hash_verified_total"); ok {
		t.Error("check series with hash_check off")
	}
	if svcs := servicesByLora(t, off); svcs[""]["HashCheck"] != "off" {
		t.Errorf("HashCheck %v with the check off", svcs[""]["HashCheck"])
	}
}

// TestRPCExtensions: RegisterEx carries what Register cannot (the profile fields of issue
// 25, index_media), UnregisterAdapter removes one adapter, and ListServiceDetails shows
// what /services shows; upstream's Register and ListServices keep their bodies.
func TestRPCExtensions(t *testing.T) {
	app := startApp(t, true)
	pub := newPublisher(t, false)
	cl, ctx := dialRPC(t, app, 20*time.Second)
	sc := cororpc.ServiceConfig{Endpoint: pub.Endpoint(), PublisherKind: publisher.VLLM, ModelName: "m", TenantID: "default",
		InstanceID: "e", BlockSize: 16,
		HashProfile: cororpc.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be"}}
	tagged := cororpc.ProfileExt{ExtraKeys: "tagged"}
	media := []string{"GPU", "CPU"}
	if _, code, err := cl.RegisterEx(ctx, &cororpc.RegisterExArgs{Config: sc, Ext: tagged, IndexMedia: media, HasIndexMedia: true}); err != nil || code != cororpc.CodeOK {
		t.Fatalf("RegisterEx base: %v %v", code, err)
	}
	sc.LoraName = "sql"
	// A tagged adapter needs its path.
	if _, code, err := cl.RegisterEx(ctx, &cororpc.RegisterExArgs{Config: sc, Ext: tagged, IndexMedia: media, HasIndexMedia: true}); err != nil || code != cororpc.CodeInvalidParams {
		t.Fatalf("RegisterEx without lora_path: %v %v", code, err)
	}
	tagged.LoraPath = "/adapters/sql"
	res, code, err := cl.RegisterEx(ctx, &cororpc.RegisterExArgs{Config: sc, Ext: tagged, IndexMedia: []string{"cpu", "gpu"}, HasIndexMedia: true})
	if err != nil || code != cororpc.CodeOK || !res.IsNew {
		t.Fatalf("RegisterEx sql: %+v %v %v", res, code, err)
	}
	// Upstream's Register cannot say tagged: the adapter it describes is another engine.
	if _, code, err := cl.Register(ctx, &sc); err != nil || code != cororpc.CodeInvalidParams {
		t.Fatalf("Register of an untagged adapter on the tagged engine: %v %v", code, err)
	}
	details, err := cl.ListServiceDetails(ctx)
	if err != nil || len(details) != 2 {
		t.Fatalf("details %+v %v", details, err)
	}
	svcs := servicesByLora(t, app)
	for _, d := range details {
		h := svcs[d.Config.LoraName]
		hp := h["HashProfile"].(map[string]any)
		if d.HashCheck != h["HashCheck"] || strings.Join(d.IndexMedia, ",") != strings.Join(anyStrings(h["IndexMedia"]), ",") ||
			d.Ext.ExtraKeys != hp["extra_keys"] || d.Config.HashProfile.RootDigest != hp["root_digest"] ||
			(d.Ext.LoraPath != "") != (hp["lora_path"] != nil) {
			t.Fatalf("RPC detail %+v, HTTP %v", d, h)
		}
	}
	if details[1].Config.LoraName != "sql" || details[1].Ext.LoraPath != "/adapters/sql" || strings.Join(details[1].IndexMedia, ",") != "GPU,CPU" {
		t.Fatalf("sql detail %+v", details[1])
	}
	list, err := cl.ListServices(ctx)
	if err != nil || len(list) != 2 || list[1].LoraName != "sql" {
		t.Fatalf("ListServices %+v %v", list, err)
	}
	if _, code, err := cl.UnregisterAdapter(ctx, "e", "", 0, "sql"); err != nil || code != cororpc.CodeOK {
		t.Fatalf("UnregisterAdapter: %v %v", code, err)
	}
	if _, code, err := cl.UnregisterAdapter(ctx, "e", "", 0, "sql"); err != nil || code != cororpc.CodeServiceNotFound {
		t.Fatalf("UnregisterAdapter again: %v %v", code, err)
	}
	if details, err := cl.ListServiceDetails(ctx); err != nil || len(details) != 1 || details[0].Config.LoraName != "" {
		t.Fatalf("after UnregisterAdapter: %+v %v", details, err)
	}
}

// TestConfigFileNewFields: kvevent_instance entries take the new hash_profile fields and
// index_media, and two entries of one engine (the same instance, two lora_names) are one
// multi-LoRA service, as over HTTP; a static service's adapters cannot be added over
// HTTP (they belong in the file).
func TestConfigFileNewFields(t *testing.T) {
	pub := newPublisher(t, false)
	dir := t.TempDir()
	prof := `"hash_profile": {"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
		"index_projection": "low64_be", "extra_keys": "tagged", "lookahead_tokens": 1%s}`
	entry := func(lora, path string) string {
		p := ""
		if path != "" {
			p = `, "lora_path": "` + path + `"`
		}
		return `{"endpoint": "` + pub.Endpoint() + `", "type": "vLLM", "modelname": "m", "instance_id": "e",
			"lora_name": "` + lora + `", "block_size": 16, "dp_rank": 0, "index_media": ["GPU", "STORAGE"], ` +
			strings.Replace(prof, "%s", p, 1) + `}`
	}
	cfgPath := filepath.Join(dir, "conductor.json")
	body := `{"http_server_port": 0, "rpc_server_port": 0, "state_file": "", "kvevent_instance": {
		"e-base": ` + entry("", "") + `, "e-sql": ` + entry("sql", "/adapters/sql") + `}}`
	if err := os.WriteFile(cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := LoadConfigFile(cfgPath)
	if err != nil || len(fc.Skipped) != 0 || len(fc.Services) != 2 {
		t.Fatalf("config: %v skipped %v services %d", err, fc.Skipped, len(fc.Services))
	}
	ac := fc.AppConfig()
	ac.Logger, ac.BindAddress = testLogger(), "127.0.0.1"
	app, err := Start(ac)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Stop()
	svcs := app.Service.Services()
	if len(svcs) != 1 || len(svcs[0].Adapters) != 1 || svcs[0].Adapters[0].LoraPath != "/adapters/sql" ||
		svcs[0].Profile.Lookahead != 1 || strings.Join(svcs[0].Media.Names(svcs[0].Kind), ",") != "GPU,STORAGE" {
		t.Fatalf("services %+v", svcs)
	}
	body2 := registerBody(pub.Endpoint(), "e", 0, "lora_name", "other", "index_media", []any{"GPU", "STORAGE"},
		"hash_profile", map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
			"index_projection": "low64_be", "extra_keys": "tagged", "lookahead_tokens": 1, "lora_path": "/adapters/other"})
	code, resp := msgpackPost(t, app, "/register", body2)
	if msg, _ := resp["error"].(string); code != http.StatusBadRequest || !strings.Contains(msg, "in the config file") {
		t.Fatalf("adapter over HTTP on a static service: %d %v", code, resp)
	}
}

// TestClusterRecordProfileBytes: the registry's canonical profile of a registration
// using none of the new fields is byte for byte what earlier releases wrote (replicas
// compare the bytes to pin a context), and the new fields are in it when set.
func TestClusterRecordProfileBytes(t *testing.T) {
	old := service.Registration{Endpoint: "tcp://h:1", Type: "vLLM", ModelName: "m", InstanceID: "e", BlockSize: 16,
		Strategy: "vllm_v1", Algorithm: "sha256_cbor", PythonHashSeed: "0", IndexProjection: "low64_be"}
	cfg, err := old.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	rec, rerr := clusterRecord(&cfg)
	if rerr != nil {
		t.Fatal(rerr)
	}
	const before = `{"algorithm":"sha256_cbor","index_projection":"low64_be","python_hash_seed":"0",` +
		`"root":"4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e","strategy":"vllm_v1"}`
	if string(rec.Profile) != before {
		t.Fatalf("profile %s\nwant %s", rec.Profile, before)
	}
	sgl := service.Registration{Endpoint: "tcp://h:2", Type: "SGLang", ModelName: "m", InstanceID: "s", BlockSize: 16,
		Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"}
	if cfg, err = sgl.Resolve(); err != nil {
		t.Fatal(err)
	}
	if rec, rerr = clusterRecord(&cfg); rerr != nil || !strings.Contains(string(rec.Profile), `"python_hash_seed":""`) {
		t.Fatalf("SGLang profile %s %v", rec.Profile, rerr)
	}
	old.ExtraKeys, old.LookaheadTokens, old.LoraName, old.LoraPath = "tagged", 1, "a", "/a"
	if cfg, err = old.Resolve(); err != nil {
		t.Fatal(err)
	}
	if rec, rerr = clusterRecord(&cfg); rerr != nil || !strings.Contains(string(rec.Profile), `"extra_keys":"tagged"`) ||
		!strings.Contains(string(rec.Profile), `"lookahead_tokens":1`) || !strings.Contains(string(rec.Profile), `"lora_path":"/a"`) {
		t.Fatalf("new fields: %s %v", rec.Profile, rerr)
	}
}
