package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
}

func wantBody(t *testing.T, f *fakeConductor, route string, want any) {
	t.Helper()
	reqs := f.requests(route)
	if len(reqs) != 1 {
		t.Fatalf("%s: %d requests, want 1", route, len(reqs))
	}
	if !reflect.DeepEqual(reqs[0].body, want) {
		t.Fatalf("%s body\n got  %#v\n want %#v", route, reqs[0].body, want)
	}
}

// tableRows splits aligned table output into rows of cells.
func tableRows(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		rows = append(rows, strings.Fields(line))
	}
	return rows
}

func hasRow(rows [][]string, cells ...string) bool {
	for _, r := range rows {
		if reflect.DeepEqual(r, cells) {
			return true
		}
	}
	return false
}

func jsonOf(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, s)
	}
	return v
}

var registered = map[string]any{"status": "registered successfully", "instance_id": "vllm-prefill-node1"}

func TestRegisterFromFlags(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	r := f.run(t, "", "register", "--endpoint", "tcp://10.0.0.1:5557", "--replay-endpoint", "tcp://10.0.0.1:5558",
		"--type", "vLLM", "--model", "deepseek", "--lora", "ad", "--tenant", "t1", "--instance", "vllm-prefill-node1",
		"--block-size", "16", "--dp-rank", "2", "--cache-group", "0", "--strategy", "vllm_v1",
		"--algorithm", "sha256_cbor", "--seed", "0", "--projection", "low64_be")
	wantCode(t, r, 0)
	wantBody(t, f, "POST /register", map[string]any{
		"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558", "type": "vLLM",
		"modelname": "deepseek", "lora_name": "ad", "tenant_id": "t1", "instance_id": "vllm-prefill-node1",
		"block_size": int64(16), "dp_rank": int64(2), "cache_group": int64(0),
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor",
			"python_hash_seed": "0", "index_projection": "low64_be"},
	})
	rows := tableRows(r.stdout)
	if !hasRow(rows, "status", "registered", "successfully") || !hasRow(rows, "instance_id", "vllm-prefill-node1") {
		t.Fatalf("table:\n%s", r.stdout)
	}
}

func TestRegisterDerivedDefaults(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	// SGLang implies the sglang strategy, its only algorithm and projection; no seed.
	r := f.run(t, "", "register", "--endpoint", "tcp://h:1", "--type", "SGLang", "--model", "m",
		"--instance", "s1", "--block-size", "64")
	wantCode(t, r, 0)
	wantBody(t, f, "POST /register", map[string]any{
		"endpoint": "tcp://h:1", "type": "SGLang", "modelname": "m", "instance_id": "s1",
		"block_size": int64(64), "dp_rank": int64(0),
		"hash_profile": map[string]any{"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"},
	})
}

func TestRegisterFromFileWithOverrides(t *testing.T) {
	file := filepath.Join(t.TempDir(), "svc.json")
	svc := `{"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558", "type": "vLLM",
	  "modelname": "deepseek", "lora_name": "", "tenant_id": "default", "instance_id": "vllm-prefill-node1",
	  "block_size": 16, "dp_rank": 0, "cache_group": null,
	  "hash_profile": {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}}`
	if err := os.WriteFile(file, []byte(svc), 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"endpoint": "tcp://10.0.0.1:5557", "replay_endpoint": "tcp://10.0.0.1:5558", "type": "vLLM",
		"modelname": "deepseek", "tenant_id": "default", "instance_id": "vllm-prefill-node1",
		"block_size": int64(16), "dp_rank": int64(0),
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor",
			"python_hash_seed": "0", "index_projection": "low64_be"},
	}
	f := newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	wantCode(t, f.run(t, "", "register", "--file", file), 0)
	wantBody(t, f, "POST /register", want)

	// Flags given with --file win over its fields; the same file also comes from stdin.
	f = newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	wantCode(t, f.run(t, svc, "register", "--file", "-", "--dp-rank", "3", "--endpoint", "tcp://10.0.0.1:6000", "--seed", "42"), 0)
	want["dp_rank"], want["endpoint"] = int64(3), "tcp://10.0.0.1:6000"
	want["hash_profile"].(map[string]any)["python_hash_seed"] = "42"
	wantBody(t, f, "POST /register", want)
}

func TestRegisterBadInput(t *testing.T) {
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknown, []byte(`{"endpoint": "tcp://h:1", "model": "m"}`), 0o600)
	cases := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"vllm without seed", []string{"--endpoint", "tcp://h:1", "--type", "vLLM", "--model", "m", "--instance", "i",
			"--block-size", "16", "--algorithm", "sha256"}, "missing --seed"},
		{"vllm without algorithm", []string{"--endpoint", "tcp://h:1", "--type", "vLLM", "--model", "m", "--instance", "i",
			"--block-size", "16", "--seed", "0"}, "missing --algorithm"},
		{"no endpoint", []string{"--type", "SGLang", "--model", "m", "--instance", "i", "--block-size", "16"}, "missing --endpoint"},
		{"zero block size", []string{"--endpoint", "tcp://h:1", "--type", "SGLang", "--model", "m", "--instance", "i"}, "--block-size"},
		{"mooncake needs strategy", []string{"--endpoint", "tcp://h:1", "--type", "Mooncake", "--model", "m", "--instance", "i",
			"--block-size", "16"}, "missing --strategy"},
		{"bad cache group", []string{"--cache-group", "x"}, "--cache-group"},
		{"unknown flag", []string{"--modelname", "m"}, "flag provided but not defined: -modelname"},
		{"unknown file field", []string{"--file", unknown}, `unknown field "model"`},
		{"missing file", []string{"--file", filepath.Join(dir, "nope.json")}, "read --file"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeConductor(t)
			r := f.run(t, "", append([]string{"register"}, c.args...)...)
			wantCode(t, r, 2)
			if !strings.Contains(r.stderr, c.stderr) {
				t.Fatalf("stderr lacks %q:\n%s", c.stderr, r.stderr)
			}
			if f.total() != 0 {
				t.Fatal("a request was sent despite bad input")
			}
		})
	}
	// Flag problems come with the command's usage; an unreadable file does not need it.
	f := newFakeConductor(t)
	if r := f.run(t, "", "register", "--type", "vLLM"); !strings.Contains(r.stderr, "usage: conductorctl register") {
		t.Fatalf("no usage:\n%s", r.stderr)
	}
}

func TestRegisterJSONAndServerError(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /register", func(n int, _ any) (int, any) {
		if n == 1 {
			return 200, registered
		}
		return 400, map[string]any{"error": "conflicting registration for service key", "reason": "invalid_registration"}
	})
	args := []string{"register", "--endpoint", "tcp://h:1", "--type", "SGLang", "--model", "m", "--instance", "vllm-prefill-node1", "--block-size", "16"}
	r := f.run(t, "", append([]string{"--json"}, args...)...)
	wantCode(t, r, 0)
	if got := jsonOf(t, r.stdout); !reflect.DeepEqual(got, map[string]any{"status": "registered successfully", "instance_id": "vllm-prefill-node1"}) {
		t.Fatalf("JSON %v", got)
	}
	r = f.run(t, "", args...)
	wantCode(t, r, 1)
	if r.stderr != "error: conflicting registration for service key (reason: invalid_registration)\n" || r.stdout != "" {
		t.Fatalf("stderr %q stdout %q", r.stderr, r.stdout)
	}
}

func TestUnregister(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /unregister", func(n int, body any) (int, any) {
		if body.(map[string]any)["instance_id"] == "gone" {
			return 404, map[string]any{"error": "service not found: gone|default|0"}
		}
		return 200, map[string]any{"status": "unregistered successfully", "removed_instances": []any{"a|t1|3"}}
	})
	r := f.run(t, "", "unregister", "--instance", "a", "--tenant", "t1", "--dp-rank", "3")
	wantCode(t, r, 0)
	wantBody(t, f, "POST /unregister", map[string]any{"instance_id": "a", "tenant_id": "t1", "dp_rank": int64(3)})
	if !hasRow(tableRows(r.stdout), "removed_instances", "a|t1|3") {
		t.Fatalf("table:\n%s", r.stdout)
	}

	// Global flags also work after the command.
	r = f.run(t, "", "unregister", "--instance", "b", "--json")
	wantCode(t, r, 0)
	if got := jsonOf(t, r.stdout); !reflect.DeepEqual(got, map[string]any{"status": "unregistered successfully", "removed_instances": []any{"a|t1|3"}}) {
		t.Fatalf("JSON %v", got)
	}
	if last := f.requests("POST /unregister")[1].body; !reflect.DeepEqual(last, map[string]any{"instance_id": "b", "dp_rank": int64(0)}) {
		t.Fatalf("default tenant/rank body %#v", last)
	}

	r = f.run(t, "", "unregister", "--instance", "gone")
	wantCode(t, r, 1)
	if r.stderr != "error: service not found: gone|default|0\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	r = f.run(t, "", "unregister")
	wantCode(t, r, 2)
	if !strings.Contains(r.stderr, "missing --instance") || !strings.Contains(r.stderr, "usage: conductorctl unregister") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

var servicesBody = map[string]any{
	"count": 3,
	"services": []any{
		map[string]any{
			"Endpoint": "tcp://10.0.0.1:5557", "ReplayEndpoint": "tcp://10.0.0.1:5558", "Type": "vLLM",
			"ModelName": "deepseek", "LoraName": "", "TenantID": "default", "InstanceID": "vllm-prefill-node1",
			"BlockSize": 16, "DPRank": 0, "CacheGroup": nil,
			"HashProfile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0",
				"root_digest": strings.Repeat("ab", 32), "index_projection": "low64_be"},
			"IndexMedia": []any{"GPU"}, "HashCheck": "ok",
		},
		// The adapter of a multi-LoRA engine (issue 25's profile fields), whose profile
		// does not match its engine.
		map[string]any{
			"Endpoint": "tcp://10.0.0.1:5557", "ReplayEndpoint": "tcp://10.0.0.1:5558", "Type": "vLLM",
			"ModelName": "deepseek", "LoraName": "sql", "TenantID": "default", "InstanceID": "vllm-prefill-node1",
			"BlockSize": 16, "DPRank": 0, "CacheGroup": nil,
			"HashProfile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "unset",
				"root_digest": strings.Repeat("cd", 32), "index_projection": "low64_be", "extra_keys": "tagged",
				"lora_path": "/adapters/sql", "lookahead_tokens": 1},
			"IndexMedia": []any{"GPU", "CPU"}, "HashCheck": `mismatch (engine hashes match lookahead_tokens 0)`,
		},
		map[string]any{
			"Endpoint": "tcp://10.0.0.9:7000", "ReplayEndpoint": "", "Type": "Mooncake",
			"ModelName": "deepseek", "LoraName": "", "TenantID": "default", "InstanceID": "store",
			"BlockSize": 16, "DPRank": 0, "CacheGroup": 0,
			"HashProfile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0",
				"root_digest": strings.Repeat("ab", 32), "index_projection": "low64_be"},
		},
	},
}

func TestServices(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /services", reply(200, servicesBody))
	r := f.run(t, "", "services")
	wantCode(t, r, 0)
	rows := tableRows(r.stdout)
	if !hasRow(rows, "INSTANCE", "TENANT", "DP", "TYPE", "MODEL", "LORA", "BLOCK", "ENDPOINT", "REPLAY", "CACHE_GROUP", "MEDIA",
		"HASH_PROFILE", "HASH_CHECK") ||
		!hasRow(rows, "vllm-prefill-node1", "default", "0", "vLLM", "deepseek", "-", "16", "tcp://10.0.0.1:5557",
			"tcp://10.0.0.1:5558", "-", "GPU", "vllm_v1/sha256_cbor/low64_be", "seed=0", "ok") ||
		!hasRow(rows, "vllm-prefill-node1", "default", "0", "vLLM", "deepseek", "sql", "16", "tcp://10.0.0.1:5557",
			"tcp://10.0.0.1:5558", "-", "GPU,CPU", "vllm_v1/sha256_cbor/low64_be", "seed=unset", "extra_keys=tagged",
			"lora_path=/adapters/sql", "lookahead=1", "mismatch", "(engine", "hashes", "match", "lookahead_tokens", "0)") ||
		!hasRow(rows, "store", "default", "0", "Mooncake", "deepseek", "-", "16", "tcp://10.0.0.9:7000", "-", "0", "-",
			"vllm_v1/sha256_cbor/low64_be", "seed=0", "-") {
		t.Fatalf("table:\n%s", r.stdout)
	}
	// Columns are aligned: every row's ENDPOINT starts at the same offset.
	lines := strings.Split(r.stdout, "\n")
	if strings.Index(lines[0], "ENDPOINT") != strings.Index(lines[1], "tcp://10.0.0.1:5557") {
		t.Fatalf("not aligned:\n%s", r.stdout)
	}

	r = f.run(t, "", "--json", "services")
	wantCode(t, r, 0)
	want := jsonOf(t, mustJSON(t, servicesBody))
	if got := jsonOf(t, r.stdout); !reflect.DeepEqual(got, want) {
		t.Fatalf("JSON\n got  %v\n want %v", got, want)
	}

	f.on("GET /services", reply(200, map[string]any{"count": 0, "services": []any{}}))
	if r := f.run(t, "", "services"); r.code != 0 || r.stdout != "no services registered\n" {
		t.Fatalf("empty: %+v", r)
	}
	// None in JSON is an empty list, not null.
	r = f.run(t, "", "--json", "services")
	if got := jsonOf(t, r.stdout); r.code != 0 || !reflect.DeepEqual(got, map[string]any{"count": 0.0, "services": []any{}}) {
		t.Fatalf("empty JSON: %+v", r)
	}
	if r := f.run(t, "", "services", "extra"); r.code != 2 {
		t.Fatalf("extra argument accepted: %+v", r)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func viewBody(prefixes int) map[string]any {
	return map[string]any{
		"context_count": 2,
		"contexts": []any{
			map[string]any{
				"model_name": "qwen", "lora_name": "sql", "block_size": 64, "tenant_id": "acme", "prefix_count": 7,
				"hash_profile": map[string]any{"strategy": "sglang", "algorithm": "sha256_raw", "python_hash_seed": "0",
					"root_digest": strings.Repeat("0", 64), "index_projection": "first64_be"},
				"instances": map[string]any{"sg-1": []any{0}},
			},
			map[string]any{
				"model_name": "deepseek", "lora_name": "", "block_size": 16, "tenant_id": "default", "prefix_count": prefixes,
				"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0",
					"root_digest": "0123456789abcdef" + strings.Repeat("f", 48), "index_projection": "low64_be"},
				"instances": map[string]any{"vllm-b": []any{0}, "vllm-a": []any{0, 1}},
			},
		},
	}
}

func TestView(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(42)))
	r := f.run(t, "", "view")
	wantCode(t, r, 0)
	rows := tableRows(r.stdout)
	want := [][]string{
		{"TENANT", "MODEL", "LORA", "BLOCK", "PREFIXES", "HASH_PROFILE", "ROOT", "INSTANCES"},
		// Sorted by tenant, then model.
		{"acme", "qwen", "sql", "64", "7", "sglang/sha256_raw/first64_be", "seed=0", "000000000000...", "sg-1[0]"},
		{"default", "deepseek", "-", "16", "42", "vllm_v1/sha256_cbor/low64_be", "seed=0", "0123456789ab...", "vllm-a[0,1]", "vllm-b[0]"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("table\n got  %q\n want %q", rows, want)
	}
	r = f.run(t, "", "--json", "view")
	wantCode(t, r, 0)
	if got, exp := jsonOf(t, r.stdout), jsonOf(t, mustJSON(t, viewBody(42))); !reflect.DeepEqual(got, exp) {
		t.Fatalf("JSON\n got  %v\n want %v", got, exp)
	}
	f.on("GET /global_view", reply(200, map[string]any{"context_count": 0, "contexts": []any{}}))
	if r := f.run(t, "", "view"); r.code != 0 || r.stdout != "no contexts indexed\n" {
		t.Fatalf("empty: %+v", r)
	}
}

// queryBody answers like the contract's example, plus an instance with two ranks.
var queryBody = map[string]any{"instances": map[string]any{
	"vllm-prefill-node1": map[string]any{
		"longest_matched": 32, "dp": map[string]any{"0": 16},
		"rank_matches": map[string]any{"0": map[string]any{"device": 16, "cpu_local": 16, "cpu_share": 32, "disk": 32}},
		"device":       16, "cpu_local": 16, "cpu_share": 32, "disk": 32,
	},
	"dp-engine": map[string]any{
		"longest_matched": 48, "dp": map[string]any{"1": 48, "0": 0},
		"rank_matches": map[string]any{
			"0": map[string]any{"device": 0, "cpu_local": 0, "cpu_share": 0, "disk": 0},
			"1": map[string]any{"device": 48, "cpu_local": 48, "cpu_share": 48, "disk": 48},
		},
		"device": 48, "cpu_local": 48, "cpu_share": 48, "disk": 48,
	},
}}

func TestQueryTokenSources(t *testing.T) {
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "toks.json")
	os.WriteFile(jsonFile, []byte(" [101, 15,\n 100, 55, 89]\n"), 0o600)
	textFile := filepath.Join(dir, "toks.txt")
	os.WriteFile(textFile, []byte("101 15\n100,55\t89\n"), 0o600)
	want := []any{int64(101), int64(15), int64(100), int64(55), int64(89)}
	cases := []struct {
		name, stdin string
		args        []string
	}{
		{"inline", "", []string{"--tokens", "101,15,100,55,89"}},
		{"json file", "", []string{"--tokens-file", jsonFile}},
		{"text file", "", []string{"--tokens-file", textFile}},
		{"stdin dash", "101 15 100 55 89\n", []string{"-"}},
		{"stdin json via tokens-file", "[101,15,100,55,89]", []string{"--tokens-file", "-"}},
		{"stdin via tokens", "101,15,100,55,89", []string{"--tokens", "-"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeConductor(t)
			f.on("POST /query", reply(200, queryBody))
			r := f.run(t, c.stdin, append([]string{"query", "--model", "deepseek", "--block-size", "16"}, c.args...)...)
			wantCode(t, r, 0)
			wantBody(t, f, "POST /query", map[string]any{"model": "deepseek", "block_size": int64(16), "token_ids": want})
		})
	}
}

func TestQueryAllFieldsAndOutput(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /query", reply(200, queryBody))
	r := f.run(t, "", "query", "--model", "deepseek", "--block-size", "16", "--lora", "ad", "--tenant", "t1",
		"--instance", "vllm-prefill-node1", "--salt", "s3cret", "--tokens", "1, 2, -3")
	wantCode(t, r, 0)
	wantBody(t, f, "POST /query", map[string]any{"model": "deepseek", "block_size": int64(16), "lora_name": "ad",
		"tenant_id": "t1", "instance_id": "vllm-prefill-node1", "cache_salt": "s3cret",
		"token_ids": []any{int64(1), int64(2), int64(-3)}})
	want := [][]string{
		{"3", "tokens", "queried,", "2", "instances"},
		{"INSTANCE", "RANK", "LONGEST", "DEVICE", "CPU_LOCAL", "CPU_SHARE", "DISK"},
		{"dp-engine", "all", "48", "48", "48", "48", "48"},
		{"0", "0", "0", "0", "0"},
		{"1", "48", "48", "48", "48"},
		{"vllm-prefill-node1", "0", "32", "16", "16", "32", "32"},
	}
	if got := tableRows(r.stdout); !reflect.DeepEqual(got, want) {
		t.Fatalf("table\n got  %q\n want %q\n%s", got, want, r.stdout)
	}

	r = f.run(t, "", "--json", "query", "--model", "deepseek", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 0)
	if got, exp := jsonOf(t, r.stdout), jsonOf(t, mustJSON(t, queryBody)); !reflect.DeepEqual(got, exp) {
		t.Fatalf("JSON\n got  %v\n want %v", got, exp)
	}

	f.on("POST /query", reply(200, map[string]any{"instances": map[string]any{}}))
	r = f.run(t, "", "query", "--model", "other", "--block-size", "16", "--tokens", "")
	// An empty --tokens value is no source at all.
	wantCode(t, r, 2)
	r = f.run(t, "", "query", "--model", "other", "--block-size", "16", "-")
	wantCode(t, r, 0)
	if r.stdout != "0 tokens queried; no instances in this context\n" {
		t.Fatalf("empty: %q", r.stdout)
	}
}

func TestQueryBinaryTokens(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /query", reply(200, queryBody))
	r := f.run(t, "", "query", "--model", "m", "--block-size", "4", "--binary", "--tokens", "1 -2 2147483647")
	wantCode(t, r, 0)
	body := f.requests("POST /query")[0].body.(map[string]any)
	bin, ok := body["token_ids"].([]byte)
	if !ok || len(bin) != 12 {
		t.Fatalf("token_ids %#v", body["token_ids"])
	}
	for i, want := range []int32{1, -2, 2147483647} {
		if got := int32(binary.LittleEndian.Uint32(bin[4*i:])); got != want {
			t.Fatalf("token %d = %d, want %d", i, got, want)
		}
	}
}

func TestQueryErrors(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /query", reply(400, map[string]any{"error": "token id out of range", "reason": "out_of_range",
		"field": "token_ids", "index": 1}))
	r := f.run(t, "", "query", "--model", "m", "--block-size", "16", "--tokens", "1,2")
	wantCode(t, r, 1)
	if r.stderr != "error: token id out of range (reason: out_of_range, field: token_ids, index: 1)\n" || r.stdout != "" {
		t.Fatalf("stderr %q stdout %q", r.stderr, r.stdout)
	}

	f.on("POST /query", reply(400, map[string]any{"error": "block_size must be a positive integer", "reason": "out_of_range", "field": "block_size"}))
	r = f.run(t, "", "query", "--model", "m", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 1)
	if r.stderr != "error: block_size must be a positive integer (reason: out_of_range, field: block_size)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}

	f.on("POST /query", reply(500, map[string]any{"error": "internal error"}))
	r = f.run(t, "", "--json", "query", "--model", "m", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 1)
	if r.stderr != "error: internal error\n" || r.stdout != "" {
		t.Fatalf("stderr %q stdout %q", r.stderr, r.stdout)
	}

	sent := f.total()
	bad := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"no model", []string{"--block-size", "16", "--tokens", "1"}, "missing --model"},
		{"no block size", []string{"--model", "m", "--tokens", "1"}, "--block-size"},
		{"no tokens", []string{"--model", "m", "--block-size", "16"}, "no tokens"},
		{"two sources", []string{"--model", "m", "--block-size", "16", "--tokens", "1", "-"}, "only one of"},
		{"stray argument", []string{"--model", "m", "--block-size", "16", "toks.txt"}, "unexpected arguments"},
		{"not an int", []string{"--model", "m", "--block-size", "16", "--tokens", "1,x,3"}, `token 1 ("x"): not an integer`},
		{"out of int32", []string{"--model", "m", "--block-size", "16", "--tokens", "1 2 2147483648"}, `token 2 ("2147483648"): out of int32 range`},
		{"bad json", []string{"--model", "m", "--block-size", "16", "--tokens", "[1, 2.5]"}, "token 1 (2.5): not an integer"},
		{"missing file", []string{"--model", "m", "--block-size", "16", "--tokens-file", "/nonexistent/t"}, "read tokens from /nonexistent/t"},
		{"bad flag value", []string{"--model", "m", "--block-size", "x"}, "invalid value"},
	}
	for _, c := range bad {
		r := f.run(t, "", append([]string{"query"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.stderr) {
			t.Errorf("%s: exit %d stderr %q, want 2 and %q", c.name, r.code, r.stderr, c.stderr)
		}
	}
	if f.total() != sent {
		t.Fatal("bad input still sent a request")
	}
}

func TestConnectionRefused(t *testing.T) {
	addr := deadAddr(t)
	for _, args := range [][]string{
		{"view"},
		{"services"},
		{"query", "--model", "m", "--block-size", "1", "--tokens", "1"},
		{"unregister", "--instance", "x"},
		{"register", "--endpoint", "tcp://h:1", "--type", "SGLang", "--model", "m", "--instance", "i", "--block-size", "1"},
	} {
		r := runWith(t, context.Background(), "", append([]string{"--addr", addr}, args...)...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, "error: cannot reach http://"+addr+": ") || r.stdout != "" {
			t.Errorf("%v: exit %d stderr %q stdout %q", args, r.code, r.stderr, r.stdout)
		}
	}
}

func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	f := newFakeConductor(t)
	f.on("GET /global_view", func(int, any) (int, any) {
		<-release
		return 200, map[string]any{"context_count": 0, "contexts": []any{}}
	})
	defer close(release) // before the server's Close (registered earlier) waits for the handler
	r := f.run(t, "", "--timeout", "50ms", "view")
	wantCode(t, r, 2)
	if !strings.Contains(r.stderr, "cannot reach "+f.srv.URL+": no response within 50ms") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

func TestUsage(t *testing.T) {
	cases := []struct {
		args   []string
		code   int
		stream string // where the usage goes
		text   string
	}{
		{nil, 2, "stderr", "error: no command given"},
		{[]string{"frobnicate"}, 2, "stderr", `error: unknown command "frobnicate"`},
		{[]string{"--bogus", "view"}, 2, "stderr", "flag provided but not defined: -bogus"},
		{[]string{"--timeout", "soon", "view"}, 2, "stderr", "invalid value"},
		{[]string{"--addr", "ftp://x", "view"}, 2, "stderr", "error: --addr: "},
		{[]string{"-h"}, 0, "stdout", "usage: conductorctl"},
		{[]string{"help"}, 0, "stdout", "commands:"},
		{[]string{"query", "-h"}, 0, "stdout", "usage: conductorctl query"},
		{[]string{"snapshot", "-h"}, 0, "stdout", "usage: conductorctl snapshot"},
		{[]string{"snapshot", "-h"}, 0, "stdout", "-addr string"},
		{[]string{"snapshot", "-h"}, 0, "stdout", "-token string"},
		{[]string{"snapshot", "save", "-h"}, 0, "stdout", "-token string"},
		{[]string{"snapshot", "frobnicate"}, 2, "stderr", "-token string"},
		{[]string{"watch", "--interval", "0"}, 2, "stderr", "--interval must be positive"},
	}
	for _, c := range cases {
		r := runWith(t, context.Background(), "", c.args...)
		out := r.stdout
		if c.stream == "stderr" {
			out = r.stderr
		}
		if r.code != c.code || !strings.Contains(out, c.text) {
			t.Errorf("%q: exit %d (want %d), %s lacks %q:\nstdout %s\nstderr %s", c.args, r.code, c.code, c.stream, c.text, r.stdout, r.stderr)
		}
		if c.code == 2 && !strings.Contains(r.stderr, "usage: conductorctl") && c.args[0] != "--addr" {
			t.Errorf("%q: no usage on stderr", c.args)
		}
	}
}

func TestWatchTable(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", func(n int, _ any) (int, any) { return 200, viewBody(40 + 5*n) })
	f.on("GET /services", reply(200, servicesBody))
	f.on("POST /query", reply(200, queryBody))
	toks := filepath.Join(t.TempDir(), "probe.json")
	os.WriteFile(toks, []byte("[1,2,3,4]"), 0o600)
	r := f.run(t, "", "watch", "--interval", "5ms", "--count", "3", "--model", "deepseek", "--block-size", "16", "--tokens-file", toks)
	wantCode(t, r, 0)
	for _, route := range []string{"GET /global_view", "GET /services", "POST /query"} {
		if n := len(f.requests(route)); n != 3 {
			t.Fatalf("%s called %d times, want 3", route, n)
		}
	}
	wantProbe := map[string]any{"model": "deepseek", "block_size": int64(16), "token_ids": []any{int64(1), int64(2), int64(3), int64(4)}}
	if got := f.requests("POST /query")[2].body; !reflect.DeepEqual(got, wantProbe) {
		t.Fatalf("probe body %#v", got)
	}
	if strings.Contains(r.stdout, clearScreen) {
		t.Fatal("cleared the screen of a non-terminal")
	}
	frames := strings.Split(r.stdout, "conductor "+f.srv.URL)
	if len(frames) != 4 || !strings.Contains(frames[3], "refresh 3/3") {
		t.Fatalf("want 3 frames:\n%s", r.stdout)
	}
	// The CHANGE column: unknown on the first refresh, then the growth of prefix_count.
	first, third := tableRows(frames[1]), tableRows(frames[3])
	if !hasRow(first, "default", "deepseek", "-", "16", "45", "-", "vllm_v1/sha256_cbor/low64_be", "seed=0",
		"0123456789ab...", "vllm-a[0,1]", "vllm-b[0]") {
		t.Fatalf("first frame:\n%s", frames[1])
	}
	if !hasRow(third, "default", "deepseek", "-", "16", "55", "+5", "vllm_v1/sha256_cbor/low64_be", "seed=0",
		"0123456789ab...", "vllm-a[0,1]", "vllm-b[0]") || !hasRow(third, "acme", "qwen", "sql", "64", "7", "+0",
		"sglang/sha256_raw/first64_be", "seed=0", "000000000000...", "sg-1[0]") {
		t.Fatalf("third frame:\n%s", frames[3])
	}
	if !hasRow(third, "store", "default", "0", "Mooncake", "deepseek", "-", "16", "tcp://10.0.0.9:7000", "-") ||
		!hasRow(third, "vllm-prefill-node1", "default", "0", "vLLM", "deepseek", "sql", "16", "tcp://10.0.0.1:5557", "mismatch",
			"(engine", "hashes", "match", "lookahead_tokens", "0)") ||
		!hasRow(third, "vllm-prefill-node1", "0", "32", "16", "16", "32", "32") ||
		!strings.Contains(frames[3], "PROBE model deepseek, block 16") || !strings.Contains(frames[3], "4 tokens queried, 2 instances") {
		t.Fatalf("services or probe missing:\n%s", frames[3])
	}
}

func TestWatchWithoutProbeJSON(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(1)))
	f.on("GET /services", reply(200, servicesBody))
	r := f.run(t, "", "--json", "watch", "--interval", "1ms", "--count", "2")
	wantCode(t, r, 0)
	if n := len(f.requests("POST /query")); n != 0 {
		t.Fatalf("probed %d times without a probe prompt", n)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines:\n%s", r.stdout)
	}
	for i, line := range lines {
		v := jsonOf(t, line).(map[string]any)
		if v["refresh"] != float64(i+1) || v["global_view"].(map[string]any)["context_count"] != float64(2) ||
			v["services"].(map[string]any)["count"] != float64(3) || v["probe"] != nil {
			t.Fatalf("line %d: %s", i, line)
		}
		if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT`).MatchString(v["time"].(string)) {
			t.Fatalf("time %v", v["time"])
		}
	}
}

func TestWatchErrors(t *testing.T) {
	// Unreachable: one error line per refresh, frames still drawn, exit 2 at the end.
	addr := deadAddr(t)
	r := runWith(t, context.Background(), "", "--addr", addr, "watch", "--interval", "1ms", "--count", "2")
	wantCode(t, r, 2)
	if n := strings.Count(r.stderr, "error: cannot reach http://"+addr); n != 2 {
		t.Fatalf("%d error lines:\n%s", n, r.stderr)
	}
	if strings.Count(r.stdout, "unavailable") != 4 {
		t.Fatalf("frames:\n%s", r.stdout)
	}

	// A failing probe is reported while the rest of the frame is shown; a later
	// success decides the exit status of a --count run.
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(1)))
	f.on("GET /services", reply(200, servicesBody))
	f.on("POST /query", func(n int, _ any) (int, any) {
		if n == 1 {
			return 400, map[string]any{"error": "model must not be empty", "reason": "invalid_value", "field": "model"}
		}
		return 200, queryBody
	})
	r = f.run(t, "", "watch", "--interval", "1ms", "--count", "2", "--model", "m", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 0)
	if r.stderr != "error: model must not be empty (reason: invalid_value, field: model)\n" {
		t.Fatalf("stderr %q", r.stderr)
	}
	r = f.run(t, "", "watch", "--count", "1", "--model", "m", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 0)
	f.on("POST /query", reply(404, map[string]any{"error": "nope"}))
	r = f.run(t, "", "watch", "--count", "1", "--model", "m", "--block-size", "16", "--tokens", "1")
	wantCode(t, r, 1)

	// A partial probe is a usage error.
	r = f.run(t, "", "watch", "--count", "1", "--model", "m")
	wantCode(t, r, 2)
	if !strings.Contains(r.stderr, "probe: missing or non-positive --block-size") {
		t.Fatalf("stderr %q", r.stderr)
	}
}

func TestWatchStopsOnInterrupt(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(1)))
	f.on("GET /services", reply(200, servicesBody))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // as if SIGINT arrived during the first refresh
	r := runWith(t, ctx, "", "--addr", f.srv.URL, "watch", "--interval", "1h")
	wantCode(t, r, 0)
	if n := len(f.requests("GET /global_view")); n != 1 {
		t.Fatalf("%d refreshes", n)
	}
}

func TestWatchClearsTerminal(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(1)))
	f.on("GET /services", reply(200, servicesBody))
	var out, errb strings.Builder
	c := &cli{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb, clearScreen: true}
	if code := c.run([]string{"--addr", f.srv.URL, "watch", "--interval", "1ms", "--count", "2"}); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Count(out.String(), clearScreen) != 2 || !strings.HasPrefix(out.String(), clearScreen) {
		t.Fatalf("output %q", out.String())
	}
}

func TestRunUsesGivenWriters(t *testing.T) {
	f := newFakeConductor(t)
	f.on("GET /global_view", reply(200, viewBody(3)))
	var out, errb strings.Builder
	if code := run([]string{"--addr", f.srv.URL, "view"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "deepseek") || errb.Len() != 0 {
		t.Fatalf("exit %d stdout %q stderr %q", code, out.String(), errb.String())
	}
}

// TestRegisterNewProfileFields: the hash_profile fields of issue 25 and index_media, from
// flags or a file; unregister --lora names one adapter ("" included), without it none.
func TestRegisterNewProfileFields(t *testing.T) {
	f := newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	r := f.run(t, "", "register", "--endpoint", "tcp://h:1", "--type", "vLLM", "--model", "m", "--lora", "sql",
		"--instance", "e", "--block-size", "16", "--algorithm", "sha256", "--seed", "unset", "--extra-keys", "tagged",
		"--lora-path", "/adapters/sql", "--lookahead-tokens", "1", "--index-media", "GPU,CPU")
	wantCode(t, r, 0)
	want := map[string]any{
		"endpoint": "tcp://h:1", "type": "vLLM", "modelname": "m", "lora_name": "sql", "instance_id": "e",
		"block_size": int64(16), "dp_rank": int64(0), "index_media": []any{"GPU", "CPU"},
		"hash_profile": map[string]any{"strategy": "vllm_v1", "algorithm": "sha256", "python_hash_seed": "unset",
			"index_projection": "low64_be", "extra_keys": "tagged", "lora_path": "/adapters/sql", "lookahead_tokens": int64(1)},
	}
	wantBody(t, f, "POST /register", want)
	file := filepath.Join(t.TempDir(), "svc.json")
	svc := `{"endpoint": "tcp://h:1", "type": "vLLM", "modelname": "m", "lora_name": "sql", "instance_id": "e",
	  "block_size": 16, "dp_rank": 0, "index_media": ["GPU", "CPU"], "hash_profile": {"strategy": "vllm_v1",
	  "algorithm": "sha256", "python_hash_seed": "unset", "index_projection": "low64_be", "extra_keys": "tagged",
	  "lora_path": "/adapters/sql", "lookahead_tokens": 1}}`
	if err := os.WriteFile(file, []byte(svc), 0o600); err != nil {
		t.Fatal(err)
	}
	f = newFakeConductor(t)
	f.on("POST /register", reply(200, registered))
	wantCode(t, f.run(t, "", "register", "--file", file), 0)
	wantBody(t, f, "POST /register", want)

	for _, c := range []struct {
		args []string
		want map[string]any
	}{
		{[]string{"--lora", ""}, map[string]any{"instance_id": "e", "dp_rank": int64(0), "lora_name": ""}},
		{[]string{"--lora", "sql"}, map[string]any{"instance_id": "e", "dp_rank": int64(0), "lora_name": "sql"}},
		{nil, map[string]any{"instance_id": "e", "dp_rank": int64(0)}},
	} {
		f = newFakeConductor(t)
		f.on("POST /unregister", reply(200, map[string]any{"status": "unregistered successfully", "removed_instances": []any{"e|default|0"}}))
		wantCode(t, f.run(t, "", append([]string{"unregister", "--instance", "e"}, c.args...)...), 0)
		wantBody(t, f, "POST /unregister", c.want)
	}
}
