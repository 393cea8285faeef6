package server

import (
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/wire"
)

// HTTPServer serves the contract's five msgpack routes over fasthttp.
type HTTPServer struct {
	svc     *Service
	metrics *Metrics
	log     *slog.Logger
	srv     *fasthttp.Server
	extra   map[string]fasthttp.RequestHandler
	pool    sync.Pool // *queryScratch
	access  *AccessLog
}

// queryScratch is the per-request state of /query, pooled so that a query allocates nothing.
type queryScratch struct {
	req   wire.QueryRequest
	hreq  wire.QueryByHashRequest
	query engine.Query
	res   engine.Result
	ranks []wire.RankTiers
	body  []byte
}

// HTTPOptions configures the HTTP server.
type HTTPOptions struct {
	Service *Service
	Logger  *slog.Logger
	// Extra routes (e.g. /metrics, /healthz), served when no contract route matches.
	Extra map[string]fasthttp.RequestHandler
	// Metrics, when set, records queries and requests.
	Metrics *Metrics
	// AccessLog, when set, gets one line per contract route request.
	AccessLog *AccessLog
}

// NewHTTPServer builds the HTTP server; call Serve with a listener.
func NewHTTPServer(opts HTTPOptions) *HTTPServer {
	h := &HTTPServer{svc: opts.Service, metrics: opts.Metrics, log: opts.Logger, extra: opts.Extra, access: opts.AccessLog}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.pool.New = func() any { return &queryScratch{} }
	h.srv = &fasthttp.Server{
		Handler:               h.handle,
		Name:                  "mooncake_conductor",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		ReadTimeout:           60 * time.Second,
		IdleTimeout:           120 * time.Second,
		MaxRequestBodySize:    256 << 20,
	}
	return h
}

// Serve accepts connections on ln until Shutdown.
func (h *HTTPServer) Serve(ln net.Listener) error {
	return h.srv.Serve(ln)
}

// Shutdown stops accepting and waits for in-flight requests.
func (h *HTTPServer) Shutdown() error {
	return h.srv.Shutdown()
}

// Handler returns the request handler (for in-memory tests).
func (h *HTTPServer) Handler() fasthttp.RequestHandler { return h.handle }

func (h *HTTPServer) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	route := ""
	start := time.Now()
	var e accessEntry
	switch string(path) {
	case "/query":
		blocks := 0
		if h.method(ctx, fasthttp.MethodPost) {
			blocks = h.query(ctx, &e)
		}
		h.metrics.observeHTTPQuery(start, ctx.Response.StatusCode(), blocks)
		h.logAccess(ctx, start, "/query", &e)
		return
	case "/query_by_hash":
		if h.method(ctx, fasthttp.MethodPost) {
			h.queryByHash(ctx, &e)
		}
		h.metrics.observeHTTPQueryByHash(start, ctx.Response.StatusCode())
		h.logAccess(ctx, start, "/query_by_hash", &e)
		return
	case "/register":
		route = "/register"
		if h.method(ctx, fasthttp.MethodPost) {
			h.register(ctx)
		}
	case "/unregister":
		route = "/unregister"
		if h.method(ctx, fasthttp.MethodPost) {
			h.unregister(ctx)
		}
	case "/global_view":
		route = "/global_view"
		if h.method(ctx, fasthttp.MethodGet) {
			h.globalView(ctx)
		}
	case "/services":
		route = "/services"
		if h.method(ctx, fasthttp.MethodGet) {
			h.services(ctx)
		}
	default:
		if fn, ok := h.extra[string(path)]; ok {
			fn(ctx)
			return
		}
		route = "other"
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		h.writeMsgpack(ctx, wire.AppendErrorMessage(nil, "Not found"))
	}
	h.metrics.observeHTTP(route, ctx.Response.StatusCode())
	h.logAccess(ctx, start, route, &e)
}

func (h *HTTPServer) method(ctx *fasthttp.RequestCtx, want string) bool {
	if string(ctx.Method()) == want {
		return true
	}
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.Response.Header.Set("Allow", want)
	h.writeMsgpack(ctx, wire.AppendErrorMessage(nil, "Method not allowed"))
	return false
}

var msgpackContentType = []byte("application/msgpack")

func (h *HTTPServer) writeMsgpack(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.Response.Header.SetContentTypeBytes(msgpackContentType)
	ctx.SetBody(body)
}

// checkPost validates the request's content type and the service state.
func (h *HTTPServer) checkPost(ctx *fasthttp.RequestCtx) bool {
	if !wire.IsMsgpackContentType(ctx.Request.Header.ContentType()) {
		h.requestError(ctx, &wire.RequestError{Msg: "Content-Type must be application/msgpack",
			Reason: "unsupported_content_type", Index: -1})
		return false
	}
	if h.svc.Stopping() {
		h.serviceError(ctx, errStopping)
		return false
	}
	return true
}

func (h *HTTPServer) requestError(ctx *fasthttp.RequestCtx, e *wire.RequestError) {
	ctx.SetStatusCode(fasthttp.StatusBadRequest)
	h.writeMsgpack(ctx, wire.AppendRequestError(nil, e))
}

// serviceError maps a service-level failure to its HTTP status and body.
func (h *HTTPServer) serviceError(ctx *fasthttp.RequestCtx, e *Error) {
	switch e.Code {
	case CodeInvalidParams:
		if e.Reason != "" {
			idx := -1
			if e.HasIndex {
				idx = e.Index
			}
			h.requestError(ctx, &wire.RequestError{Msg: e.Msg, Reason: e.Reason, Field: e.Field, Index: idx})
			return
		}
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
	case CodeNotFound:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	case CodeUnavailable:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	default:
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	}
	h.writeMsgpack(ctx, wire.AppendErrorMessage(nil, e.Msg))
}

// query answers /query and returns the number of blocks it hashed; e gets what the
// access log reports.
func (h *HTTPServer) query(ctx *fasthttp.RequestCtx, e *accessEntry) int {
	if !h.checkPost(ctx) {
		return 0
	}
	sc := h.pool.Get().(*queryScratch)
	defer h.pool.Put(sc)
	if rerr := wire.DecodeQueryRequest(ctx.PostBody(), &sc.req); rerr != nil {
		h.requestError(ctx, rerr)
		return 0
	}
	q := &sc.query
	q.Key = engine.ContextKey{TenantID: sc.req.TenantID, ModelName: sc.req.Model, LoraName: sc.req.LoraName, BlockSize: sc.req.BlockSize}
	q.Tokens = sc.req.Tokens
	q.CacheSalt = sc.req.CacheSalt
	q.InstanceFilter = sc.req.InstanceID
	if serr := h.svc.Query(q, &sc.res); serr != nil {
		h.serviceError(ctx, serr)
		return 0
	}
	h.writeQueryResult(ctx, sc, &sc.res)
	e.fill(sc.req.Model, int64(len(sc.req.Tokens)), sc.res.BlocksHashed(), &sc.res)
	// Drop references into the request body before the scratch goes back to the pool.
	sc.query = engine.Query{}
	sc.req.Model, sc.req.LoraName, sc.req.TenantID, sc.req.InstanceID, sc.req.CacheSalt = "", "", "", "", ""
	return sc.res.BlocksHashed()
}

func (h *HTTPServer) register(ctx *fasthttp.RequestCtx) {
	if !h.checkPost(ctx) {
		return
	}
	req, rerr := wire.DecodeRegisterRequest(ctx.PostBody())
	if rerr != nil {
		h.requestError(ctx, rerr)
		return
	}
	r := Registration{
		Endpoint: req.Endpoint, ReplayEndpoint: req.ReplayEndpoint, Type: req.Type, ModelName: req.ModelName,
		LoraName: req.LoraName, TenantID: req.TenantID, InstanceID: req.InstanceID, BlockSize: req.BlockSize,
		DPRank: int64(req.DPRank), CacheGroup: req.CacheGroup,
		Strategy: req.HashProfile.Strategy, Algorithm: req.HashProfile.Algorithm,
		PythonHashSeed: req.HashProfile.PythonHashSeed, IndexProjection: req.HashProfile.IndexProjection,
	}
	cfg, _, serr := h.svc.RegisterInput(&r)
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, wire.AppendStatusRegistered(nil, cfg.InstanceID))
}

func (h *HTTPServer) unregister(ctx *fasthttp.RequestCtx) {
	if !h.checkPost(ctx) {
		return
	}
	req, rerr := wire.DecodeUnregisterRequest(ctx.PostBody())
	if rerr != nil {
		h.requestError(ctx, rerr)
		return
	}
	key, serr := h.svc.Unregister(req.InstanceID, req.TenantID, req.DPRank)
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, wire.AppendStatusUnregistered(nil, key))
}

func (h *HTTPServer) globalView(ctx *fasthttp.RequestCtx) {
	views, serr := h.svc.GlobalView()
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, appendGlobalView(nil, views))
}

func (h *HTTPServer) services(ctx *fasthttp.RequestCtx) {
	if h.svc.Stopping() {
		h.serviceError(ctx, errStopping)
		return
	}
	h.writeMsgpack(ctx, appendServices(nil, h.svc.Services()))
}
