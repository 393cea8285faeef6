package server

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// QueryByHash answers a prefix-hit query whose block keys the caller computed: keys[i] is
// the projected key of block i, and each block stands for BlockSize tokens, so counts
// are clamped at len(keys)*BlockSize. The validation is Query's. CacheSalt has no effect
// here: a salt is already folded into the keys.
func (s *Service) QueryByHash(key engine.ContextKey, keys []uint64, instanceFilter string, res *engine.Result) *Error {
	if s.stopping.Load() {
		return errStopping
	}
	if key.ModelName == "" {
		return invalidField("invalid_value", "model", "model must not be empty")
	}
	if key.BlockSize <= 0 {
		return invalidField("out_of_range", "block_size", "block_size must be a positive integer")
	}
	if key.TenantID == "" {
		key.TenantID = "default"
	}
	positions := math.MaxInt
	if n := int64(len(keys)); n == 0 || key.BlockSize <= math.MaxInt/n {
		positions = int(n * key.BlockSize)
	}
	if err := s.eng.QueryKeys(key, keys, positions, instanceFilter, res); err != nil {
		return queryError(err)
	}
	return nil
}

// queryByHash answers POST /query_by_hash: /query's request with block_hashes in place of
// token_ids, and /query's response. It returns the number of block keys received.
func (h *HTTPServer) queryByHash(ctx *fasthttp.RequestCtx, body []byte, e *accessEntry) int {
	sc := h.pool.Get().(*queryScratch)
	defer h.pool.Put(sc)
	req := &sc.hreq
	if rerr := httpapi.DecodeQueryByHashRequest(body, req); rerr != nil {
		req.Release(maxPooledTokens / 2)
		h.requestError(ctx, rerr)
		return 0
	}
	key := engine.ContextKey{TenantID: req.TenantID, ModelName: req.Model, LoraName: req.LoraName, BlockSize: req.BlockSize}
	if serr := h.svc.QueryByHash(key, req.BlockHashes, req.InstanceID, &sc.res); serr != nil {
		h.serviceError(ctx, serr)
		return 0
	}
	h.writeQueryResult(ctx, sc, &sc.res)
	e.fill(req.Model, int64(len(req.BlockHashes))*req.BlockSize, 0, &sc.res)
	// Drop references into the request body (and an outlier prompt's buffer) before the
	// scratch goes back to the pool.
	n := len(req.BlockHashes)
	req.Release(maxPooledTokens / 2)
	return n
}

// writeQueryResult encodes res as the /query response body, appended into the scratch's
// buffer, which is then swapped with the response's (no copy, no allocation).
func (h *HTTPServer) writeQueryResult(ctx *fasthttp.RequestCtx, sc *queryScratch, res *engine.Result) {
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

// byHashMetrics are the pre-resolved /query_by_hash children of the query metrics
// (protocol label "http_by_hash").
type byHashMetrics struct {
	queries prometheus.Counter
	latency prometheus.Observer
	ok      prometheus.Counter
	errors  prometheus.Counter
}

const protocolByHash = "http_by_hash"

func (m *Metrics) initByHash() {
	m.byHash = byHashMetrics{
		queries: m.queries.WithLabelValues(protocolByHash),
		latency: m.queryLatency.WithLabelValues(protocolByHash),
		ok:      m.httpRequests.WithLabelValues("/query_by_hash", "200"),
		errors:  m.queryErrors.WithLabelValues(protocolByHash),
	}
}

// observeHTTPQueryByHash records one /query_by_hash: its latency and outcome.
func (m *Metrics) observeHTTPQueryByHash(start time.Time, status int) {
	if m == nil {
		return
	}
	m.byHash.queries.Inc()
	m.byHash.latency.Observe(time.Since(start).Seconds())
	if status == http.StatusOK {
		m.byHash.ok.Inc()
		return
	}
	m.byHash.errors.Inc()
	m.httpRequests.WithLabelValues("/query_by_hash", strconv.Itoa(status)).Inc()
}
