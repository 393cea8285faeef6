package server

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
)

// qbhFill builds a context (lora "l", block size bs) in which instances hold different
// prefixes of the salted prompt in different tiers and ranks, so that every count of the
// answer is distinct.
func qbhFill(t *testing.T, app *App, profile [4]string, bs int, salt string, tokens []int32) {
	t.Helper()
	p, err := hashing.Resolve(profile[0], profile[1], profile[2], profile[3])
	if err != nil {
		t.Fatal(err)
	}
	key := engine.ContextKey{TenantID: "default", ModelName: "m", LoraName: "l", BlockSize: int64(bs)}
	keys := blockKeys(t, profile[0], profile[1], profile[2], profile[3], bs, "l", salt, tokens)
	layout := []struct {
		inst   string
		rank   int
		tier   engine.EngineTier
		blocks int
	}{
		{"a", 0, engine.TierDevice, len(keys)},
		{"a", 1, engine.TierDevice, len(keys) / 3},
		{"b", 0, engine.TierDevice, 2},
		{"b", 0, engine.TierCPULocal, len(keys) / 2},
		{"c", 0, engine.TierDisk, len(keys) - 1},
		{"d", 0, engine.TierDevice, 0},
	}
	for _, l := range layout {
		slot := engine.Slot{InstanceID: l.inst, DPRank: l.rank}
		if _, err := app.Engine.RegisterSlot(key, p, slot); err != nil {
			t.Fatal(err)
		}
		ops := []engine.Op{{Kind: engine.OpStore, Slot: slot, Tier: l.tier, Hashes: keys[:l.blocks]}}
		if err := app.Engine.Apply(key, ops); err != nil || ops[0].Err != nil {
			t.Fatal(err, ops[0].Err)
		}
	}
}

// rawPost sends a msgpack body and returns the status and raw response bytes.
func rawPost(t *testing.T, app *App, path string, body []byte) (int, []byte) {
	t.Helper()
	code, _, raw := httpRaw(t, app, http.MethodPost, path, body, "Content-Type", "application/msgpack")
	return code, raw
}

func hashesBin(keys []uint64) []byte {
	b := make([]byte, 0, 8*len(keys))
	for _, k := range keys {
		b = binary.LittleEndian.AppendUint64(b, k)
	}
	return b
}

// TestQueryByHashEqualsQuery: for prompts that hit fully, partly and not at all, with and
// without an instance filter, /query_by_hash with the prompt's block keys (array and bin)
// answers with exactly the bytes /query answers, for each vLLM algorithm and SGLang.
func TestQueryByHashEqualsQuery(t *testing.T) {
	profiles := [][4]string{
		{"vllm_v1", "sha256_cbor", "0", "low64_be"},
		{"vllm_v1", "sha256", "7", "low64_be"},
		{"sglang", "sha256_raw", "", "first64_be"},
	}
	const bs, salt = 4, "s1"
	for _, prof := range profiles {
		t.Run(prof[0]+"-"+prof[1], func(t *testing.T) {
			app := startApp(t, false)
			full := seqTokens(20*bs, 100) // 20 whole blocks
			qbhFill(t, app, prof, bs, salt, full)
			miss := append([]int32{9}, full[1:]...)
			half := append(append([]int32(nil), full[:10*bs]...), seqTokens(10*bs, 5000)...)
			for name, toks := range map[string][]int32{"full": full, "half": half, "miss": miss, "short": full[:3*bs], "empty": {}} {
				keys := blockKeys(t, prof[0], prof[1], prof[2], prof[3], bs, "l", salt, toks)
				for _, extra := range [][]any{nil, {"instance_id", "b"}, {"instance_id", "nobody"}, {"tenant_id", "default"}} {
					common := append([]any{"model", "m", "block_size", bs, "lora_name", "l", "cache_salt", salt}, extra...)
					code, want := rawPost(t, app, "/query", mp(append(common, "token_ids", toks)...))
					if code != http.StatusOK {
						t.Fatalf("%s /query: %d %x", name, code, want)
					}
					for _, form := range []any{anys(keys), hashesBin(keys)} {
						code, got := rawPost(t, app, "/query_by_hash", mp(append(common, "block_hashes", form)...))
						if code != http.StatusOK || !bytes.Equal(got, want) {
							t.Errorf("%s %v %T: /query_by_hash %d %x, /query %x", name, extra, form, code, got, want)
						}
					}
				}
			}
			// The answer is not empty by construction: the full prompt hits on a's rank 0.
			_, r := msgpackPost(t, app, "/query_by_hash", mp("model", "m", "block_size", bs, "lora_name", "l",
				"block_hashes", anys(blockKeys(t, prof[0], prof[1], prof[2], prof[3], bs, "l", salt, full))))
			if got := tierOf(t, hits(t, r), "a", "device"); got != 20*bs {
				t.Errorf("full prompt device on a = %d, want %d (%v)", got, 20*bs, r)
			}
		})
	}
}

// TestQueryByHashErrors: the request errors are /query's (field block_hashes for the
// prompt), and the route answers the wrong method and content type like /query.
func TestQueryByHashErrors(t *testing.T) {
	app := startApp(t, false)
	qbhFill(t, app, [4]string{"vllm_v1", "sha256_cbor", "0", "low64_be"}, 4, "", seqTokens(16, 1))
	for _, c := range []struct {
		name          string
		query, byHash []byte
	}{
		{"model missing", mp("block_size", 4, "token_ids", []any{1}), mp("block_size", 4, "block_hashes", []any{1})},
		{"model empty", mp("model", "", "block_size", 4, "token_ids", []any{1}), mp("model", "", "block_size", 4, "block_hashes", []any{1})},
		{"block_size zero", mp("model", "m", "block_size", 0, "token_ids", []any{1}), mp("model", "m", "block_size", 0, "block_hashes", []any{1})},
		{"unknown field", mp("model", "m", "block_size", 4, "token_ids", []any{1}, "x", 1), mp("model", "m", "block_size", 4, "block_hashes", []any{1}, "x", 1)},
		{"tenant int", mp("model", "m", "block_size", 4, "token_ids", []any{1}, "tenant_id", 1), mp("model", "m", "block_size", 4, "block_hashes", []any{1}, "tenant_id", 1)},
		{"not a map", []byte{0x91, 0x01}, []byte{0x91, 0x01}},
	} {
		qc, qr := msgpackPost(t, app, "/query", c.query)
		hc, hr := msgpackPost(t, app, "/query_by_hash", c.byHash)
		if qc != http.StatusBadRequest || hc != qc || fmt.Sprint(hr) != fmt.Sprint(qr) {
			t.Errorf("%s: /query %d %v, /query_by_hash %d %v", c.name, qc, qr, hc, hr)
		}
	}
	for _, c := range []struct {
		body   []byte
		reason string
		index  int64
	}{
		{mp("model", "m", "block_size", 4), "missing", -1},
		{mp("model", "m", "block_size", 4, "block_hashes", []any{1, -2}), "out_of_range", 1},
		{mp("model", "m", "block_size", 4, "block_hashes", []any{1, "x"}), "invalid_type", 1},
		{mp("model", "m", "block_size", 4, "block_hashes", make([]byte, 9)), "invalid_value", -1},
		{mp("model", "m", "block_size", 4, "token_ids", []any{1}), "unknown_field", -1},
	} {
		code, r := msgpackPost(t, app, "/query_by_hash", c.body)
		idx, hasIdx := r["index"]
		if code != http.StatusBadRequest || r["reason"] != c.reason || (c.reason != "unknown_field" && r["field"] != "block_hashes") ||
			hasIdx != (c.index >= 0) || (hasIdx && asInt(t, idx) != c.index) {
			t.Errorf("%x: %d %v, want %s index %d", c.body, code, r, c.reason, c.index)
		}
	}
	code, _ := doHTTP(t, app, http.MethodGet, "/query_by_hash", "", nil)
	if code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", code)
	}
	code, r := doHTTP(t, app, http.MethodPost, "/query_by_hash", "application/json", []byte("{}"))
	if code != http.StatusBadRequest || r["reason"] != "unsupported_content_type" {
		t.Errorf("json: %d %v", code, r)
	}
}

// TestQueryByHashZeroAllocs: the in-process handler allocates nothing per request once warm.
func TestQueryByHashZeroAllocs(t *testing.T) {
	app := startWith(t, AppConfig{RPCPort: -1})
	full := seqTokens(4096, 1)
	fillInstances(t, app, 4, full)
	keys := blockKeys(t, "vllm_v1", "sha256_cbor", "0", "low64_be", 16, "", "", full)
	h := app.HTTP.Handler()
	for _, form := range []any{hashesBin(keys), anys(keys)} {
		var ctx fasthttp.RequestCtx
		setPost(&ctx, "/query_by_hash", mp("model", "m", "block_size", 16, "block_hashes", form))
		run := func() { serveOK(t, h, &ctx) }
		run()
		if n := testing.AllocsPerRun(50, run); n != 0 && !raceEnabled {
			t.Errorf("%T: %v allocs per /query_by_hash", form, n)
		}
	}
	// The metrics count the route under its own protocol label.
	mfs, err := app.Metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "conductor_queries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == protocolByHash && m.GetCounter().GetValue() >= 100 {
				found = true
			}
		}
	}
	if !found {
		t.Error("conductor_queries_total{protocol=\"http_by_hash\"} did not count the queries")
	}
}
