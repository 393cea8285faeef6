package server

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/wire/httpapi"
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
	bufs    sync.Pool // *[]byte request bodies up to SmallBodyBytes

	limits   Limits
	counters *Counters
	budget   bodyBudget
	// adminAuth is "Bearer <admin_token>", or nil when no token is configured.
	adminAuth []byte

	connMu sync.Mutex
	conns  map[net.Conn]struct{}

	// lnMu guards ln (the listener Serve runs on) and shut (Shutdown was called).
	lnMu sync.Mutex
	ln   net.Listener
	shut bool

	// poisonReleased (tests only) zeroes a body buffer as it goes back to the pool, so
	// that a use after release shows up as wrong bytes instead of a rare race.
	poisonReleased bool
}

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
	// Limits bound bodies, connections and timeouts (zero fields take the defaults).
	Limits Limits
	// Counters receives the limit counters (nil: private ones).
	Counters *Counters
	// AdminToken, when set, is required as "Authorization: Bearer <token>" on the routes
	// that change state (/register, /unregister).
	AdminToken string
}

// NewHTTPServer builds the HTTP server; call Serve with a listener.
func NewHTTPServer(opts HTTPOptions) *HTTPServer {
	h := &HTTPServer{svc: opts.Service, metrics: opts.Metrics, log: opts.Logger, extra: opts.Extra, access: opts.AccessLog}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.limits = opts.Limits.WithDefaults()
	h.counters = opts.Counters
	if h.counters == nil {
		h.counters = &Counters{}
	}
	h.budget = bodyBudget{limit: h.limits.MaxInflightBodyBytes, counters: h.counters}
	if opts.AdminToken != "" {
		h.adminAuth = []byte("Bearer " + opts.AdminToken)
	}
	h.pool.New = func() any { return &queryScratch{} }
	h.srv = &fasthttp.Server{
		Handler:               h.handle,
		Name:                  "mooncake_conductor",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		// Bodies are streamed so that the handler checks size, content type and the
		// in-flight budget before reading them (see readBody); multipart is never
		// parsed (fasthttp would otherwise spill it to temporary files).
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           h.limits.MaxQueryBodyBytes,
		Concurrency:                  h.limits.HTTPMaxConnections,
		ReadBufferSize:               h.limits.HTTPReadBufferBytes,
		ReadTimeout:                  h.limits.HTTPReadTimeout,
		WriteTimeout:                 h.limits.HTTPReadTimeout,
		IdleTimeout:                  h.limits.HTTPIdleTimeout,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{h.log},
		ConnState:                    h.trackConn,
	}
	h.conns = make(map[net.Conn]struct{})
	return h
}

// trackConn keeps the set of open connections, so that a shutdown that timed out can
// close those still reading a request.
func (h *HTTPServer) trackConn(c net.Conn, st fasthttp.ConnState) {
	h.connMu.Lock()
	switch st {
	case fasthttp.StateNew:
		h.conns[c] = struct{}{}
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(h.conns, c)
	}
	h.connMu.Unlock()
}

// fasthttpLogger routes fasthttp's own messages (rare: connection-level errors) to slog
// at debug level: each is also a counted client error, and they can come in floods.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
	}
}

// Serve accepts connections on ln until Shutdown. Temporary accept failures (EMFILE...)
// are retried with back-off instead of ending it.
func (h *HTTPServer) Serve(ln net.Listener) error {
	if _, ok := ln.(*retryListener); !ok {
		ln = newRetryListener(ln, "http", h.log, h.counters)
	}
	ln = fastListener{ln} // see fastConn
	// fasthttp's Shutdown closes only the listeners Serve has registered so far: one
	// called just before Serve gets there would leave Serve accepting for ever. So
	// Shutdown also closes the listener it finds here, and Serve after Shutdown returns.
	h.lnMu.Lock()
	if h.shut {
		h.lnMu.Unlock()
		return ln.Close()
	}
	h.ln = ln
	h.lnMu.Unlock()
	return h.srv.Serve(ln)
}

// Shutdown stops accepting, closes idle connections and waits for in-flight requests
// for at most the shutdown timeout; connections still open then (a half-sent request)
// are closed.
func (h *HTTPServer) Shutdown() error {
	h.lnMu.Lock()
	h.shut = true
	ln := h.ln
	h.lnMu.Unlock()
	if ln != nil {
		_ = ln.Close() // see Serve; closing twice is harmless
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.limits.ShutdownTimeout)
	defer cancel()
	err := h.srv.ShutdownWithContext(ctx)
	if errors.Is(err, net.ErrClosed) {
		err = nil // we closed the listener first
	}
	if errors.Is(err, context.DeadlineExceeded) {
		h.connMu.Lock()
		n := len(h.conns)
		for c := range h.conns {
			c.Close()
		}
		h.connMu.Unlock()
		h.log.Warn("http shutdown timed out; open connections closed", "timeout", h.limits.ShutdownTimeout.String(), "connections", n)
		return nil
	}
	return err
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
		// The body goes back to its pool only after the access line is written: the
		// entry's model aliases it.
		blocks := 0
		var body *[]byte
		var held int64
		ok := h.method(ctx, fasthttp.MethodPost) && h.checkPost(ctx)
		if ok {
			body, held, ok = h.readBody(ctx, h.limits.MaxQueryBodyBytes, queryBodyWeight)
		}
		if ok {
			blocks = h.query(ctx, *body, &e)
		}
		h.metrics.observeHTTPQuery(start, ctx.Response.StatusCode(), blocks)
		h.logAccess(ctx, start, "/query", &e)
		if ok {
			h.releaseBody(body, held)
		}
		return
	case "/query_by_hash":
		var body *[]byte
		var held int64
		ok := h.method(ctx, fasthttp.MethodPost) && h.checkPost(ctx)
		if ok {
			body, held, ok = h.readBody(ctx, h.limits.MaxQueryBodyBytes, queryByHashBodyWeight)
		}
		if ok {
			h.queryByHash(ctx, *body, &e)
		}
		h.metrics.observeHTTPQueryByHash(start, ctx.Response.StatusCode())
		h.logAccess(ctx, start, "/query_by_hash", &e)
		if ok {
			h.releaseBody(body, held)
		}
		return
	case "/register":
		route = "/register"
		if h.method(ctx, fasthttp.MethodPost) && h.authorized(ctx) && h.checkPost(ctx) {
			if body, held, ok := h.readBody(ctx, h.limits.MaxAdminBodyBytes, 1); ok {
				h.register(ctx, *body)
				h.releaseBody(body, held)
			}
		}
	case "/unregister":
		route = "/unregister"
		if h.method(ctx, fasthttp.MethodPost) && h.authorized(ctx) && h.checkPost(ctx) {
			if body, held, ok := h.readBody(ctx, h.limits.MaxAdminBodyBytes, 1); ok {
				h.unregister(ctx, *body)
				h.releaseBody(body, held)
			}
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
		h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Not found"))
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
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Method not allowed"))
	return false
}

var msgpackContentType = []byte("application/msgpack")

func (h *HTTPServer) writeMsgpack(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.Response.Header.SetContentTypeBytes(msgpackContentType)
	ctx.SetBody(body)
}

// checkPost validates the request's content type and the service state, before the
// body is read. A rejected request's body is never read: the connection is closed.
func (h *HTTPServer) checkPost(ctx *fasthttp.RequestCtx) bool {
	if !httpapi.IsMsgpackContentType(ctx.Request.Header.ContentType()) {
		ctx.SetConnectionClose()
		h.requestError(ctx, &httpapi.RequestError{Msg: "Content-Type must be application/msgpack",
			Reason: "unsupported_content_type", Index: -1})
		return false
	}
	if h.svc.Stopping() {
		ctx.SetConnectionClose()
		h.serviceError(ctx, errStopping)
		return false
	}
	return true
}

// authorized checks the admin token on a state-changing route (always true when none
// is configured). The comparison takes constant time.
func (h *HTTPServer) authorized(ctx *fasthttp.RequestCtx) bool {
	if h.adminAuth == nil {
		return true
	}
	if subtle.ConstantTimeCompare(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization), h.adminAuth) == 1 {
		return true
	}
	h.counters.Unauthorized.Add(1)
	ctx.SetConnectionClose()
	ctx.SetStatusCode(fasthttp.StatusUnauthorized)
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="conductor"`)
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Unauthorized: this route requires Authorization: Bearer <admin_token>"))
	return false
}

// queryBodyWeight and queryByHashBodyWeight: a query body is held while it is served as
// its bytes and as what is decoded from them, and a positive fixint element takes one
// byte but decodes to a 4-byte token or an 8-byte block key. So a body counts 1+4 (/query)
// or 1+8 (/query_by_hash) times its size against the in-flight budget: an array of
// small ids must not hold four or eight times what it was charged.
const (
	queryBodyWeight       = 1 + 4
	queryByHashBodyWeight = 1 + 8
)

// errBodyTooLarge marks a chunked body that passed its bound while being read.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads the request body, at most max bytes, into a buffer of the server's
// own: a declared length above max is answered 413 before anything is read, and the
// bytes are reserved in the in-flight budget first (503 with Retry-After when they do
// not fit), so neither one huge body nor many big ones at once can grow the heap
// without bound. weight multiplies the size for the budget (see queryBodyWeight). held
// is the budget reserved; pass both to releaseBody.
func (h *HTTPServer) readBody(ctx *fasthttp.RequestCtx, max int, weight int64) (body *[]byte, held int64, ok bool) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		// Not streamed (in-memory handler tests): the body is already here.
		b := ctx.PostBody()
		if len(b) > max {
			h.tooLarge(ctx, max)
			return nil, 0, false
		}
		p := h.getBuf(0)
		*p = append(*p, b...)
		return p, 0, true
	}
	cl := ctx.Request.Header.ContentLength()
	if cl > max {
		h.tooLarge(ctx, max)
		return nil, 0, false
	}
	size := int64(cl)
	if cl < 0 { // chunked: reserve the bound
		size = int64(max)
	}
	need, ok := h.budget.acquire(size * weight)
	if !ok {
		h.counters.BodyBudgetFull.Add(1)
		ctx.SetConnectionClose()
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Server busy: too many request bytes in flight (max_inflight_body_bytes); retry"))
		return nil, 0, false
	}
	var err error
	if cl >= 0 {
		body = h.getBuf(cl)
		_, err = io.ReadFull(stream, *body)
	} else {
		body = h.getBuf(0)
		*body, err = readChunked(stream, *body, max)
	}
	if err != nil {
		h.releaseBody(body, need)
		ctx.SetConnectionClose()
		if errors.Is(err, errBodyTooLarge) {
			h.tooLarge(ctx, max)
		} else {
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "cannot read request body: "+err.Error()))
		}
		return nil, 0, false
	}
	return body, need, true
}

// readChunked reads a body of unknown length, failing with errBodyTooLarge past max.
func readChunked(r io.Reader, buf []byte, max int) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			if len(buf) > max {
				return buf, errBodyTooLarge
			}
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > max {
			return buf, errBodyTooLarge
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func (h *HTTPServer) tooLarge(ctx *fasthttp.RequestCtx, max int) {
	h.counters.BodyTooLarge.Add(1)
	ctx.SetConnectionClose()
	ctx.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Request body too large: the limit for this route is "+strconv.Itoa(max)+" bytes"))
}

// getBuf returns a buffer of length n: pooled when small, allocated when large (and
// then dropped after use, so one big body does not pin its memory).
func (h *HTTPServer) getBuf(n int) *[]byte {
	if n <= SmallBodyBytes {
		if p, ok := h.bufs.Get().(*[]byte); ok {
			if cap(*p) >= n {
				*p = (*p)[:n]
				return p
			}
			*p = make([]byte, n, max(n, 4096))
			return p
		}
	}
	b := make([]byte, n, max(n, 4096))
	return &b
}

// releaseBody returns the budget and, when small enough, the buffer to the pool.
func (h *HTTPServer) releaseBody(body *[]byte, held int64) {
	if held > 0 {
		h.budget.release(held)
	}
	if body == nil {
		return
	}
	// Counted by the buffer's size, not by the budget held (a multiple of it, or the
	// whole bound for a chunked body): the memory release this triggers is a full
	// collection, worth it only for buffers too large for the pool.
	if cap(*body) > SmallBodyBytes {
		h.counters.LargeBodies.Add(1)
		return
	}
	if h.poisonReleased {
		clear((*body)[:cap(*body)])
	}
	*body = (*body)[:0]
	h.bufs.Put(body)
}

func (h *HTTPServer) requestError(ctx *fasthttp.RequestCtx, e *httpapi.RequestError) {
	ctx.SetStatusCode(fasthttp.StatusBadRequest)
	h.writeMsgpack(ctx, httpapi.AppendRequestError(nil, e))
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
			h.requestError(ctx, &httpapi.RequestError{Msg: e.Msg, Reason: e.Reason, Field: e.Field, Index: idx})
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
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, e.Msg))
}

// query answers /query and returns the number of blocks it hashed; e gets what the
// access log reports.
func (h *HTTPServer) query(ctx *fasthttp.RequestCtx, body []byte, e *accessEntry) int {
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
	if serr := h.svc.Query(q, &sc.res); serr != nil {
		h.serviceError(ctx, serr)
		return 0
	}
	h.writeQueryResult(ctx, sc, &sc.res)
	e.fill(sc.req.Model, int64(len(sc.req.Tokens)), sc.res.BlocksHashed(), &sc.res)
	// Drop references into the request body (and an outlier prompt's buffer) before the
	// scratch goes back to the pool.
	sc.query = engine.Query{}
	sc.req.Release(maxPooledTokens)
	return sc.res.BlocksHashed()
}

func (h *HTTPServer) register(ctx *fasthttp.RequestCtx, body []byte) {
	req, rerr := httpapi.DecodeRegisterRequest(body)
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
	h.writeMsgpack(ctx, httpapi.AppendStatusRegistered(nil, cfg.InstanceID))
}

func (h *HTTPServer) unregister(ctx *fasthttp.RequestCtx, body []byte) {
	req, rerr := httpapi.DecodeUnregisterRequest(body)
	if rerr != nil {
		h.requestError(ctx, rerr)
		return
	}
	key, serr := h.svc.Unregister(req.InstanceID, req.TenantID, req.DPRank)
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, httpapi.AppendStatusUnregistered(nil, key))
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
