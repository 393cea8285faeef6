// Package hashing recomputes engine KV block hashes from token ids: hash profiles
// (validation, root digest), the vLLM v1 and SGLang block chains and their 64-bit
// projections. It knows nothing about contexts or the index.
package hashing

import "fmt"

// Strategy selects how a prompt is cut into blocks and chained.
type Strategy uint8

// Strategies accepted in a hash profile.
const (
	StrategyVLLMV1 Strategy = iota + 1
	StrategySGLang
	StrategySGLangBigram
)

// Algorithm selects the bytes that are hashed for one block.
type Algorithm uint8

// Algorithms accepted in a hash profile.
const (
	AlgoSHA256Pickle Algorithm = iota + 1 // "sha256": CPython pickle protocol 5
	AlgoSHA256CBOR                        // "sha256_cbor": canonical CBOR
	AlgoSHA256Raw                         // "sha256_raw": SGLang raw uint32 LE tokens
)

// Projection selects which 64 bits of a digest are the index key.
type Projection uint8

// Projections accepted in a hash profile.
const (
	ProjLow64BE   Projection = iota + 1 // last 8 digest bytes, big-endian
	ProjFirst64BE                       // first 8 digest bytes, big-endian
)

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
