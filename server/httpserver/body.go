package httpserver

import (
	"errors"
	"io"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/server/internal/limits"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// QueryBodyWeight and QueryByHashBodyWeight: a query body is held while it is served as
// its bytes and as what is decoded from them, and a positive fixint element takes one
// byte but decodes to a 4-byte token or an 8-byte block key. So a body counts 1+4 (/query)
// or 1+8 (/query_by_hash) times its size against the in-flight budget
// (max_inflight_body_bytes): an array of small ids must not hold four or eight times
// what it was charged.
const (
	QueryBodyWeight       = 1 + 4
	QueryByHashBodyWeight = 1 + 8
)

// errBodyTooLarge marks a chunked body that passed its bound while being read.
var errBodyTooLarge = errors.New("request body too large")

// readBody reads the request body, at most max bytes, into a buffer of the server's
// own: a declared length above max is answered 413 before anything is read, and the
// bytes are reserved in the in-flight budget first (503 with Retry-After when they do
// not fit), so neither one huge body nor many big ones at once can grow the heap
// without bound. weight multiplies the size for the budget (see QueryBodyWeight). held
// is the budget reserved; pass both to releaseBody.
func (h *Server) readBody(ctx *fasthttp.RequestCtx, max int, weight int64) (body *[]byte, held int64, ok bool) {
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
	need, ok := h.budget.Acquire(size * weight)
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

func (h *Server) tooLarge(ctx *fasthttp.RequestCtx, max int) {
	h.counters.BodyTooLarge.Add(1)
	ctx.SetConnectionClose()
	ctx.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, "Request body too large: the limit for this route is "+strconv.Itoa(max)+" bytes"))
}

// getBuf returns a buffer of length n: pooled when small, allocated when large (and
// then dropped after use, so one big body does not pin its memory).
func (h *Server) getBuf(n int) *[]byte {
	if n <= limits.SmallBodyBytes {
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
func (h *Server) releaseBody(body *[]byte, held int64) {
	if held > 0 {
		h.budget.Release(held)
	}
	if body == nil {
		return
	}
	// Counted by the buffer's size, not by the budget held (a multiple of it, or the
	// whole bound for a chunked body): the memory release this triggers is a full
	// collection, worth it only for buffers too large for the pool.
	if cap(*body) > limits.SmallBodyBytes {
		h.counters.LargeBody()
		return
	}
	if h.poisonReleased {
		clear((*body)[:cap(*body)])
	}
	*body = (*body)[:0]
	h.bufs.Put(body)
}
