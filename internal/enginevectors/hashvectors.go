package enginevectors

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// HashFile is the part of testdata/vectors/hash_vectors.json (testdata/vectors/README.md)
// that tests read: the block hashes upstream vLLM and SGLang compute for one prompt, and
// example event payloads.
type HashFile struct {
	Prompt []int32 `json:"prompt_token_ids"`
	VLLM   struct {
		Seed     string `json:"pythonhashseed"`
		NoneHash map[string]map[string]struct {
			PreimageHex string `json:"preimage_hex"`
			HashHex     string `json:"hash_hex"`
		} `json:"none_hash"`
		Cases      []VLLMCase `json:"cases"`
		Multiframe struct {
			Tokens         string `json:"tokens"`
			PreimageLen    int    `json:"preimage_len"`
			PreimageSHA256 string `json:"preimage_sha256"`
		} `json:"pickle_multiframe_check"`
	} `json:"vllm_v1"`
	SGLang struct {
		Cases []SGLangCase `json:"cases"`
	} `json:"sglang"`
	// Events are engine event batches by name, as the engines publish them.
	Events map[string]struct {
		PayloadHex string `json:"payload_hex"`
	} `json:"event_examples"`
}

// VLLMCase is the block chain of the prompt under one vLLM algorithm, block size and
// variant (LoRA, salt, multimodal).
type VLLMCase struct {
	Algo       string          `json:"algo"`
	BlockSize  int             `json:"block_size"`
	Variant    string          `json:"variant"`
	LoraName   *string         `json:"lora_name"`
	CacheSalt  *string         `json:"cache_salt"`
	MMFeatures json.RawMessage `json:"mm_features"`
	Unhashed   []int32         `json:"unhashed_tail_tokens"`
	Blocks     []VLLMBlock     `json:"blocks"`
}

// VLLMBlock is one block of a VLLMCase: its preimage, digest and event key.
type VLLMBlock struct {
	TokenRange  [2]int `json:"token_range"`
	ParentHex   string `json:"parent_hash_hex"`
	PreimageHex string `json:"preimage_hex"`
	HashHex     string `json:"hash_hex"`
	EventU64    uint64 `json:"event_u64"`
	EventU64Hex string `json:"event_u64_hex"`
}

// SGLangCase is the page chain of the prompt under one SGLang page size and variant.
type SGLangCase struct {
	PageSize     int          `json:"page_size"`
	Bigram       bool         `json:"bigram"`
	Variant      string       `json:"variant"`
	ChainSeedHex *string      `json:"chain_seed_hex"`
	Pages        []SGLangPage `json:"pages"`
}

// SGLangPage is one page of an SGLangCase: its digest and event key.
type SGLangPage struct {
	UnitRange [2]int `json:"unit_range"`
	Partial   bool   `json:"partial"`
	HashHex   string `json:"hash_hex"`
	EventI64  int64  `json:"event_i64"`
	First8U64 uint64 `json:"first8_u64"`
}

// HashVectors decodes the repository's hash vectors, testdata/vectors/hash_vectors.json;
// root is the repository root relative to the test. It fails the test when the file does
// not read or decode, or holds no cases.
func HashVectors(tb testing.TB, root string) *HashFile {
	tb.Helper()
	v := decodeFile[HashFile](tb, filepath.Join(root, "testdata", "vectors", "hash_vectors.json"))
	if len(v.Prompt) == 0 || len(v.VLLM.Cases) == 0 || len(v.SGLang.Cases) == 0 {
		tb.Fatalf("hash vectors file has no cases")
	}
	return v
}
