package sim

import (
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/hashing"
)

// HashSpec is a hash profile as engines register it (the hash_profile map of /register).
type HashSpec struct {
	Strategy, Algorithm, PythonHashSeed, IndexProjection string
}

// VLLMHash is the profile of a vLLM v1 engine hashing with algorithm ("sha256" or
// "sha256_cbor") under PYTHONHASHSEED=seed.
func VLLMHash(algorithm, seed string) HashSpec {
	return HashSpec{Strategy: "vllm_v1", Algorithm: algorithm, PythonHashSeed: seed, IndexProjection: "low64_be"}
}

// SGLangHash is the profile of an SGLang radix-cache engine (no seed).
func SGLangHash() HashSpec {
	return HashSpec{Strategy: "sglang", Algorithm: "sha256_raw", PythonHashSeed: "0", IndexProjection: "first64_be"}
}

// Resolve validates the spec with the conductor's own resolver.
func (h HashSpec) Resolve() (hashing.Profile, error) {
	p, err := hashing.Resolve(h.Strategy, h.Algorithm, h.PythonHashSeed, h.IndexProjection)
	if err != nil {
		return hashing.Profile{}, fmt.Errorf("resolve hash profile: %w", err)
	}
	return p, nil
}

// errBigram: EAGLE bigram engines publish token pairs, which this simulator does not model.
var errBigram = errors.New("sglang_bigram engines are not simulated")

// Hasher turns prompts into the projected block keys an engine publishes. It computes only
// full blocks: vLLM never hashes a partial tail, and SGLang's radix cache inserts
// page-aligned prefixes only. Not safe for concurrent use; reuse one per goroutine.
type Hasher struct {
	prof      hashing.Profile
	blockSize int
	lora      string
	salt      string
	chain     hashing.Chain
}

// NewHasher builds a hasher for one context (profile, block size, LoRA name, cache salt).
func NewHasher(spec HashSpec, blockSize int, loraName, cacheSalt string) (*Hasher, error) {
	p, err := spec.Resolve()
	if err != nil {
		return nil, err
	}
	if p.Strategy == hashing.StrategySGLangBigram {
		return nil, errBigram
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("block size %d: must be positive", blockSize)
	}
	return &Hasher{prof: p, blockSize: blockSize, lora: loraName, salt: cacheSalt}, nil
}

// BlockSize is the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Profile is the resolved profile.
func (h *Hasher) Profile() hashing.Profile { return h.prof }

// AppendKeys appends the key of every full block of tokens to dst. For vLLM a key is the
// published event hash (low 64 bits); for SGLang it is the first 64 bits, which the engine
// publishes reinterpreted as a signed int64.
func (h *Hasher) AppendKeys(dst []uint64, tokens []int32) ([]uint64, error) {
	h.chain.Reset(&h.prof, h.blockSize, h.lora, h.salt, tokens)
	full := len(tokens) / h.blockSize
	for i := 0; i < full; i++ {
		k, err := h.chain.Next()
		if err != nil {
			return dst, fmt.Errorf("hash block %d: %w", i, err)
		}
		dst = append(dst, k)
	}
	return dst, nil
}

// AppendDigests appends the full 32-byte digest of every full block: what vLLM publishes
// in bytes mode and what Mooncake store keys carry.
func (h *Hasher) AppendDigests(dst [][32]byte, tokens []int32) ([][32]byte, error) {
	h.chain.Reset(&h.prof, h.blockSize, h.lora, h.salt, tokens)
	full := len(tokens) / h.blockSize
	for i := 0; i < full; i++ {
		if _, err := h.chain.Next(); err != nil {
			return dst, fmt.Errorf("hash block %d: %w", i, err)
		}
		dst = append(dst, h.chain.Digest())
	}
	return dst, nil
}
