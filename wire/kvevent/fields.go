package kvevent

import "github.com/conductor-go/conductor/wire/publisher"

// field identifies a recognised event key across all publishers; recognised-key
// sets are bitmasks over it.
type field uint8

const (
	efType field = iota
	efBlockHashes
	efParentBlockHash
	efTokenIDs
	efBlockSize
	efLoraID
	efMedium
	efLoraName
	efExtraKeys
	efGroupIdx
	efSpecKind
	efSlidingWindow
	efCacheSalt
	efSessionID
	efEventID
	efTimestamp
	efEventType
	efModelName
	efAdditionalSalt
	efTenantID
	efBackendID
	efDPRank
	efGroupID
	efObjectKey
	efConnectorBlockHash
	efCachePrefix
	efTPRank
	efHeadOrTPRank
	efPCPRank
	efDCPRank
	efPPRank
	efLayerID
	efSeqHashes
	efBaseBlockIdx
	efParentHash
	efLookahead
	efMetadata
	numFields
	efUnknown field = 255
)

// fieldNames are the wire keys, also used as EventError.Field (static strings, so
// recording an error allocates nothing).
var fieldNames = [numFields]string{
	efType: "type", efBlockHashes: "block_hashes", efParentBlockHash: "parent_block_hash",
	efTokenIDs: "token_ids", efBlockSize: "block_size", efLoraID: "lora_id",
	efMedium: "medium", efLoraName: "lora_name", efExtraKeys: "extra_keys",
	efGroupIdx: "group_idx", efSpecKind: "kv_cache_spec_kind",
	efSlidingWindow: "kv_cache_spec_sliding_window", efCacheSalt: "cache_salt",
	efSessionID: "session_id", efEventID: "event_id", efTimestamp: "timestamp",
	efEventType: "event_type", efModelName: "model_name", efAdditionalSalt: "additional_salt",
	efTenantID: "tenant_id", efBackendID: "backend_id", efDPRank: "dp_rank",
	efGroupID: "group_id", efObjectKey: "object_key",
	efConnectorBlockHash: "connector_block_hash", efCachePrefix: "cache_prefix",
	efTPRank: "tp_rank", efHeadOrTPRank: "head_or_tp_rank", efPCPRank: "pcp_rank",
	efDCPRank: "dcp_rank", efPPRank: "pp_rank", efLayerID: "layer_id",
	efSeqHashes: "seq_hashes", efBaseBlockIdx: "base_block_idx", efParentHash: "parent_hash",
	efLookahead: "lookahead_token_ids", efMetadata: "metadata",
}

type fieldSet uint64

func bit(f field) fieldSet { return 1 << f }

// Recognised-key sets per publisher and tag (reference notes §5.2–§5.4).
const (
	vllmStoredReq = fieldSet(1<<efType | 1<<efBlockHashes | 1<<efParentBlockHash |
		1<<efTokenIDs | 1<<efBlockSize | 1<<efLoraID | 1<<efMedium | 1<<efLoraName)
	vllmStoredAllowed = vllmStoredReq | 1<<efExtraKeys | 1<<efGroupIdx | 1<<efSpecKind | 1<<efSlidingWindow |
		1<<efLookahead
	vllmRemovedReq     = fieldSet(1<<efType | 1<<efBlockHashes | 1<<efMedium)
	vllmRemovedAllowed = vllmRemovedReq | 1<<efGroupIdx

	sglStoredReq = fieldSet(1<<efType | 1<<efBlockHashes | 1<<efParentBlockHash |
		1<<efTokenIDs | 1<<efBlockSize | 1<<efLoraID)
	sglStoredAllowed = sglStoredReq | 1<<efMedium | 1<<efCacheSalt | 1<<efSessionID | 1<<efLoraName |
		1<<efMetadata
	sglRemovedReq     = fieldSet(1<<efType | 1<<efBlockHashes)
	sglRemovedAllowed = sglRemovedReq | 1<<efMedium

	clearedSet = fieldSet(1 << efType)

	// Positional (array-encoded) events need only the fields of the first releases:
	// vLLM #16750 and SGLang's first BlockStored had these five; BlockRemoved its hashes.
	storedArrayReq = fieldSet(1<<efType | 1<<efBlockHashes | 1<<efParentBlockHash |
		1<<efTokenIDs | 1<<efBlockSize | 1<<efLoraID)
	removedArrayReq = fieldSet(1<<efType | 1<<efBlockHashes)

	mcCommonReq = fieldSet(1<<efEventID | 1<<efTimestamp | 1<<efEventType | 1<<efModelName |
		1<<efBlockSize | 1<<efAdditionalSalt | 1<<efLoraName | 1<<efTenantID | 1<<efBackendID |
		1<<efMedium | 1<<efDPRank)
	mcCommonAllowed = mcCommonReq | 1<<efType
	mcObjectReq     = fieldSet(1<<efGroupID | 1<<efSeqHashes | 1<<efBaseBlockIdx)
	mcObjectOpt     = fieldSet(1<<efObjectKey | 1<<efConnectorBlockHash | 1<<efCachePrefix |
		1<<efTPRank | 1<<efHeadOrTPRank | 1<<efPCPRank | 1<<efDCPRank | 1<<efPPRank |
		1<<efLayerID | 1<<efBlockHashes)
	mcRemovedReq     = mcCommonReq | mcObjectReq
	mcRemovedAllowed = mcCommonAllowed | mcObjectReq | mcObjectOpt
	mcStoredReq      = mcRemovedReq | 1<<efParentHash | 1<<efTokenIDs
	mcStoredAllowed  = mcRemovedAllowed | 1<<efParentHash | 1<<efTokenIDs | 1<<efParentBlockHash
)

// Field order of the positional events (msgspec array_like structs: the tag, then the
// fields in declaration order). Later releases appended fields, so one list per tag
// serves every release: vLLM BlockStored gained medium, lora_name, extra_keys,
// group_idx, the kv_cache_spec pair, then locality, ownership, session_id (not read:
// efUnknown) and lookahead_token_ids; SGLang's BlockStoredWithMetadata appends a
// metadata map ({cache_salt}) to BlockStored.
var (
	vllmStoredPos = []field{efBlockHashes, efParentBlockHash, efTokenIDs, efBlockSize, efLoraID,
		efMedium, efLoraName, efExtraKeys, efGroupIdx, efSpecKind, efSlidingWindow,
		efUnknown, efUnknown, efUnknown, efLookahead}
	vllmRemovedPos = []field{efBlockHashes, efMedium, efGroupIdx}
	sglStoredPos   = []field{efBlockHashes, efParentBlockHash, efTokenIDs, efBlockSize, efLoraID,
		efMedium, efMetadata}
	sglRemovedPos = []field{efBlockHashes, efMedium}
)

// arrayFields is the positional field list of an engine event tag (nil: no fields, or
// an unknown tag, which the checks reject).
func arrayFields(kind publisher.Kind, tag []byte) []field {
	switch string(tag) {
	case "BlockStored":
		if kind == publisher.SGLang {
			return sglStoredPos
		}
		return vllmStoredPos
	case "BlockRemoved":
		if kind == publisher.SGLang {
			return sglRemovedPos
		}
		return vllmRemovedPos
	}
	return nil
}

func lookupVLLM(k []byte) field {
	switch string(k) {
	case "type":
		return efType
	case "block_hashes":
		return efBlockHashes
	case "parent_block_hash":
		return efParentBlockHash
	case "token_ids":
		return efTokenIDs
	case "block_size":
		return efBlockSize
	case "lora_id":
		return efLoraID
	case "medium":
		return efMedium
	case "lora_name":
		return efLoraName
	case "extra_keys":
		return efExtraKeys
	case "group_idx":
		return efGroupIdx
	case "kv_cache_spec_kind":
		return efSpecKind
	case "kv_cache_spec_sliding_window":
		return efSlidingWindow
	case "lookahead_token_ids":
		return efLookahead
	}
	return efUnknown
}

func lookupSGLang(k []byte) field {
	switch string(k) {
	case "type":
		return efType
	case "block_hashes":
		return efBlockHashes
	case "parent_block_hash":
		return efParentBlockHash
	case "token_ids":
		return efTokenIDs
	case "block_size":
		return efBlockSize
	case "lora_id":
		return efLoraID
	case "medium":
		return efMedium
	case "cache_salt":
		return efCacheSalt
	case "session_id":
		return efSessionID
	case "lora_name":
		return efLoraName
	}
	return efUnknown
}

func lookupMooncake(k []byte) field {
	switch string(k) {
	case "event_id":
		return efEventID
	case "timestamp":
		return efTimestamp
	case "event_type":
		return efEventType
	case "type":
		return efType
	case "model_name":
		return efModelName
	case "block_size":
		return efBlockSize
	case "additional_salt":
		return efAdditionalSalt
	case "lora_name":
		return efLoraName
	case "tenant_id":
		return efTenantID
	case "backend_id":
		return efBackendID
	case "medium":
		return efMedium
	case "dp_rank":
		return efDPRank
	case "group_id":
		return efGroupID
	case "object_key":
		return efObjectKey
	case "connector_block_hash":
		return efConnectorBlockHash
	case "cache_prefix":
		return efCachePrefix
	case "tp_rank":
		return efTPRank
	case "head_or_tp_rank":
		return efHeadOrTPRank
	case "pcp_rank":
		return efPCPRank
	case "dcp_rank":
		return efDCPRank
	case "pp_rank":
		return efPPRank
	case "layer_id":
		return efLayerID
	case "seq_hashes":
		return efSeqHashes
	case "block_hashes":
		return efBlockHashes
	case "base_block_idx":
		return efBaseBlockIdx
	case "parent_hash":
		return efParentHash
	case "token_ids":
		return efTokenIDs
	case "parent_block_hash":
		return efParentBlockHash
	}
	return efUnknown
}
