// Package rpcclient is a small Go client for the conductor coro_rpc channel (the one the
// upstream Python client uses): tests, the load generator and benchmarks speak the real
// wire through it. Like the upstream C++ client it keeps one TCP connection behind a
// mutex; any transport failure closes that connection, and the caller dials again.
package rpcclient

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/wire/cororpc"
)

// DefaultConnectTimeout is used by Dial when connectTimeout <= 0; it matches the upstream
// client's connect_timeout_ms default.
const DefaultConnectTimeout = time.Second

var (
	// ErrTimeout wraps every failure caused by the call's context deadline or a socket
	// timeout; Code maps it to RPC_TIMEOUT.
	ErrTimeout = errors.New("rpcclient: request timed out")
	// ErrClosed is returned by calls on a client that was closed, or whose connection was
	// dropped after an earlier transport failure.
	ErrClosed = errors.New("rpcclient: connection closed")
	// ErrProtocol means the server answered with a frame that does not belong to the
	// request (wrong sequence number); the connection is dropped.
	ErrProtocol = errors.New("rpcclient: protocol violation")
)

// Client calls one conductor RPC server. Safe for concurrent use; calls are serialised
// over the single connection, as upstream does.
type Client struct {
	conn    net.Conn
	closed  atomic.Bool
	maxBody int

	mu   sync.Mutex // serialises calls and guards the fields below
	br   *bufio.Reader
	wbuf []byte
	seq  uint32
	dead error // why the connection is unusable, once it is

	dlMu   sync.Mutex // guards active: lets a late context callback know its call is over
	active uint32     // sequence number of the call in flight, 0 when none
}

// Dial connects to addr ("host:port").
func Dial(addr string, connectTimeout time.Duration) (*Client, error) {
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	conn, err := net.DialTimeout("tcp", addr, connectTimeout)
	if err != nil {
		return nil, fmt.Errorf("rpcclient: dial %s: %w", addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return &Client{conn: conn, br: bufio.NewReaderSize(conn, 64<<10), maxBody: cororpc.DefaultMaxBody}, nil
}

// Close closes the connection; calls in flight fail. Repeated calls are safe.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}

// Code maps an error returned by this client to the upstream client's ErrorCode: nil is
// OK, timeouts are RPC_TIMEOUT, everything else (connection, framework, decoding) is
// RPC_FAIL.
func Code(err error) cororpc.ErrorCode {
	switch {
	case err == nil:
		return cororpc.CodeOK
	case errors.Is(err, ErrTimeout):
		return cororpc.CodeRPCTimeout
	default:
		return cororpc.CodeRPCFail
	}
}

// Query runs ConductorService::Query, filling res (its slices are reused, so a loop that
// passes the same res allocates little). Instance ids alias a buffer private to this call
// and stay valid. The code is the business result; err reports transport, framework or
// decoding failures.
func (c *Client) Query(ctx context.Context, q *cororpc.QueryRequest, res *cororpc.QueryResult) (cororpc.ErrorCode, error) {
	body, err := c.call(ctx, cororpc.FuncQuery, func(dst []byte) []byte { return cororpc.AppendQueryRequest(dst, q) })
	if err != nil {
		return 0, err
	}
	return cororpc.DecodeQueryResponse(body, res)
}

// Register runs ConductorService::Register.
func (c *Client) Register(ctx context.Context, cfg *cororpc.ServiceConfig) (cororpc.RegisterResult, cororpc.ErrorCode, error) {
	return callCoded(ctx, c, cororpc.FuncRegister, func(dst []byte) []byte { return cororpc.AppendServiceConfig(dst, cfg) },
		cororpc.DecodeRegisterResponse)
}

// Unregister runs ConductorService::Unregister.
func (c *Client) Unregister(ctx context.Context, instanceID, tenantID string, dpRank int32) (cororpc.UnregisterResult, cororpc.ErrorCode, error) {
	return callCoded(ctx, c, cororpc.FuncUnregister, func(dst []byte) []byte {
		return cororpc.AppendUnregisterArgs(dst, instanceID, tenantID, dpRank)
	}, cororpc.DecodeUnregisterResponse)
}

// GetGlobalView runs ConductorService::GetGlobalView (no business error code upstream).
func (c *Client) GetGlobalView(ctx context.Context) (cororpc.GlobalView, error) {
	return callDecode(ctx, c, cororpc.FuncGetGlobalView, nil, cororpc.DecodeGlobalView)
}

// ListServices runs ConductorService::ListServices (no business error code upstream).
func (c *Client) ListServices(ctx context.Context) ([]cororpc.ServiceConfig, error) {
	return callDecode(ctx, c, cororpc.FuncListServices, nil, cororpc.DecodeServiceList)
}

// RegisterEx runs this conductor's RegisterEx: Register with the hash_profile fields of
// issue 25 and index_media (an upstream conductor answers "function not registered").
func (c *Client) RegisterEx(ctx context.Context, args *cororpc.RegisterExArgs) (cororpc.RegisterResult, cororpc.ErrorCode, error) {
	return callCoded(ctx, c, cororpc.FuncRegisterEx, func(dst []byte) []byte { return cororpc.AppendRegisterExArgs(dst, args) },
		cororpc.DecodeRegisterResponse)
}

// UnregisterAdapter runs this conductor's UnregisterAdapter: one adapter of a multi-LoRA
// registration.
func (c *Client) UnregisterAdapter(ctx context.Context, instanceID, tenantID string, dpRank int32, loraName string) (cororpc.UnregisterResult, cororpc.ErrorCode, error) {
	return callCoded(ctx, c, cororpc.FuncUnregisterAdapter, func(dst []byte) []byte {
		return cororpc.AppendUnregisterAdapterArgs(dst, instanceID, tenantID, dpRank, loraName)
	}, cororpc.DecodeUnregisterResponse)
}

// ListServiceDetails runs this conductor's ListServiceDetails: ListServices with the
// profile fields, media and self-check of each entry.
func (c *Client) ListServiceDetails(ctx context.Context) ([]cororpc.ServiceDetail, error) {
	return callDecode(ctx, c, cororpc.FuncListServiceDetails, nil, cororpc.DecodeServiceDetails)
}

// callDecode runs c.call and decodes the body of its successful response with decode.
func callDecode[T any](ctx context.Context, c *Client, fn uint32, encode func([]byte) []byte,
	decode func([]byte) (T, error)) (T, error) {
	body, err := c.call(ctx, fn, encode)
	if err != nil {
		var zero T
		return zero, err
	}
	return decode(body)
}

// callCoded is callDecode for a method whose response carries a business error code.
func callCoded[T any](ctx context.Context, c *Client, fn uint32, encode func([]byte) []byte,
	decode func([]byte) (T, cororpc.ErrorCode, error)) (T, cororpc.ErrorCode, error) {
	body, err := c.call(ctx, fn, encode)
	if err != nil {
		var zero T
		return zero, 0, err
	}
	return decode(body)
}

// call sends one request and returns the body of its successful response. encode appends
// the argument body; nil means a method without parameters (empty body).
func (c *Client) call(ctx context.Context, fn uint32, encode func([]byte) []byte) ([]byte, error) {
	method := cororpc.FunctionName(fn)
	if err := ctx.Err(); err != nil {
		return nil, c.ctxError(method, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, fmt.Errorf("%s: %w", method, ErrClosed)
	}
	if c.dead != nil {
		return nil, fmt.Errorf("%s: %w (after: %v)", method, ErrClosed, c.dead)
	}
	c.seq++
	if c.seq == 0 { // 0 marks "no call in flight"
		c.seq = 1
	}
	seq := c.seq

	frame, start := cororpc.BeginRequest(c.wbuf[:0], seq, fn)
	if encode != nil {
		frame = encode(frame)
	}
	if err := cororpc.FinishRequest(frame, start); err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	c.wbuf = frame

	deadline, _ := ctx.Deadline() // zero time: no deadline
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, c.drop(ctx, method, err)
	}
	c.dlMu.Lock()
	c.active = seq
	c.dlMu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		// Cancellation interrupts blocking I/O by expiring the deadline, but only if
		// this call is still the one in flight.
		c.dlMu.Lock()
		if c.active == seq {
			_ = c.conn.SetDeadline(time.Unix(1, 0))
		}
		c.dlMu.Unlock()
	})
	defer func() {
		stop()
		c.dlMu.Lock()
		c.active = 0
		c.dlMu.Unlock()
	}()

	if _, err := c.conn.Write(frame); err != nil {
		return nil, c.drop(ctx, method, err)
	}
	// A fresh body buffer per call: decoded strings alias it and must outlive the call.
	h, body, err := cororpc.ReadResponse(c.br, nil, c.maxBody)
	if err != nil {
		return nil, c.drop(ctx, method, err)
	}
	if h.SeqNum != seq {
		return nil, c.drop(ctx, method, fmt.Errorf("%w: response seq %d for request %d", ErrProtocol, h.SeqNum, seq))
	}
	if h.ErrCode != 0 {
		fe, err := cororpc.DecodeFrameworkError(h.ErrCode, body)
		if err != nil {
			return nil, fmt.Errorf("%s: framework error %d: %w", method, h.ErrCode, err)
		}
		return nil, fmt.Errorf("%s: %w", method, fe)
	}
	return body, nil
}

// drop closes the connection after a transport failure (the stream may hold a late
// response, so it cannot be reused) and classifies the error.
func (c *Client) drop(ctx context.Context, method string, err error) error {
	c.dead = err
	_ = c.conn.Close()
	if cerr := ctx.Err(); cerr != nil {
		return c.ctxError(method, cerr)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("%s: %w: %w", method, ErrTimeout, err)
	}
	return fmt.Errorf("%s: %w", method, err)
}

func (c *Client) ctxError(method string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w: %w", method, ErrTimeout, err)
	}
	return fmt.Errorf("%s: %w", method, err)
}
