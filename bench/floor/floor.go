// Package floor is the load benchmark's floor server: an HTTP server with the conductor's
// connection layer, fasthttp settings and query pulse (internal/pulse, at the default
// query_pulse_ms) that reads each request's body in full and answers with a fixed body,
// doing no other work. Its CPU time per request, measured with
// the same request bodies and clients as a /query cell right after it, is the part of
// that cell's server CPU that the HTTP exchange alone costs on the machine at that moment
// (system calls, loopback TCP, scheduler wake-ups, the Go runtime and fasthttp), which no
// query path can remove. Comparing a cell with its floor separates the conductor's own
// work from the machine's, which on a shared VM drifts by tens of percent within minutes.
package floor

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/conductor-go/conductor/internal/pulse"
	"github.com/conductor-go/conductor/server"
	"github.com/conductor-go/conductor/server/httpserver"
	"github.com/valyala/fasthttp"
)

// ReplyPath is the route that sets the answer: PUT ReplyPath with the body to answer
// every later request with (before a cell, the conductor's own answer to one of its
// prompts, so that both write the same bytes). Every other request is answered with it.
const ReplyPath = "/floor/reply"

// SetReply sets the answer of the floor server at addr (host:port) to body (PUT ReplyPath).
func SetReply(addr string, body []byte) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + ReplyPath)
	req.Header.SetMethod(fasthttp.MethodPut)
	req.SetBody(body)
	if err := fasthttp.DoTimeout(req, resp, 10*time.Second); err != nil {
		return fmt.Errorf("set floor reply: %w", err)
	}
	if resp.StatusCode() != fasthttp.StatusNoContent {
		return fmt.Errorf("set floor reply: status %d", resp.StatusCode())
	}
	return nil
}

// Server is a floor server. Its zero value is not usable; call New.
type Server struct {
	srv   *fasthttp.Server
	pulse *pulse.Pulse
	reply atomic.Pointer[[]byte]
	bufs  sync.Pool
	// Requests counts the requests answered and Bytes the body bytes read (both for
	// tests and for a caller that checks the server did read what was sent).
	Requests, Bytes atomic.Int64
	maxBody         int
}

// New returns a floor server that answers an empty msgpack map until a reply is set.
func New() *Server {
	s := &Server{pulse: pulse.New(pulse.Config{Interval: pulse.DefaultInterval})}
	empty := []byte{0x80}
	s.reply.Store(&empty)
	s.bufs.New = func() any { return new([]byte) }
	// The conductor's defaults (server.Limits): the same buffer, bounds and deadlines
	// (fasthttp sets a connection's deadlines again for every request).
	lim := server.Limits{}.WithDefaults()
	s.maxBody = lim.MaxQueryBodyBytes
	s.srv = &fasthttp.Server{
		Handler:                      s.handle,
		Name:                         "conductor-floor",
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		MaxRequestBodySize:           lim.MaxQueryBodyBytes,
		Concurrency:                  lim.HTTPMaxConnections,
		ReadBufferSize:               lim.HTTPReadBufferBytes,
		WriteBufferSize:              lim.HTTPWriteBufferBytes,
		ReadTimeout:                  lim.HTTPReadTimeout,
		WriteTimeout:                 lim.HTTPReadTimeout,
		IdleTimeout:                  lim.HTTPIdleTimeout,
	}
	return s
}

// Serve answers connections accepted on ln, through the conductor's connection layer
// (httpserver.FastListener), until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(httpserver.FastListener(ln))
}

// Shutdown stops the server, closes its connections and stops its pulse.
func (s *Server) Shutdown() error {
	err := s.srv.Shutdown()
	s.pulse.Close()
	return err
}

// PulseStarts is how often a request started the server's pulse (tests).
func (s *Server) PulseStarts() uint64 { return s.pulse.Stats().Starts }

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	p := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(p)
	n, err := readBody(ctx, p, s.maxBody)
	if err != nil {
		ctx.SetConnectionClose()
		ctx.Error(fmt.Sprintf("floor: read body: %v", err), fasthttp.StatusBadRequest)
		return
	}
	s.Bytes.Add(int64(n))
	if string(ctx.Path()) == ReplyPath && ctx.IsPut() {
		r := append([]byte(nil), (*p)[:n]...)
		s.reply.Store(&r)
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	s.Requests.Add(1)
	s.pulse.Beat() // as the conductor's query routes do
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(*s.reply.Load())
}

// readBody reads the whole body into *p (grown as needed), as the conductor's handler
// reads a /query body: from the stream, declared length first.
func readBody(ctx *fasthttp.RequestCtx, p *[]byte, maxBody int) (int, error) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		*p = append((*p)[:0], ctx.PostBody()...)
		return len(*p), nil
	}
	cl := ctx.Request.Header.ContentLength()
	if cl > maxBody {
		return 0, fmt.Errorf("body of %d bytes: over %d", cl, maxBody)
	}
	if cl >= 0 {
		if cap(*p) < cl {
			*p = make([]byte, cl)
		}
		*p = (*p)[:cl]
		_, err := io.ReadFull(stream, *p)
		return cl, err
	}
	// Chunked: whatever comes, up to the bound.
	*p = (*p)[:0]
	for {
		if len(*p) == cap(*p) {
			*p = append(*p, 0)[:len(*p)]
		}
		n, err := stream.Read((*p)[len(*p):cap(*p)])
		*p = (*p)[:len(*p)+n]
		if len(*p) > maxBody {
			return len(*p), errors.New("chunked body over the bound")
		}
		if errors.Is(err, io.EOF) {
			return len(*p), nil
		}
		if err != nil {
			return len(*p), err
		}
	}
}
