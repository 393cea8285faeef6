package wire

// Go mirrors of the upstream conductor RPC types (include/conductor/client/types.h). Only
// field order and types travel on the wire, never names, so fields are named for this
// project: the first tier is Device (upstream calls it npu; the contract calls it device).
// std::map and std::set become slices kept in ascending key order, which is both the
// wire order and what lets the hot paths reuse memory instead of allocating Go maps.

import "fmt"

// RPCErrorCode is the business error code (C++ enum ErrorCode : int32) carried inside
// tl::expected results; framework failures use the response header instead.
type RPCErrorCode int32

// Business error codes, values as upstream.
const (
	RPCCodeOK                   RPCErrorCode = 0
	RPCCodeInternalError        RPCErrorCode = -1
	RPCCodeInvalidParams        RPCErrorCode = -600
	RPCCodeRPCFail              RPCErrorCode = -900
	RPCCodeRPCTimeout           RPCErrorCode = -901
	RPCCodeConductorUnavailable RPCErrorCode = -2000
	RPCCodeServiceNotFound      RPCErrorCode = -2001
)

// String returns the upstream constant name, or the number for unknown codes.
func (c RPCErrorCode) String() string {
	switch c {
	case RPCCodeOK:
		return "OK"
	case RPCCodeInternalError:
		return "INTERNAL_ERROR"
	case RPCCodeInvalidParams:
		return "INVALID_PARAMS"
	case RPCCodeRPCFail:
		return "RPC_FAIL"
	case RPCCodeRPCTimeout:
		return "RPC_TIMEOUT"
	case RPCCodeConductorUnavailable:
		return "CONDUCTOR_UNAVAILABLE"
	case RPCCodeServiceNotFound:
		return "SERVICE_NOT_FOUND"
	}
	return fmt.Sprintf("ErrorCode(%d)", int32(c))
}

// RPCPublisherKind is ServiceConfig.publisher_kind (C++ enum : int32). Decoders accept any
// int32 so that an unknown kind reaches the service layer and becomes INVALID_PARAMS, as
// upstream does, instead of a framework-level decode failure.
type RPCPublisherKind int32

// Publisher kinds, values as upstream.
const (
	RPCPublisherVLLM     RPCPublisherKind = 0
	RPCPublisherMooncake RPCPublisherKind = 1
	RPCPublisherSGLang   RPCPublisherKind = 2
)

// Valid reports whether k is one of the three known kinds.
func (k RPCPublisherKind) Valid() bool { return k >= RPCPublisherVLLM && k <= RPCPublisherSGLang }

// String returns the registration "type" spelling (vLLM, Mooncake, SGLang).
func (k RPCPublisherKind) String() string {
	switch k {
	case RPCPublisherVLLM:
		return "vLLM"
	case RPCPublisherMooncake:
		return "Mooncake"
	case RPCPublisherSGLang:
		return "SGLang"
	}
	return fmt.Sprintf("PublisherKind(%d)", int32(k))
}

// RPCContextKey is ContextKey{tenant_id, model_name, lora_name, int64 block_size}.
type RPCContextKey struct {
	TenantID  string
	ModelName string
	LoraName  string
	BlockSize int64
}

// RPCQueryRequest is QueryRequest{context, vector<int32> token_ids, optional<string>
// cache_salt, optional<string> instance_filter}. The Has* flags keep "absent" distinct
// from "present and empty" so a decoded request re-encodes byte for byte.
type RPCQueryRequest struct {
	Context           RPCContextKey
	Tokens            []int32
	CacheSalt         string
	HasCacheSalt      bool
	InstanceFilter    string
	HasInstanceFilter bool
}

// RPCRankValue is one entry of CacheHitResult.dp (map<int64,int64>).
type RPCRankValue struct {
	Rank  int64
	Value int64
}

// RPCRankTiers is one entry of CacheHitResult.rank_matches: the rank and its
// RankCacheHitResult{npu, cpu_local, cpu_share, disk} token counts.
type RPCRankTiers struct {
	Rank     int64
	Device   int64
	CPULocal int64
	CPUShare int64
	Disk     int64
}

// RPCCacheHitResult is CacheHitResult{longest_match_tokens, dp, rank_matches, npu,
// cpu_local, cpu_share, disk}. DP and RankMatches must be strictly ascending by Rank.
type RPCCacheHitResult struct {
	LongestMatchTokens int64
	DP                 []RPCRankValue
	RankMatches        []RPCRankTiers
	Device             int64
	CPULocal           int64
	CPUShare           int64
	Disk               int64
}

// RPCInstanceHit is one entry of QueryResult.instances (map<string,CacheHitResult>).
type RPCInstanceHit struct {
	InstanceID string
	Hit        RPCCacheHitResult
}

// RPCQueryResult is QueryResult{map<string,CacheHitResult> instances}; Instances must be
// strictly ascending by InstanceID compared as bytes (std::string order).
type RPCQueryResult struct {
	Instances []RPCInstanceHit
}

// RPCHashProfile is ResolvedHashProfile{strategy, algorithm, python_hash_seed,
// root_digest, index_projection}.
type RPCHashProfile struct {
	Strategy        string
	Algorithm       string
	PythonHashSeed  string
	RootDigest      string
	IndexProjection string
}

// RPCServiceConfig is ServiceConfig, the Register argument and the ListServices element.
type RPCServiceConfig struct {
	Endpoint       string
	ReplayEndpoint string
	PublisherKind  RPCPublisherKind
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int64
	DPRank         int32
	CacheGroup     int64 // meaningful only when HasCacheGroup
	HasCacheGroup  bool
	HashProfile    RPCHashProfile
}

// RPCRegisterResult is RegisterResult{instance_id, is_new}.
type RPCRegisterResult struct {
	InstanceID string
	IsNew      bool
}

// RPCUnregisterResult is UnregisterResult{removed_key} (the service key
// "instance|tenant|rank").
type RPCUnregisterResult struct {
	RemovedKey string
}

// RPCInstanceRanks is one entry of ContextView.instance_ranks (map<string,set<int64>>);
// Ranks must be strictly ascending.
type RPCInstanceRanks struct {
	InstanceID string
	Ranks      []int64
}

// RPCContextView is ContextView{context, profile, instance_ranks, uint64 prefix_count};
// InstanceRanks must be strictly ascending by InstanceID.
type RPCContextView struct {
	Context       RPCContextKey
	Profile       RPCHashProfile
	InstanceRanks []RPCInstanceRanks
	PrefixCount   uint64
}

// RPCGlobalView is GlobalView{int32 context_count, vector<ContextView> contexts}.
// ContextCount is sent as given; upstream sets it to len(Contexts).
type RPCGlobalView struct {
	ContextCount int32
	Contexts     []RPCContextView
}
