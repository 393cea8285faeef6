package httpclient

import (
	"encoding/binary"
	"slices"

	"github.com/tinylib/msgp/msgp"
)

// RegisterRequest is the body of POST /register, in the contract's HTTP field names.
// Optional string fields that are empty are left out of the request, which the server
// treats exactly like the default ("" lora, tenant "default", no replay endpoint).
type RegisterRequest struct {
	Endpoint       string      `json:"endpoint"`
	ReplayEndpoint string      `json:"replay_endpoint,omitempty"`
	Type           string      `json:"type"`
	ModelName      string      `json:"modelname"`
	LoraName       string      `json:"lora_name,omitempty"`
	TenantID       string      `json:"tenant_id,omitempty"`
	InstanceID     string      `json:"instance_id"`
	BlockSize      int64       `json:"block_size"`
	DPRank         int64       `json:"dp_rank"`
	CacheGroup     *int64      `json:"cache_group,omitempty"`
	HashProfile    HashProfile `json:"hash_profile"`
	// IndexMedia is index_media, the event media to index (nil: left out, the kind's
	// default).
	IndexMedia []string `json:"index_media,omitempty"`
}

// UnregisterRequest is the body of POST /unregister. An empty TenantID is left out and
// means "default". LoraName, when set, unregisters that adapter of a multi-LoRA
// registration alone ("" is the base model's: a pointer tells it from absent).
type UnregisterRequest struct {
	InstanceID string  `json:"instance_id"`
	TenantID   string  `json:"tenant_id,omitempty"`
	DPRank     int64   `json:"dp_rank"`
	LoraName   *string `json:"lora_name,omitempty"`
}

// QueryRequest is the body of POST /query. Empty optional strings are left out: an empty
// InstanceID queries every instance of the context, an empty CacheSalt means no salt.
type QueryRequest struct {
	Model      string
	BlockSize  int64
	TokenIDs   []int32
	LoraName   string
	TenantID   string
	InstanceID string
	CacheSalt  string
	// BinaryTokens sends token_ids as a msgpack bin of little-endian int32 values instead
	// of an array: 4 bytes per token whatever its value, and no per-element parsing on
	// the server.
	BinaryTokens bool
}

// AppendRegisterRequest appends r as a msgpack map to dst.
func AppendRegisterRequest(dst []byte, r *RegisterRequest) []byte {
	required := uint32(7) // endpoint, type, modelname, instance_id, block_size, dp_rank, hash_profile
	if r.CacheGroup != nil {
		required++
	}
	if r.IndexMedia != nil {
		required++
	}
	dst = appendMapHeader(dst, required, r.ReplayEndpoint, r.LoraName, r.TenantID)
	dst = appendKV(dst, "endpoint", r.Endpoint)
	dst = appendOptKV(dst, "replay_endpoint", r.ReplayEndpoint)
	dst = appendKV(dst, "type", r.Type)
	dst = appendKV(dst, "modelname", r.ModelName)
	dst = appendOptKV(dst, "lora_name", r.LoraName)
	dst = appendOptKV(dst, "tenant_id", r.TenantID)
	dst = appendKV(dst, "instance_id", r.InstanceID)
	dst = msgp.AppendString(dst, "block_size")
	dst = msgp.AppendInt64(dst, r.BlockSize)
	dst = msgp.AppendString(dst, "dp_rank")
	dst = msgp.AppendInt64(dst, r.DPRank)
	if r.CacheGroup != nil {
		dst = msgp.AppendString(dst, "cache_group")
		dst = msgp.AppendInt64(dst, *r.CacheGroup)
	}
	dst = msgp.AppendString(dst, "hash_profile")
	dst = appendProfileRequest(dst, &r.HashProfile)
	if r.IndexMedia != nil {
		dst = msgp.AppendString(dst, "index_media")
		dst = msgp.AppendArrayHeader(dst, uint32(len(r.IndexMedia)))
		for _, m := range r.IndexMedia {
			dst = msgp.AppendString(dst, m)
		}
	}
	return dst
}

// appendProfileRequest writes the selectors of p. python_hash_seed is left out when empty
// because the contract makes it optional (and ignored) for the sglang strategies;
// root_digest is never sent since the server refuses it as input. The optional fields
// of issue 25 are sent only when set, so a request without them is what it was.
func appendProfileRequest(dst []byte, p *HashProfile) []byte {
	required := uint32(3)
	if p.LookaheadTokens != 0 {
		required++
	}
	dst = appendMapHeader(dst, required, p.PythonHashSeed, p.ExtraKeys, p.LoraPath)
	dst = appendKV(dst, "strategy", p.Strategy)
	dst = appendKV(dst, "algorithm", p.Algorithm)
	dst = appendOptKV(dst, "python_hash_seed", p.PythonHashSeed)
	dst = appendKV(dst, "index_projection", p.IndexProjection)
	dst = appendOptKV(dst, "extra_keys", p.ExtraKeys)
	dst = appendOptKV(dst, "lora_path", p.LoraPath)
	if p.LookaheadTokens != 0 {
		dst = msgp.AppendString(dst, "lookahead_tokens")
		dst = msgp.AppendInt64(dst, p.LookaheadTokens)
	}
	return dst
}

// AppendUnregisterRequest appends r as a msgpack map to dst.
func AppendUnregisterRequest(dst []byte, r *UnregisterRequest) []byte {
	required := uint32(2)
	if r.LoraName != nil {
		required++
	}
	dst = appendMapHeader(dst, required, r.TenantID)
	dst = appendKV(dst, "instance_id", r.InstanceID)
	dst = appendOptKV(dst, "tenant_id", r.TenantID)
	dst = msgp.AppendString(dst, "dp_rank")
	dst = msgp.AppendInt64(dst, r.DPRank)
	if r.LoraName != nil {
		dst = appendKV(dst, "lora_name", *r.LoraName)
	}
	return dst
}

// AppendQueryRequest appends q as a msgpack map to dst. It allocates nothing once dst has
// room, so a caller that keeps its buffer can query in a loop without garbage.
func AppendQueryRequest(dst []byte, q *QueryRequest) []byte {
	dst = appendQueryFields(dst, q.Model, q.BlockSize, q.LoraName, q.TenantID, q.InstanceID, q.CacheSalt, "token_ids")
	if q.BinaryTokens {
		return appendTokensBin(dst, q.TokenIDs)
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(q.TokenIDs)))
	dst = slices.Grow(dst, 5*len(q.TokenIDs)) // int32 encodes in at most 5 bytes
	for _, t := range q.TokenIDs {
		dst = msgp.AppendInt32(dst, t)
	}
	return dst
}

// appendQueryFields appends the map header and every field of a /query-shaped body up
// to and including the key of its prompt field (listKey), whose value the caller appends.
// Empty optional strings are left out.
func appendQueryFields(dst []byte, model string, blockSize int64, lora, tenant, instance, salt, listKey string) []byte {
	dst = appendMapHeader(dst, 3, lora, tenant, instance, salt)
	dst = appendKV(dst, "model", model)
	dst = appendOptKV(dst, "lora_name", lora)
	dst = msgp.AppendString(dst, "block_size")
	dst = msgp.AppendInt64(dst, blockSize)
	dst = appendOptKV(dst, "tenant_id", tenant)
	dst = appendOptKV(dst, "instance_id", instance)
	dst = appendOptKV(dst, "cache_salt", salt)
	return msgp.AppendString(dst, listKey)
}

// appendBinHeader appends the header of a msgpack bin of size bytes and makes room for
// them.
func appendBinHeader(dst []byte, size int) []byte {
	switch {
	case size <= 0xff:
		dst = append(dst, 0xc4, byte(size))
	case size <= 0xffff:
		dst = append(dst, 0xc5, byte(size>>8), byte(size))
	default:
		dst = append(dst, 0xc6, byte(size>>24), byte(size>>16), byte(size>>8), byte(size))
	}
	return slices.Grow(dst, size)
}

// appendTokensBin writes the bin header, then the little-endian words in place, so a
// large prompt costs one copy rather than an intermediate byte slice.
func appendTokensBin(dst []byte, toks []int32) []byte {
	dst = appendBinHeader(dst, 4*len(toks))
	for _, t := range toks {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(t))
	}
	return dst
}

func appendKV(dst []byte, key, val string) []byte {
	dst = msgp.AppendString(dst, key)
	return msgp.AppendString(dst, val)
}

// appendMapHeader appends the header of a map of required fields and one field per
// non-empty optional string (appendOptKV leaves the empty ones out).
func appendMapHeader(dst []byte, required uint32, optional ...string) []byte {
	n := required
	for _, s := range optional {
		if s != "" {
			n++
		}
	}
	return msgp.AppendMapHeader(dst, n)
}

func appendOptKV(dst []byte, key, val string) []byte {
	if val == "" {
		return dst
	}
	return appendKV(dst, key, val)
}
