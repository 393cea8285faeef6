package server

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
	"github.com/conductor-go/conductor/hashing"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// RPCServer serves the coro_rpc/struct_pack wire of the upstream Python client over TCP.
type RPCServer struct {
	svc     *Service
	metrics *Metrics
	log     *slog.Logger
	maxBody int
	access  *AccessLog

	limits   Limits
	counters *Counters
	// clientLog carries the lines that clients cause (bad frames and bodies, rejected
	// registrations), rate-limited per kind (RPCOptions.ClientLogLimit), then a count.
	clientLog *slog.Logger
	budget    bodyBudget

	// done is closed by Close: frames waiting for the body budget give up.
	done chan struct{}

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// RPCOptions configures the RPC listener.
type RPCOptions struct {
	Service *Service
	Logger  *slog.Logger
	// MaxBody bounds one request body (0: cororpc.DefaultMaxBody).
	MaxBody int
	// Metrics, when set, records queries and requests.
	Metrics *Metrics
	// AccessLog, when set, gets one line per Query call.
	AccessLog *AccessLog
	// Limits: connection cap, read and idle deadlines (zero fields take the defaults).
	Limits Limits
	// Counters receives the limit counters (nil: private ones).
	Counters *Counters
	// ClientLogLimit limits the log lines clients cause, per kind (zero: 20 per second).
	ClientLogLimit lograte.Config
}

// NewRPCServer builds the RPC listener; call Serve with a listener.
func NewRPCServer(opts RPCOptions) *RPCServer {
	s := &RPCServer{svc: opts.Service, metrics: opts.Metrics, log: opts.Logger, maxBody: opts.MaxBody, conns: make(map[net.Conn]struct{}), access: opts.AccessLog}
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
	s.counters = opts.Counters
	if s.counters == nil {
		s.counters = &Counters{}
	}
	s.budget = bodyBudget{limit: s.limits.MaxInflightBodyBytes, counters: s.counters}
	s.done = make(chan struct{})
	return s
}

// Serve accepts connections until Close. Each connection is served by its own goroutine.
// Temporary accept failures (EMFILE...) are retried with back-off; connections beyond
// the cap are closed at once.
func (s *RPCServer) Serve(ln net.Listener) {
	if _, ok := ln.(*retryListener); !ok {
		ln = newRetryListener(ln, "rpc", s.log, s.counters)
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
func (s *RPCServer) Close() {
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
	s      *RPCServer
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

func (s *RPCServer) serveConn(c net.Conn) {
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
			held, ok := s.budget.acquireBy(2*total, deadline, s.done)
			if !ok {
				s.counters.RPCTimeouts.Add(1)
				rc.closingFlush()
				return false
			}
			defer s.budget.release(held)
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

// rpcCode maps a service error to the wire's business error code.
func rpcCode(e *Error) cororpc.ErrorCode {
	switch e.Code {
	case CodeInvalidParams:
		return cororpc.CodeInvalidParams
	case CodeNotFound:
		return cororpc.CodeServiceNotFound
	case CodeUnavailable:
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
		rc.s.metrics.observeRPC("GetGlobalView", "OK")
	case cororpc.FuncListServices:
		if len(body) != 0 {
			return errors.New("ListServices takes no arguments")
		}
		out = cororpc.AppendServiceList(out, rpcServiceList(rc.s.svc.Services()))
		rc.s.metrics.observeRPC("ListServices", "OK")
	default:
		rc.s.metrics.observeRPC("unknown", "function_not_registered")
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

func (rc *rpcConn) query(out, body []byte) ([]byte, error) {
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
	serr := rc.s.svc.Query(q, &rc.res)
	*q = engine.Query{}
	tokens := len(rc.qreq.Tokens)
	if cap(rc.qreq.Tokens) > maxConnTokens {
		rc.qreq.Tokens = nil
	}
	rc.s.metrics.observeRPCQuery(start, serr == nil, rc.res.BlocksHashed())
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

func (rc *rpcConn) register(out, body []byte) ([]byte, error) {
	var c cororpc.ServiceConfig
	if err := cororpc.DecodeServiceConfig(body, &c); err != nil {
		return out, err
	}
	if !c.PublisherKind.Valid() {
		return cororpc.AppendRegisterError(out, cororpc.CodeInvalidParams), nil
	}
	r := Registration{
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
	cfg, isNew, serr := rc.s.svc.RegisterInput(&r)
	if serr != nil {
		rc.s.clientLog.Info("rpc register rejected", "instance", c.InstanceID, "err", serr)
		rc.s.metrics.observeRPC("Register", rpcCode(serr).String())
		return cororpc.AppendRegisterError(out, rpcCode(serr)), nil
	}
	rc.s.metrics.observeRPC("Register", "OK")
	return cororpc.AppendRegisterResult(out, cororpc.RegisterResult{InstanceID: cfg.InstanceID, IsNew: isNew}), nil
}

func (rc *rpcConn) unregister(out, body []byte) ([]byte, error) {
	id, tenant, rank, err := cororpc.DecodeUnregisterArgs(body)
	if err != nil {
		return out, err
	}
	key, serr := rc.s.svc.Unregister(id, tenant, int(rank))
	if serr != nil {
		rc.s.metrics.observeRPC("Unregister", rpcCode(serr).String())
		return cororpc.AppendUnregisterError(out, rpcCode(serr)), nil
	}
	rc.s.metrics.observeRPC("Unregister", "OK")
	return cororpc.AppendUnregisterResult(out, cororpc.UnregisterResult{RemovedKey: key}), nil
}

func rpcProfile(p *hashing.Profile) cororpc.HashProfile {
	return cororpc.HashProfile{Strategy: p.StrategyName(), Algorithm: p.AlgorithmName(), PythonHashSeed: p.Seed,
		RootDigest: p.RootHex(), IndexProjection: p.ProjectionName()}
}

func rpcServiceList(svcs []ServiceConfig) []cororpc.ServiceConfig {
	out := make([]cororpc.ServiceConfig, len(svcs))
	for i := range svcs {
		c := &svcs[i]
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

func rpcGlobalView(svc *Service) *cororpc.GlobalView {
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
