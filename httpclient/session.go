package httpclient

import (
	"fmt"

	"github.com/valyala/fasthttp"
)

// Session is one goroutine's handle for sending /query in a loop, as a load generator or
// a router does. It keeps its own request and response for its whole life, so a call
// costs the round trip and nothing else: no pool traffic, no header rebuilding, and with
// QueryEncoded not even the encoding. The Client it comes from may hand out any number
// of Sessions; each one is not safe for concurrent use.
type Session struct {
	c    *Client
	req  *fasthttp.Request
	resp *fasthttp.Response
}

// NewSession returns a Session that sends through c's connections. Call Close when done.
func (c *Client) NewSession() *Session {
	s := &Session{c: c, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	// Method, URI and content type never change, so they are set once here.
	post(s.req, c.queryURI)
	return s
}

// Close returns the Session's request and response to fasthttp's pools; the Session must
// not be used afterwards. The Client stays usable.
func (s *Session) Close() {
	if s.req == nil {
		return
	}
	fasthttp.ReleaseRequest(s.req)
	fasthttp.ReleaseResponse(s.resp)
	s.req, s.resp = nil, nil
}

// Query encodes q into the Session's request buffer, sends it and decodes the answer
// into res, which may be reused across calls (see DecodeQueryResult). In steady state it
// allocates nothing.
func (s *Session) Query(q *QueryRequest, res *QueryResult) error {
	buf := s.req.SwapBody(nil)
	s.req.SwapBody(AppendQueryRequest(buf[:0], q))
	return s.decode(res)
}

// QueryEncoded sends body, a /query request already encoded with AppendQueryRequest,
// and decodes the answer into res. Encoding a prompt once and sending the bytes many
// times keeps the encoding cost out of a measured round trip. body is sent as is, not
// copied, and must not change until the call returns.
func (s *Session) QueryEncoded(body []byte, res *QueryResult) error {
	s.req.SetBodyRaw(body)
	return s.decode(res)
}

// QueryRaw sends body (as QueryEncoded) and returns the answer's bytes undecoded, for
// callers that store, compare or decode them their own way. The bytes belong to the
// Session and stay valid until its next call or Close. A non-2xx reply is an *Error, a
// transport failure a *ConnError, as for every other call.
func (s *Session) QueryRaw(body []byte) ([]byte, error) {
	s.req.SetBodyRaw(body)
	if err := s.c.roundTrip(s.req, s.resp); err != nil {
		return nil, err
	}
	return s.resp.Body(), nil
}

// decode sends the prepared request and decodes the 2xx answer into res.
func (s *Session) decode(res *QueryResult) error {
	if err := s.c.roundTrip(s.req, s.resp); err != nil {
		return err
	}
	if err := DecodeQueryResult(res, s.resp.Body()); err != nil {
		return fmt.Errorf("decode /query response: %w", err)
	}
	return nil
}
