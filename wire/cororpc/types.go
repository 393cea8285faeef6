package cororpc

// Go mirrors of the upstream conductor RPC types (include/conductor/client/types.h). Only
// field order and types travel on the wire, never names, so fields are named for this
// project: the first tier is Device (upstream calls it npu; the contract calls it device).
// std::map and std::set become slices kept in ascending key order, which is both the
// wire order and what lets the hot paths reuse memory instead of allocating Go maps.

import (
	"fmt"

	"github.com/conductor-go/conductor/wire/publisher"
)

// ErrorCode is the business error code (C++ enum ErrorCode : int32) carried inside
// tl::expected results; framework failures use the response header instead.
type ErrorCode int32

// Business error codes, values as upstream.
const (
	CodeOK                   ErrorCode = 0
	CodeInternalError        ErrorCode = -1
	CodeInvalidParams        ErrorCode = -600
	CodeRPCFail              ErrorCode = -900
	CodeRPCTimeout           ErrorCode = -901
	CodeConductorUnavailable ErrorCode = -2000
	CodeServiceNotFound      ErrorCode = -2001
)

// String returns the upstream constant name, or the number for unknown codes.
func (c ErrorCode) String() string {
	switch c {
	case CodeOK:
		return "OK"
	case CodeInternalError:
		return "INTERNAL_ERROR"
	case CodeInvalidParams:
		return "INVALID_PARAMS"
	case CodeRPCFail:
		return "RPC_FAIL"
	case CodeRPCTimeout:
		return "RPC_TIMEOUT"
	case CodeConductorUnavailable:
		return "CONDUCTOR_UNAVAILABLE"
	case CodeServiceNotFound:
		return "SERVICE_NOT_FOUND"
	}
	return fmt.Sprintf("ErrorCode(%d)", int32(c))
}

// ContextKey is the C++ struct ContextKey{tenant_id, model_name, lora_name, int64 block_size}.
type ContextKey struct {
	TenantID  string
	ModelName string
	LoraName  string
	BlockSize int64
}

// QueryRequest is the C++ struct QueryRequest{context, vector<int32> token_ids, optional<string>
// cache_salt, optional<string> instance_filter}. The Has* flags keep "absent" distinct
// from "present and empty" so a decoded request re-encodes byte for byte.
type QueryRequest struct {
	Context           ContextKey
	Tokens            []int32
	CacheSalt         string
	HasCacheSalt      bool
	InstanceFilter    string
	HasInstanceFilter bool
}

// RankValue is one entry of CacheHitResult.dp (map<int64,int64>).
type RankValue struct {
	Rank  int64
	Value int64
}

// RankTiers is one entry of CacheHitResult.rank_matches: the rank and its
// RankCacheHitResult{npu, cpu_local, cpu_share, disk} token counts.
type RankTiers struct {
	Rank     int64
	Device   int64
	CPULocal int64
	CPUShare int64
	Disk     int64
}

// CacheHitResult is the C++ struct CacheHitResult{longest_match_tokens, dp, rank_matches, npu,
// cpu_local, cpu_share, disk}. DP and RankMatches must be strictly ascending by Rank.
type CacheHitResult struct {
	LongestMatchTokens int64
	DP                 []RankValue
	RankMatches        []RankTiers
	Device             int64
	CPULocal           int64
	CPUShare           int64
	Disk               int64
}

// InstanceHit is one entry of QueryResult.instances (map<string,CacheHitResult>).
type InstanceHit struct {
	InstanceID string
	Hit        CacheHitResult
}

// QueryResult is the C++ struct QueryResult{map<string,CacheHitResult> instances}; Instances must be
// strictly ascending by InstanceID compared as bytes (std::string order).
type QueryResult struct {
	Instances []InstanceHit
}

// HashProfile is ResolvedHashProfile{strategy, algorithm, python_hash_seed,
// root_digest, index_projection}.
type HashProfile struct {
	Strategy        string
	Algorithm       string
	PythonHashSeed  string
	RootDigest      string
	IndexProjection string
}

// ServiceConfig is the C++ struct ServiceConfig, the Register argument and the ListServices element.
type ServiceConfig struct {
	Endpoint       string
	ReplayEndpoint string
	PublisherKind  publisher.Kind
	ModelName      string
	LoraName       string
	TenantID       string
	InstanceID     string
	BlockSize      int64
	DPRank         int32
	CacheGroup     int64 // meaningful only when HasCacheGroup
	HasCacheGroup  bool
	HashProfile    HashProfile
}

// RegisterResult is the C++ struct RegisterResult{instance_id, is_new}.
type RegisterResult struct {
	InstanceID string
	IsNew      bool
}

// UnregisterResult is the C++ struct UnregisterResult{removed_key} (the service key
// "instance|tenant|rank").
type UnregisterResult struct {
	RemovedKey string
}

// InstanceRanks is one entry of ContextView.instance_ranks (map<string,set<int64>>);
// Ranks must be strictly ascending.
type InstanceRanks struct {
	InstanceID string
	Ranks      []int64
}

// ContextView is the C++ struct ContextView{context, profile, instance_ranks, uint64 prefix_count};
// InstanceRanks must be strictly ascending by InstanceID.
type ContextView struct {
	Context       ContextKey
	Profile       HashProfile
	InstanceRanks []InstanceRanks
	PrefixCount   uint64
}

// GlobalView is the C++ struct GlobalView{int32 context_count, vector<ContextView> contexts}.
// ContextCount is sent as given; upstream sets it to len(Contexts).
type GlobalView struct {
	ContextCount int32
	Contexts     []ContextView
}
