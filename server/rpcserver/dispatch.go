package rpcserver

import (
	"errors"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// rpcCode maps a service error to the wire's business error code.
func rpcCode(e *service.Error) cororpc.ErrorCode {
	switch e.Code {
	case service.CodeInvalidParams:
		return cororpc.CodeInvalidParams
	case service.CodeNotFound:
		return cororpc.CodeServiceNotFound
	case service.CodeUnavailable:
		return cororpc.CodeConductorUnavailable
	}
	return cororpc.CodeInternalError
}

// dispatch decodes one request, calls the service and leaves the response frame in rc.out.
// An error means the body was malformed: the connection is closed.
func (rc *rpcConn) dispatch(hdr cororpc.RequestHeader, body []byte) error {
	out, start := cororpc.BeginResponse(rc.out[:0], hdr.SeqNum, 0)
	var err error
	switch hdr.FunctionID {
	case cororpc.FuncQuery:
		out, err = rc.query(out, body)
	case cororpc.FuncRegister:
		out, err = rc.register(out, body)
	case cororpc.FuncUnregister:
		out, err = rc.unregister(out, body)
	case cororpc.FuncGetGlobalView:
		if len(body) != 0 {
			return errors.New("GetGlobalView takes no arguments")
		}
		out, err = cororpc.AppendGlobalView(out, rpcGlobalView(rc.s.svc))
		rc.s.observe("GetGlobalView", "OK")
	case cororpc.FuncListServices:
		if len(body) != 0 {
			return errors.New("ListServices takes no arguments")
		}
		out = cororpc.AppendServiceList(out, rpcServiceList(rc.s.svc.Views()))
		rc.s.observe("ListServices", "OK")
	case cororpc.FuncRegisterEx:
		out, err = rc.registerEx(out, body)
	case cororpc.FuncUnregisterAdapter:
		out, err = rc.unregisterAdapter(out, body)
	case cororpc.FuncListServiceDetails:
		if len(body) != 0 {
			return errors.New("ListServiceDetails takes no arguments")
		}
		out = cororpc.AppendServiceDetails(out, rpcServiceDetails(rc.s.svc.Views()))
		rc.s.observe("ListServiceDetails", "OK")
	default:
		rc.s.observe("unknown", "function_not_registered")
		rc.out = cororpc.AppendFrameworkError(rc.out[:0], hdr.SeqNum, cororpc.ErrcFunctionNotRegistered,
			"the function is not registered")
		return nil
	}
	if err != nil {
		return err
	}
	if ferr := cororpc.FinishResponse(out, start); ferr != nil {
		return ferr
	}
	rc.out = out
	return nil
}

// query answers a Query call.
func (rc *rpcConn) query(out, body []byte) ([]byte, error) {
	rc.s.pulse.Beat()
	start := time.Now()
	if err := cororpc.DecodeQueryRequest(body, &rc.qreq); err != nil {
		return out, err
	}
	q := &rc.q
	ctx := &rc.qreq.Context
	q.Key = engine.ContextKey{TenantID: ctx.TenantID, ModelName: ctx.ModelName, LoraName: ctx.LoraName, BlockSize: ctx.BlockSize}
	q.Tokens = rc.qreq.Tokens
	q.CacheSalt = rc.qreq.CacheSalt
	q.InstanceFilter = rc.qreq.InstanceFilter
	serr := rc.s.svc.Query(q, service.CheckKey, &rc.res)
	*q = engine.Query{}
	tokens := len(rc.qreq.Tokens)
	if cap(rc.qreq.Tokens) > maxConnTokens {
		rc.qreq.Tokens = nil
	}
	rc.s.observeQuery(start, serr == nil, rc.res.BlocksHashed())
	rc.s.logQuery(start, ctx.ModelName, tokens, &rc.res, serr)
	if serr != nil {
		return cororpc.AppendQueryError(out, rpcCode(serr)), nil
	}
	res := &rc.rpcRes
	res.Instances = res.Instances[:0]
	for i := range rc.res.Instances {
		inst := &rc.res.Instances[i]
		// Grow by reslicing so each element keeps its DP/RankMatches capacity from earlier queries.
		if len(res.Instances) < cap(res.Instances) {
			res.Instances = res.Instances[:len(res.Instances)+1]
		} else {
			res.Instances = append(res.Instances, cororpc.InstanceHit{})
		}
		ih := &res.Instances[len(res.Instances)-1]
		ih.InstanceID = inst.InstanceID
		hit := &ih.Hit
		hit.LongestMatchTokens = inst.Disk
		hit.Device, hit.CPULocal, hit.CPUShare, hit.Disk = inst.Device, inst.CPULocal, inst.CPUShare, inst.Disk
		hit.DP = hit.DP[:0]
		hit.RankMatches = hit.RankMatches[:0]
		for _, r := range inst.Ranks {
			hit.DP = append(hit.DP, cororpc.RankValue{Rank: int64(r.Rank), Value: r.Device})
			hit.RankMatches = append(hit.RankMatches, cororpc.RankTiers{Rank: int64(r.Rank), Device: r.Device,
				CPULocal: r.CPULocal, CPUShare: r.CPUShare, Disk: r.Disk})
		}
	}
	out, err := cororpc.AppendQueryResult(out, res)
	for i := range res.Instances {
		res.Instances[i].InstanceID = "" // drop references into the engine's slot table
	}
	return out, err
}

// register answers a Register call.
func (rc *rpcConn) register(out, body []byte) ([]byte, error) {
	var c cororpc.ServiceConfig
	if err := cororpc.DecodeServiceConfig(body, &c); err != nil {
		return out, err
	}
	return rc.registerConfig(out, "Register", &c, nil), nil
}

// registerEx answers a RegisterEx call: Register with the fields of issue 25.
func (rc *rpcConn) registerEx(out, body []byte) ([]byte, error) {
	var a cororpc.RegisterExArgs
	if err := cororpc.DecodeRegisterExArgs(body, &a); err != nil {
		return out, err
	}
	return rc.registerConfig(out, "RegisterEx", &a.Config, &a), nil
}

// registerConfig registers c (with ext's fields when it is a RegisterEx call) and
// appends the answer of function fn.
func (rc *rpcConn) registerConfig(out []byte, fn string, c *cororpc.ServiceConfig, ext *cororpc.RegisterExArgs) []byte {
	if rc.s.refuseMutations {
		rc.s.refused(fn, c.InstanceID)
		return cororpc.AppendRegisterError(out, cororpc.CodeConductorUnavailable)
	}
	if !c.PublisherKind.Valid() {
		rc.s.observe(fn, cororpc.CodeInvalidParams.String())
		return cororpc.AppendRegisterError(out, cororpc.CodeInvalidParams)
	}
	r := service.Registration{
		Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, Type: c.PublisherKind.String(),
		ModelName: c.ModelName, LoraName: c.LoraName, TenantID: c.TenantID, InstanceID: c.InstanceID,
		BlockSize: c.BlockSize, DPRank: int64(c.DPRank),
		Strategy: c.HashProfile.Strategy, Algorithm: c.HashProfile.Algorithm,
		PythonHashSeed: c.HashProfile.PythonHashSeed, IndexProjection: c.HashProfile.IndexProjection,
		RootDigest: c.HashProfile.RootDigest,
	}
	if c.HasCacheGroup {
		g := c.CacheGroup
		r.CacheGroup = &g
	}
	if ext != nil {
		r.ExtraKeys, r.LoraPath, r.LookaheadTokens = ext.Ext.ExtraKeys, ext.Ext.LoraPath, ext.Ext.LookaheadTokens
		if ext.HasIndexMedia {
			r.IndexMedia = ext.IndexMedia
		}
	}
	cfg, isNew, serr := rc.s.svc.RegisterInput(&r)
	if serr != nil {
		rc.s.clientLog.Info("rpc register rejected", "function", fn, "instance", c.InstanceID, "err", serr)
		rc.s.observe(fn, rpcCode(serr).String())
		return cororpc.AppendRegisterError(out, rpcCode(serr))
	}
	rc.s.observe(fn, "OK")
	return cororpc.AppendRegisterResult(out, cororpc.RegisterResult{InstanceID: cfg.InstanceID, IsNew: isNew})
}

// unregister answers an Unregister call.
func (rc *rpcConn) unregister(out, body []byte) ([]byte, error) {
	id, tenant, rank, err := cororpc.DecodeUnregisterArgs(body)
	if err != nil {
		return out, err
	}
	if rc.s.refuseMutations {
		rc.s.refused("Unregister", id)
		return cororpc.AppendUnregisterError(out, cororpc.CodeConductorUnavailable), nil
	}
	key, serr := rc.s.svc.Unregister(id, tenant, int(rank))
	if serr != nil {
		rc.s.observe("Unregister", rpcCode(serr).String())
		return cororpc.AppendUnregisterError(out, rpcCode(serr)), nil
	}
	rc.s.observe("Unregister", "OK")
	return cororpc.AppendUnregisterResult(out, cororpc.UnregisterResult{RemovedKey: key}), nil
}

// refused counts and logs (rate-limited) a Register or Unregister refused because RPC
// mutations are off.
func (s *Server) refused(function, instance string) {
	s.observe(function, cororpc.CodeConductorUnavailable.String())
	s.clientLog.Warn("rpc "+function+" refused: admin_token is set and rpc_allow_mutations is not true "+
		"(the RPC wire carries no token); register over HTTP with the token", "instance", instance)
}

// unregisterAdapter answers an UnregisterAdapter call: one adapter of a multi-LoRA
// registration.
func (rc *rpcConn) unregisterAdapter(out, body []byte) ([]byte, error) {
	id, tenant, rank, lora, err := cororpc.DecodeUnregisterAdapterArgs(body)
	if err != nil {
		return out, err
	}
	if rc.s.refuseMutations {
		rc.s.refused("UnregisterAdapter", id)
		return cororpc.AppendUnregisterError(out, cororpc.CodeConductorUnavailable), nil
	}
	key, serr := rc.s.svc.UnregisterAdapter(id, tenant, int(rank), lora)
	if serr != nil {
		rc.s.observe("UnregisterAdapter", rpcCode(serr).String())
		return cororpc.AppendUnregisterError(out, rpcCode(serr)), nil
	}
	rc.s.observe("UnregisterAdapter", "OK")
	return cororpc.AppendUnregisterResult(out, cororpc.UnregisterResult{RemovedKey: key}), nil
}

// rpcServiceDetails is the ListServiceDetails answer: ListServices' entries with the
// profile fields, media and self-check they cannot carry.
func rpcServiceDetails(views []service.View) []cororpc.ServiceDetail {
	cfgs := rpcServiceList(views)
	out := make([]cororpc.ServiceDetail, len(views))
	for i := range views {
		c := &views[i].Config
		out[i] = cororpc.ServiceDetail{Config: cfgs[i], IndexMedia: c.Media.Names(c.Kind), HashCheck: views[i].HashCheck,
			Ext: cororpc.ProfileExt{LoraPath: c.Profile.LoraPath, LookaheadTokens: int64(c.Profile.Lookahead)}}
		if c.Profile.ExtraKeys != hashing.ExtraKeysUntagged {
			out[i].Ext.ExtraKeys = c.Profile.ExtraKeysName()
		}
	}
	return out
}

func rpcProfile(p *hashing.Profile) cororpc.HashProfile {
	return cororpc.HashProfile{Strategy: p.StrategyName(), Algorithm: p.AlgorithmName(), PythonHashSeed: p.Seed,
		RootDigest: p.RootHex(), IndexProjection: p.ProjectionName()}
}

// rpcServiceList is the ListServices answer: one ServiceConfig per adapter of a
// multi-LoRA registration, as /services lists them (the upstream type has no room for
// the other fields of issue 25; root_digest covers them).
func rpcServiceList(views []service.View) []cororpc.ServiceConfig {
	out := make([]cororpc.ServiceConfig, len(views))
	for i := range views {
		c := &views[i].Config
		out[i] = cororpc.ServiceConfig{
			Endpoint: c.Endpoint, ReplayEndpoint: c.ReplayEndpoint, PublisherKind: c.Kind,
			ModelName: c.ModelName, LoraName: c.LoraName, TenantID: c.TenantID, InstanceID: c.InstanceID,
			BlockSize: c.BlockSize, DPRank: int32(c.DPRank), HashProfile: rpcProfile(&c.Profile),
		}
		if c.CacheGroup != nil {
			out[i].CacheGroup, out[i].HasCacheGroup = *c.CacheGroup, true
		}
	}
	return out
}

func rpcGlobalView(svc *service.Service) *cororpc.GlobalView {
	views, serr := svc.GlobalView()
	v := &cororpc.GlobalView{}
	// While stopping, an empty view: GetGlobalView has no error channel on the wire.
	if serr != nil {
		return v
	}
	for i := range views {
		cv := &views[i]
		ctx := cororpc.ContextView{
			Context:     cororpc.ContextKey{TenantID: cv.Key.TenantID, ModelName: cv.Key.ModelName, LoraName: cv.Key.LoraName, BlockSize: cv.Key.BlockSize},
			Profile:     rpcProfile(&cv.Profile),
			PrefixCount: cv.PrefixCount,
		}
		for _, inst := range cv.Instances {
			ir := cororpc.InstanceRanks{InstanceID: inst.InstanceID}
			for _, r := range inst.Ranks {
				ir.Ranks = append(ir.Ranks, int64(r))
			}
			ctx.InstanceRanks = append(ctx.InstanceRanks, ir)
		}
		v.Contexts = append(v.Contexts, ctx)
	}
	v.ContextCount = int32(len(v.Contexts))
	return v
}

func (s *Server) observeQuery(start time.Time, ok bool, blocks int) {
	if s.metrics != nil {
		s.metrics.ObserveRPCQuery(start, ok, blocks)
	}
}

func (s *Server) observe(function, code string) {
	if s.metrics != nil {
		s.metrics.ObserveRPC(function, code)
	}
}

// logQuery writes the access line of a Query call when the log is on.
func (s *Server) logQuery(start time.Time, model string, tokens int, res *engine.Result, serr *service.Error) {
	if s.access == nil {
		return
	}
	e := accesslog.Entry{Route: "Query"}
	code := int64(0)
	if serr != nil {
		code = int64(rpcCode(serr))
	} else {
		e.Fill(model, int64(tokens), res.BlocksHashed(), res)
	}
	s.access.RPC(start, &e, code)
}
