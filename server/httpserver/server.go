// Package httpserver is the conductor's HTTP transport: the contract's msgpack routes
// (/query, /query_by_hash, /register, /unregister, /global_view, /services) over
// fasthttp. Each route only decodes (package wire/httpapi), calls the service layer
// (package service) and encodes; the limits it enforces (body sizes, the in-flight body
// budget shared with RPC, connections, timeouts, the admin token) are its own.
package httpserver

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// Server serves the contract's msgpack routes over fasthttp.
type Server struct {
	svc     *service.Service
	metrics Observer
	log     *slog.Logger
	srv     *fasthttp.Server
	extra   map[string]fasthttp.RequestHandler
	pool    sync.Pool // *queryScratch
	access  *accesslog.Log
	bufs    sync.Pool // *[]byte request bodies up to limits.SmallBodyBytes

	limits   limits.Config
	counters *limits.Counters
	budget   *limits.Budget
	// adminAuth is "Bearer <admin_token>", or nil when no token is configured.
	adminAuth []byte

	connMu sync.Mutex
	conns  map[net.Conn]struct{}

	// lnMu guards ln (the listener Serve runs on) and shut (Shutdown was called).
	lnMu sync.Mutex
	ln   net.Listener
	shut bool

	// pulse (Options.Pulse) hears of every query.
	pulse *pulse.Pulse

	// poisonReleased (Options.PoisonReleasedBodies) zeroes a body buffer as it goes back
	// to the pool.
	poisonReleased bool
}

// Observer records what the server serves (the server's metrics implement it). A nil
// Observer records nothing.
type Observer interface {
	// ObserveHTTPQuery records one /query: its latency, status and blocks hashed.
	ObserveHTTPQuery(start time.Time, status int, blocks int)
	// ObserveHTTPQueryByHash records one /query_by_hash: its latency and status.
	ObserveHTTPQueryByHash(start time.Time, status int)
	// ObserveHTTP counts a request to any other route ("other": an unknown path).
	ObserveHTTP(route string, status int)
}

// Options configures the HTTP server.
type Options struct {
	Service *service.Service
	Logger  *slog.Logger
	// Extra routes (e.g. /metrics, /healthz), served when no contract route matches.
	Extra map[string]fasthttp.RequestHandler
	// Metrics, when set, records queries and requests.
	Metrics Observer
	// AccessLog, when set, gets one line per contract route request.
	AccessLog *accesslog.Log
	// Limits bound bodies, connections and timeouts (zero fields take the defaults).
	Limits limits.Config
	// Counters receives the limit counters (nil: private ones).
	Counters *limits.Counters
	// Budget is the in-flight body budget, shared with the RPC server (nil: a private
	// one of Limits.MaxInflightBodyBytes, held in Counters).
	Budget *limits.Budget
	// AdminToken, when set, is required as "Authorization: Bearer <token>" on the routes
	// that change state (/register, /unregister).
	AdminToken string
	// Pulse, when set, is told of every /query and /query_by_hash (it keeps a timer
	// firing while queries arrive; see package internal/pulse).
	Pulse *pulse.Pulse
	// PoisonReleasedBodies, in tests, zeroes a body buffer as it goes back to its pool,
	// so that a use after release shows up as wrong bytes instead of a rare race.
	PoisonReleasedBodies bool
}

// New builds the HTTP server; call Serve with a listener.
func New(opts Options) *Server {
	h := &Server{svc: opts.Service, metrics: opts.Metrics, log: opts.Logger, extra: opts.Extra, access: opts.AccessLog,
		poisonReleased: opts.PoisonReleasedBodies, pulse: opts.Pulse}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.limits = opts.Limits.WithDefaults()
	h.counters, h.budget = limits.Defaults(opts.Counters, opts.Budget, h.limits.MaxInflightBodyBytes)
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
		WriteBufferSize:              h.limits.HTTPWriteBufferBytes,
		ReadTimeout:                  h.limits.HTTPReadTimeout,
		WriteTimeout:                 h.limits.HTTPReadTimeout,
		IdleTimeout:                  h.limits.HTTPIdleTimeout,
		// fasthttp's worker pool looks for idle workers to end this often, even in a
		// process that serves nothing (its default, 10 s, was the last periodic wake-up of
		// an idle conductor). An idle worker is one parked goroutine.
		MaxIdleWorkerDuration: idleWorkerDuration,
		CloseOnShutdown:       true,
		Logger:                fasthttpLogger{h.log},
		ConnState:             h.trackConn,
	}
	h.conns = make(map[net.Conn]struct{})
	return h
}

// idleWorkerDuration is how long fasthttp keeps a worker goroutine that serves no
// connection, and how often it looks for such workers.
const idleWorkerDuration = 2 * time.Minute

// trackConn keeps the set of open connections, so that a shutdown that timed out can
// close those still reading a request.
func (h *Server) trackConn(c net.Conn, st fasthttp.ConnState) {
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
func (h *Server) Serve(ln net.Listener) error {
	if _, ok := ln.(*limits.RetryListener); !ok {
		ln = limits.NewRetryListener(ln, "http", h.log, h.counters)
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
func (h *Server) Shutdown() error {
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

// FastListener wraps ln as the HTTP server wraps its own listener: on Linux each
// accepted TCP connection reads and writes with raw non-blocking socket calls (see
// fastConn). For servers that must pay exactly the conductor's connection costs, such
// as the benchmark's floor server (bench/floor).
func FastListener(ln net.Listener) net.Listener { return fastListener{ln} }

// Handler returns the request handler (for in-memory tests).
func (h *Server) Handler() fasthttp.RequestHandler { return h.handle }

func (h *Server) handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	route := ""
	start := time.Now()
	var e accesslog.Entry
	switch string(path) {
	case "/query":
		h.serveQuery(ctx, start, &e, false)
		return
	case "/query_by_hash":
		h.serveQuery(ctx, start, &e, true)
		return
	case "/register":
		route = "/register"
		h.serveAdmin(ctx, h.register)
	case "/unregister":
		route = "/unregister"
		h.serveAdmin(ctx, h.unregister)
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
	h.observe(route, ctx.Response.StatusCode())
	h.logAccess(ctx, start, route, &e)
}

// serveQuery serves /query, or /query_by_hash when byHash, and writes its access line.
// The body goes back to its pool only after the access line is written: the entry's
// model aliases it.
func (h *Server) serveQuery(ctx *fasthttp.RequestCtx, start time.Time, e *accesslog.Entry, byHash bool) {
	h.pulse.Beat()
	route, weight := "/query", int64(QueryBodyWeight)
	if byHash {
		route, weight = "/query_by_hash", QueryByHashBodyWeight
	}
	var body *[]byte
	var held int64
	ok := h.method(ctx, fasthttp.MethodPost) && h.checkPost(ctx)
	if ok {
		body, held, ok = h.readBody(ctx, h.limits.MaxQueryBodyBytes, weight)
	}
	switch {
	case byHash:
		if ok {
			h.queryByHash(ctx, *body, e)
		}
		h.observeQueryByHash(start, ctx.Response.StatusCode())
	default:
		blocks := 0
		if ok {
			blocks = h.query(ctx, *body, e)
		}
		h.observeQuery(start, ctx.Response.StatusCode(), blocks)
	}
	h.logAccess(ctx, start, route, e)
	if ok {
		h.releaseBody(body, held)
	}
}

// serveAdmin serves a registry change: a POST, authorized, whose body (read within the
// admin body limit) goes to serve.
func (h *Server) serveAdmin(ctx *fasthttp.RequestCtx, serve func(*fasthttp.RequestCtx, []byte)) {
	if h.method(ctx, fasthttp.MethodPost) && h.authorized(ctx) && h.checkPost(ctx) {
		if body, held, ok := h.readBody(ctx, h.limits.MaxAdminBodyBytes, 1); ok {
			serve(ctx, *body)
			h.releaseBody(body, held)
		}
	}
}

func (h *Server) method(ctx *fasthttp.RequestCtx, want string) bool {
	if string(ctx.Method()) == want {
		return true
	}
	ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
	ctx.Response.Header.Set("Allow", want)
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Method not allowed"))
	return false
}

var msgpackContentType = []byte("application/msgpack")

func (h *Server) writeMsgpack(ctx *fasthttp.RequestCtx, body []byte) {
	ctx.Response.Header.SetContentTypeBytes(msgpackContentType)
	ctx.SetBody(body)
}

// checkPost validates the request's content type and the service state, before the
// body is read. A rejected request's body is never read: the connection is closed.
func (h *Server) checkPost(ctx *fasthttp.RequestCtx) bool {
	if !httpapi.IsMsgpackContentType(ctx.Request.Header.ContentType()) {
		ctx.SetConnectionClose()
		h.requestError(ctx, &httpapi.RequestError{Msg: "Content-Type must be application/msgpack",
			Reason: "unsupported_content_type", Index: -1})
		return false
	}
	if h.svc.Stopping() {
		ctx.SetConnectionClose()
		h.serviceError(ctx, service.StoppingError())
		return false
	}
	return true
}

// authorized checks the admin token on a state-changing route (always true when none
// is configured). The comparison takes constant time.
func (h *Server) authorized(ctx *fasthttp.RequestCtx) bool {
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

func (h *Server) observeQuery(start time.Time, status, blocks int) {
	if h.metrics != nil {
		h.metrics.ObserveHTTPQuery(start, status, blocks)
	}
}

func (h *Server) observeQueryByHash(start time.Time, status int) {
	if h.metrics != nil {
		h.metrics.ObserveHTTPQueryByHash(start, status)
	}
}

func (h *Server) observe(route string, status int) {
	if h.metrics != nil {
		h.metrics.ObserveHTTP(route, status)
	}
}

// logAccess writes the access line of a contract route request when the log is on.
func (h *Server) logAccess(ctx *fasthttp.RequestCtx, start time.Time, route string, e *accesslog.Entry) {
	if h.access == nil {
		return
	}
	e.Route = route
	h.access.HTTP(start, e, ctx.Response.StatusCode(), ctx.Request.Header.Peek(h.access.TraceHeader()))
}
