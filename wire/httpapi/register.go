package httpapi

import (
	"fmt"
	"math"
	"strings"

	"github.com/tinylib/msgp/msgp"

	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/wire/internal/msgpack"
)

// HashProfileFields is the hash_profile map of a registration as sent. Only its shape is
// checked here; whether the combination is one Conductor can hash is decided when the
// server resolves it (hashing.ResolveSpec of Spec).
type HashProfileFields struct {
	Strategy, Algorithm, PythonHashSeed, IndexProjection string
	// HasSeed reports whether python_hash_seed was sent; SGLang strategies may omit it.
	HasSeed bool
	// ExtraKeys is extra_keys ("" when absent: the untagged default).
	ExtraKeys string
	// LoraPath is lora_path ("" when absent).
	LoraPath string
	// LookaheadTokens is lookahead_tokens (0 when absent); the decoder has checked it is
	// a non-negative integer, the resolver bounds it.
	LookaheadTokens int64
}

// Spec is the profile as hashing.ResolveSpec takes it.
func (f HashProfileFields) Spec() hashing.Spec {
	return hashing.Spec{Strategy: f.Strategy, Algorithm: f.Algorithm, PythonHashSeed: f.PythonHashSeed,
		IndexProjection: f.IndexProjection, ExtraKeys: f.ExtraKeys, LoraPath: f.LoraPath,
		LookaheadTokens: f.LookaheadTokens}
}

// RegisterRequest is a decoded POST /register body. Strings are copies: the service keeps
// them long after the request buffer is reused.
type RegisterRequest struct {
	Endpoint, ReplayEndpoint, Type, ModelName, LoraName, TenantID, InstanceID string
	BlockSize                                                                 int64
	DPRank                                                                    int
	// CacheGroup is nil when the field is absent or nil; otherwise it points at 0, the
	// only group supported.
	CacheGroup  *int64
	HashProfile HashProfileFields
	// IndexMedia is index_media, the media to index: nil when absent (the kind's
	// default). Names are checked by the server (translate.ParseIndexMedia).
	IndexMedia []string
}

// UnregisterRequest is a decoded POST /unregister body.
type UnregisterRequest struct {
	InstanceID, TenantID string
	DPRank               int
	// LoraName, when HasLoraName, names the one adapter of a multi-LoRA registration to
	// unregister; without it the whole service goes.
	LoraName    string
	HasLoraName bool
}

// Slots of the /register fields, in upstream's validation order.
const (
	regEndpoint = iota
	regType
	regModelName
	regInstanceID
	regBlockSize
	regReplayEndpoint
	regLoraName
	regTenantID
	regCacheGroup
	regHashProfile
	regDPRank
	regIndexMedia
	regFields
)

// registerKeys are the /register keys of the reg* slots.
var registerKeys = [regFields]string{regEndpoint: "endpoint", regType: "type", regModelName: "modelname",
	regInstanceID: "instance_id", regBlockSize: "block_size", regReplayEndpoint: "replay_endpoint",
	regLoraName: "lora_name", regTenantID: "tenant_id", regCacheGroup: "cache_group",
	regHashProfile: "hash_profile", regDPRank: "dp_rank", regIndexMedia: "index_media"}

// DecodeRegisterRequest strictly decodes a POST /register body. Checks run in upstream's
// order (body shape, unknown fields, endpoint, type, modelname, instance_id, block_size,
// optional strings, cache_group, hash_profile, type value, dp_rank), so the same bad
// request gets the same error as from the C++ conductor.
func DecodeRegisterRequest(body []byte) (RegisterRequest, *RequestError) {
	var req RegisterRequest
	var vals [regFields][]byte
	if rerr := decodeRoot(body, registerKeys[:], vals[:]); rerr != nil {
		return req, rerr
	}
	var rerr *RequestError
	if req.Endpoint, rerr = requiredString(vals[regEndpoint], "endpoint"); rerr != nil {
		return req, rerr
	}
	if req.Type, rerr = requiredString(vals[regType], "type"); rerr != nil {
		return req, rerr
	}
	if req.ModelName, rerr = requiredString(vals[regModelName], "modelname"); rerr != nil {
		return req, rerr
	}
	if req.InstanceID, rerr = requiredString(vals[regInstanceID], "instance_id"); rerr != nil {
		return req, rerr
	}
	if req.BlockSize, rerr = positiveInt(vals[regBlockSize], "block_size", "block_size must be greater than zero"); rerr != nil {
		return req, rerr
	}
	if req.ReplayEndpoint, rerr = optionalString(vals[regReplayEndpoint], "replay_endpoint"); rerr != nil {
		return req, rerr
	}
	if req.LoraName, rerr = optionalString(vals[regLoraName], "lora_name"); rerr != nil {
		return req, rerr
	}
	if req.TenantID, rerr = optionalString(vals[regTenantID], "tenant_id"); rerr != nil {
		return req, rerr
	}
	if req.TenantID == "" {
		req.TenantID = tenantDefault
	}
	if req.CacheGroup, rerr = cacheGroup(vals[regCacheGroup]); rerr != nil {
		return req, rerr
	}
	if req.HashProfile, rerr = hashProfile(vals[regHashProfile]); rerr != nil {
		return req, rerr
	}
	switch req.Type {
	case "vLLM", "SGLang", "Mooncake":
	default:
		return req, newRequestError(ReasonInvalidValue, "type", "type must be vLLM, SGLang or Mooncake")
	}
	if req.DPRank, rerr = dpRank(vals[regDPRank], ReasonInvalidType, ReasonOutOfRange); rerr != nil {
		return req, rerr
	}
	if req.IndexMedia, rerr = stringList(vals[regIndexMedia], "index_media", maxIndexMedia); rerr != nil {
		return req, rerr
	}
	return req, nil
}

// maxIndexMedia bounds index_media (an engine names three media).
const maxIndexMedia = 16

// stringList decodes an optional array of strings into copies (nil when absent): at most
// max elements, each a string (the index of a wrong one is reported).
func stringList(raw []byte, field string, max int) ([]string, *RequestError) {
	if raw == nil {
		return nil, nil
	}
	n, rest, err := msgp.ReadArrayHeaderBytes(raw)
	if err != nil {
		return nil, newRequestError(ReasonInvalidType, field, field+" must be an array of strings")
	}
	if int(n) > max {
		return nil, newRequestError(ReasonOutOfRange, field, fmt.Sprintf("%s has %d elements, more than %d", field, n, max))
	}
	out := make([]string, 0, n)
	for i := range int(n) {
		s, r, err := msgpack.Str(rest)
		if err != nil {
			e := newRequestError(ReasonInvalidType, field, field+" elements must be strings")
			e.Index = i
			return nil, e
		}
		out = append(out, string(s))
		rest = r
	}
	return out, nil
}

// Slots of the /unregister fields, in validation order.
const (
	unregInstanceID = iota
	unregTenantID
	unregDPRank
	unregLoraName
	unregFields
)

// unregisterKeys are the /unregister keys of the unreg* slots.
var unregisterKeys = [unregFields]string{unregInstanceID: "instance_id", unregTenantID: "tenant_id",
	unregDPRank: "dp_rank", unregLoraName: "lora_name"}

// DecodeUnregisterRequest strictly decodes a POST /unregister body. Upstream reports any
// bad dp_rank (wrong type or range) as invalid_value here, unlike /register; that is kept.
func DecodeUnregisterRequest(body []byte) (UnregisterRequest, *RequestError) {
	var req UnregisterRequest
	var vals [unregFields][]byte
	if rerr := decodeRoot(body, unregisterKeys[:], vals[:]); rerr != nil {
		return req, rerr
	}
	var rerr *RequestError
	if req.InstanceID, rerr = requiredString(vals[unregInstanceID], "instance_id"); rerr != nil {
		return req, rerr
	}
	if req.TenantID, rerr = optionalString(vals[unregTenantID], "tenant_id"); rerr != nil {
		return req, rerr
	}
	if req.TenantID == "" {
		req.TenantID = tenantDefault
	}
	if req.DPRank, rerr = dpRank(vals[unregDPRank], ReasonInvalidValue, ReasonInvalidValue); rerr != nil {
		return req, rerr
	}
	if raw := vals[unregLoraName]; raw != nil {
		if req.LoraName, rerr = optionalString(raw, "lora_name"); rerr != nil {
			return req, rerr
		}
		req.HasLoraName = true
	}
	return req, nil
}

// Slots of the hash_profile fields, in validation order.
const (
	hpStrategy = iota
	hpAlgorithm
	hpSeed
	hpProjection
	hpExtraKeys
	hpLoraPath
	hpLookahead
	hpFields
)

// hashProfileKeys are the hash_profile keys of the hp* slots.
var hashProfileKeys = [hpFields]string{hpStrategy: "strategy", hpAlgorithm: "algorithm",
	hpSeed: "python_hash_seed", hpProjection: "index_projection", hpExtraKeys: "extra_keys",
	hpLoraPath: "lora_path", hpLookahead: "lookahead_tokens"}

// hashProfile checks the shape of hash_profile. As upstream (reference notes
// § Register), errors about its keys carry the bare key as field (`strategy`,
// `algorithm`, `python_hash_seed`, `index_projection`, and the optional `extra_keys`,
// `lora_path`, `lookahead_tokens` of issue 25), while the message names the nested path
// for people; root_digest is derived by the server and rejected as an unknown field.
func hashProfile(raw []byte) (HashProfileFields, *RequestError) {
	p, rerr := hashProfileFields(raw)
	if rerr != nil && rerr.Field != "hash_profile" {
		rerr.Field = strings.TrimPrefix(rerr.Field, hashProfilePrefix)
	}
	return p, rerr
}

// hashProfilePrefix is how messages name the keys of the nested hash_profile map.
const hashProfilePrefix = "hash_profile."

func hashProfileFields(raw []byte) (HashProfileFields, *RequestError) {
	var p HashProfileFields
	if raw == nil {
		return p, newRequestError(ReasonMissing, "hash_profile", "hash_profile is required")
	}
	if raw[0]&0xf0 != 0x80 && raw[0] != 0xde && raw[0] != 0xdf {
		return p, newRequestError(ReasonInvalidType, "hash_profile", "hash_profile must be a map")
	}
	var vals [hpFields][]byte
	var st strictMap
	if _, rerr := walkStrict(raw, hashProfileKeys[:], vals[:], &st); rerr != nil {
		return p, rerr
	}
	if rerr := st.finish("hash_profile."); rerr != nil {
		return p, rerr
	}
	var rerr *RequestError
	if p.Strategy, rerr = requiredString(vals[hpStrategy], "hash_profile.strategy"); rerr != nil {
		return p, rerr
	}
	if p.Algorithm, rerr = requiredString(vals[hpAlgorithm], "hash_profile.algorithm"); rerr != nil {
		return p, rerr
	}
	sglang := p.Strategy == "sglang" || p.Strategy == "sglang_bigram"
	switch {
	case vals[hpSeed] == nil && sglang:
		// SGLang ignores PYTHONHASHSEED, so its profiles may leave the seed out.
	case sglang:
		// Present but ignored: only its type matters.
		s, ok := readString(vals[hpSeed])
		if !ok {
			return p, newRequestError(ReasonInvalidType, "hash_profile.python_hash_seed", "hash_profile.python_hash_seed must be a string")
		}
		p.PythonHashSeed, p.HasSeed = string(s), true
	default:
		if p.PythonHashSeed, rerr = requiredString(vals[hpSeed], "hash_profile.python_hash_seed"); rerr != nil {
			return p, rerr
		}
		p.HasSeed = true
	}
	if p.IndexProjection, rerr = requiredString(vals[hpProjection], "hash_profile.index_projection"); rerr != nil {
		return p, rerr
	}
	// Optional, each a non-empty string or an integer when sent; values are the
	// resolver's.
	if vals[hpExtraKeys] != nil {
		if p.ExtraKeys, rerr = requiredString(vals[hpExtraKeys], "hash_profile.extra_keys"); rerr != nil {
			return p, rerr
		}
	}
	if vals[hpLoraPath] != nil {
		if p.LoraPath, rerr = requiredString(vals[hpLoraPath], "hash_profile.lora_path"); rerr != nil {
			return p, rerr
		}
	}
	if raw := vals[hpLookahead]; raw != nil {
		v, kind, _ := readInt(raw)
		switch {
		case kind == intNotInt || kind == intShort:
			return p, newRequestError(ReasonInvalidType, "hash_profile.lookahead_tokens", "hash_profile.lookahead_tokens must be an integer")
		case kind == intTooBig || v < 0:
			return p, newRequestError(ReasonOutOfRange, "hash_profile.lookahead_tokens", "hash_profile.lookahead_tokens must be a non-negative integer")
		}
		p.LookaheadTokens = v
	}
	return p, nil
}

// requiredString decodes a required, non-empty string field into a copy.
func requiredString(raw []byte, field string) (string, *RequestError) {
	s, rerr := requiredBytes(raw, field)
	if rerr != nil {
		return "", rerr
	}
	return string(s), nil
}

// requiredBytes decodes a required, non-empty string field, aliasing raw.
func requiredBytes(raw []byte, field string) ([]byte, *RequestError) {
	if raw == nil {
		return nil, newRequestError(ReasonMissing, field, field+" is required")
	}
	s, ok := readString(raw)
	if !ok {
		return nil, newRequestError(ReasonInvalidType, field, field+" must be a string")
	}
	if len(s) == 0 {
		return nil, newRequestError(ReasonInvalidValue, field, field+" must not be empty")
	}
	return s, nil
}

// optionalString decodes an optional string field into a copy ("" when absent). Nil
// is a type error: upstream accepts nil only where the contract says so (cache_salt).
func optionalString(raw []byte, field string) (string, *RequestError) {
	s, rerr := optionalBytes(raw, field)
	if rerr != nil {
		return "", rerr
	}
	return string(s), nil
}

// optionalBytes decodes an optional string field, aliasing raw (nil when absent).
func optionalBytes(raw []byte, field string) ([]byte, *RequestError) {
	if raw == nil {
		return nil, nil
	}
	s, ok := readString(raw)
	if !ok {
		return nil, newRequestError(ReasonInvalidType, field, field+" must be a string")
	}
	return s, nil
}

// positiveInt decodes a required integer > 0; a uint64 beyond int64 is out of range
// rather than a type error because it is still an integer.
func positiveInt(raw []byte, field, rangeMsg string) (int64, *RequestError) {
	if raw == nil {
		return 0, newRequestError(ReasonMissing, field, field+" is required")
	}
	v, kind, _ := readInt(raw)
	switch {
	case kind == intNotInt || kind == intShort:
		return 0, newRequestError(ReasonInvalidType, field, field+" must be an integer")
	case kind == intTooBig || v <= 0:
		return 0, newRequestError(ReasonOutOfRange, field, rangeMsg)
	}
	return v, nil
}

// dpRank decodes a required dp_rank in 0..INT32_MAX (a C++ int upstream), with the
// reasons each route uses for a wrong type and a wrong range.
func dpRank(raw []byte, typeReason, rangeReason string) (int, *RequestError) {
	if raw == nil {
		return 0, newRequestError(ReasonMissing, "dp_rank", "dp_rank is required")
	}
	v, kind, _ := readInt(raw)
	switch {
	case kind == intNotInt || kind == intShort:
		msg := "dp_rank must be an integer"
		if typeReason == ReasonInvalidValue {
			msg = "dp_rank must be a non-negative int"
		}
		return 0, newRequestError(typeReason, "dp_rank", msg)
	case kind == intTooBig || v < 0 || v > math.MaxInt32:
		return 0, newRequestError(rangeReason, "dp_rank", "dp_rank must be a non-negative int")
	}
	return int(v), nil
}

// cacheGroup decodes cache_group: absent or nil means none, 0 is the only group
// upstream supports.
func cacheGroup(raw []byte) (*int64, *RequestError) {
	if raw == nil || raw[0] == 0xc0 {
		return nil, nil
	}
	v, kind, _ := readInt(raw)
	switch {
	case kind == intNotInt || kind == intShort:
		return nil, newRequestError(ReasonInvalidType, "cache_group", "cache_group must be an integer or nil")
	case kind == intTooBig || v != 0:
		return nil, newRequestError(ReasonUnsupported, "cache_group", "only cache group zero is supported")
	}
	return new(int64), nil
}
