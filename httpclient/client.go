// Package httpclient is a Go client for Conductor's HTTP indexer API: the five msgpack
// routes POST /register, /unregister, /query and GET /services, /global_view, with the
// request and response shapes of the contract (indexer-http-api.txt).
//
// The encoders (Append*Request) and decoders (Decode*) are exported on their own so that
// tests and tools can build exact request bytes or read captured bodies without a
// network. Client.Query is the hot path: with a QueryResult reused across calls it
// allocates nothing in steady state. A goroutine querying in a loop (a router, a load
// generator) uses a Session, which also sends pre-encoded bodies and returns raw answers.
//
// Files: client.go and session.go (transport), request.go (request encoders), response.go
// (the hand-written, allocation-free /query decoder), views.go and its generated
// views_gen.go (tinylib/msgp decoders of the management responses and error bodies).
package httpclient

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// DefaultPort is used when an address names a host without a port and without a scheme,
// the shorthand an operator types for a conductor ("10.0.0.1").
const DefaultPort = 13333

// DefaultTimeout bounds each call when Options.Timeout is zero.
const DefaultTimeout = 5 * time.Second

const contentType = "application/msgpack"

// Options configures a Client.
type Options struct {
	// Timeout bounds each call from sending the request to reading the whole response.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// MaxConns caps concurrent connections to the server; zero means fasthttp's default.
	MaxConns int
	// AdminToken, when set, is sent as "Authorization: Bearer <token>" on Register and
	// Unregister (the conductor's admin_token).
	AdminToken string
	// WriteBufferSize is the buffer a request is written through: a request (head and
	// body) up to this size leaves in one write. Zero or less means
	// DefaultWriteBufferSize.
	WriteBufferSize int
}

// DefaultWriteBufferSize is Options.WriteBufferSize when not positive: a /query of up to
// 26K tokens (an int array takes at most 5 bytes a token) leaves in one write. With
// fasthttp's 4 KiB default a request over 4 KiB left as two writes, its first 4 KiB
// and the rest, and the conductor, woken by the first, found the rest not there yet and
// waited for it again: an 8K-token miss cost the server 2.7-3.8 us more CPU that way
// (docs/performance.md). The buffers are pooled per request being written, not held
// per connection.
const DefaultWriteBufferSize = 128 << 10

func writeBufferSize(n int) int {
	if n <= 0 {
		return DefaultWriteBufferSize
	}
	return n
}

// Client calls one conductor. It is safe for concurrent use.
type Client struct {
	base    string // normalized "http://host:port[/prefix]", for messages
	host    string // "host:port" the connections go to
	hc      *fasthttp.HostClient
	timeout time.Duration
	auth    string // "Bearer <token>" or ""
	// Full request URIs, built once so calls do not concatenate strings.
	registerURI, unregisterURI, queryURI, queryByHashURI, servicesURI, viewURI string
}

// New returns a client for the conductor at addr: "http://host:port", "https://host",
// "host:port" or "host" (DefaultPort). A path after the host is kept as a prefix for
// every route, for conductors behind a reverse proxy.
func New(addr string, opts Options) (*Client, error) {
	raw := strings.TrimSpace(addr)
	schemeless := !strings.Contains(raw, "://")
	if schemeless {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse address %q: %w", addr, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("address %q: scheme must be http or https", addr)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("address %q: missing host", addr)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("address %q: only scheme, host, port and path are allowed", addr)
	}
	port := u.Port()
	if port == "" {
		switch {
		case schemeless:
			port = strconv.Itoa(DefaultPort)
		case u.Scheme == "https":
			port = "443"
		default:
			port = "80"
		}
	}
	hostPort := net.JoinHostPort(u.Hostname(), port)
	prefix := strings.TrimRight(u.EscapedPath(), "/")
	c := &Client{
		base:    u.Scheme + "://" + hostPort + prefix,
		host:    hostPort,
		timeout: opts.Timeout,
	}
	if opts.AdminToken != "" {
		c.auth = "Bearer " + opts.AdminToken
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	c.hc = &fasthttp.HostClient{
		Addr:       hostPort,
		IsTLS:      u.Scheme == "https",
		Name:       "conductor-httpclient",
		MaxConns:   opts.MaxConns,
		RetryIfErr: retryIfSafe,
		// The pool of request buffers sized so that a request is one write (see
		// DefaultWriteBufferSize).
		WriteBufferSize: writeBufferSize(opts.WriteBufferSize),
	}
	c.registerURI = c.base + "/register"
	c.unregisterURI = c.base + "/unregister"
	c.queryURI = c.base + "/query"
	c.queryByHashURI = c.base + "/query_by_hash"
	c.servicesURI = c.base + "/services"
	c.viewURI = c.base + "/global_view"
	return c, nil
}

// retryIfSafe lets fasthttp retry a request whose keep-alive connection turned out to be
// closed, but only for calls without side effects: a retried /unregister could report 404
// for a service it had just removed.
func retryIfSafe(req *fasthttp.Request, attempts int, _ error) (resetTimeout, retry bool) {
	if attempts >= 3 {
		return false, false
	}
	if req.Header.IsGet() {
		return false, true
	}
	return false, bytes.HasSuffix(req.URI().Path(), []byte("/query"))
}

// Addr returns the normalized base address, e.g. "http://127.0.0.1:13333".
func (c *Client) Addr() string { return c.base }

// Host returns the "host:port" the client connects to, without scheme or path prefix:
// the form to print next to process figures or hand to tools that take a bare address.
func (c *Client) Host() string { return c.host }

// Close drops idle connections. The Client stays usable.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Error is a non-2xx reply. Validation failures (400) carry Reason and usually Field or
// Index; service-level failures carry only Message.
type Error struct {
	Status  int
	Message string
	Reason  string
	Field   string
	// Index is the offending array element when HasIndex is set.
	Index    int64
	HasIndex bool
}

// Error formats the reply as "<error> (reason: <reason>, field: <field>, index: <i>)",
// leaving out the parts the server did not send.
func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString(e.Message)
	parts := 0
	add := func(name, val string) {
		if parts == 0 {
			sb.WriteString(" (")
		} else {
			sb.WriteString(", ")
		}
		parts++
		sb.WriteString(name)
		sb.WriteString(": ")
		sb.WriteString(val)
	}
	if e.Reason != "" {
		add("reason", e.Reason)
	}
	if e.Field != "" {
		add("field", e.Field)
	}
	if e.HasIndex {
		add("index", strconv.FormatInt(e.Index, 10))
	}
	if parts > 0 {
		sb.WriteString(")")
	}
	return sb.String()
}

// DecodeError builds the Error for a non-2xx reply. A body that is not the contract's
// error map (a proxy's HTML page, say) becomes the message, or the status text when empty.
func DecodeError(status int, body []byte) *Error {
	e := &Error{Status: status}
	var eb errorBody
	_, err := eb.UnmarshalMsg(body)
	if err == nil {
		e.Message, e.Reason, e.Field = eb.Error, eb.Reason, eb.Field
		if eb.Index != nil {
			e.Index, e.HasIndex = *eb.Index, true
		}
	}
	if err != nil {
		*e = Error{Status: status, Message: strings.TrimSpace(string(body))}
		if len(e.Message) > 200 {
			e.Message = e.Message[:200] + "..."
		}
	}
	if e.Message == "" {
		e.Message = "HTTP " + strconv.Itoa(status) + " " + fasthttp.StatusMessage(status)
	}
	return e
}

// ConnError means no reply came back: the server refused or dropped the connection, or
// did not answer within the timeout.
type ConnError struct {
	Addr string
	Err  error
}

// Error names the address so an operator sees which conductor was unreachable.
func (e *ConnError) Error() string { return "cannot reach " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the transport error.
func (e *ConnError) Unwrap() error { return e.Err }

// roundTrip sends req and leaves the reply in resp. A transport failure is a *ConnError
// and a non-2xx reply an *Error; the caller decodes a 2xx body.
func (c *Client) roundTrip(req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := c.hc.DoTimeout(req, resp, c.timeout); err != nil {
		if errors.Is(err, fasthttp.ErrTimeout) {
			err = fmt.Errorf("no response within %s: %w", c.timeout, err)
		}
		return &ConnError{Addr: c.base, Err: err}
	}
	if s := resp.StatusCode(); s < 200 || s > 299 {
		return DecodeError(s, resp.Body())
	}
	return nil
}

// authorize adds the admin token to a state-changing request.
func (c *Client) authorize(req *fasthttp.Request) {
	if c.auth != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, c.auth)
	}
}

// post sets the method, URI and content type of a msgpack POST.
func post(req *fasthttp.Request, uri string) {
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(uri)
	req.Header.SetContentType(contentType)
}

// get sends a GET and hands the 2xx body to fn, which must not keep it: the buffer goes
// back to fasthttp's pool on return.
func (c *Client) get(uri string, fn func(body []byte) error) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI(uri)
	if err := c.roundTrip(req, resp); err != nil {
		return err
	}
	return fn(resp.Body())
}

// Query asks for the cached prefix of q.TokenIDs and decodes the answer into res, which
// may be reused across calls (see DecodeQueryResult). A goroutine that queries in a loop
// saves the per-call pool round trip with a Session (NewSession).
func (c *Client) Query(q *QueryRequest, res *QueryResult) error {
	return c.postQuery(c.queryURI, "/query", res, func(b []byte) []byte { return AppendQueryRequest(b, q) })
}

// postQuery POSTs the body that appendBody appends to its argument to uri (path names
// the endpoint in errors) and decodes the answer, a query result, into res.
func (c *Client) postQuery(uri, path string, res *QueryResult, appendBody func([]byte) []byte) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	post(req, uri)
	// Encode straight into the request's pooled body buffer.
	buf := req.SwapBody(nil)
	req.SwapBody(appendBody(buf[:0]))
	if err := c.roundTrip(req, resp); err != nil {
		return err
	}
	if err := DecodeQueryResult(res, resp.Body()); err != nil {
		return fmt.Errorf("decode %s response: %w", path, err)
	}
	return nil
}

// Register registers a publisher.
func (c *Client) Register(r *RegisterRequest) (RegisterResult, error) {
	return postAdmin(c, c.registerURI, "/register", func(b []byte) []byte { return AppendRegisterRequest(b, r) },
		DecodeRegisterResult)
}

// postAdmin sends an admin POST to uri (route names it in errors), with the admin token
// and the body encode appends, and decodes the answer.
func postAdmin[T any](c *Client, uri, route string, encode func([]byte) []byte, decode func([]byte) (T, error)) (T, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	post(req, uri)
	c.authorize(req)
	buf := req.SwapBody(nil)
	req.SwapBody(encode(buf[:0]))
	if err := c.roundTrip(req, resp); err != nil {
		var zero T
		return zero, err
	}
	res, err := decode(resp.Body())
	if err != nil {
		return res, fmt.Errorf("decode %s response: %w", route, err)
	}
	return res, nil
}

// Unregister removes a publisher.
func (c *Client) Unregister(r *UnregisterRequest) (UnregisterResult, error) {
	return postAdmin(c, c.unregisterURI, "/unregister", func(b []byte) []byte { return AppendUnregisterRequest(b, r) },
		DecodeUnregisterResult)
}

// Services lists the registered publishers.
func (c *Client) Services() (ServiceList, error) {
	return getView(c, c.servicesURI, "/services", DecodeServiceList)
}

// GlobalView returns the snapshot of indexed contexts.
func (c *Client) GlobalView() (GlobalView, error) {
	return getView(c, c.viewURI, "/global_view", DecodeGlobalView)
}

// getView GETs uri (route names it in errors) and decodes the answer.
func getView[T any](c *Client, uri, route string, decode func([]byte) (T, error)) (T, error) {
	var v T
	err := c.get(uri, func(body []byte) error {
		var err error
		if v, err = decode(body); err != nil {
			return fmt.Errorf("decode %s response: %w", route, err)
		}
		return nil
	})
	return v, err
}
