package wire

// Encoders and decoders for every conductor RPC body (reference notes §2.2-2.3). Each
// encoder first finds the largest length in the object (struct_pack picks one length width
// for the whole body from it), then appends the body. Decoders are strict: wrong type code,
// truncation, trailing bytes, impossible lengths, bad flags and unsorted map keys are
// errors, and nothing is allocated from a length before it is checked against the body.

import (
	"errors"
	"fmt"
)

// struct_pack type codes of the conductor types, bit 0 clear. They are MD5s of the type
// structure, so any upstream change of a field type or order changes them; the tests
// recompute them from the structure.
const (
	spCodeQueryRequest     uint32 = 0xf9001a1c // QueryRequest
	spCodeQueryResponse    uint32 = 0xadd5d2cc // expected<QueryResult, ErrorCode>
	spCodeServiceConfig    uint32 = 0xf2a72a10 // ServiceConfig
	spCodeRegisterResponse uint32 = 0xd89001a8 // expected<RegisterResult, ErrorCode>
	spCodeUnregisterArgs   uint32 = 0x9981ca1a // tuple<string, string, int>
	spCodeUnregisterResp   uint32 = 0xf354385c // expected<UnregisterResult, ErrorCode>
	spCodeGlobalView       uint32 = 0x3a0bde58 // GlobalView
	spCodeServiceList      uint32 = 0x667842f8 // vector<ServiceConfig>
	spCodeString           uint32 = 0x9dcffa76 // std::string (framework error message)
	spCodeU16StringPair    uint32 = 0x372be64c // pair<uint16, string> (framework error 255)
)

// ErrRPCUnsorted is returned by encoders when a slice standing for a std::map or std::set
// is not strictly ascending: the C++ side would silently reorder or drop entries.
var ErrRPCUnsorted = errors.New("rpc encode: map or set keys not strictly ascending")

func rpcDecodeErr(what string, err error) error {
	return fmt.Errorf("decode %s: %w", what, err)
}

// ---- QueryRequest ----

func rpcQueryRequestMax(q *RPCQueryRequest) uint64 {
	m := rpcContextKeyMax(0, &q.Context)
	m = spMax(m, len(q.Tokens))
	if q.HasCacheSalt {
		m = spMax(m, len(q.CacheSalt))
	}
	if q.HasInstanceFilter {
		m = spMax(m, len(q.InstanceFilter))
	}
	return m
}

func rpcContextKeyMax(m uint64, k *RPCContextKey) uint64 {
	m = spMax(m, len(k.TenantID))
	m = spMax(m, len(k.ModelName))
	return spMax(m, len(k.LoraName))
}

func rpcAppendContextKey(dst []byte, w int, k *RPCContextKey) []byte {
	dst = spAppendString(dst, w, k.TenantID)
	dst = spAppendString(dst, w, k.ModelName)
	dst = spAppendString(dst, w, k.LoraName)
	return spAppendI64(dst, k.BlockSize)
}

// AppendRPCQueryRequest appends the Query argument body (struct_pack QueryRequest).
func AppendRPCQueryRequest(dst []byte, q *RPCQueryRequest) []byte {
	dst, w := spBegin(dst, spCodeQueryRequest, rpcQueryRequestMax(q))
	dst = rpcAppendContextKey(dst, w, &q.Context)
	dst = spAppendLen(dst, w, len(q.Tokens))
	dst = spAppendI32s(dst, q.Tokens)
	dst = spAppendOptString(dst, w, q.HasCacheSalt, q.CacheSalt)
	return spAppendOptString(dst, w, q.HasInstanceFilter, q.InstanceFilter)
}

func (r *spReader) contextKey(k *RPCContextKey, copyStr bool) {
	r.field = "context.tenant_id"
	k.TenantID = r.str(copyStr)
	r.field = "context.model_name"
	k.ModelName = r.str(copyStr)
	r.field = "context.lora_name"
	k.LoraName = r.str(copyStr)
	r.field = "context.block_size"
	k.BlockSize = r.i64()
}

func (r *spReader) str(copyStr bool) string {
	if copyStr {
		return r.strCopy()
	}
	return r.strAlias()
}

// DecodeRPCQueryRequest decodes a Query argument body into q without allocating in steady
// state: strings alias body (valid only while body is neither modified nor reused) and
// tokens are appended to q.Tokens[:0].
func DecodeRPCQueryRequest(body []byte, q *RPCQueryRequest) error {
	r := spOpen(body, spCodeQueryRequest)
	r.contextKey(&q.Context, false)
	r.field = "token_ids"
	q.Tokens = r.i32s(q.Tokens[:0])
	r.field = "cache_salt"
	q.CacheSalt, q.HasCacheSalt = r.optStr(false)
	r.field = "instance_filter"
	q.InstanceFilter, q.HasInstanceFilter = r.optStr(false)
	if err := r.finish(); err != nil {
		return rpcDecodeErr("QueryRequest", err)
	}
	return nil
}

// ---- expected<QueryResult, ErrorCode> ----

// Smallest wire sizes (for w = 1 they are exact minimums; lengths add w each), used to
// bound counts before allocating.
func rpcMinInstanceHit(w int) int { return 40 + 3*w } // id len + lm + dp len + rm len + 4 tiers

func rpcQueryResultMax(res *RPCQueryResult) (uint64, error) {
	m := spMax(0, len(res.Instances))
	for i := range res.Instances {
		in := &res.Instances[i]
		if i > 0 && res.Instances[i-1].InstanceID >= in.InstanceID {
			return 0, fmt.Errorf("%w: instance %q after %q", ErrRPCUnsorted, in.InstanceID, res.Instances[i-1].InstanceID)
		}
		m = spMax(m, len(in.InstanceID))
		m = spMax(m, len(in.Hit.DP))
		m = spMax(m, len(in.Hit.RankMatches))
		for j := 1; j < len(in.Hit.DP); j++ {
			if in.Hit.DP[j-1].Rank >= in.Hit.DP[j].Rank {
				return 0, fmt.Errorf("%w: instance %q dp rank %d", ErrRPCUnsorted, in.InstanceID, in.Hit.DP[j].Rank)
			}
		}
		for j := 1; j < len(in.Hit.RankMatches); j++ {
			if in.Hit.RankMatches[j-1].Rank >= in.Hit.RankMatches[j].Rank {
				return 0, fmt.Errorf("%w: instance %q rank_matches rank %d", ErrRPCUnsorted, in.InstanceID, in.Hit.RankMatches[j].Rank)
			}
		}
	}
	return m, nil
}

// AppendRPCQueryResult appends a successful Query response body (expected holding the
// QueryResult). It allocates nothing beyond growing dst, and fails only when Instances,
// DP or RankMatches are not strictly ascending.
func AppendRPCQueryResult(dst []byte, res *RPCQueryResult) ([]byte, error) {
	m, err := rpcQueryResultMax(res)
	if err != nil {
		return dst, err
	}
	dst, w := spBegin(dst, spCodeQueryResponse, m)
	dst = append(dst, 1)
	dst = spAppendLen(dst, w, len(res.Instances))
	for i := range res.Instances {
		in := &res.Instances[i]
		h := &in.Hit
		dst = spAppendString(dst, w, in.InstanceID)
		dst = spAppendI64(dst, h.LongestMatchTokens)
		dst = spAppendLen(dst, w, len(h.DP))
		for _, d := range h.DP {
			dst = spAppendI64(dst, d.Rank)
			dst = spAppendI64(dst, d.Value)
		}
		dst = spAppendLen(dst, w, len(h.RankMatches))
		for _, t := range h.RankMatches {
			dst = spAppendI64(dst, t.Rank)
			dst = rpcAppendTiers(dst, t.Device, t.CPULocal, t.CPUShare, t.Disk)
		}
		dst = rpcAppendTiers(dst, h.Device, h.CPULocal, h.CPUShare, h.Disk)
	}
	return dst, nil
}

func rpcAppendTiers(dst []byte, a, b, c, d int64) []byte {
	dst = spAppendI64(dst, a)
	dst = spAppendI64(dst, b)
	dst = spAppendI64(dst, c)
	return spAppendI64(dst, d)
}

// rpcAppendExpectedError appends an expected<T, ErrorCode> holding the error: no containers,
// so one-byte lengths and no metainfo.
func rpcAppendExpectedError(dst []byte, code uint32, ec RPCErrorCode) []byte {
	dst, _ = spBegin(dst, code, 0)
	return spAppendI32(append(dst, 0), int32(ec))
}

// AppendRPCQueryError appends a Query response body carrying a business error.
func AppendRPCQueryError(dst []byte, ec RPCErrorCode) []byte {
	return rpcAppendExpectedError(dst, spCodeQueryResponse, ec)
}

// DecodeRPCQueryResponse decodes a Query response body. On a business error it returns
// that code and leaves res.Instances empty. Instance ids alias body; the slices in res are
// reused, so steady-state decoding into the same res allocates nothing.
func DecodeRPCQueryResponse(body []byte, res *RPCQueryResult) (RPCErrorCode, error) {
	r := spOpen(body, spCodeQueryResponse)
	res.Instances = res.Instances[:0]
	r.field = "expected flag"
	if !r.flag() {
		r.field = "error code"
		ec := RPCErrorCode(r.i32())
		if err := r.finish(); err != nil {
			return 0, rpcDecodeErr("Query response", err)
		}
		return ec, nil
	}
	r.field = "instances"
	n := r.length(rpcMinInstanceHit(r.w))
	if r.err == nil {
		res.Instances = rpcGrowKeep(res.Instances, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		in := &res.Instances[i]
		r.field = "instance id"
		in.InstanceID = r.strAlias()
		if i > 0 && r.err == nil && res.Instances[i-1].InstanceID >= in.InstanceID {
			r.fail(fmt.Errorf("%w: instance ids not strictly ascending", ErrStructPackValue))
		}
		r.cacheHit(&in.Hit)
	}
	if err := r.finish(); err != nil {
		res.Instances = res.Instances[:0]
		return 0, rpcDecodeErr("Query response", err)
	}
	return RPCCodeOK, nil
}

// rpcGrowKeep returns s with length n, keeping the elements (and their inner slices) already
// in its capacity so they can be reused.
func rpcGrowKeep[T any](s []T, n int) []T {
	s = s[:cap(s)]
	if len(s) < n {
		s = append(s, make([]T, n-len(s))...)
	}
	return s[:n]
}

func (r *spReader) cacheHit(h *RPCCacheHitResult) {
	r.field = "longest_match_tokens"
	h.LongestMatchTokens = r.i64()
	r.field = "dp"
	n := r.length(16)
	h.DP = h.DP[:0]
	for j := 0; j < n && r.err == nil; j++ {
		d := RPCRankValue{Rank: r.i64(), Value: r.i64()}
		if j > 0 && h.DP[j-1].Rank >= d.Rank {
			r.fail(fmt.Errorf("%w: dp ranks not strictly ascending", ErrStructPackValue))
		}
		h.DP = append(h.DP, d)
	}
	r.field = "rank_matches"
	n = r.length(40)
	h.RankMatches = h.RankMatches[:0]
	for j := 0; j < n && r.err == nil; j++ {
		t := RPCRankTiers{Rank: r.i64(), Device: r.i64(), CPULocal: r.i64(), CPUShare: r.i64(), Disk: r.i64()}
		if j > 0 && h.RankMatches[j-1].Rank >= t.Rank {
			r.fail(fmt.Errorf("%w: rank_matches ranks not strictly ascending", ErrStructPackValue))
		}
		h.RankMatches = append(h.RankMatches, t)
	}
	r.field = "tiers"
	h.Device = r.i64()
	h.CPULocal = r.i64()
	h.CPUShare = r.i64()
	h.Disk = r.i64()
}

// ---- ServiceConfig (Register argument, ListServices element) ----

func rpcHashProfileMax(m uint64, p *RPCHashProfile) uint64 {
	m = spMax(m, len(p.Strategy))
	m = spMax(m, len(p.Algorithm))
	m = spMax(m, len(p.PythonHashSeed))
	m = spMax(m, len(p.RootDigest))
	return spMax(m, len(p.IndexProjection))
}

func rpcServiceConfigMax(m uint64, c *RPCServiceConfig) uint64 {
	for _, s := range [...]string{c.Endpoint, c.ReplayEndpoint, c.ModelName, c.LoraName, c.TenantID, c.InstanceID} {
		m = spMax(m, len(s))
	}
	return rpcHashProfileMax(m, &c.HashProfile)
}

func rpcAppendHashProfile(dst []byte, w int, p *RPCHashProfile) []byte {
	dst = spAppendString(dst, w, p.Strategy)
	dst = spAppendString(dst, w, p.Algorithm)
	dst = spAppendString(dst, w, p.PythonHashSeed)
	dst = spAppendString(dst, w, p.RootDigest)
	return spAppendString(dst, w, p.IndexProjection)
}

func rpcAppendServiceConfig(dst []byte, w int, c *RPCServiceConfig) []byte {
	dst = spAppendString(dst, w, c.Endpoint)
	dst = spAppendString(dst, w, c.ReplayEndpoint)
	dst = spAppendI32(dst, int32(c.PublisherKind))
	dst = spAppendString(dst, w, c.ModelName)
	dst = spAppendString(dst, w, c.LoraName)
	dst = spAppendString(dst, w, c.TenantID)
	dst = spAppendString(dst, w, c.InstanceID)
	dst = spAppendI64(dst, c.BlockSize)
	dst = spAppendI32(dst, c.DPRank)
	if c.HasCacheGroup {
		dst = spAppendI64(append(dst, 1), c.CacheGroup)
	} else {
		dst = append(dst, 0)
	}
	return rpcAppendHashProfile(dst, w, &c.HashProfile)
}

func (r *spReader) hashProfile(p *RPCHashProfile) {
	r.field = "hash_profile.strategy"
	p.Strategy = r.strCopy()
	r.field = "hash_profile.algorithm"
	p.Algorithm = r.strCopy()
	r.field = "hash_profile.python_hash_seed"
	p.PythonHashSeed = r.strCopy()
	r.field = "hash_profile.root_digest"
	p.RootDigest = r.strCopy()
	r.field = "hash_profile.index_projection"
	p.IndexProjection = r.strCopy()
}

func (r *spReader) serviceConfig(c *RPCServiceConfig) {
	r.field = "endpoint"
	c.Endpoint = r.strCopy()
	r.field = "replay_endpoint"
	c.ReplayEndpoint = r.strCopy()
	r.field = "publisher_kind"
	c.PublisherKind = RPCPublisherKind(r.i32())
	r.field = "model_name"
	c.ModelName = r.strCopy()
	r.field = "lora_name"
	c.LoraName = r.strCopy()
	r.field = "tenant_id"
	c.TenantID = r.strCopy()
	r.field = "instance_id"
	c.InstanceID = r.strCopy()
	r.field = "block_size"
	c.BlockSize = r.i64()
	r.field = "dp_rank"
	c.DPRank = r.i32()
	r.field = "cache_group"
	c.HasCacheGroup = r.flag()
	c.CacheGroup = 0
	if c.HasCacheGroup {
		c.CacheGroup = r.i64()
	}
	r.hashProfile(&c.HashProfile)
}

// rpcMinServiceConfig is the smallest ServiceConfig on the wire: 11 strings, kind, block
// size, dp rank and the cache_group flag.
func rpcMinServiceConfig(w int) int { return 17 + 11*w }

// AppendRPCServiceConfig appends the Register argument body (struct_pack ServiceConfig).
func AppendRPCServiceConfig(dst []byte, c *RPCServiceConfig) []byte {
	dst, w := spBegin(dst, spCodeServiceConfig, rpcServiceConfigMax(0, c))
	return rpcAppendServiceConfig(dst, w, c)
}

// DecodeRPCServiceConfig decodes a Register argument body into c. Strings are copied, as
// the service keeps them.
func DecodeRPCServiceConfig(body []byte, c *RPCServiceConfig) error {
	r := spOpen(body, spCodeServiceConfig)
	r.serviceConfig(c)
	if err := r.finish(); err != nil {
		return rpcDecodeErr("ServiceConfig", err)
	}
	return nil
}

// ---- expected<RegisterResult, ErrorCode> ----

// AppendRPCRegisterResult appends a successful Register response body.
func AppendRPCRegisterResult(dst []byte, res RPCRegisterResult) []byte {
	dst, w := spBegin(dst, spCodeRegisterResponse, uint64(len(res.InstanceID)))
	dst = spAppendString(append(dst, 1), w, res.InstanceID)
	return spAppendBool(dst, res.IsNew)
}

// AppendRPCRegisterError appends a Register response body carrying a business error.
func AppendRPCRegisterError(dst []byte, ec RPCErrorCode) []byte {
	return rpcAppendExpectedError(dst, spCodeRegisterResponse, ec)
}

// DecodeRPCRegisterResponse decodes a Register response body; the result is meaningful
// only when the code is RPCCodeOK.
func DecodeRPCRegisterResponse(body []byte) (RPCRegisterResult, RPCErrorCode, error) {
	r := spOpen(body, spCodeRegisterResponse)
	var res RPCRegisterResult
	ec := RPCCodeOK
	r.field = "expected flag"
	if r.flag() {
		r.field = "instance_id"
		res.InstanceID = r.strCopy()
		r.field = "is_new"
		res.IsNew = r.flag()
	} else {
		r.field = "error code"
		ec = RPCErrorCode(r.i32())
	}
	if err := r.finish(); err != nil {
		return RPCRegisterResult{}, 0, rpcDecodeErr("Register response", err)
	}
	return res, ec, nil
}

// ---- Unregister: tuple<string, string, int> / expected<UnregisterResult, ErrorCode> ----

// AppendRPCUnregisterArgs appends the Unregister argument body (the three parameters
// serialized as one tuple).
func AppendRPCUnregisterArgs(dst []byte, instanceID, tenantID string, dpRank int32) []byte {
	dst, w := spBegin(dst, spCodeUnregisterArgs, spMax(uint64(len(instanceID)), len(tenantID)))
	dst = spAppendString(dst, w, instanceID)
	dst = spAppendString(dst, w, tenantID)
	return spAppendI32(dst, dpRank)
}

// DecodeRPCUnregisterArgs decodes the Unregister argument body; strings are copied.
func DecodeRPCUnregisterArgs(body []byte) (instanceID, tenantID string, dpRank int32, err error) {
	r := spOpen(body, spCodeUnregisterArgs)
	r.field = "instance_id"
	instanceID = r.strCopy()
	r.field = "tenant_id"
	tenantID = r.strCopy()
	r.field = "dp_rank"
	dpRank = r.i32()
	if err := r.finish(); err != nil {
		return "", "", 0, rpcDecodeErr("Unregister arguments", err)
	}
	return instanceID, tenantID, dpRank, nil
}

// AppendRPCUnregisterResult appends a successful Unregister response body.
func AppendRPCUnregisterResult(dst []byte, res RPCUnregisterResult) []byte {
	dst, w := spBegin(dst, spCodeUnregisterResp, uint64(len(res.RemovedKey)))
	return spAppendString(append(dst, 1), w, res.RemovedKey)
}

// AppendRPCUnregisterError appends an Unregister response body carrying a business error.
func AppendRPCUnregisterError(dst []byte, ec RPCErrorCode) []byte {
	return rpcAppendExpectedError(dst, spCodeUnregisterResp, ec)
}

// DecodeRPCUnregisterResponse decodes an Unregister response body; the result is
// meaningful only when the code is RPCCodeOK.
func DecodeRPCUnregisterResponse(body []byte) (RPCUnregisterResult, RPCErrorCode, error) {
	r := spOpen(body, spCodeUnregisterResp)
	var res RPCUnregisterResult
	ec := RPCCodeOK
	r.field = "expected flag"
	if r.flag() {
		r.field = "removed_key"
		res.RemovedKey = r.strCopy()
	} else {
		r.field = "error code"
		ec = RPCErrorCode(r.i32())
	}
	if err := r.finish(); err != nil {
		return RPCUnregisterResult{}, 0, rpcDecodeErr("Unregister response", err)
	}
	return res, ec, nil
}

// ---- GlobalView ----

func rpcGlobalViewMax(v *RPCGlobalView) (uint64, error) {
	m := spMax(0, len(v.Contexts))
	for i := range v.Contexts {
		c := &v.Contexts[i]
		m = rpcContextKeyMax(m, &c.Context)
		m = rpcHashProfileMax(m, &c.Profile)
		m = spMax(m, len(c.InstanceRanks))
		for j := range c.InstanceRanks {
			ir := &c.InstanceRanks[j]
			if j > 0 && c.InstanceRanks[j-1].InstanceID >= ir.InstanceID {
				return 0, fmt.Errorf("%w: context %d instance %q", ErrRPCUnsorted, i, ir.InstanceID)
			}
			m = spMax(m, len(ir.InstanceID))
			m = spMax(m, len(ir.Ranks))
			for k := 1; k < len(ir.Ranks); k++ {
				if ir.Ranks[k-1] >= ir.Ranks[k] {
					return 0, fmt.Errorf("%w: instance %q rank %d", ErrRPCUnsorted, ir.InstanceID, ir.Ranks[k])
				}
			}
		}
	}
	return m, nil
}

// AppendRPCGlobalView appends the GetGlobalView response body (GlobalView, not wrapped in
// expected). It fails only when InstanceRanks or Ranks are not strictly ascending.
func AppendRPCGlobalView(dst []byte, v *RPCGlobalView) ([]byte, error) {
	m, err := rpcGlobalViewMax(v)
	if err != nil {
		return dst, err
	}
	dst, w := spBegin(dst, spCodeGlobalView, m)
	dst = spAppendI32(dst, v.ContextCount)
	dst = spAppendLen(dst, w, len(v.Contexts))
	for i := range v.Contexts {
		c := &v.Contexts[i]
		dst = rpcAppendContextKey(dst, w, &c.Context)
		dst = rpcAppendHashProfile(dst, w, &c.Profile)
		dst = spAppendLen(dst, w, len(c.InstanceRanks))
		for _, ir := range c.InstanceRanks {
			dst = spAppendString(dst, w, ir.InstanceID)
			dst = spAppendLen(dst, w, len(ir.Ranks))
			for _, rk := range ir.Ranks {
				dst = spAppendI64(dst, rk)
			}
		}
		dst = spAppendU64(dst, c.PrefixCount)
	}
	return dst, nil
}

// rpcMinContextView is the smallest ContextView on the wire: the key (3 strings and the
// block size), 5 profile strings, the instance map length and prefix_count.
func rpcMinContextView(w int) int { return 16 + 9*w }

// DecodeRPCGlobalView decodes a GetGlobalView response body; strings are copied.
func DecodeRPCGlobalView(body []byte) (RPCGlobalView, error) {
	r := spOpen(body, spCodeGlobalView)
	var v RPCGlobalView
	r.field = "context_count"
	v.ContextCount = r.i32()
	r.field = "contexts"
	n := r.length(rpcMinContextView(r.w))
	if r.err == nil && n > 0 {
		v.Contexts = make([]RPCContextView, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		c := &v.Contexts[i]
		r.contextKey(&c.Context, true)
		r.hashProfile(&c.Profile)
		r.field = "instance_ranks"
		ni := r.length(2 * r.w)
		if r.err == nil && ni > 0 {
			c.InstanceRanks = make([]RPCInstanceRanks, ni)
		}
		for j := 0; j < ni && r.err == nil; j++ {
			ir := &c.InstanceRanks[j]
			r.field = "instance_ranks key"
			ir.InstanceID = r.strCopy()
			if j > 0 && r.err == nil && c.InstanceRanks[j-1].InstanceID >= ir.InstanceID {
				r.fail(fmt.Errorf("%w: instance ids not strictly ascending", ErrStructPackValue))
			}
			r.field = "instance_ranks set"
			nr := r.length(8)
			if r.err == nil && nr > 0 {
				ir.Ranks = make([]int64, 0, nr)
			}
			for k := 0; k < nr && r.err == nil; k++ {
				rk := r.i64()
				if k > 0 && ir.Ranks[k-1] >= rk {
					r.fail(fmt.Errorf("%w: ranks not strictly ascending", ErrStructPackValue))
				}
				ir.Ranks = append(ir.Ranks, rk)
			}
		}
		r.field = "prefix_count"
		c.PrefixCount = r.u64()
	}
	if err := r.finish(); err != nil {
		return RPCGlobalView{}, rpcDecodeErr("GlobalView", err)
	}
	return v, nil
}

// ---- vector<ServiceConfig> ----

// AppendRPCServiceList appends the ListServices response body (vector<ServiceConfig>, not
// wrapped in expected).
func AppendRPCServiceList(dst []byte, list []RPCServiceConfig) []byte {
	m := spMax(0, len(list))
	for i := range list {
		m = rpcServiceConfigMax(m, &list[i])
	}
	dst, w := spBegin(dst, spCodeServiceList, m)
	dst = spAppendLen(dst, w, len(list))
	for i := range list {
		dst = rpcAppendServiceConfig(dst, w, &list[i])
	}
	return dst
}

// DecodeRPCServiceList decodes a ListServices response body; strings are copied.
func DecodeRPCServiceList(body []byte) ([]RPCServiceConfig, error) {
	r := spOpen(body, spCodeServiceList)
	r.field = "services"
	n := r.length(rpcMinServiceConfig(r.w))
	var list []RPCServiceConfig
	if r.err == nil && n > 0 {
		list = make([]RPCServiceConfig, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		r.serviceConfig(&list[i])
	}
	if err := r.finish(); err != nil {
		return nil, rpcDecodeErr("ServiceConfig list", err)
	}
	return list, nil
}
