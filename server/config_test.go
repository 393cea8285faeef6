package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/publisher"
)

// writeConfig writes text to a fresh file and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "conductor_config.json")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// docEntry is the example entry of reference notes §1.5.
func docEntry() map[string]any {
	return map[string]any{
		"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "tcp://127.0.0.1:5558", "type": "vLLM",
		"modelname": "test-model", "lora_name": "", "tenant_id": "default", "instance_id": "engine-a",
		"block_size": 16, "dp_rank": 0, "cache_group": 0,
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"},
	}
}

// entryWith copies the example entry, setting keys (a nil value deletes the key; use
// jsonNull for an explicit null).
func entryWith(kv ...any) map[string]any { return setKeys(docEntry(), kv) }

// profileWith copies the example hash_profile with the same rules as entryWith.
func profileWith(kv ...any) map[string]any {
	return setKeys(docEntry()["hash_profile"].(map[string]any), kv)
}

// setKeys sets m's keys from key, value pairs, deleting those whose value is nil.
func setKeys(m map[string]any, kv []any) map[string]any {
	for i := 0; i < len(kv); i += 2 {
		k := kv[i].(string)
		if kv[i+1] == nil {
			delete(m, k)
			continue
		}
		m[k] = kv[i+1]
	}
	return m
}

type jsonNullT struct{}

func (jsonNullT) MarshalJSON() ([]byte, error) { return []byte("null"), nil }

var jsonNull = jsonNullT{}

// loadEntries writes a config with the given kvevent_instance entries and loads it.
func loadEntries(t *testing.T, entries map[string]any) FileConfig {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"http_server_port": 0, "kvevent_instance": entries})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfigFile(writeConfig(t, string(raw)))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return cfg
}

func TestLoadConfigMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent", "conductor_config.json")
	cfg, err := LoadConfigFile(path)
	if err != nil {
		t.Fatalf("missing file: %v", err)
	}
	if cfg.Found || cfg.HTTPPort != DefaultHTTPPort || cfg.RPCPort != DefaultRPCPort || len(cfg.Services) != 0 ||
		len(cfg.Skipped) != 0 || cfg.Path != path {
		t.Errorf("missing file config = %+v", cfg)
	}
	app := cfg.AppConfig()
	if app.HTTPPort != 13333 || app.RPCPort != 13334 || app.ConfigPath != path {
		t.Errorf("AppConfig = %+v", app)
	}
}

func TestLoadConfigFileErrors(t *testing.T) {
	for _, c := range []struct{ name, text, want string }{
		{"malformed JSON", `{"http_server_port": 1,`, "malformed"},
		{"not JSON", `http_server_port = 1`, "malformed"},
		{"empty file", ``, "malformed"},
		{"array root", `[]`, ""},
		{"number root", `5`, ""},
		{"string root", `"x"`, ""},
		{"null root", `null`, "object"},
		{"trailing data", `{} {}`, "trailing"},
		{"http port string", `{"http_server_port": "13333"}`, "http_server_port"},
		{"http port negative", `{"http_server_port": -1}`, "http_server_port"},
		{"http port too big", `{"http_server_port": 65536}`, "http_server_port"},
		{"http port fraction", `{"http_server_port": 1.5}`, "http_server_port"},
		{"rpc port null", `{"rpc_server_port": null}`, "rpc_server_port"},
		{"rpc port huge", `{"rpc_server_port": 99999999999999999999}`, "rpc_server_port"},
		{"kvevent_instance array", `{"kvevent_instance": []}`, "kvevent_instance"},
	} {
		path := writeConfig(t, c.text)
		_, err := LoadConfigFile(path)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error does not name the file: %v", c.name, err)
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not mention %q", c.name, err, c.want)
		}
	}
	// A path that exists but cannot be read as a file is an error too, not "missing".
	dir := t.TempDir()
	if _, err := LoadConfigFile(dir); err == nil || !strings.Contains(err.Error(), dir) {
		t.Errorf("directory as config: %v", err)
	}
}

func TestLoadConfigPorts(t *testing.T) {
	for _, c := range []struct {
		text              string
		http, rpc, appRPC int
	}{
		{`{"http_server_port": 8080, "rpc_server_port": 9090}`, 8080, 9090, 9090},
		{`{"http_server_port": 8080, "rpc_server_port": 0}`, 8080, 0, -1}, // 0 disables RPC
		{`{"rpc_server_port": 9090}`, DefaultHTTPPort, 9090, 9090},        // absent keeps the default
		{`{"http_server_port": 0}`, 0, DefaultRPCPort, DefaultRPCPort},
		{`{"http_server_port": 65535, "services": []}`, 65535, DefaultRPCPort, DefaultRPCPort}, // upstream's tests write "services"
		{`{"kvevent_instance": null}`, DefaultHTTPPort, DefaultRPCPort, DefaultRPCPort},
		{`{"kvevent_instance": {}}`, DefaultHTTPPort, DefaultRPCPort, DefaultRPCPort},
	} {
		cfg, err := LoadConfigFile(writeConfig(t, c.text))
		if err != nil {
			t.Errorf("%s: %v", c.text, err)
			continue
		}
		if !cfg.Found || cfg.HTTPPort != c.http || cfg.RPCPort != c.rpc || len(cfg.Services) != 0 || len(cfg.Skipped) != 0 {
			t.Errorf("%s: %+v", c.text, cfg)
		}
		if app := cfg.AppConfig(); app.HTTPPort != c.http || app.RPCPort != c.appRPC {
			t.Errorf("%s: AppConfig ports %d/%d, want %d/%d", c.text, app.HTTPPort, app.RPCPort, c.http, c.appRPC)
		}
	}
}

func TestLoadConfigDocExample(t *testing.T) {
	cfg := loadEntries(t, map[string]any{"vllm-a-r0": docEntry()})
	if len(cfg.Services) != 1 || len(cfg.Skipped) != 0 {
		t.Fatalf("services %d, skipped %v", len(cfg.Services), cfg.Skipped)
	}
	s := cfg.Services[0]
	if s.Endpoint != "tcp://127.0.0.1:5557" || s.ReplayEndpoint != "tcp://127.0.0.1:5558" || s.Kind != publisher.VLLM ||
		s.ModelName != "test-model" || s.LoraName != "" || s.TenantID != "default" || s.InstanceID != "engine-a" ||
		s.BlockSize != 16 || s.DPRank != 0 || s.CacheGroup == nil || *s.CacheGroup != 0 {
		t.Errorf("service = %+v", s)
	}
	if s.Profile.StrategyName() != "vllm_v1" || s.Profile.AlgorithmName() != "sha256_cbor" || s.Profile.Seed != "0" ||
		s.Profile.ProjectionName() != "low64_be" ||
		s.Profile.RootHex() != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Errorf("profile = %+v", s.Profile)
	}
	if app := cfg.AppConfig(); len(app.Services) != 1 || app.SkippedServices != 0 {
		t.Errorf("AppConfig = %+v", app)
	}

	// Hand-written, indented JSON (whitespace around every value) loads the same service.
	raw, err := json.MarshalIndent(map[string]any{"kvevent_instance": map[string]any{"vllm-a-r0": docEntry()}}, "\t", "    ")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(raw), ": ", " :\n  \t")
	indented, err := LoadConfigFile(writeConfig(t, "\n "+text+"\n\n"))
	if err != nil || len(indented.Services) != 1 || len(indented.Skipped) != 0 {
		t.Fatalf("indented config: %v, %+v", err, indented)
	}
	if !indented.Services[0].Equal(&s) {
		t.Errorf("indented config loaded %+v, want %+v", indented.Services[0], s)
	}
}

// TestLoadConfigEntryRules walks every per-entry rule of reference notes §1.5: an invalid
// entry is skipped (and reported by name) while the others load.
func TestLoadConfigEntryRules(t *testing.T) {
	sglang := func(kv ...any) map[string]any {
		p := map[string]any{"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"}
		for i := 0; i < len(kv); i += 2 {
			p[kv[i].(string)] = kv[i+1]
		}
		return entryWith("type", "SGLang", "hash_profile", p)
	}
	valid := map[string]struct {
		entry map[string]any
		check func(s service.Config) bool
	}{
		"plain":             {docEntry(), func(s service.Config) bool { return s.InstanceID == "engine-a" }},
		"instance-from-key": {entryWith("instance_id", nil), func(s service.Config) bool { return s.InstanceID == "instance-from-key" }},
		"empty-tenant":      {entryWith("tenant_id", ""), func(s service.Config) bool { return s.TenantID == "default" }},
		"absent-tenant":     {entryWith("tenant_id", nil), func(s service.Config) bool { return s.TenantID == "default" }},
		"tenant-t":          {entryWith("tenant_id", "t"), func(s service.Config) bool { return s.TenantID == "t" }},
		"lora":              {entryWith("lora_name", "ad"), func(s service.Config) bool { return s.LoraName == "ad" }},
		"absent-lora":       {entryWith("lora_name", nil), func(s service.Config) bool { return s.LoraName == "" }},
		"no-replay":         {entryWith("replay_endpoint", nil), func(s service.Config) bool { return s.ReplayEndpoint == "" }},
		"replay-int":        {entryWith("replay_endpoint", 5), func(s service.Config) bool { return s.ReplayEndpoint == "" }},
		"cache-group-null":  {entryWith("cache_group", jsonNull), func(s service.Config) bool { return s.CacheGroup == nil }},
		"cache-group-none":  {entryWith("cache_group", nil), func(s service.Config) bool { return s.CacheGroup == nil }},
		"cache-group-0":     {entryWith("cache_group", 0), func(s service.Config) bool { return s.CacheGroup != nil && *s.CacheGroup == 0 }},
		"dp-rank-max":       {entryWith("dp_rank", 2147483647), func(s service.Config) bool { return s.DPRank == 2147483647 }},
		"mooncake":          {entryWith("type", "Mooncake"), func(s service.Config) bool { return s.Kind == publisher.Mooncake }},
		"pickle": {entryWith("hash_profile", profileWith("algorithm", "sha256")), func(s service.Config) bool {
			return s.Profile.AlgorithmName() == "sha256" && s.Profile.RootHex() == "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
		}},
		"seed-random": {entryWith("hash_profile", profileWith("python_hash_seed", "random")), func(s service.Config) bool { return s.Profile.Seed == "random" }},
		"sglang-no-seed": {sglang(), func(s service.Config) bool {
			return s.Kind == publisher.SGLang && s.Profile.Seed == "0" && s.Profile.RootHex() == strings.Repeat("0", 64)
		}},
		"sglang-seed":   {sglang("python_hash_seed", "123"), func(s service.Config) bool { return s.Profile.StrategyName() == "sglang" }},
		"sglang-bigram": {sglang("strategy", "sglang_bigram"), func(s service.Config) bool { return s.Profile.StrategyName() == "sglang_bigram" }},
	}
	invalid := map[string]any{
		"x-not-object-number":  5,
		"x-not-object-string":  "tcp://127.0.0.1:1",
		"x-not-object-array":   []any{docEntry()},
		"x-not-object-null":    jsonNull,
		"x-type-lowercase":     entryWith("type", "vllm"),
		"x-type-missing":       entryWith("type", nil),
		"x-type-int":           entryWith("type", 1),
		"x-endpoint-missing":   entryWith("endpoint", nil),
		"x-endpoint-int":       entryWith("endpoint", 5),
		"x-modelname-missing":  entryWith("modelname", nil),
		"x-lora-int":           entryWith("lora_name", 1),
		"x-lora-null":          entryWith("lora_name", jsonNull),
		"x-tenant-int":         entryWith("tenant_id", 1),
		"x-instance-empty":     entryWith("instance_id", ""),
		"x-instance-int":       entryWith("instance_id", 7),
		"x-block-size-missing": entryWith("block_size", nil),
		"x-block-size-string":  entryWith("block_size", "16"),
		"x-block-size-float":   entryWith("block_size", 16.5),
		"x-block-size-zero":    entryWith("block_size", 0),
		"x-block-size-neg":     entryWith("block_size", -16),
		"x-dp-missing":         entryWith("dp_rank", nil),
		"x-dp-negative":        entryWith("dp_rank", -1),
		"x-dp-too-big":         entryWith("dp_rank", int64(2147483648)),
		"x-dp-string":          entryWith("dp_rank", "0"),
		"x-cache-group-1":      entryWith("cache_group", 1),
		"x-cache-group-str":    entryWith("cache_group", "0"),
		"x-cache-group-float":  entryWith("cache_group", 0.5),
		"x-profile-missing":    entryWith("hash_profile", nil),
		"x-profile-string":     entryWith("hash_profile", "vllm_v1"),
		"x-profile-root":       entryWith("hash_profile", profileWith("root_digest", "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e")),
		"x-profile-unknown":    entryWith("hash_profile", profileWith("seed", "0")),
		"x-profile-no-seed":    entryWith("hash_profile", profileWith("python_hash_seed", nil)),
		"x-profile-seed-int":   entryWith("hash_profile", profileWith("python_hash_seed", 0)),
		"x-profile-seed-bad":   entryWith("hash_profile", profileWith("python_hash_seed", " 0")),
		"x-profile-no-strat":   entryWith("hash_profile", profileWith("strategy", nil)),
		"x-profile-bad-algo":   entryWith("hash_profile", profileWith("algorithm", "sha256_raw")),
		"x-profile-bad-proj":   entryWith("hash_profile", profileWith("index_projection", "first64_be")),
		"x-profile-proj-int":   entryWith("hash_profile", profileWith("index_projection", 1)),
		"x-sglang-seed-int":    sglang("python_hash_seed", 0),
	}
	entries := map[string]any{}
	for name, v := range valid {
		entries[name] = v.entry
	}
	for name, v := range invalid {
		entries[name] = v
	}
	cfg := loadEntries(t, entries)

	if len(cfg.Services) != len(valid) {
		t.Errorf("%d services loaded, want %d", len(cfg.Services), len(valid))
	}
	got := map[string]service.Config{}
	for i, s := range cfg.Services {
		// The entry name is not kept; recover it from the order (sorted by entry name).
		got[sortedNames(valid)[i]] = s
	}
	for name, v := range valid {
		s, ok := got[name]
		if !ok || !v.check(s) {
			t.Errorf("valid entry %s loaded as %+v", name, s)
		}
	}
	if len(cfg.Skipped) != len(invalid) {
		t.Errorf("%d entries skipped, want %d: %v", len(cfg.Skipped), len(invalid), cfg.Skipped)
	}
	for name := range invalid {
		found := false
		for _, e := range cfg.Skipped {
			if strings.Contains(e.Error(), `"`+name+`"`) {
				found = true
			}
		}
		if !found {
			t.Errorf("invalid entry %s not reported as skipped", name)
		}
	}
	if app := cfg.AppConfig(); app.SkippedServices != len(invalid) || len(app.Services) != len(valid) {
		t.Errorf("AppConfig counts: %d services, %d skipped", len(app.Services), app.SkippedServices)
	}
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// TestLoadConfigMultiRank: one instance_id over several entries (one per DP rank) gives
// one service per rank, ordered by entry name, and they all start in one app.
func TestLoadConfigMultiRank(t *testing.T) {
	pubs := []string{newPublisher(t, false).Endpoint(), newPublisher(t, false).Endpoint()}
	cfg := loadEntries(t, map[string]any{
		"a-r1": entryWith("dp_rank", 1, "endpoint", pubs[1], "replay_endpoint", nil),
		"a-r0": entryWith("dp_rank", 0, "endpoint", pubs[0], "replay_endpoint", nil),
		"bad":  entryWith("dp_rank", -3),
	})
	if len(cfg.Services) != 2 || cfg.Services[0].DPRank != 0 || cfg.Services[1].DPRank != 1 ||
		cfg.Services[0].InstanceID != "engine-a" || cfg.Services[1].InstanceID != "engine-a" || len(cfg.Skipped) != 1 {
		t.Fatalf("services = %+v, skipped = %v", cfg.Services, cfg.Skipped)
	}
	appCfg := cfg.AppConfig()
	appCfg.HTTPPort, appCfg.RPCPort, appCfg.BindAddress, appCfg.Logger = 0, -1, "127.0.0.1", testLogger()
	app, err := Start(appCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Stop)
	svcs := app.Service.Services()
	if len(svcs) != 2 || svcs[0].Key() != "engine-a|default|0" || svcs[1].Key() != "engine-a|default|1" {
		t.Errorf("started services = %+v", svcs)
	}
	views := app.Engine.GlobalView()
	if len(views) != 1 || len(views[0].Instances) != 1 || len(views[0].Instances[0].Ranks) != 2 {
		t.Errorf("global view = %+v", views)
	}
}

// keyCase is a config text and the value its key must take in the file config and in
// the AppConfig made from it.
type keyCase[V comparable] struct {
	text      string
	file, app V
}

// checkConfigKey loads each case's text and compares what get reads from the file config
// and its AppConfig; each bad value of key must be refused with an error naming the key.
func checkConfigKey[V comparable](t *testing.T, key string, get func(FileConfig) (file, app V), cases []keyCase[V], bad ...string) {
	t.Helper()
	for _, c := range cases {
		cfg, err := LoadConfigFile(writeConfig(t, c.text))
		if err != nil {
			t.Fatalf("%s: %v", c.text, err)
		}
		if file, app := get(cfg); file != c.file || app != c.app {
			t.Errorf("%s: %s file %v app %v, want %v and %v", c.text, key, file, app, c.file, c.app)
		}
	}
	for _, v := range bad {
		text := `{"` + key + `": ` + v + `}`
		if _, err := LoadConfigFile(writeConfig(t, text)); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: error %v, want one naming %s", text, err, key)
		}
	}
}

// TestLoadConfigMemoPopulate: query_memo_populate defaults to true, takes a JSON bool,
// reaches the app's config, and anything else is an error naming the key.
func TestLoadConfigMemoPopulate(t *testing.T) {
	checkConfigKey(t, "query_memo_populate", func(c FileConfig) (bool, bool) { return c.PopulateMemo, c.AppConfig().PopulateMemo },
		[]keyCase[bool]{{`{}`, true, true}, {`{"query_memo_populate": false}`, false, false}, {`{"query_memo_populate": true}`, true, true}},
		`"yes"`, `1`, `null`)
}

// TestLoadConfigMaxBlocks: the engine-wide block budget key, its default and its errors.
func TestLoadConfigMaxBlocks(t *testing.T) {
	checkConfigKey(t, "max_blocks", func(c FileConfig) (int, int) { return c.MaxBlocks, c.AppConfig().MaxBlocks },
		[]keyCase[int]{{`{}`, 0, 0}, {`{"max_blocks": 0}`, 0, 0}, {`{"max_blocks": 5000000}`, 5_000_000, 5_000_000}},
		`-1`, `"10"`, `1.5`, `1e12`)
}

// TestLoadConfigMemoryLimit: the engine memory budget key, its default and its errors.
func TestLoadConfigMemoryLimit(t *testing.T) {
	checkConfigKey(t, "memory_limit_bytes", func(c FileConfig) (int64, int64) { return c.MemoryLimitBytes, c.AppConfig().MemoryLimitBytes },
		[]keyCase[int64]{{`{}`, 0, 0}, {`{"memory_limit_bytes": 0}`, 0, 0}, {`{"memory_limit_bytes": 68719476736}`, 64 << 30, 64 << 30}},
		`-1`, `"1G"`, `1.5`, `1e30`)
}

// TestLoadConfigMemoEntries: query_memo_entries, its default, 0 turning the memo off (-1
// in the AppConfig), its errors, and an app started with the memo off.
func TestLoadConfigMemoEntries(t *testing.T) {
	checkConfigKey(t, "query_memo_entries", func(c FileConfig) (int, int) { return c.MemoEntries, c.AppConfig().MemoEntries },
		[]keyCase[int]{
			{`{}`, hashing.DefaultMemoEntries, hashing.DefaultMemoEntries},
			{`{"query_memo_entries": 4096}`, 4096, 4096},
			{`{"query_memo_entries": 0}`, 0, -1}, // 0 disables the memo
		},
		`-1`, `"big"`, `1.5`, `1099511627776`)
	// Disabled in the file means no memo in the engine.
	app := startWith(t, AppConfig{RPCPort: -1, MemoEntries: -1})
	// A query answers (and Stop finds the listener serving).
	if code, _ := msgpackPost(t, app, "/query", queryBody("m", 16, seqTokens(32, 1))); code != 200 {
		t.Fatalf("query %d", code)
	}
	if c := app.Engine.MemoStats().Capacity; c != 0 {
		t.Fatalf("memo disabled but capacity %d", c)
	}
}

// TestConfigUnknownKeysRejected: a key the conductor does not know (a typo, or the
// bind_address it used to ignore) is an error naming the key, not silently ignored.
func TestConfigUnknownKeysRejected(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{`{"other": {"x": 1}}`, `unknown key(s) "other"`},
		{`{"bind_address": "127.0.0.1"}`, "http_bind_address and rpc_bind_address"},
		{`{"max_service": 3, "http_server_port": 1}`, `"max_service"`},
	} {
		path := writeConfig(t, c.text)
		_, err := LoadConfigFile(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err = %v, want mention of %s", c.text, err, c.want)
		}
	}
}

// TestConfigExposureAndLimitKeys: bind addresses, the admin token and every limit key
// reach the AppConfig; a non-positive limit is an error.
func TestConfigExposureAndLimitKeys(t *testing.T) {
	cfg, err := LoadConfigFile(writeConfig(t, `{"http_bind_address": "127.0.0.1", "rpc_bind_address": "::1",
		"admin_token": "s3cret", "max_query_body_bytes": 1000, "max_admin_body_bytes": 100,
		"max_inflight_body_bytes": 5000, "http_max_connections": 7, "http_read_buffer_bytes": 65536, "http_read_timeout_ms": 1500,
		"http_write_buffer_bytes": 16384, "http_idle_timeout_ms": 2500, "rpc_max_connections": 9, "rpc_read_timeout_ms": 3500,
		"rpc_idle_timeout_ms": 4500, "max_services": 11, "max_registration_field_bytes": 64, "shutdown_timeout_ms": 2000}`))
	if err != nil {
		t.Fatal(err)
	}
	app := cfg.AppConfig()
	want := Limits{MaxQueryBodyBytes: 1000, MaxAdminBodyBytes: 100, MaxInflightBodyBytes: 5000, HTTPMaxConnections: 7, HTTPReadBufferBytes: 65536,
		HTTPWriteBufferBytes: 16384, HTTPReadTimeout: 1500 * time.Millisecond, HTTPIdleTimeout: 2500 * time.Millisecond, RPCMaxConnections: 9,
		RPCReadTimeout: 3500 * time.Millisecond, RPCIdleTimeout: 4500 * time.Millisecond, MaxServices: 11,
		MaxFieldBytes: 64, ShutdownTimeout: 2 * time.Second}
	if app.Limits != want || app.HTTPBindAddress != "127.0.0.1" || app.RPCBindAddress != "::1" || app.AdminToken != "s3cret" {
		t.Fatalf("AppConfig = %+v", app)
	}
	for _, bad := range []string{`{"max_services": 0}`, `{"http_read_timeout_ms": -1}`, `{"http_read_buffer_bytes": 1024}`, `{"http_read_buffer_bytes": 1073741824}`, `{"http_write_buffer_bytes": 1024}`, `{"http_write_buffer_bytes": 1073741824}`, `{"max_query_body_bytes": "1"}`, `{"admin_token": 1}`} {
		if _, err := LoadConfigFile(writeConfig(t, bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	if d := (Limits{}).WithDefaults(); d.MaxQueryBodyBytes != 64<<20 || d.MaxServices != service.DefaultMaxServices || d.ShutdownTimeout != 5*time.Second || d.HTTPReadBufferBytes != 4<<10 || d.HTTPWriteBufferBytes != 4<<10 {
		t.Errorf("defaults = %+v", d)
	}
	if d := (Limits{HTTPReadBufferBytes: 100}).WithDefaults(); d.HTTPReadBufferBytes != limits.MinHTTPReadBufferBytes {
		t.Errorf("a read buffer under the minimum = %d", d.HTTPReadBufferBytes)
	}
}
