package sim

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/conductor-go/conductor/wire/publisher"
)

// vectorsPath is the repository's test-vector file (testdata/vectors/README.md),
// relative to this package directory.
const vectorsPath = "../../testdata/vectors/hash_vectors.json"

type vectorFile struct {
	Prompt []int32 `json:"prompt_token_ids"`
	VLLM   struct {
		Seed  string `json:"pythonhashseed"`
		Cases []struct {
			Algo      string `json:"algo"`
			BlockSize int    `json:"block_size"`
			Variant   string `json:"variant"`
			Lora      string `json:"lora_name"` // null: ""
			Salt      string `json:"cache_salt"`
			Blocks    []struct {
				HashHex  string `json:"hash_hex"`
				EventU64 uint64 `json:"event_u64"`
			} `json:"blocks"`
		} `json:"cases"`
	} `json:"vllm_v1"`
	SGLang struct {
		Cases []struct {
			PageSize int    `json:"page_size"`
			Bigram   bool   `json:"bigram"`
			Variant  string `json:"variant"`
			Pages    []struct {
				Partial  bool   `json:"partial"`
				HashHex  string `json:"hash_hex"`
				EventI64 int64  `json:"event_i64"`
			} `json:"pages"`
		} `json:"cases"`
	} `json:"sglang"`
	Events map[string]struct {
		PayloadHex string          `json:"payload_hex"`
		Decoded    json.RawMessage `json:"decoded"`
	} `json:"event_examples"`
}

func loadVectors(t *testing.T) *vectorFile {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("parse %s: %v", vectorsPath, err)
	}
	if len(v.VLLM.Cases) == 0 || len(v.SGLang.Cases) == 0 {
		t.Fatal("vector file has no cases")
	}
	return &v
}

// TestVectorsVLLM: the keys simulated vLLM engines publish, and their full digests, are
// the upstream engine's values for every algorithm, block size, LoRA and salt variant.
func TestVectorsVLLM(t *testing.T) {
	v := loadVectors(t)
	checked := 0
	for _, c := range v.VLLM.Cases {
		if strings.HasPrefix(c.Variant, "mm ") {
			continue // multimodal extra keys are not simulated
		}
		h, err := NewHasher(VLLMHash(c.Algo, v.VLLM.Seed), c.BlockSize, c.Lora, c.Salt)
		if err != nil {
			t.Fatalf("%s/%d/%s: %v", c.Algo, c.BlockSize, c.Variant, err)
		}
		keys, err := h.AppendKeys(nil, v.Prompt)
		if err != nil {
			t.Fatal(err)
		}
		digests, err := h.AppendDigests(nil, v.Prompt)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != len(c.Blocks) || len(digests) != len(c.Blocks) {
			t.Fatalf("%s/%d/%s: %d keys, %d digests, want %d blocks", c.Algo, c.BlockSize, c.Variant, len(keys), len(digests), len(c.Blocks))
		}
		for i, b := range c.Blocks {
			if keys[i] != b.EventU64 {
				t.Errorf("%s/%d/%s block %d: key %d, want %d", c.Algo, c.BlockSize, c.Variant, i, keys[i], b.EventU64)
			}
			if got := hex.EncodeToString(digests[i][:]); got != b.HashHex {
				t.Errorf("%s/%d/%s block %d: digest %s, want %s", c.Algo, c.BlockSize, c.Variant, i, got, b.HashHex)
			}
		}
		checked++
	}
	if checked < 16 {
		t.Fatalf("only %d vLLM cases checked", checked)
	}
}

// TestVectorsSGLang: simulated SGLang engines publish the signed first-8-byte page hashes
// of the upstream radix cache (full pages only: the radix cache inserts page-aligned keys).
func TestVectorsSGLang(t *testing.T) {
	v := loadVectors(t)
	checked := 0
	for _, c := range v.SGLang.Cases {
		salt := ""
		switch {
		case c.Bigram:
			continue
		case c.Variant == "unsalted":
		case c.Variant == "event cache_salt=s1":
			salt = "s1"
		default:
			continue // HiCache storage chains are not event hashes
		}
		keys := hashKeys(t, SGLangHash(), c.PageSize, salt, v.Prompt)
		full := 0
		for _, p := range c.Pages {
			if p.Partial {
				continue
			}
			if full >= len(keys) {
				t.Fatalf("page %d: hasher produced only %d keys", full, len(keys))
			}
			if int64(keys[full]) != p.EventI64 {
				t.Errorf("sglang/%d/%s page %d: event hash %d, want %d", c.PageSize, c.Variant, full, int64(keys[full]), p.EventI64)
			}
			full++
		}
		if full != len(keys) {
			t.Errorf("sglang/%d/%s: %d keys, want %d full pages", c.PageSize, c.Variant, len(keys), full)
		}
		checked++
	}
	if checked < 4 {
		t.Fatalf("only %d SGLang cases checked", checked)
	}
}

// TestVectorsVLLMBatchBytes: the encoder writes exactly the bytes current vLLM (msgspec)
// writes for the reference batch: a two-block BlockStored, a BlockRemoved and an
// AllBlocksCleared.
func TestVectorsVLLMBatchBytes(t *testing.T) {
	v := loadVectors(t)
	ex, ok := v.Events["vllm_current_map_events_int_hashes"]
	if !ok {
		t.Fatal("vector vllm_current_map_events_int_hashes missing")
	}
	want, err := hex.DecodeString(ex.PayloadHex)
	if err != nil {
		t.Fatal(err)
	}
	toks := v.Prompt[:32]
	keys := hashKeys(t, VLLMHash("sha256", v.VLLM.Seed), 16, "", toks)
	enc := NewBatchEncoder(publisher.VLLM, StyleCurrent, 16, "")
	enc.Stored(keys, 0, false, toks, TierDevice)
	enc.Removed(keys[:1], TierDevice)
	enc.Cleared()
	got := enc.Finish(1757500000.25, 0)
	if hex.EncodeToString(got) != ex.PayloadHex {
		t.Fatalf("batch bytes differ\n got %x\nwant %x", got, want)
	}
}

// TestVectorsSGLangBatch: the SGLang map events carry the same hashes, parents, tokens
// and page sizes as the upstream radix-cache batch for tokens 1..32, page 16.
func TestVectorsSGLangBatch(t *testing.T) {
	v := loadVectors(t)
	ex, ok := v.Events["sglang_legacy_array_batch"]
	if !ok {
		t.Fatal("vector sglang_legacy_array_batch missing")
	}
	var decoded []json.RawMessage
	if err := json.Unmarshal(ex.Decoded, &decoded); err != nil || len(decoded) != 3 {
		t.Fatalf("decoded vector: %v", err)
	}
	var events [][]json.RawMessage
	if err := json.Unmarshal(decoded[1], &events); err != nil {
		t.Fatal(err)
	}
	sink := &captureSink{}
	r, err := newRank(0, 0, publisher.SGLang, 16, CacheConfig{Device: 8}, sink, StyleMinimal, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	toks := v.Prompt[:32]
	keys := hashKeys(t, SGLangHash(), 16, "", toks)
	if _, err := r.Store(toks, keys, 1757500000.25); err != nil {
		t.Fatal(err)
	}
	if len(sink.batches) != 1 {
		t.Fatalf("%d batches, want 1", len(sink.batches))
	}
	got := decodeTestBatch(t, sink.batches[0])
	if len(got.Events) != len(events) {
		t.Fatalf("%d events, want %d", len(got.Events), len(events))
	}
	for i, raw := range events {
		var hashes []int64
		var parent *int64
		var tokens []int32
		var bs int64
		var medium string
		for j, dst := range []any{nil, &hashes, &parent, &tokens, &bs, nil, &medium} {
			if dst != nil {
				if err := json.Unmarshal(raw[j], dst); err != nil {
					t.Fatal(err)
				}
			}
		}
		ev := got.Events[i]
		wantKeys := []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"}
		if strings.Join(ev.Keys, ",") != strings.Join(wantKeys, ",") {
			t.Errorf("event %d keys %v, want %v", i, ev.Keys, wantKeys)
		}
		if ev.Type != "BlockStored" || len(ev.Hashes) != 1 || int64(ev.Hashes[0]) != hashes[0] {
			t.Errorf("event %d: %s %v, want BlockStored %v", i, ev.Type, ev.Hashes, hashes)
		}
		if (parent == nil) != (ev.Parent == nil) || (parent != nil && int64(*ev.Parent) != *parent) {
			t.Errorf("event %d: parent mismatch", i)
		}
		if ev.BlockSize != bs || ev.Medium != medium || len(ev.Tokens) != len(tokens) {
			t.Errorf("event %d: bs %d medium %s %d tokens, want %d %s %d", i, ev.BlockSize, ev.Medium, len(ev.Tokens), bs, medium, len(tokens))
		}
		for j := range tokens {
			if ev.Tokens[j] != tokens[j] {
				t.Fatalf("event %d token %d: %d, want %d", i, j, ev.Tokens[j], tokens[j])
			}
		}
	}
}
