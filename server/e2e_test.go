package server

import (
	"net/http"
	"testing"
)

// TestEndToEndVLLM: register a real ZMQ publisher over HTTP, publish vLLM events whose
// hashes come from the engine-side recipe, and check /query, /global_view, /services, then
// unregister and check the entries are gone.
func TestEndToEndVLLM(t *testing.T) {
	app := startApp(t, false)
	pub := newPublisher(t, false)

	code, resp := msgpackPost(t, app, "/register", registerBody(pub.Endpoint(), "engine-a", 0))
	if code != http.StatusOK || resp["status"] != "registered successfully" || resp["instance_id"] != "engine-a" {
		t.Fatalf("register: %d %v", code, resp)
	}
	waitSub(t, pub, 1)
	tokens := seqTokens(64, 1) // 4 blocks of 16
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", tokens)
	mustPublish(t, pub, vllmBatch(0, stored(keys[:3], "GPU")))
	waitDevice(t, app, tokens, "engine-a", 48)
	_, r := msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	inst := hits(t, r)["engine-a"].(map[string]any)
	for _, tier := range []string{"longest_matched", "device", "cpu_local", "cpu_share", "disk"} {
		if got := asInt(t, inst[tier]); got != 48 {
			t.Errorf("%s = %d, want 48", tier, got)
		}
	}
	if dp := inst["dp"].(map[string]any); asInt(t, dp["0"]) != 48 || len(dp) != 1 {
		t.Errorf("dp = %v", dp)
	}
	rm := inst["rank_matches"].(map[string]any)["0"].(map[string]any)
	if asInt(t, rm["device"]) != 48 || asInt(t, rm["disk"]) != 48 {
		t.Errorf("rank_matches = %v", rm)
	}

	// A different salt hashes differently: no hit, but the instance is listed with zeros.
	_, r = msgpackPost(t, app, "/query", queryBody("m", 16, tokens, "cache_salt", "s1"))
	if got := tierOf(t, hits(t, r), "engine-a", "disk"); got != 0 {
		t.Errorf("salted query disk = %d, want 0", got)
	}
	// Unknown context: empty instances.
	_, r = msgpackPost(t, app, "/query", queryBody("other", 16, tokens))
	if len(hits(t, r)) != 0 {
		t.Errorf("unknown model: %v", r)
	}

	// Remove block 1: the prefix stops at block 0.
	mustPublish(t, pub, vllmBatch(0, removed(keys[1:2], "GPU")))
	waitDevice(t, app, tokens, "engine-a", 16)

	code, view := doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	if code != http.StatusOK || asInt(t, view["context_count"]) != 1 {
		t.Fatalf("global_view: %d %v", code, view)
	}
	ctx := view["contexts"].([]any)[0].(map[string]any)
	if asInt(t, ctx["prefix_count"]) != 2 || ctx["model_name"] != "m" || asInt(t, ctx["block_size"]) != 16 {
		t.Errorf("context view = %v", ctx)
	}
	hp := ctx["hash_profile"].(map[string]any)
	if hp["root_digest"] != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Errorf("root_digest = %v", hp["root_digest"])
	}
	if ranks := ctx["instances"].(map[string]any)["engine-a"].([]any); len(ranks) != 1 || asInt(t, ranks[0]) != 0 {
		t.Errorf("instances = %v", ctx["instances"])
	}

	code, svcs := doHTTP(t, app, http.MethodGet, "/services", "", nil)
	if code != http.StatusOK || asInt(t, svcs["count"]) != 1 {
		t.Fatalf("services: %d %v", code, svcs)
	}
	svc := svcs["services"].([]any)[0].(map[string]any)
	if svc["Endpoint"] != pub.Endpoint() || svc["Type"] != "vLLM" || svc["InstanceID"] != "engine-a" ||
		svc["CacheGroup"] != nil || svc["TenantID"] != "default" {
		t.Errorf("service = %v", svc)
	}

	code, resp = msgpackPost(t, app, "/unregister", mp("instance_id", "engine-a", "dp_rank", 0))
	if code != http.StatusOK || resp["status"] != "unregistered successfully" {
		t.Fatalf("unregister: %d %v", code, resp)
	}
	if rem := resp["removed_instances"].([]any); len(rem) != 1 || rem[0] != "engine-a|default|0" {
		t.Errorf("removed_instances = %v", rem)
	}
	_, r = msgpackPost(t, app, "/query", queryBody("m", 16, tokens))
	if len(hits(t, r)) != 0 {
		t.Errorf("after unregister: %v", r)
	}
	_, view = doHTTP(t, app, http.MethodGet, "/global_view", "", nil)
	for _, c := range view["contexts"].([]any) {
		if n := asInt(t, c.(map[string]any)["prefix_count"]); n != 0 {
			t.Errorf("prefix_count after unregister = %d", n)
		}
	}
	code, _ = msgpackPost(t, app, "/unregister", mp("instance_id", "engine-a", "dp_rank", 0))
	if code != http.StatusNotFound {
		t.Errorf("second unregister: %d, want 404", code)
	}
}
