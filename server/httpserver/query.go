package httpserver

import (
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// maxPooledTokens: token buffers above this many tokens (4 MiB) are not kept in the
// pools after the request.
const maxPooledTokens = 1 << 20

// queryScratch is the per-request state of /query, pooled so that a query allocates nothing.
type queryScratch struct {
	req   httpapi.QueryRequest
	hreq  httpapi.QueryByHashRequest
	query engine.Query
	res   engine.Result
	ranks []httpapi.RankTiers
	body  []byte
}

// query answers /query and returns the number of blocks it hashed; e gets what the
// access log reports.
func (h *Server) query(ctx *fasthttp.RequestCtx, body []byte, e *accesslog.Entry) int {
	sc := h.pool.Get().(*queryScratch)
	defer h.pool.Put(sc)
	if rerr := httpapi.DecodeQueryRequest(body, &sc.req); rerr != nil {
		sc.req.Release(maxPooledTokens)
		h.requestError(ctx, rerr)
		return 0
	}
	q := &sc.query
	q.Key = engine.ContextKey{TenantID: sc.req.TenantID, ModelName: sc.req.Model, LoraName: sc.req.LoraName, BlockSize: sc.req.BlockSize}
	q.Tokens = sc.req.Tokens
	q.CacheSalt = sc.req.CacheSalt
	q.InstanceFilter = sc.req.InstanceID
	// httpapi's strict decoder applied the query rules, in the contract's field order.
	if serr := h.svc.Query(q, service.KeyChecked, &sc.res); serr != nil {
		h.serviceError(ctx, serr)
		return 0
	}
	h.writeQueryResult(ctx, sc, &sc.res)
	e.Fill(sc.req.Model, int64(len(sc.req.Tokens)), sc.res.BlocksHashed(), &sc.res)
	// Drop references into the request body (and an outlier prompt's buffer) before the
	// scratch goes back to the pool.
	sc.query = engine.Query{}
	sc.req.Release(maxPooledTokens)
	return sc.res.BlocksHashed()
}

// queryByHash answers POST /query_by_hash: /query's request with block_hashes in place of
// token_ids, and /query's response. It returns the number of block keys received.
func (h *Server) queryByHash(ctx *fasthttp.RequestCtx, body []byte, e *accesslog.Entry) int {
	sc := h.pool.Get().(*queryScratch)
	defer h.pool.Put(sc)
	req := &sc.hreq
	if rerr := httpapi.DecodeQueryByHashRequest(body, req); rerr != nil {
		req.Release(maxPooledTokens / 2)
		h.requestError(ctx, rerr)
		return 0
	}
	key := engine.ContextKey{TenantID: req.TenantID, ModelName: req.Model, LoraName: req.LoraName, BlockSize: req.BlockSize}
	if serr := h.svc.QueryByHash(key, req.BlockHashes, req.InstanceID, service.KeyChecked, &sc.res); serr != nil {
		h.serviceError(ctx, serr)
		return 0
	}
	h.writeQueryResult(ctx, sc, &sc.res)
	e.Fill(req.Model, int64(len(req.BlockHashes))*req.BlockSize, 0, &sc.res)
	// Drop references into the request body (and an outlier prompt's buffer) before the
	// scratch goes back to the pool.
	n := len(req.BlockHashes)
	req.Release(maxPooledTokens / 2)
	return n
}

// writeQueryResult encodes res as the /query response body, appended into the scratch's
// buffer, which is then swapped with the response's (no copy, no allocation).
func (h *Server) writeQueryResult(ctx *fasthttp.RequestCtx, sc *queryScratch, res *engine.Result) {
	b := httpapi.AppendQueryResponseHeader(sc.body[:0], len(res.Instances))
	for i := range res.Instances {
		inst := &res.Instances[i]
		sc.ranks = sc.ranks[:0]
		for _, r := range inst.Ranks {
			sc.ranks = append(sc.ranks, httpapi.RankTiers{Rank: r.Rank, Device: r.Device, CPULocal: r.CPULocal, CPUShare: r.CPUShare, Disk: r.Disk})
		}
		b = httpapi.AppendInstanceHit(b, inst.InstanceID, inst.Disk, inst.Device, inst.CPULocal, inst.CPUShare, inst.Disk, sc.ranks)
	}
	ctx.Response.Header.SetContentTypeBytes(msgpackContentType)
	// Swap buffers instead of copying: the response keeps ours, we keep its old one.
	sc.body = ctx.Response.SwapBody(b)
}
