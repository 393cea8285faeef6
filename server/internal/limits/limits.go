// Package limits holds what the two transports (server/httpserver, server/rpcserver)
// share to bound what clients can make the process hold: the limit settings (Config),
// the counters of what they turned away (Counters), the in-flight request-body budget
// both draw from (Budget), and the listener that survives temporary accept failures
// (RetryListener).
package limits

import (
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/service"
)

// Config bounds what clients can make the process hold. Each field is a config-file key
// (docs/configuration.md); a zero field takes the default below.
type Config struct {
	// MaxQueryBodyBytes bounds a /query body (max_query_body_bytes, default 64 MiB, room
	// for a prompt of 16M tokens as int32). A larger declared body is answered 413
	// before any of it is read; a chunked one when it passes the bound.
	MaxQueryBodyBytes int
	// MaxAdminBodyBytes bounds /register and /unregister bodies (max_admin_body_bytes,
	// default 1 MiB).
	MaxAdminBodyBytes int
	// MaxInflightBodyBytes bounds the request-body bytes held at once by all HTTP and
	// RPC requests together (max_inflight_body_bytes, default 256 MiB); a query body
	// counts with what it decodes to: 5 times its size over HTTP (an array of one-byte
	// ids decodes to 4 bytes per byte), 9 times for /query_by_hash (8-byte keys), twice
	// over RPC (fixed 4-byte ids). An HTTP body that does not fit is
	// answered 503 with Retry-After before it is read; an RPC frame is left unread until
	// it fits or its read deadline passes. Bodies above SmallBodyBytes may only use 7/8
	// of it, so big bodies never starve small queries.
	MaxInflightBodyBytes int64
	// HTTPMaxConnections bounds the HTTP connections served at once
	// (http_max_connections, default 4096); beyond it fasthttp answers 503 and closes.
	HTTPMaxConnections int
	// HTTPReadBufferBytes is each HTTP connection's read buffer (http_read_buffer_bytes,
	// default 4 KiB, fasthttp's, and at least that; at most 16 MiB in the config file; it
	// also bounds a request's header: a larger one is answered 431).
	// Each open connection holds one. A larger buffer reads a request whose header and
	// body fit in one system call instead of three for a 32 KiB body, but the body is
	// then copied out of the buffer once more (a body larger than the buffer is read
	// straight into the request's): measured on 8K binary-token /query bodies sent in one
	// write, 64 KiB cost 7% more server CPU than 4 KiB.
	HTTPReadBufferBytes int
	// HTTPWriteBufferBytes is each HTTP connection's write buffer (http_write_buffer_bytes,
	// default 4 KiB, fasthttp's, and at least that; at most 16 MiB in the config file),
	// held by an open connection once it has answered. A response larger than it leaves
	// in two writes (the buffer's worth, then the rest), and the client is woken for
	// each; /query answers pass 4 KiB at 25-30 instances of one DP rank, 7-9 of eight.
	// Measured with 64 instances (8 KB answers), 16 KiB took 2-4% off the server CPU of
	// an 8K query.
	HTTPWriteBufferBytes int
	// HTTPReadTimeout bounds reading one request, headers and body
	// (http_read_timeout_ms, default 30 s); HTTPIdleTimeout closes a keep-alive
	// connection idle that long (http_idle_timeout_ms, default 60 s).
	HTTPReadTimeout time.Duration
	HTTPIdleTimeout time.Duration
	// RPCMaxConnections bounds the RPC connections open at once (rpc_max_connections,
	// default 1024); more are closed at accept.
	RPCMaxConnections int
	// RPCReadTimeout bounds reading one frame once its first byte arrived
	// (rpc_read_timeout_ms, default 30 s); RPCIdleTimeout closes a connection with no
	// frame started for that long (rpc_idle_timeout_ms, default 300 s).
	RPCReadTimeout time.Duration
	RPCIdleTimeout time.Duration
	// MaxServices caps the registered services, static ones included (max_services,
	// default 1024; each costs file descriptors and threads).
	MaxServices int
	// MaxFieldBytes bounds each string field of a registration received over HTTP or RPC
	// (max_registration_field_bytes, default 1024).
	MaxFieldBytes int
	// ShutdownTimeout bounds the wait for in-flight requests at shutdown
	// (shutdown_timeout_ms, default 5 s); connections still open then are closed.
	ShutdownTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultMaxQueryBodyBytes    = 64 << 20
	DefaultMaxAdminBodyBytes    = 1 << 20
	DefaultMaxInflightBodyBytes = 256 << 20
	DefaultHTTPMaxConnections   = 4096
	DefaultHTTPReadBufferBytes  = 4 << 10
	MinHTTPReadBufferBytes      = 4 << 10
	MaxHTTPReadBufferBytes      = 16 << 20
	DefaultHTTPWriteBufferBytes = 4 << 10
	MinHTTPWriteBufferBytes     = 4 << 10
	MaxHTTPWriteBufferBytes     = 16 << 20
	DefaultHTTPReadTimeout      = 30 * time.Second
	DefaultHTTPIdleTimeout      = 60 * time.Second
	DefaultRPCMaxConnections    = 1024
	DefaultRPCReadTimeout       = 30 * time.Second
	DefaultRPCIdleTimeout       = 300 * time.Second
	DefaultMaxServices          = service.DefaultMaxServices
	DefaultMaxFieldBytes        = service.DefaultMaxFieldBytes
	DefaultShutdownTimeout      = 5 * time.Second
	// SmallBodyBytes: bodies up to this size are "small" for the in-flight budget, and
	// pooled body buffers larger than this are dropped after use instead of kept.
	SmallBodyBytes = 1 << 20
)

// WithDefaults returns l with every zero field set to its default.
func (l Config) WithDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxQueryBodyBytes, DefaultMaxQueryBodyBytes)
	def(&l.MaxAdminBodyBytes, DefaultMaxAdminBodyBytes)
	if l.MaxInflightBodyBytes <= 0 {
		l.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	def(&l.HTTPMaxConnections, DefaultHTTPMaxConnections)
	def(&l.HTTPReadBufferBytes, DefaultHTTPReadBufferBytes)
	l.HTTPReadBufferBytes = max(l.HTTPReadBufferBytes, MinHTTPReadBufferBytes)
	def(&l.HTTPWriteBufferBytes, DefaultHTTPWriteBufferBytes)
	l.HTTPWriteBufferBytes = max(l.HTTPWriteBufferBytes, MinHTTPWriteBufferBytes)
	defD(&l.HTTPReadTimeout, DefaultHTTPReadTimeout)
	defD(&l.HTTPIdleTimeout, DefaultHTTPIdleTimeout)
	def(&l.RPCMaxConnections, DefaultRPCMaxConnections)
	defD(&l.RPCReadTimeout, DefaultRPCReadTimeout)
	defD(&l.RPCIdleTimeout, DefaultRPCIdleTimeout)
	def(&l.MaxServices, DefaultMaxServices)
	def(&l.MaxFieldBytes, DefaultMaxFieldBytes)
	defD(&l.ShutdownTimeout, DefaultShutdownTimeout)
	return l
}

// Counters count what the limits turned away; /metrics exports them. The zero value is
// ready; a nil *Counters is not (servers always get one).
type Counters struct {
	AcceptErrors    atomic.Uint64 // temporary accept failures retried (both listeners)
	BodyTooLarge    atomic.Uint64 // HTTP 413
	BodyBudgetFull  atomic.Uint64 // HTTP 503: in-flight body budget exhausted
	InflightBody    atomic.Int64  // HTTP body bytes held now
	LargeBodies     atomic.Uint64 // HTTP bodies above SmallBodyBytes served (memory release trigger: LargeBody)
	Unauthorized    atomic.Uint64 // HTTP 401 on admin routes
	RPCConnsRefused atomic.Uint64 // RPC connections closed at accept (cap reached)
	RPCConns        atomic.Int64  // RPC connections open now
	RPCTimeouts     atomic.Uint64 // RPC connections closed by the idle or read deadline
	// OnLargeBody, when set before the servers start, is called by LargeBody (the App
	// asks for a memory release then, instead of looking on a ticker).
	OnLargeBody func()
}

// LargeBody counts an HTTP body above SmallBodyBytes served and calls OnLargeBody.
func (c *Counters) LargeBody() {
	c.LargeBodies.Add(1)
	if c.OnLargeBody != nil {
		c.OnLargeBody()
	}
}

// Budget is the in-flight request-body byte budget, shared by HTTP and RPC; lock-free.
type Budget struct {
	limit    int64
	counters *Counters
}

// Defaults returns counters and budget, or new private ones where they are nil (a budget
// of limit bytes held in the counters): what a transport uses when its owner shares none.
func Defaults(counters *Counters, budget *Budget, limit int64) (*Counters, *Budget) {
	if counters == nil {
		counters = &Counters{}
	}
	if budget == nil {
		budget = NewBudget(limit, counters)
	}
	return counters, budget
}

// NewBudget returns a budget of limit bytes, held in counters.InflightBody.
func NewBudget(limit int64, counters *Counters) *Budget {
	return &Budget{limit: limit, counters: counters}
}

// Acquire reserves n bytes and returns what it reserved (pass that to Release). A large
// body may not take the last eighth of the budget; a body larger than that takes all of
// that part (so a configuration with a small budget still serves it, alone).
func (b *Budget) Acquire(n int64) (held int64, ok bool) {
	lim := b.limit
	if n > SmallBodyBytes {
		lim -= b.limit / 8
		n = min(n, lim)
	}
	for {
		cur := b.counters.InflightBody.Load()
		if cur+n > lim {
			return 0, false
		}
		if b.counters.InflightBody.CompareAndSwap(cur, cur+n) {
			return n, true
		}
	}
}

// AcquireBy waits for n bytes until the deadline or until done is closed (backing off
// from 1 ms to 20 ms): a connection whose frame does not fit is simply not read
// meanwhile, so TCP flow control holds its sender.
func (b *Budget) AcquireBy(n int64, deadline time.Time, done <-chan struct{}) (held int64, ok bool) {
	wait := time.Millisecond
	for {
		if held, ok := b.Acquire(n); ok {
			return held, true
		}
		if time.Now().Add(wait).After(deadline) {
			return 0, false
		}
		t := time.NewTimer(wait)
		select {
		case <-done:
			t.Stop()
			return 0, false
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}

// Release returns what Acquire or AcquireBy reserved.
func (b *Budget) Release(n int64) { b.counters.InflightBody.Add(-n) }
