// Package hashing recomputes engine KV block hashes from token ids: hash profiles
// (validation, root digest), the vLLM v1 and SGLang block chains and their 64-bit
// projections. It knows nothing about contexts or the index.
package hashing

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"unicode/utf8"
)

// Strategy selects how a prompt is cut into blocks and chained.
type Strategy uint8

// Strategies accepted in a hash profile.
const (
	StrategyVLLMV1 Strategy = iota + 1
	StrategySGLang
	StrategySGLangBigram
)

// String returns the wire name ("vllm_v1", "sglang", "sglang_bigram"), or "" for an
// unknown value, so a zero Profile prints as empty selectors rather than garbage.
func (s Strategy) String() string {
	switch s {
	case StrategyVLLMV1:
		return "vllm_v1"
	case StrategySGLang:
		return "sglang"
	case StrategySGLangBigram:
		return "sglang_bigram"
	}
	return ""
}

// isSGLang reports whether the strategy ignores python_hash_seed and uses raw token bytes.
func (s Strategy) isSGLang() bool { return s == StrategySGLang || s == StrategySGLangBigram }

// Algorithm selects the bytes that are hashed for one block.
type Algorithm uint8

// Algorithms accepted in a hash profile.
const (
	AlgoSHA256Pickle Algorithm = iota + 1 // "sha256": CPython pickle protocol 5
	AlgoSHA256CBOR                        // "sha256_cbor": canonical CBOR
	AlgoSHA256Raw                         // "sha256_raw": SGLang raw uint32 LE tokens
)

// String returns the wire name ("sha256", "sha256_cbor", "sha256_raw"), or "" if unknown.
func (a Algorithm) String() string {
	switch a {
	case AlgoSHA256Pickle:
		return "sha256"
	case AlgoSHA256CBOR:
		return "sha256_cbor"
	case AlgoSHA256Raw:
		return "sha256_raw"
	}
	return ""
}

// Projection selects which 64 bits of a digest are the index key.
type Projection uint8

// Projections accepted in a hash profile.
const (
	ProjLow64BE   Projection = iota + 1 // last 8 digest bytes, big-endian
	ProjFirst64BE                       // first 8 digest bytes, big-endian
)

// String returns the wire name ("low64_be", "first64_be"), or "" if unknown.
func (p Projection) String() string {
	switch p {
	case ProjLow64BE:
		return "low64_be"
	case ProjFirst64BE:
		return "first64_be"
	}
	return ""
}

// Apply projects a full 32-byte block digest onto the 64-bit index key. Event decoders
// use it for engines that publish whole digests (vLLM bytes mode) so that event keys and
// query keys come from the same code. An unknown projection yields 0.
func (p Projection) Apply(digest *[32]byte) uint64 {
	switch p {
	case ProjLow64BE:
		return binary.BigEndian.Uint64(digest[24:32])
	case ProjFirst64BE:
		return binary.BigEndian.Uint64(digest[0:8])
	}
	return 0
}

// Profile is a validated, resolved hash profile. Build it with Resolve.
type Profile struct {
	Strategy   Strategy
	Algorithm  Algorithm
	Projection Projection
	// Seed is python_hash_seed exactly as given ("0" for SGLang strategies).
	Seed string
	// Root is the derived root digest (all zeros for SGLang strategies).
	Root [32]byte
}

// FieldError is a profile rejection that names the field at fault
// ("strategy", "algorithm", "index_projection" or "python_hash_seed").
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

// Field names used in FieldError, matching the hash_profile map keys on the wire.
const (
	FieldStrategy   = "strategy"
	FieldAlgorithm  = "algorithm"
	FieldProjection = "index_projection"
	FieldSeed       = "python_hash_seed"
)

// Resolve validates (strategy, algorithm, python_hash_seed, index_projection) and derives
// Root. Errors are *FieldError; when several fields are wrong the first of strategy,
// algorithm, index_projection, python_hash_seed is named, as upstream does. For SGLang
// strategies the seed is ignored (not even validated) and normalised to "0", because
// SGLang hashes have no seed and upstream compares SGLang profiles without it.
func Resolve(strategy, algorithm, seed, projection string) (Profile, error) {
	var p Profile
	switch strategy {
	case "vllm_v1":
		p.Strategy = StrategyVLLMV1
	case "sglang":
		p.Strategy = StrategySGLang
	case "sglang_bigram":
		p.Strategy = StrategySGLangBigram
	default:
		return Profile{}, &FieldError{Field: FieldStrategy,
			Msg: fmt.Sprintf("unsupported strategy %q (want vllm_v1, sglang or sglang_bigram)", strategy)}
	}
	if p.Strategy.isSGLang() {
		if algorithm != "sha256_raw" {
			return Profile{}, &FieldError{Field: FieldAlgorithm,
				Msg: fmt.Sprintf("unsupported algorithm %q for strategy %s (want sha256_raw)", algorithm, strategy)}
		}
		if projection != "first64_be" {
			return Profile{}, &FieldError{Field: FieldProjection,
				Msg: fmt.Sprintf("unsupported index_projection %q for strategy %s (want first64_be)", projection, strategy)}
		}
		p.Algorithm, p.Projection, p.Seed = AlgoSHA256Raw, ProjFirst64BE, "0"
		return p, nil
	}
	switch algorithm {
	case "sha256":
		p.Algorithm = AlgoSHA256Pickle
	case "sha256_cbor":
		p.Algorithm = AlgoSHA256CBOR
	default:
		return Profile{}, &FieldError{Field: FieldAlgorithm,
			Msg: fmt.Sprintf("unsupported algorithm %q for strategy vllm_v1 (want sha256 or sha256_cbor)", algorithm)}
	}
	if projection != "low64_be" {
		return Profile{}, &FieldError{Field: FieldProjection,
			Msg: fmt.Sprintf("unsupported index_projection %q for strategy vllm_v1 (want low64_be)", projection)}
	}
	p.Projection = ProjLow64BE
	if err := validateSeed(seed); err != nil {
		return Profile{}, err
	}
	p.Seed = seed
	p.Root = rootDigest(p.Algorithm, seed)
	return p, nil
}

// validateSeed accepts exactly "random" or bare ASCII decimal in 0..4294967295. The text
// is kept verbatim (vLLM hashes the env string, so "00" and "0" give different roots);
// leading zeros are therefore allowed as long as the value is in range.
func validateSeed(seed string) error {
	if !utf8.ValidString(seed) {
		return &FieldError{Field: FieldSeed, Msg: "python_hash_seed must be valid UTF-8"}
	}
	if seed == "random" {
		return nil
	}
	if seed == "" {
		return &FieldError{Field: FieldSeed, Msg: `python_hash_seed must be "random" or a decimal integer in 0..4294967295, got an empty string`}
	}
	var v uint64
	for i := 0; i < len(seed); i++ {
		c := seed[i]
		if c < '0' || c > '9' {
			return &FieldError{Field: FieldSeed,
				Msg: fmt.Sprintf("python_hash_seed must be \"random\" or a decimal integer in 0..4294967295, got %q", seed)}
		}
		v = v*10 + uint64(c-'0')
		if v > 0xFFFFFFFF {
			return &FieldError{Field: FieldSeed,
				Msg: fmt.Sprintf("python_hash_seed %q is out of range 0..4294967295", seed)}
		}
	}
	return nil
}

// rootDigest is vLLM's NONE_HASH: hash_fn applied to the PYTHONHASHSEED string itself.
func rootDigest(a Algorithm, seed string) [32]byte {
	switch a {
	case AlgoSHA256Pickle:
		var pk pickler
		pk.begin()
		pk.saveStr(seed)
		pk.stop()
		return sum256(pk.b)
	case AlgoSHA256CBOR:
		b := appendCBORHead(make([]byte, 0, 9+len(seed)), cborMajorText, uint64(len(seed)))
		return sum256(append(b, seed...))
	}
	return [32]byte{}
}

// Equal is upstream ResolvedHashProfile equality: selectors and root must match;
// python_hash_seed is compared only for vllm_v1, because SGLang profiles carry no seed.
func (p Profile) Equal(o Profile) bool {
	if p.Strategy != o.Strategy || p.Algorithm != o.Algorithm ||
		p.Projection != o.Projection || p.Root != o.Root {
		return false
	}
	if p.Strategy == StrategyVLLMV1 {
		return p.Seed == o.Seed
	}
	return true
}

// StrategyName returns "vllm_v1", "sglang" or "sglang_bigram".
func (p Profile) StrategyName() string { return p.Strategy.String() }

// AlgorithmName returns "sha256", "sha256_cbor" or "sha256_raw".
func (p Profile) AlgorithmName() string { return p.Algorithm.String() }

// ProjectionName returns "low64_be" or "first64_be".
func (p Profile) ProjectionName() string { return p.Projection.String() }

// RootHex returns root_digest as 64 lowercase hex characters (64 zeros for SGLang).
func (p Profile) RootHex() string { return hex.EncodeToString(p.Root[:]) }

// AppendRootHex appends RootHex to dst without allocating, for response encoders.
func (p Profile) AppendRootHex(dst []byte) []byte { return hex.AppendEncode(dst, p.Root[:]) }

// Project maps a full block digest to this profile's 64-bit index key.
func (p Profile) Project(digest *[32]byte) uint64 { return p.Projection.Apply(digest) }
