package enginevectors

import (
	"encoding/json"
	"strings"
	"testing"
)

// EngineFile is one testdata/engines file: what one vLLM or SGLang release computed and
// published for the prompt of every case (testdata/engines/README.md).
type EngineFile struct {
	Engine     string                     `json:"engine"`
	Version    string                     `json:"version"`
	Facts      map[string]any             `json:"facts"`
	Prompt     []int32                    `json:"prompt_token_ids"`
	Structs    map[string]json.RawMessage `json:"structs"`
	HashCases  []HashCase                 `json:"hash_cases"`
	EventCases []EventCase                `json:"event_cases"`
}

// Lora is a LoRA adapter of a case: its name and path.
type Lora struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// HashCase is the block hashes of the prompt under one algorithm, seed, block size,
// lookahead, adapter and salt: each block's token range, published hash and extra keys.
type HashCase struct {
	ID        string  `json:"id"`
	Algorithm string  `json:"algorithm"`
	Seed      *string `json:"python_hash_seed"`
	BlockSize int64   `json:"block_size"`
	Lookahead int64   `json:"lookahead_tokens"`
	Lora      *Lora   `json:"lora"`
	CacheSalt *string `json:"cache_salt"`
	Blocks    []struct {
		TokenRange [2]int          `json:"token_range"`
		EventHash  uint64          `json:"event_hash"`
		EventExtra json.RawMessage `json:"event_extra_keys"`
	} `json:"blocks"`
}

// Request is one request of a vLLM event case: its label, adapter and salt.
type Request struct {
	Label     string `json:"label"`
	Lora      *Lora  `json:"lora"`
	CacheSalt string `json:"cache_salt"`
}

// EventCase is one recorded scenario: the requests (vLLM) or pages (SGLang) an engine
// served and the event frames it published for them, raw and as the engine decoded them.
type EventCase struct {
	ID        string            `json:"id"`
	Kind      string            `json:"kind"`
	Algorithm string            `json:"algorithm"`
	BlockSize int64             `json:"block_size"`
	Lookahead int64             `json:"lookahead_tokens"`
	Env       map[string]string `json:"env"`
	Requests  []Request         `json:"requests"`
	Frames    [][]string        `json:"frames"`
	Decoded   []json.RawMessage `json:"decoded"`
	// SGLang
	PageSize  int64   `json:"page_size"`
	Format    string  `json:"format"`
	Bigram    bool    `json:"bigram"`
	CacheSalt *string `json:"cache_salt"`
	Lora      *Lora   `json:"lora"`
	Tokens    []int32 `json:"tokens"`
	Pages     []struct {
		Units    []json.RawMessage `json:"units"`
		EventI64 int64             `json:"event_i64"`
	} `json:"pages"`
}

// Fact reports the boolean fact name of the release (false when absent).
func (f *EngineFile) Fact(name string) bool { v, _ := f.Facts[name].(bool); return v }

// Release is the release's name, e.g. "vLLM 0.31" or "SGLang 0.5.23".
func (f *EngineFile) Release() string {
	if f.Engine == "vllm" {
		return "vLLM " + strings.TrimSuffix(f.Version, ".0")
	}
	return "SGLang " + f.Version
}

// EventCase returns the event case id, or nil when the release has none.
func (f *EngineFile) EventCase(id string) *EventCase {
	for i := range f.EventCases {
		if f.EventCases[i].ID == id {
			return &f.EventCases[i]
		}
	}
	return nil
}

// HashCase returns the hash case id, failing the test when the release has none.
func (f *EngineFile) HashCase(tb testing.TB, id string) *HashCase {
	tb.Helper()
	for i := range f.HashCases {
		if f.HashCases[i].ID == id {
			return &f.HashCases[i]
		}
	}
	tb.Fatalf("%s: no hash case %s", f.Release(), id)
	return nil
}

// EngineFiles decodes the testdata/engines files whose name matches pattern (Load).
func EngineFiles(tb testing.TB, root, pattern string) []*EngineFile {
	tb.Helper()
	return Load[EngineFile](tb, root, pattern)
}
