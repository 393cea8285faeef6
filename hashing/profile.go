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
	return wireName(s, []string{StrategyVLLMV1: "vllm_v1", StrategySGLang: "sglang", StrategySGLangBigram: "sglang_bigram"})
}

// wireName returns the name of selector v in names, indexed by value, or "" for a value
// names does not list.
func wireName[V ~uint8](v V, names []string) string {
	if int(v) < len(names) {
		return names[v]
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
	AlgoXXHashPickle                      // "xxhash": XXH3-128 of the pickle bytes
	AlgoXXHashCBOR                        // "xxhash_cbor": XXH3-128 of the canonical CBOR bytes
)

// String returns the wire name ("sha256", "sha256_cbor", "sha256_raw", "xxhash",
// "xxhash_cbor"), or "" if unknown.
func (a Algorithm) String() string {
	return wireName(a, []string{AlgoSHA256Pickle: "sha256", AlgoSHA256CBOR: "sha256_cbor", AlgoSHA256Raw: "sha256_raw",
		AlgoXXHashPickle: "xxhash", AlgoXXHashCBOR: "xxhash_cbor"})
}

// cbor reports whether the algorithm hashes canonical CBOR (else pickle, for vllm_v1).
func (a Algorithm) cbor() bool { return a == AlgoSHA256CBOR || a == AlgoXXHashCBOR }

// xxh reports whether the algorithm's digest is XXH3-128 (16 bytes) rather than SHA-256.
func (a Algorithm) xxh() bool { return a == AlgoXXHashPickle || a == AlgoXXHashCBOR }

// DigestSize is the length of the algorithm's block digest: 16 for the xxhash
// algorithms, 32 for SHA-256.
func (a Algorithm) DigestSize() int {
	if a.xxh() {
		return 16
	}
	return 32
}

// ExtraKeys selects how vLLM writes a block's extra keys (LoRA, cache salt) into the
// hashed tuple.
type ExtraKeys uint8

// Extra-key forms. The zero value is the untagged form, so a Profile built without the
// field hashes as before it existed.
const (
	// ExtraKeysUntagged is vLLM <= 0.30: the bare values, (lora_name, cache_salt).
	ExtraKeysUntagged ExtraKeys = iota
	// ExtraKeysTagged is vLLM >= 0.31: tagged tuples, (("lora", lora_name, lora_path),
	// ("cache_salt", cache_salt)).
	ExtraKeysTagged
)

// String returns the wire name ("untagged", "tagged"), or "" if unknown.
func (e ExtraKeys) String() string {
	return wireName(e, []string{ExtraKeysUntagged: "untagged", ExtraKeysTagged: "tagged"})
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
	return wireName(p, []string{ProjLow64BE: "low64_be", ProjFirst64BE: "first64_be"})
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

// Profile is a validated, resolved hash profile. Build it with Resolve or ResolveSpec.
type Profile struct {
	Strategy   Strategy
	Algorithm  Algorithm
	Projection Projection
	// Seed is python_hash_seed exactly as given ("0" for SGLang strategies; SeedUnset
	// for an engine started without PYTHONHASHSEED).
	Seed string
	// Root is the engine's own root, vLLM's NONE_HASH: the parent of block 0 (all zeros
	// for SGLang strategies). A 16-byte xxhash digest sits in its last 16 bytes, as every
	// digest of such a profile does (see Chain.Digest). root_digest, what views show,
	// also covers the fields below: see RootDigest.
	Root [32]byte
	// ExtraKeys is the vLLM extra-key form (untagged unless the profile says tagged).
	ExtraKeys ExtraKeys
	// LoraPath is the adapter path: vLLM >= 0.31 hashes it into LoRA blocks (tagged
	// only); SGLang >= 0.5.23 derives the adapter's id from it, uuid5(name, path), and
	// publishes LoRA pages in that id's namespace (see Chain).
	LoraPath string
	// Lookahead is vLLM's num_hash_lookahead_tokens: each block's hash also covers the
	// Lookahead tokens after it.
	Lookahead int
}

// FieldError is a profile rejection that names the field at fault: one of the Field*
// names, the hash_profile map keys on the wire.
type FieldError struct {
	Field string
	Msg   string
}

// Error names the field and what is wrong with it.
func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

// Field names used in FieldError, matching the hash_profile map keys on the wire.
const (
	FieldStrategy   = "strategy"
	FieldAlgorithm  = "algorithm"
	FieldProjection = "index_projection"
	FieldSeed       = "python_hash_seed"
	FieldExtraKeys  = "extra_keys"
	FieldLoraPath   = "lora_path"
	FieldLookahead  = "lookahead_tokens"
)

// SeedUnset is the python_hash_seed of a vLLM engine started without PYTHONHASHSEED.
// vLLM >= 0.29 then derives NONE_HASH from the fixed text DefaultNoneHashSeed when the
// algorithm is cryptographic (sha256, sha256_cbor); the xxhash algorithms draw a random
// seed per process, which no indexer can reproduce. Python refuses any PYTHONHASHSEED
// other than "random" or a decimal, so the word cannot collide with a real seed.
const SeedUnset = "unset"

// DefaultNoneHashSeed is the text vLLM >= 0.29 hashes into NONE_HASH when PYTHONHASHSEED
// is unset (DEFAULT_NONE_HASH_SEED in vllm/v1/core/kv_cache_utils.py).
const DefaultNoneHashSeed = "vllm-none-hash"

// MaxLookahead bounds lookahead_tokens. vLLM sets it to the speculative decoding depth,
// a handful of tokens; the bound keeps a block's encoding (and the chain's buffer) small.
const MaxLookahead = 256

// Spec is a hash_profile as registered, each field as sent. The zero value of a field
// added after the first four is its default: ExtraKeys "" is "untagged", LoraPath ""
// is none, LookaheadTokens 0 is none.
type Spec struct {
	Strategy, Algorithm, PythonHashSeed, IndexProjection string
	// ExtraKeys is "untagged" (the default, also "") or "tagged".
	ExtraKeys string
	// LoraPath is the adapter path given to the engine (vllm_v1 tagged; SGLang >= 0.5.23
	// adapters from --lora-paths).
	LoraPath string
	// LookaheadTokens is the engine's num_hash_lookahead_tokens, 0..MaxLookahead.
	LookaheadTokens int64
}

// Resolve validates (strategy, algorithm, python_hash_seed, index_projection) and derives
// Root, exactly as before the fields of issue 25 existed: it accepts only the sha256
// algorithms and a decimal or "random" seed. Errors are *FieldError; when several
// fields are wrong the first of strategy, algorithm, index_projection, python_hash_seed
// is named, as upstream does. For SGLang strategies the seed is ignored (not even
// validated) and normalised to "0", because SGLang hashes have no seed and upstream
// compares SGLang profiles without it. ResolveSpec takes every field.
func Resolve(strategy, algorithm, seed, projection string) (Profile, error) {
	return resolve(Spec{Strategy: strategy, Algorithm: algorithm, PythonHashSeed: seed, IndexProjection: projection}, true)
}

// ResolveSpec validates a whole hash_profile and derives Root. Errors are *FieldError
// naming the wire field; fields are checked in the order strategy, algorithm,
// index_projection, python_hash_seed, extra_keys, lora_path, lookahead_tokens. A Spec
// that uses none of the fields after the first four resolves exactly as Resolve.
//
// vllm_v1 accepts sha256, sha256_cbor, xxhash and xxhash_cbor; python_hash_seed is a
// decimal in 0..4294967295, "random", or "unset" (sha256 algorithms only: vLLM >= 0.29
// then uses DefaultNoneHashSeed). The xxhash algorithms need PYTHONHASHSEED set:
// without it vLLM seeds them randomly per process ("random" is fine: vLLM hashes the
// text "random", reproducibly, as the engine vectors show). extra_keys "tagged" is vLLM >=
// 0.31; lora_path is allowed only with it (Profile.CheckLora says, once the
// registration's lora_name is known, whether one is required). SGLang strategies take
// lora_path (SGLang >= 0.5.23 LoRA pages) and only the defaults of the other new fields.
func ResolveSpec(s Spec) (Profile, error) { return resolve(s, false) }

// resolve is ResolveSpec; legacy restricts it to what Resolve accepted before issue 25
// (sha256 algorithms, no "unset"), with the messages it gave.
func resolve(s Spec, legacy bool) (Profile, error) {
	var p Profile
	strategy, algorithm, seed, projection := s.Strategy, s.Algorithm, s.PythonHashSeed, s.IndexProjection
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
		if err := sglangDefaults(s, strategy); err != nil {
			return Profile{}, err
		}
		if !utf8.ValidString(s.LoraPath) {
			return Profile{}, &FieldError{Field: FieldLoraPath, Msg: "lora_path must be valid UTF-8"}
		}
		p.LoraPath = s.LoraPath
		return p, nil
	}
	want := "sha256, sha256_cbor, xxhash or xxhash_cbor"
	if legacy {
		want = "sha256 or sha256_cbor"
	}
	switch {
	case algorithm == "sha256":
		p.Algorithm = AlgoSHA256Pickle
	case algorithm == "sha256_cbor":
		p.Algorithm = AlgoSHA256CBOR
	case algorithm == "xxhash" && !legacy:
		p.Algorithm = AlgoXXHashPickle
	case algorithm == "xxhash_cbor" && !legacy:
		p.Algorithm = AlgoXXHashCBOR
	default:
		return Profile{}, &FieldError{Field: FieldAlgorithm,
			Msg: fmt.Sprintf("unsupported algorithm %q for strategy vllm_v1 (want %s)", algorithm, want)}
	}
	if projection != "low64_be" {
		return Profile{}, &FieldError{Field: FieldProjection,
			Msg: fmt.Sprintf("unsupported index_projection %q for strategy vllm_v1 (want low64_be)", projection)}
	}
	p.Projection = ProjLow64BE
	if err := validateSeed(seed, p.Algorithm, legacy); err != nil {
		return Profile{}, err
	}
	p.Seed = seed
	switch s.ExtraKeys {
	case "", "untagged":
		p.ExtraKeys = ExtraKeysUntagged
	case "tagged":
		p.ExtraKeys = ExtraKeysTagged
	default:
		return Profile{}, &FieldError{Field: FieldExtraKeys,
			Msg: fmt.Sprintf("unsupported extra_keys %q (want untagged or tagged)", s.ExtraKeys)}
	}
	if s.LoraPath != "" {
		if p.ExtraKeys != ExtraKeysTagged {
			return Profile{}, &FieldError{Field: FieldLoraPath,
				Msg: `lora_path is hashed only with extra_keys "tagged" (vLLM >= 0.31); leave it out for untagged profiles`}
		}
		if !utf8.ValidString(s.LoraPath) {
			return Profile{}, &FieldError{Field: FieldLoraPath, Msg: "lora_path must be valid UTF-8"}
		}
		p.LoraPath = s.LoraPath
	}
	if s.LookaheadTokens < 0 || s.LookaheadTokens > MaxLookahead {
		return Profile{}, &FieldError{Field: FieldLookahead,
			Msg: fmt.Sprintf("lookahead_tokens %d is out of range 0..%d", s.LookaheadTokens, MaxLookahead)}
	}
	p.Lookahead = int(s.LookaheadTokens)
	p.Root = rootDigest(p.Algorithm, noneHashSeed(seed))
	return p, nil
}

// sglangDefaults refuses, for an SGLang strategy, the fields only vllm_v1 hashes.
func sglangDefaults(s Spec, strategy string) error {
	switch {
	case s.ExtraKeys != "" && s.ExtraKeys != "untagged":
		return &FieldError{Field: FieldExtraKeys,
			Msg: fmt.Sprintf("extra_keys %q is a vllm_v1 setting; strategy %s takes only untagged", s.ExtraKeys, strategy)}
	case s.LookaheadTokens != 0:
		return &FieldError{Field: FieldLookahead,
			Msg: fmt.Sprintf("lookahead_tokens is a vllm_v1 setting; strategy %s takes only 0", strategy)}
	}
	return nil
}

// noneHashSeed is the text vLLM hashes into NONE_HASH for a python_hash_seed.
func noneHashSeed(seed string) string {
	if seed == SeedUnset {
		return DefaultNoneHashSeed
	}
	return seed
}

// CheckLora validates the profile against the registration's lora_name, which is not
// part of hash_profile: with extra_keys "tagged", vLLM hashes the adapter's path into
// every block of a LoRA request, so a non-empty lora_name needs lora_path, and a
// lora_path without a lora_name would describe blocks no request makes. The error is a
// *FieldError naming lora_path. For SGLang only the latter holds: without lora_path a
// LoRA context has the base pages' hashes, as SGLang before 0.5.23 publishes them.
func (p Profile) CheckLora(loraName string) error {
	if p.Strategy != StrategyVLLMV1 {
		if p.LoraPath != "" && loraName == "" {
			return &FieldError{Field: FieldLoraPath, Msg: "lora_path needs a non-empty lora_name: base-model pages carry no adapter"}
		}
		return nil
	}
	switch {
	case p.ExtraKeys == ExtraKeysTagged && loraName != "" && p.LoraPath == "":
		return &FieldError{Field: FieldLoraPath,
			Msg: fmt.Sprintf(`lora_path is required with extra_keys "tagged" and lora_name %q: vLLM >= 0.31 hashes the adapter path`, loraName)}
	case p.LoraPath != "" && loraName == "":
		return &FieldError{Field: FieldLoraPath, Msg: "lora_path needs a non-empty lora_name: base-model blocks carry no adapter"}
	}
	return nil
}

// validateSeed accepts "random", "unset" (sha256 algorithms) or bare ASCII decimal in
// 0..4294967295; the xxhash algorithms refuse "unset" (vLLM seeds them randomly then).
// "random" is not random to vLLM: it hashes the text, as any other seed. The text is kept verbatim
// (vLLM hashes the env string, so "00" and "0" give different roots); leading zeros
// are therefore allowed as long as the value is in range.
func validateSeed(seed string, a Algorithm, legacy bool) error {
	if !utf8.ValidString(seed) {
		return &FieldError{Field: FieldSeed, Msg: "python_hash_seed must be valid UTF-8"}
	}
	if a.xxh() && seed == SeedUnset {
		return &FieldError{Field: FieldSeed,
			Msg: fmt.Sprintf(`algorithm %s needs python_hash_seed set (a decimal in 0..4294967295, or "random"): without PYTHONHASHSEED vLLM seeds xxhash randomly per process`, a)}
	}
	if seed == "random" || seed == SeedUnset && !legacy {
		return nil
	}
	words := `"random", "unset"`
	if legacy {
		words = `"random"`
	}
	if seed == "" {
		return &FieldError{Field: FieldSeed,
			Msg: fmt.Sprintf("python_hash_seed must be %s or a decimal integer in 0..4294967295, got an empty string", words)}
	}
	var v uint64
	for i := 0; i < len(seed); i++ {
		c := seed[i]
		if c < '0' || c > '9' {
			return &FieldError{Field: FieldSeed,
				Msg: fmt.Sprintf("python_hash_seed must be %s or a decimal integer in 0..4294967295, got %q", words, seed)}
		}
		v = v*10 + uint64(c-'0')
		if v > 0xFFFFFFFF {
			return &FieldError{Field: FieldSeed,
				Msg: fmt.Sprintf("python_hash_seed %q is out of range 0..4294967295", seed)}
		}
	}
	return nil
}

// rootDigest is vLLM's NONE_HASH: hash_fn applied to the seed text itself (the
// PYTHONHASHSEED string, or DefaultNoneHashSeed when it is unset).
func rootDigest(a Algorithm, seed string) [32]byte {
	var d [32]byte
	var pre []byte
	if a.cbor() {
		pre = append(appendCBORHead(make([]byte, 0, 9+len(seed)), cborMajorText, uint64(len(seed))), seed...)
	} else {
		var pk pickler
		pk.begin()
		pk.saveStr(seed)
		pk.stop()
		pre = pk.b
	}
	if a.xxh() {
		xxhDigest(&d, pre)
	} else {
		d = sum256(pre)
	}
	return d
}

// rootFoldPrefix separates the root_digest fold from every engine preimage.
const rootFoldPrefix = "conductor-root-digest-v1\x00"

// usesNewFields reports whether the profile sets a field that NONE_HASH does not cover:
// then root_digest is a fold of NONE_HASH and those fields (RootDigest).
func (p Profile) usesNewFields() bool {
	return p.Algorithm.xxh() || p.ExtraKeys != ExtraKeysUntagged || p.LoraPath != "" || p.Lookahead != 0
}

// RootDigest is the profile's root_digest, the value views show and registrations may
// echo. A profile that uses none of the fields of issue 25 (sha256 or sha256_cbor,
// untagged, no lora_path, no lookahead) has NONE_HASH itself, as always; "unset" is
// covered because it changes NONE_HASH. Otherwise it is SHA-256 of
// "conductor-root-digest-v1\0", the algorithm name, NONE_HASH (its DigestSize bytes),
// the extra-keys form, u64-LE length and bytes of lora_path, and u64-LE lookahead (see
// appendRootFold), so that two profiles differing in any hashed field differ in it.
func (p Profile) RootDigest() [32]byte {
	if !p.usesNewFields() {
		return p.Root
	}
	var b [160]byte
	return sum256(p.appendRootFold(b[:0]))
}

// appendRootFold appends the bytes RootDigest hashes for a profile that uses new fields.
func (p Profile) appendRootFold(b []byte) []byte {
	b = append(b, rootFoldPrefix...)
	b = append(b, byte(len(p.Algorithm.String())))
	b = append(b, p.Algorithm.String()...)
	b = append(b, p.Root[32-p.Algorithm.DigestSize():]...)
	b = append(b, byte(p.ExtraKeys))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(p.LoraPath)))
	b = append(b, p.LoraPath...)
	return binary.LittleEndian.AppendUint64(b, uint64(p.Lookahead))
}

// Equal is upstream ResolvedHashProfile equality: selectors and root must match;
// python_hash_seed and the vLLM fields of issue 25 (extra-key form, lookahead) are
// compared only for vllm_v1, because SGLang profiles carry none of them; lora_path
// always.
func (p Profile) Equal(o Profile) bool {
	return p.SameEngine(o) && p.LoraPath == o.LoraPath
}

// SameEngine is Equal but for lora_path: whether two profiles describe one engine's
// hashing, as the registrations of several adapters of one multi-LoRA engine must
// (each names its own adapter's path).
func (p Profile) SameEngine(o Profile) bool {
	if p.Strategy != o.Strategy || p.Algorithm != o.Algorithm ||
		p.Projection != o.Projection || p.Root != o.Root {
		return false
	}
	if p.Strategy == StrategyVLLMV1 {
		return p.Seed == o.Seed && p.ExtraKeys == o.ExtraKeys && p.Lookahead == o.Lookahead
	}
	return true
}

// ExtraKeysName returns "untagged" or "tagged".
func (p Profile) ExtraKeysName() string { return p.ExtraKeys.String() }

// DigestSize is the length of the profile's block digests: 16 for xxhash algorithms,
// 32 otherwise. A 16-byte digest is kept in the last 16 bytes of a [32]byte.
func (p Profile) DigestSize() int { return p.Algorithm.DigestSize() }

// StrategyName returns "vllm_v1", "sglang" or "sglang_bigram".
func (p Profile) StrategyName() string { return p.Strategy.String() }

// AlgorithmName returns "sha256", "sha256_cbor", "sha256_raw", "xxhash" or "xxhash_cbor".
func (p Profile) AlgorithmName() string { return p.Algorithm.String() }

// ProjectionName returns "low64_be" or "first64_be".
func (p Profile) ProjectionName() string { return p.Projection.String() }

// RootHex returns root_digest (RootDigest) as 64 lowercase hex characters (64 zeros for
// SGLang).
func (p Profile) RootHex() string {
	d := p.RootDigest()
	return hex.EncodeToString(d[:])
}

// AppendRootHex appends RootHex to dst without allocating, for response encoders.
func (p Profile) AppendRootHex(dst []byte) []byte {
	d := p.RootDigest()
	return hex.AppendEncode(dst, d[:])
}

// Project maps a full block digest to this profile's 64-bit index key.
func (p Profile) Project(digest *[32]byte) uint64 { return p.Projection.Apply(digest) }

// Spec returns the hash_profile fields that resolve to p (ResolveSpec(p.Spec()) is p):
// what a registration records, and the base for a variant (another adapter's lora_path).
func (p Profile) Spec() Spec {
	s := Spec{Strategy: p.StrategyName(), Algorithm: p.AlgorithmName(), PythonHashSeed: p.Seed,
		IndexProjection: p.ProjectionName(), LoraPath: p.LoraPath, LookaheadTokens: int64(p.Lookahead)}
	if p.ExtraKeys != ExtraKeysUntagged {
		s.ExtraKeys = p.ExtraKeysName()
	}
	return s
}
