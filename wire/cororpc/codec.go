package cororpc

// Encoders and decoders for every conductor RPC body (reference notes §2.2-2.3). Each
// encoder first finds the largest length in the object (struct_pack picks one length width
// for the whole body from it), then appends the body. Decoders are strict: wrong type code,
// truncation, trailing bytes, impossible lengths, bad flags and unsorted map keys are
// errors, and nothing is allocated from a length before it is checked against the body.

import (
	"errors"
	"fmt"

	"github.com/conductor-go/conductor/wire/publisher"
)

// struct_pack type codes of the conductor types, bit 0 clear. They are MD5s of the type
// structure, so any upstream change of a field type or order changes them; the tests
// recompute them from the structure.
const (
	codeQueryRequest     uint32 = 0xf9001a1c // QueryRequest
	codeQueryResponse    uint32 = 0xadd5d2cc // expected<QueryResult, ErrorCode>
	codeServiceConfig    uint32 = 0xf2a72a10 // ServiceConfig
	codeRegisterResponse uint32 = 0xd89001a8 // expected<RegisterResult, ErrorCode>
	codeUnregisterArgs   uint32 = 0x9981ca1a // tuple<string, string, int>
	codeUnregisterResp   uint32 = 0xf354385c // expected<UnregisterResult, ErrorCode>
	codeGlobalView       uint32 = 0x3a0bde58 // GlobalView
	codeServiceList      uint32 = 0x667842f8 // vector<ServiceConfig>
	codeString           uint32 = 0x9dcffa76 // std::string (framework error message)
	codeU16StringPair    uint32 = 0x372be64c // pair<uint16, string> (framework error 255)
)

// ErrUnsorted is returned by encoders when a slice standing for a std::map or std::set
// is not strictly ascending: the C++ side would silently reorder or drop entries.
var ErrUnsorted = errors.New("rpc encode: map or set keys not strictly ascending")

func decodeErr(what string, err error) error {
	return fmt.Errorf("decode %s: %w", what, err)
}

// at names the field read next (errors name it) and returns r, for one-line reads.
func (r *reader) at(field string) *reader {
	r.field = field
	return r
}

// expected reads the flag of an expected<T, ErrorCode>: true when a T follows; false when
// the business error code followed, which it stores in *ec.
func (r *reader) expected(ec *ErrorCode) bool {
	if r.at("expected flag").flag() {
		return true
	}
	*ec = ErrorCode(r.at("error code").i32())
	return false
}

// done is finish, its error naming what was decoded.
func (r *reader) done(what string) error {
	if err := r.finish(); err != nil {
		return decodeErr(what, err)
	}
	return nil
}

// ---- QueryRequest ----

func queryRequestMax(q *QueryRequest) uint64 {
	m := contextKeyMax(0, &q.Context)
	m = maxLen(m, len(q.Tokens))
	if q.HasCacheSalt {
		m = maxLen(m, len(q.CacheSalt))
	}
	if q.HasInstanceFilter {
		m = maxLen(m, len(q.InstanceFilter))
	}
	return m
}

func contextKeyMax(m uint64, k *ContextKey) uint64 {
	m = maxLen(m, len(k.TenantID))
	m = maxLen(m, len(k.ModelName))
	return maxLen(m, len(k.LoraName))
}

func appendContextKey(dst []byte, w int, k *ContextKey) []byte {
	dst = appendString(dst, w, k.TenantID)
	dst = appendString(dst, w, k.ModelName)
	dst = appendString(dst, w, k.LoraName)
	return appendI64(dst, k.BlockSize)
}

// AppendQueryRequest appends the Query argument body (struct_pack QueryRequest).
func AppendQueryRequest(dst []byte, q *QueryRequest) []byte {
	dst, w := begin(dst, codeQueryRequest, queryRequestMax(q))
	dst = appendContextKey(dst, w, &q.Context)
	dst = appendLen(dst, w, len(q.Tokens))
	dst = appendI32s(dst, q.Tokens)
	dst = appendOptString(dst, w, q.HasCacheSalt, q.CacheSalt)
	return appendOptString(dst, w, q.HasInstanceFilter, q.InstanceFilter)
}

func (r *reader) contextKey(k *ContextKey, copyStr bool) {
	k.TenantID = r.at("context.tenant_id").str(copyStr)
	k.ModelName = r.at("context.model_name").str(copyStr)
	k.LoraName = r.at("context.lora_name").str(copyStr)
	k.BlockSize = r.at("context.block_size").i64()
}

func (r *reader) str(copyStr bool) string {
	if copyStr {
		return r.strCopy()
	}
	return r.strAlias()
}

// DecodeQueryRequest decodes a Query argument body into q without allocating in steady
// state: strings alias body (valid only while body is neither modified nor reused) and
// tokens are appended to q.Tokens[:0].
func DecodeQueryRequest(body []byte, q *QueryRequest) error {
	r := open(body, codeQueryRequest)
	r.contextKey(&q.Context, false)
	q.Tokens = r.at("token_ids").i32s(q.Tokens[:0])
	q.CacheSalt, q.HasCacheSalt = r.at("cache_salt").optStr(false)
	q.InstanceFilter, q.HasInstanceFilter = r.at("instance_filter").optStr(false)
	if err := r.done("QueryRequest"); err != nil {
		return err
	}
	return nil
}

// ---- expected<QueryResult, ErrorCode> ----

// Smallest wire sizes (for w = 1 they are exact minimums; lengths add w each), used to
// bound counts before allocating.
func minInstanceHit(w int) int { return 40 + 3*w } // id len + lm + dp len + rm len + 4 tiers

func queryResultMax(res *QueryResult) (uint64, error) {
	m := maxLen(0, len(res.Instances))
	for i := range res.Instances {
		in := &res.Instances[i]
		if i > 0 && res.Instances[i-1].InstanceID >= in.InstanceID {
			return 0, fmt.Errorf("%w: instance %q after %q", ErrUnsorted, in.InstanceID, res.Instances[i-1].InstanceID)
		}
		m = maxLen(m, len(in.InstanceID))
		m = maxLen(m, len(in.Hit.DP))
		m = maxLen(m, len(in.Hit.RankMatches))
		for j := 1; j < len(in.Hit.DP); j++ {
			if in.Hit.DP[j-1].Rank >= in.Hit.DP[j].Rank {
				return 0, fmt.Errorf("%w: instance %q dp rank %d", ErrUnsorted, in.InstanceID, in.Hit.DP[j].Rank)
			}
		}
		for j := 1; j < len(in.Hit.RankMatches); j++ {
			if in.Hit.RankMatches[j-1].Rank >= in.Hit.RankMatches[j].Rank {
				return 0, fmt.Errorf("%w: instance %q rank_matches rank %d", ErrUnsorted, in.InstanceID, in.Hit.RankMatches[j].Rank)
			}
		}
	}
	return m, nil
}

// AppendQueryResult appends a successful Query response body (expected holding the
// QueryResult). It allocates nothing beyond growing dst, and fails only when Instances,
// DP or RankMatches are not strictly ascending.
func AppendQueryResult(dst []byte, res *QueryResult) ([]byte, error) {
	m, err := queryResultMax(res)
	if err != nil {
		return dst, err
	}
	dst, w := begin(dst, codeQueryResponse, m)
	dst = appendLen(append(dst, 1), w, len(res.Instances)) // the expected flag: a value
	for i := range res.Instances {
		in := &res.Instances[i]
		h := &in.Hit
		dst = appendString(dst, w, in.InstanceID)
		dst = appendI64(dst, h.LongestMatchTokens)
		dst = appendLen(dst, w, len(h.DP))
		for _, d := range h.DP {
			dst = appendI64(dst, d.Rank)
			dst = appendI64(dst, d.Value)
		}
		dst = appendLen(dst, w, len(h.RankMatches))
		for _, t := range h.RankMatches {
			dst = appendI64(dst, t.Rank)
			dst = appendTiers(dst, t.Device, t.CPULocal, t.CPUShare, t.Disk)
		}
		dst = appendTiers(dst, h.Device, h.CPULocal, h.CPUShare, h.Disk)
	}
	return dst, nil
}

func appendTiers(dst []byte, a, b, c, d int64) []byte {
	dst = appendI64(dst, a)
	dst = appendI64(dst, b)
	dst = appendI64(dst, c)
	return appendI64(dst, d)
}

// appendExpectedError appends an expected<T, ErrorCode> holding the error: no containers,
// so one-byte lengths and no metainfo.
func appendExpectedError(dst []byte, code uint32, ec ErrorCode) []byte {
	dst, _ = begin(dst, code, 0)
	return appendI32(append(dst, 0), int32(ec))
}

// AppendQueryError appends a Query response body carrying a business error.
func AppendQueryError(dst []byte, ec ErrorCode) []byte {
	return appendExpectedError(dst, codeQueryResponse, ec)
}

// DecodeQueryResponse decodes a Query response body. On a business error it returns
// that code and leaves res.Instances empty. Instance ids alias body; the slices in res are
// reused, so steady-state decoding into the same res allocates nothing.
func DecodeQueryResponse(body []byte, res *QueryResult) (ErrorCode, error) {
	r := open(body, codeQueryResponse)
	res.Instances = res.Instances[:0]
	var ec ErrorCode
	if !r.expected(&ec) {
		if err := r.done("Query response"); err != nil {
			return 0, err
		}
		return ec, nil
	}
	n := r.at("instances").length(minInstanceHit(r.w))
	if r.err == nil {
		res.Instances = growKeep(res.Instances, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		in := &res.Instances[i]
		in.InstanceID = r.at("instance id").strAlias()
		if i > 0 && r.err == nil && res.Instances[i-1].InstanceID >= in.InstanceID {
			r.fail(fmt.Errorf("%w: instance ids not strictly ascending", ErrStructPackValue))
		}
		r.cacheHit(&in.Hit)
	}
	if err := r.done("Query response"); err != nil {
		res.Instances = res.Instances[:0]
		return 0, err
	}
	return CodeOK, nil
}

// growKeep returns s with length n, keeping the elements (and their inner slices) already
// in its capacity so they can be reused.
func growKeep[T any](s []T, n int) []T {
	s = s[:cap(s)]
	if len(s) < n {
		s = append(s, make([]T, n-len(s))...)
	}
	return s[:n]
}

func (r *reader) cacheHit(h *CacheHitResult) {
	h.LongestMatchTokens = r.at("longest_match_tokens").i64()
	n := r.at("dp").length(16)
	h.DP = h.DP[:0]
	for j := 0; j < n && r.err == nil; j++ {
		d := RankValue{Rank: r.i64(), Value: r.i64()}
		if j > 0 && h.DP[j-1].Rank >= d.Rank {
			r.fail(fmt.Errorf("%w: dp ranks not strictly ascending", ErrStructPackValue))
		}
		h.DP = append(h.DP, d)
	}
	n = r.at("rank_matches").length(40)
	h.RankMatches = h.RankMatches[:0]
	for j := 0; j < n && r.err == nil; j++ {
		t := RankTiers{Rank: r.i64(), Device: r.i64(), CPULocal: r.i64(), CPUShare: r.i64(), Disk: r.i64()}
		if j > 0 && h.RankMatches[j-1].Rank >= t.Rank {
			r.fail(fmt.Errorf("%w: rank_matches ranks not strictly ascending", ErrStructPackValue))
		}
		h.RankMatches = append(h.RankMatches, t)
	}
	h.Device = r.at("tiers").i64()
	h.CPULocal = r.i64()
	h.CPUShare = r.i64()
	h.Disk = r.i64()
}

// ---- ServiceConfig (Register argument, ListServices element) ----

func hashProfileMax(m uint64, p *HashProfile) uint64 {
	m = maxLen(m, len(p.Strategy))
	m = maxLen(m, len(p.Algorithm))
	m = maxLen(m, len(p.PythonHashSeed))
	m = maxLen(m, len(p.RootDigest))
	return maxLen(m, len(p.IndexProjection))
}

func serviceConfigMax(m uint64, c *ServiceConfig) uint64 {
	for _, s := range [...]string{c.Endpoint, c.ReplayEndpoint, c.ModelName, c.LoraName, c.TenantID, c.InstanceID} {
		m = maxLen(m, len(s))
	}
	return hashProfileMax(m, &c.HashProfile)
}

func appendHashProfile(dst []byte, w int, p *HashProfile) []byte {
	dst = appendString(dst, w, p.Strategy)
	dst = appendString(dst, w, p.Algorithm)
	dst = appendString(dst, w, p.PythonHashSeed)
	dst = appendString(dst, w, p.RootDigest)
	return appendString(dst, w, p.IndexProjection)
}

func appendServiceConfig(dst []byte, w int, c *ServiceConfig) []byte {
	dst = appendString(dst, w, c.Endpoint)
	dst = appendString(dst, w, c.ReplayEndpoint)
	dst = appendI32(dst, int32(c.PublisherKind))
	dst = appendString(dst, w, c.ModelName)
	dst = appendString(dst, w, c.LoraName)
	dst = appendString(dst, w, c.TenantID)
	dst = appendString(dst, w, c.InstanceID)
	dst = appendI64(dst, c.BlockSize)
	dst = appendI32(dst, c.DPRank)
	if c.HasCacheGroup {
		dst = appendI64(append(dst, 1), c.CacheGroup)
	} else {
		dst = append(dst, 0)
	}
	return appendHashProfile(dst, w, &c.HashProfile)
}

func (r *reader) hashProfile(p *HashProfile) {
	p.Strategy = r.at("hash_profile.strategy").strCopy()
	p.Algorithm = r.at("hash_profile.algorithm").strCopy()
	p.PythonHashSeed = r.at("hash_profile.python_hash_seed").strCopy()
	p.RootDigest = r.at("hash_profile.root_digest").strCopy()
	p.IndexProjection = r.at("hash_profile.index_projection").strCopy()
}

func (r *reader) serviceConfig(c *ServiceConfig) {
	c.Endpoint = r.at("endpoint").strCopy()
	c.ReplayEndpoint = r.at("replay_endpoint").strCopy()
	c.PublisherKind = publisher.Kind(r.at("publisher_kind").i32())
	c.ModelName = r.at("model_name").strCopy()
	c.LoraName = r.at("lora_name").strCopy()
	c.TenantID = r.at("tenant_id").strCopy()
	c.InstanceID = r.at("instance_id").strCopy()
	c.BlockSize = r.at("block_size").i64()
	c.DPRank = r.at("dp_rank").i32()
	c.HasCacheGroup = r.at("cache_group").flag()
	c.CacheGroup = 0
	if c.HasCacheGroup {
		c.CacheGroup = r.i64()
	}
	r.hashProfile(&c.HashProfile)
}

// minServiceConfig is the smallest ServiceConfig on the wire: 11 strings, kind, block
// size, dp rank and the cache_group flag.
func minServiceConfig(w int) int { return 17 + 11*w }

// AppendServiceConfig appends the Register argument body (struct_pack ServiceConfig).
func AppendServiceConfig(dst []byte, c *ServiceConfig) []byte {
	dst, w := begin(dst, codeServiceConfig, serviceConfigMax(0, c))
	return appendServiceConfig(dst, w, c)
}

// DecodeServiceConfig decodes a Register argument body into c. Strings are copied, as
// the service keeps them.
func DecodeServiceConfig(body []byte, c *ServiceConfig) error {
	r := open(body, codeServiceConfig)
	r.serviceConfig(c)
	if err := r.done("ServiceConfig"); err != nil {
		return err
	}
	return nil
}

// ---- expected<RegisterResult, ErrorCode> ----

// AppendRegisterResult appends a successful Register response body.
func AppendRegisterResult(dst []byte, res RegisterResult) []byte {
	dst, w := begin(dst, codeRegisterResponse, uint64(len(res.InstanceID)))
	dst = appendString(append(dst, 1), w, res.InstanceID)
	return appendBool(dst, res.IsNew)
}

// AppendRegisterError appends a Register response body carrying a business error.
func AppendRegisterError(dst []byte, ec ErrorCode) []byte {
	return appendExpectedError(dst, codeRegisterResponse, ec)
}

// DecodeRegisterResponse decodes a Register response body; the result is meaningful
// only when the code is CodeOK.
func DecodeRegisterResponse(body []byte) (RegisterResult, ErrorCode, error) {
	return decodeExpected(body, codeRegisterResponse, "Register response", func(r *reader, res *RegisterResult) {
		res.InstanceID = r.at("instance_id").strCopy()
		res.IsNew = r.at("is_new").flag()
	})
}

// decodeExpected decodes an expected<T, ErrorCode> body of type code (what names it in
// errors): value reads the T when the flag says one follows. The T is meaningful only
// when the code is CodeOK.
func decodeExpected[T any](body []byte, code uint32, what string, value func(*reader, *T)) (T, ErrorCode, error) {
	r := open(body, code)
	var res T
	ec := CodeOK
	if r.expected(&ec) {
		value(&r, &res)
	}
	if err := r.done(what); err != nil {
		var zero T
		return zero, 0, err
	}
	return res, ec, nil
}

// ---- Unregister: tuple<string, string, int> / expected<UnregisterResult, ErrorCode> ----

// AppendUnregisterArgs appends the Unregister argument body (the three parameters
// serialized as one tuple).
func AppendUnregisterArgs(dst []byte, instanceID, tenantID string, dpRank int32) []byte {
	dst, w := begin(dst, codeUnregisterArgs, maxLen(uint64(len(instanceID)), len(tenantID)))
	dst = appendString(dst, w, instanceID)
	dst = appendString(dst, w, tenantID)
	return appendI32(dst, dpRank)
}

// DecodeUnregisterArgs decodes the Unregister argument body; strings are copied.
func DecodeUnregisterArgs(body []byte) (instanceID, tenantID string, dpRank int32, err error) {
	r := open(body, codeUnregisterArgs)
	instanceID, tenantID, dpRank = r.serviceID()
	if err := r.finish(); err != nil {
		return "", "", 0, decodeErr("Unregister arguments", err)
	}
	return instanceID, tenantID, dpRank, nil
}

// serviceID reads the (instance_id, tenant_id, dp_rank) an unregistration names.
func (r *reader) serviceID() (instanceID, tenantID string, dpRank int32) {
	r.field = "instance_id"
	instanceID = r.strCopy()
	r.field = "tenant_id"
	tenantID = r.strCopy()
	r.field = "dp_rank"
	return instanceID, tenantID, r.i32()
}

// AppendUnregisterResult appends a successful Unregister response body.
func AppendUnregisterResult(dst []byte, res UnregisterResult) []byte {
	dst, w := begin(dst, codeUnregisterResp, uint64(len(res.RemovedKey)))
	return appendString(append(dst, 1), w, res.RemovedKey)
}

// AppendUnregisterError appends an Unregister response body carrying a business error.
func AppendUnregisterError(dst []byte, ec ErrorCode) []byte {
	return appendExpectedError(dst, codeUnregisterResp, ec)
}

// DecodeUnregisterResponse decodes an Unregister response body; the result is
// meaningful only when the code is CodeOK.
func DecodeUnregisterResponse(body []byte) (UnregisterResult, ErrorCode, error) {
	return decodeExpected(body, codeUnregisterResp, "Unregister response", func(r *reader, res *UnregisterResult) {
		res.RemovedKey = r.at("removed_key").strCopy()
	})
}

// ---- GlobalView ----

// AppendGlobalView appends the GetGlobalView response body (GlobalView, not wrapped in
// expected). It fails only when InstanceRanks or Ranks are not strictly ascending.
func AppendGlobalView(dst []byte, v *GlobalView) ([]byte, error) {
	m, err := globalViewMax(v)
	if err != nil {
		return dst, err
	}
	dst, w := begin(dst, codeGlobalView, m)
	dst = appendI32(dst, v.ContextCount)
	dst = appendLen(dst, w, len(v.Contexts))
	for i := range v.Contexts {
		c := &v.Contexts[i]
		dst = appendContextKey(dst, w, &c.Context)
		dst = appendHashProfile(dst, w, &c.Profile)
		dst = appendLen(dst, w, len(c.InstanceRanks))
		for _, ir := range c.InstanceRanks {
			dst = appendString(dst, w, ir.InstanceID)
			dst = appendLen(dst, w, len(ir.Ranks))
			for _, rk := range ir.Ranks {
				dst = appendI64(dst, rk)
			}
		}
		dst = appendU64(dst, c.PrefixCount)
	}
	return dst, nil
}

// globalViewMax is AppendGlobalView's size pass, which also checks the order of the
// instance ids and ranks.
func globalViewMax(v *GlobalView) (uint64, error) {
	m := maxLen(0, len(v.Contexts))
	for i := range v.Contexts {
		c := &v.Contexts[i]
		m = contextKeyMax(m, &c.Context)
		m = hashProfileMax(m, &c.Profile)
		m = maxLen(m, len(c.InstanceRanks))
		for j := range c.InstanceRanks {
			ir := &c.InstanceRanks[j]
			if j > 0 && c.InstanceRanks[j-1].InstanceID >= ir.InstanceID {
				return 0, fmt.Errorf("%w: context %d instance %q", ErrUnsorted, i, ir.InstanceID)
			}
			m = maxLen(m, len(ir.InstanceID))
			m = maxLen(m, len(ir.Ranks))
			for k := 1; k < len(ir.Ranks); k++ {
				if ir.Ranks[k-1] >= ir.Ranks[k] {
					return 0, fmt.Errorf("%w: instance %q rank %d", ErrUnsorted, ir.InstanceID, ir.Ranks[k])
				}
			}
		}
	}
	return m, nil
}

// minContextView is the smallest ContextView on the wire: the key (3 strings and the
// block size), 5 profile strings, the instance map length and prefix_count.
func minContextView(w int) int { return 16 + 9*w }

// DecodeGlobalView decodes a GetGlobalView response body; strings are copied.
func DecodeGlobalView(body []byte) (GlobalView, error) {
	r := open(body, codeGlobalView)
	var v GlobalView
	v.ContextCount = r.at("context_count").i32()
	n := r.at("contexts").length(minContextView(r.w))
	if r.err == nil && n > 0 {
		v.Contexts = make([]ContextView, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		c := &v.Contexts[i]
		r.contextKey(&c.Context, true)
		r.hashProfile(&c.Profile)
		ni := r.at("instance_ranks").length(2 * r.w)
		if r.err == nil && ni > 0 {
			c.InstanceRanks = make([]InstanceRanks, ni)
		}
		for j := 0; j < ni && r.err == nil; j++ {
			ir := &c.InstanceRanks[j]
			ir.InstanceID = r.at("instance_ranks key").strCopy()
			if j > 0 && r.err == nil && c.InstanceRanks[j-1].InstanceID >= ir.InstanceID {
				r.fail(fmt.Errorf("%w: instance ids not strictly ascending", ErrStructPackValue))
			}
			nr := r.at("instance_ranks set").length(8)
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
		c.PrefixCount = r.at("prefix_count").u64()
	}
	if err := r.done("GlobalView"); err != nil {
		return GlobalView{}, err
	}
	return v, nil
}

// ---- vector<ServiceConfig> ----

// AppendServiceList appends the ListServices response body (vector<ServiceConfig>, not
// wrapped in expected).
func AppendServiceList(dst []byte, list []ServiceConfig) []byte {
	m := maxLen(0, len(list))
	for i := range list {
		m = serviceConfigMax(m, &list[i])
	}
	dst, w := begin(dst, codeServiceList, m)
	dst = appendLen(dst, w, len(list))
	for i := range list {
		dst = appendServiceConfig(dst, w, &list[i])
	}
	return dst
}

// DecodeServiceList decodes a ListServices response body; strings are copied.
func DecodeServiceList(body []byte) ([]ServiceConfig, error) {
	r := open(body, codeServiceList)
	n := r.at("services").length(minServiceConfig(r.w))
	var list []ServiceConfig
	if r.err == nil && n > 0 {
		list = make([]ServiceConfig, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		r.serviceConfig(&list[i])
	}
	if err := r.done("ServiceConfig list"); err != nil {
		return nil, err
	}
	return list, nil
}
