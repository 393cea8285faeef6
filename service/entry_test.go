package service

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// newFieldsCfg is a registration using every field of issue 25: a vLLM >= 0.33 engine
// serving two adapters, indexing its offloaded tiers too.
func newFieldsCfg(t testing.TB) Config {
	t.Helper()
	r := Registration{Endpoint: "tcp://127.0.0.1:5557", Type: "vLLM", ModelName: "m", LoraName: "a", InstanceID: "e",
		BlockSize: 16, Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "unset", IndexProjection: "low64_be",
		ExtraKeys: "tagged", LoraPath: "/adapters/a", LookaheadTokens: 1, IndexMedia: []string{"gpu", "CPU", "storage"}}
	cfg, err := r.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err = cfg.WithAdapters(append(cfg.Loras(), Adapter{LoraName: "b", LoraPath: "/adapters/b"}, Adapter{LoraName: ""}))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestEntryRoundTripNewFields: the persisted form (state file, cluster registry) keeps
// every new field, the media and the adapters; reading it back gives the same
// registration, and its root_digest.
func TestEntryRoundTripNewFields(t *testing.T) {
	cfg := newFieldsCfg(t)
	raw, err := EncodeEntry(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"extra_keys":"tagged"`, `"lora_path":"/adapters/a"`, `"lookahead_tokens":1`,
		`"python_hash_seed":"unset"`, `"index_media":["GPU","CPU","STORAGE"]`,
		`"lora_adapters":[{"lora_name":""},{"lora_name":"b","lora_path":"/adapters/b"}]`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("entry %s lacks %s", raw, want)
		}
	}
	back, err := DecodeEntry("", raw)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Equal(&cfg) || back.Profile.RootHex() != cfg.Profile.RootHex() || back.Media != cfg.Media {
		t.Fatalf("read back %+v\nwant %+v", back, cfg)
	}
	// Through the state file too.
	path := filepath.Join(t.TempDir(), StateFileName)
	f := &StateFile{Path: path}
	if err := f.Put(&cfg); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	st, err := (&StateFile{Path: path}).Load()
	if err != nil || len(st.Services) != 1 || len(st.Skipped) != 0 || !st.Services[0].Equal(&cfg) {
		t.Fatalf("state file: %v %+v %v", err, st.Services, st.Skipped)
	}
}

// TestEntryWithoutNewFieldsUnchanged: a registration using none of the new fields is
// written byte for byte as before they existed, and an entry written then loads.
func TestEntryWithoutNewFieldsUnchanged(t *testing.T) {
	cfg := stateCfg(t, 1)
	raw, err := EncodeEntry(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	const before = `{"endpoint":"tcp://127.0.0.1:1001","replay_endpoint":"","type":"vLLM","modelname":"m","lora_name":"",` +
		`"tenant_id":"default","instance_id":"e1","block_size":16,"dp_rank":0,"cache_group":null,` +
		`"hash_profile":{"algorithm":"sha256","index_projection":"low64_be","python_hash_seed":"0","strategy":"vllm_v1"}}`
	if string(raw) != before {
		t.Fatalf("entry\n%s\nwant\n%s", raw, before)
	}
	back, err := DecodeEntry("", json.RawMessage(before))
	if err != nil || !back.Equal(&cfg) || back.Media.Explicit() || len(back.Adapters) != 0 {
		t.Fatalf("%v %+v", err, back)
	}
}

func TestEntryRefusals(t *testing.T) {
	// vllm is an entry with the profile's extra members prof and the entry's extra.
	vllm := func(prof, extra string) string {
		return fmt.Sprintf(`{"endpoint":"tcp://h:1","type":"vLLM","modelname":"m","instance_id":"e","block_size":16,"dp_rank":0,`+
			`"hash_profile":{"strategy":"vllm_v1","algorithm":"sha256","python_hash_seed":"0","index_projection":"low64_be"%s}%s}`, prof, extra)
	}
	for _, c := range []struct{ name, entry, want string }{
		{"tagged LoRA without path", vllm(`,"extra_keys":"tagged"`, `,"lora_name":"a"`), "lora_path is required"},
		{"path untagged", vllm(`,"lora_path":"/p"`, `,"lora_name":"a"`), `lora_path is hashed only with extra_keys "tagged"`},
		{"lookahead type", vllm(`,"lookahead_tokens":"1"`, ""), "lookahead_tokens must be an integer"},
		{"lookahead range", vllm(`,"lookahead_tokens":-1`, ""), "lookahead_tokens -1 is out of range"},
		{"unknown profile key", vllm(`,"lookahead":1`, ""), `unknown key "lookahead"`},
		{"media type", vllm("", `,"index_media":"GPU"`), "index_media must be an array of strings"},
		{"media name", vllm("", `,"index_media":["CPU_PINNED"]`), `"CPU_PINNED" is not a vLLM medium`},
		{"adapter twice", vllm("", `,"lora_adapters":[{"lora_name":""}]`), `lora_name "" is listed twice`},
		{"adapter key", vllm("", `,"lora_adapters":[{"name":"b"}]`), `unknown key "name"`},
		{"adapter path untagged", vllm("", `,"lora_adapters":[{"lora_name":"b","lora_path":"/b"}]`), `adapter "b"`},
		{"adapter without name", vllm("", `,"lora_adapters":[{"lora_path":"/b"}]`), "lora_name is required"},
	} {
		_, err := DecodeEntry("", json.RawMessage(c.entry))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %s: %v, want %q", c.name, c.entry, err, c.want)
		}
	}
}

// TestWithAdaptersSGLangAmbiguous: an SGLang engine registered for the base model and
// an adapter without lora_path is refused (its LoRA pages may carry the base pages'
// hashes); with lora_path (SGLang >= 0.5.23) it is accepted, and so are adapters
// without path when the base model is not registered on the engine.
func TestWithAdaptersSGLangAmbiguous(t *testing.T) {
	r := Registration{Endpoint: "tcp://h:1", Type: "SGLang", ModelName: "m", InstanceID: "e", BlockSize: 16,
		Strategy: "sglang", Algorithm: "sha256_raw", IndexProjection: "first64_be"}
	base, verr := r.Resolve()
	if verr != nil {
		t.Fatal(verr)
	}
	if _, err := base.WithAdapters(append(base.Loras(), Adapter{LoraName: "a"})); err == nil ||
		err.Reason != "invalid_registration" || !strings.Contains(err.Msg, "wrong hits") {
		t.Fatalf("base + adapter without path: %v", err)
	}
	if _, err := base.WithAdapters([]Adapter{{LoraName: "a"}, {LoraName: ""}}); err == nil {
		t.Fatal("adapter without path first, then the base: accepted")
	}
	if c, err := base.WithAdapters(append(base.Loras(), Adapter{LoraName: "a", LoraPath: "/adapters/a"})); err != nil ||
		len(c.Adapters) != 1 || c.Adapters[0].LoraPath != "/adapters/a" {
		t.Fatalf("base + adapter with path: %v %+v", err, c)
	}
	if _, err := base.WithAdapters([]Adapter{{LoraName: "a"}, {LoraName: "b"}}); err != nil {
		t.Fatalf("adapters without the base: %v", err)
	}
	// vLLM has no such ambiguity: its events name the adapter.
	v := stateCfg(t, 0)
	if _, err := v.WithAdapters(append(v.Loras(), Adapter{LoraName: "a"})); err != nil {
		t.Fatalf("vLLM base + untagged adapter: %v", err)
	}
	// Mooncake sources have no adapters.
	m := v
	m.Kind = publisher.Mooncake
	if _, err := m.WithAdapters(append(m.Loras(), Adapter{LoraName: "a"})); err == nil {
		t.Fatal("Mooncake adapters accepted")
	}
}

// TestResolveIndexMedia: index_media is validated for the kind and normalised (the
// default set is the zero value).
func TestResolveIndexMedia(t *testing.T) {
	r := Registration{Endpoint: "tcp://h:1", Type: "vLLM", ModelName: "m", InstanceID: "e", BlockSize: 16,
		Strategy: "vllm_v1", Algorithm: "sha256", PythonHashSeed: "0", IndexProjection: "low64_be"}
	for _, c := range []struct {
		media []string
		want  []string // nil: refused
	}{
		{nil, []string{"GPU"}}, {[]string{"GPU"}, []string{"GPU"}}, {[]string{"storage", "CPU"}, []string{"CPU", "STORAGE"}},
		{[]string{}, nil}, {[]string{"DISK"}, nil},
	} {
		r.IndexMedia = c.media
		cfg, err := r.Resolve()
		if c.want == nil {
			if err == nil || err.Field != "index_media" {
				t.Errorf("%q: %v, want an index_media refusal", c.media, err)
			}
			continue
		}
		if err != nil || strings.Join(cfg.Media.Names(cfg.Kind), ",") != strings.Join(c.want, ",") {
			t.Errorf("%q: %v %v", c.media, err, cfg.Media.Names(cfg.Kind))
		}
		if def := c.media == nil || len(c.media) == 1; def == cfg.Media.Explicit() {
			t.Errorf("%q: explicit %v", c.media, cfg.Media.Explicit())
		}
	}
}
