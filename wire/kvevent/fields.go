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

// fieldIndex finds a field by its wire key (fieldNames), so that every key is spelled
// once for all publishers: slot keyHash(name) holds the field, the others efUnknown.
// Read-only after package initialisation.
var fieldIndex = func() (t [fieldIndexSize]field) {
	for i := range t {
		t[i] = efUnknown
	}
	for f, name := range fieldNames {
		h := keyHash(name)
		if t[h] != efUnknown {
			panic("kvevent: keyHash puts " + name + " and " + fieldNames[t[h]] + " in one slot: change its factors")
		}
		t[h] = field(f)
	}
	return t
}()

// fieldIndexSize is the number of fieldIndex slots, a power of two.
const fieldIndexSize = 128

// keyHash mixes a non-empty key's length with its first and last bytes; the factors are
// chosen so that every key of fieldNames has a slot of its own (a lookup is one load
// and one comparison), which package initialisation checks.
func keyHash[K string | []byte](k K) uint {
	return (15*uint(len(k)) + 26*uint(k[0]) + uint(k[len(k)-1])) % fieldIndexSize
}

// The keys a publisher's map events may carry under any tag; lookupField skips the
// others like keys that no publisher sends. metadata is SGLang's positional field only.
const (
	vllmMapKeys     = vllmStoredAllowed | vllmRemovedAllowed
	sglMapKeys      = (sglStoredAllowed | sglRemovedAllowed) &^ (1 << efMetadata)
	mooncakeMapKeys = mcStoredAllowed | mcRemovedAllowed
)

// mapKeys is the recognised-key set of kind's map events.
func mapKeys(kind publisher.Kind) fieldSet {
	switch kind {
	case publisher.VLLM:
		return vllmMapKeys
	case publisher.SGLang:
		return sglMapKeys
	}
	return mooncakeMapKeys
}

// lookupField returns the field of map key k, or efUnknown when k is not in keys.
func lookupField(keys fieldSet, k []byte) field {
	if len(k) == 0 {
		return efUnknown
	}
	f := fieldIndex[keyHash(k)]
	if f == efUnknown || fieldNames[f] != string(k) || keys&bit(f) == 0 {
		return efUnknown
	}
	return f
}
