// Package rpcserver is the conductor's RPC transport: the coro_rpc / struct_pack wire of
// the upstream Python client over TCP (Query, Register, Unregister, GetGlobalView,
// ListServices). Each call only decodes (package wire/cororpc), calls the service layer
// (package service) and encodes; its limits (connections, frame and idle deadlines, the
// in-flight body budget shared with HTTP) are its own.
package rpcserver

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/accesslog"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// Server serves the coro_rpc/struct_pack wire of the upstream Python client over TCP.
type Server struct {
	svc     *service.Service
	metrics Observer
	log     *slog.Logger
	maxBody int
	access  *accesslog.Log

	limits   limits.Config
	counters *limits.Counters
	// clientLog carries the lines that clients cause (bad frames and bodies, rejected
	// registrations), rate-limited per kind (RPCOptions.ClientLogLimit), then a count.
	clientLog *slog.Logger
	budget    *limits.Budget
	// refuseMutations: Register and Unregister answer CONDUCTOR_UNAVAILABLE (the RPC wire
	// carries no token; see Options.RefuseMutations).
	refuseMutations bool
	// pulse (Options.Pulse) hears of every Query call.
	pulse *pulse.Pulse

	// done is closed by Close: frames waiting for the body budget give up.
	done chan struct{}

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Observer records what the server serves (the server's metrics implement it). A nil
// Observer records nothing.
type Observer interface {
	// ObserveRPCQuery records one Query call: its latency, outcome and blocks hashed.
	ObserveRPCQuery(start time.Time, ok bool, blocks int)
	// ObserveRPC counts one call of another function by its result code.
	ObserveRPC(function, code string)
}

// Options configures the RPC listener.
type Options struct {
	Service *service.Service
	Logger  *slog.Logger
	// MaxBody bounds one request body (0: cororpc.DefaultMaxBody).
	MaxBody int
	// Metrics, when set, records queries and requests.
	Metrics Observer
	// AccessLog, when set, gets one line per Query call.
	AccessLog *accesslog.Log
	// Limits: connection cap, read and idle deadlines (zero fields take the defaults).
	Limits limits.Config
	// Counters receives the limit counters (nil: private ones).
	Counters *limits.Counters
	// Budget is the in-flight body budget, shared with the HTTP server (nil: a private
	// one of Limits.MaxInflightBodyBytes, held in Counters).
	Budget *limits.Budget
	// ClientLogLimit limits the log lines clients cause, per kind (zero: 20 per second).
	ClientLogLimit lograte.Config
	// RefuseMutations makes Register and Unregister answer CONDUCTOR_UNAVAILABLE without
	// changing anything: the coro_rpc wire has no field for a token, so a server whose
	// HTTP routes need the admin token refuses RPC changes unless told otherwise.
	RefuseMutations bool
	// Pulse, when set, is told of every Query call (it keeps a timer firing while
	// queries arrive; see package internal/pulse).
	Pulse *pulse.Pulse
}

// New builds the RPC listener; call Serve with a listener.
func New(opts Options) *Server {
	s := &Server{svc: opts.Service, metrics: opts.Metrics, log: opts.Logger, maxBody: opts.MaxBody, conns: make(map[net.Conn]struct{}),
		access: opts.AccessLog, refuseMutations: opts.RefuseMutations, pulse: opts.Pulse}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.maxBody <= 0 {
		s.maxBody = cororpc.DefaultMaxBody
	}
	s.limits = opts.Limits.WithDefaults()
	clientLimit := opts.ClientLogLimit
	if clientLimit.Burst == 0 && clientLimit.Interval == 0 {
		clientLimit.Burst, clientLimit.Interval = 20, time.Second
	}
	s.clientLog = lograte.New(s.log.Handler(), clientLimit).Logger()
	s.counters, s.budget = limits.Defaults(opts.Counters, opts.Budget, s.limits.MaxInflightBodyBytes)
	s.done = make(chan struct{})
	return s
}

// Serve accepts connections until Close. Each connection is served by its own goroutine.
// Temporary accept failures (EMFILE...) are retried with back-off; connections beyond
// the cap are closed at once.
func (s *Server) Serve(ln net.Listener) {
	if _, ok := ln.(*limits.RetryListener); !ok {
		ln = limits.NewRetryListener(ln, "rpc", s.log, s.counters)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			s.log.Error("rpc accept failed; listener stopped", "err", err)
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.conns) >= s.limits.RPCMaxConnections {
			s.mu.Unlock()
			refused := s.counters.RPCConnsRefused.Add(1)
			c.Close()
			if refused%1000 == 1 {
				s.log.Warn("rpc connection refused: rpc_max_connections reached", "max", s.limits.RPCMaxConnections,
					"refused_total", s.counters.RPCConnsRefused.Load())
			}
			continue
		}
		s.counters.RPCConns.Add(1)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Close stops accepting, closes every connection and waits for their goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.done)
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// rpcConn is one connection's reusable state: a query allocates nothing once warm.
type rpcConn struct {
	s      *Server
	c      net.Conn
	r      *bufio.Reader
	w      *bufio.Writer
	in     []byte
	out    []byte
	qreq   cororpc.QueryRequest
	q      engine.Query
	res    engine.Result
	rpcRes cororpc.QueryResult
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.counters.RPCConns.Add(-1)
		s.wg.Done()
	}()
	rc := &rpcConn{s: s, c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}
	for rc.serveFrame() {
	}
}

// serveFrame reads and answers one request frame; false means the connection is done.
func (rc *rpcConn) serveFrame() bool {
	s, c := rc.s, rc.c
	// Idle deadline until the next frame starts, then the read deadline for the whole
	// frame: neither an idle peer nor a half-sent frame holds the connection (and the
	// buffer it grew) for longer.
	if rc.r.Buffered() == 0 {
		_ = c.SetReadDeadline(time.Now().Add(s.limits.RPCIdleTimeout))
		if _, err := rc.r.Peek(1); err != nil {
			if isTimeout(err) {
				s.counters.RPCTimeouts.Add(1)
			}
			rc.closingFlush()
			return false
		}
	}
	deadline := time.Now().Add(s.limits.RPCReadTimeout)
	_ = c.SetReadDeadline(deadline)
	// The body's bytes (twice: raw and decoded) come out of the in-flight budget shared
	// with HTTP before it is read; while they do not fit the connection is not read.
	if hb, err := rc.r.Peek(cororpc.RequestHeaderSize); err == nil {
		if total := int64(binary.LittleEndian.Uint32(hb[12:])) + int64(binary.LittleEndian.Uint32(hb[16:])); total > 0 && total <= int64(s.maxBody) {
			held, ok := s.budget.AcquireBy(2*total, deadline, s.done)
			if !ok {
				s.counters.RPCTimeouts.Add(1)
				rc.closingFlush()
				return false
			}
			defer s.budget.Release(held)
		}
	}
	hdr, body, err := cororpc.ReadRequest(rc.r, rc.in[:0], s.maxBody)
	if body != nil && cap(body) > cap(rc.in) {
		rc.in = body[:0]
	}
	if err != nil && isTimeout(err) {
		s.counters.RPCTimeouts.Add(1)
		s.log.Debug("rpc connection closed: frame not received within rpc_read_timeout", "remote", c.RemoteAddr().String())
		rc.closingFlush()
		return false
	}
	if err != nil {
		if errors.Is(err, cororpc.ErrSerializeType) {
			rc.out = cororpc.AppendFrameworkError(rc.out[:0], hdr.SeqNum, cororpc.ErrcInvalidArguments, "unsupported serialize_type")
			return rc.flush() == nil
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			s.clientLog.Warn("rpc connection closed: bad frame", "remote", c.RemoteAddr().String(), "err", err)
		}
		// Answers to the good requests pipelined before the bad frame are still owed.
		rc.closingFlush()
		return false
	}
	if err := rc.dispatch(hdr, body); err != nil {
		s.clientLog.Warn("rpc connection closed: bad request body", "remote", c.RemoteAddr().String(),
			"function", cororpc.FunctionName(hdr.FunctionID), "err", err)
		rc.out = cororpc.AppendFrameworkError(rc.out[:0], hdr.SeqNum, cororpc.ErrcInvalidArguments, err.Error())
		if _, err := rc.w.Write(rc.out); err == nil {
			rc.closingFlush()
		}
		return false
	}
	if rc.flush() != nil {
		return false
	}
	// Give large buffers back: an outlier request must not pin its size for the life of
	// the connection.
	if cap(rc.in) > rpcKeptBufferBytes {
		rc.in = nil
	}
	if cap(rc.out) > rpcKeptBufferBytes {
		rc.out = nil
	}
	return true
}

// rpcKeptBufferBytes bounds each buffer (frame in, frame out, decoded tokens) an RPC
// connection keeps between frames. An idle connection lives for rpc_idle_timeout_ms, so
// what it keeps, times rpc_max_connections, is memory an outsider can hold with no
// request in flight: 3 x 64 KiB (plus bufio's 2 x 64 KiB) x 1024 connections is about
// 320 MiB at the defaults. 64 KiB holds a 16K-token query, so ordinary prompts still
// reuse their buffers and allocate nothing.
const rpcKeptBufferBytes = 64 << 10

// maxConnTokens is the largest token buffer an RPC connection keeps between frames.
const maxConnTokens = rpcKeptBufferBytes / 4

// isTimeout reports a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (rc *rpcConn) flush() error {
	if _, err := rc.w.Write(rc.out); err != nil {
		return err
	}
	if rc.nextFrameBuffered() {
		// The next pipelined request is already here whole: answer it before flushing, so
		// a burst of requests costs one write.
		return nil
	}
	return rc.w.Flush()
}

// closingFlushTimeout bounds the last write to a connection being dropped, so a peer that
// stopped reading cannot hold its goroutine.
const closingFlushTimeout = 2 * time.Second

// closingFlush sends what is still buffered before the connection is closed.
func (rc *rpcConn) closingFlush() {
	_ = rc.c.SetWriteDeadline(time.Now().Add(closingFlushTimeout))
	_ = rc.w.Flush()
}

// nextFrameBuffered reports whether a complete request frame is waiting in the read
// buffer. Only then may a response wait for the next one: with part of a frame buffered
// the server would block reading the rest while holding answers the client may be
// waiting for before it sends that rest.
func (rc *rpcConn) nextFrameBuffered() bool {
	n := rc.r.Buffered()
	if n < cororpc.RequestHeaderSize {
		return false
	}
	hb, err := rc.r.Peek(cororpc.RequestHeaderSize)
	if err != nil {
		return false
	}
	length := uint64(binary.LittleEndian.Uint32(hb[12:])) + uint64(binary.LittleEndian.Uint32(hb[16:]))
	return uint64(n) >= uint64(cororpc.RequestHeaderSize)+length
}

// Dispatcher answers request frames without a connection, with the reusable state of
// one (in-memory tests and benchmarks of the dispatch path).
type Dispatcher struct{ rc rpcConn }

// Dispatcher returns a Dispatcher of s.
func (s *Server) Dispatcher() *Dispatcher { return &Dispatcher{rc: rpcConn{s: s}} }

// Dispatch decodes one request frame's body, calls the service and returns the response
// frame (valid until the next call). An error means the body was malformed (a
// connection would be closed).
func (d *Dispatcher) Dispatch(hdr cororpc.RequestHeader, body []byte) ([]byte, error) {
	if err := d.rc.dispatch(hdr, body); err != nil {
		return nil, err
	}
	return d.rc.out, nil
}
