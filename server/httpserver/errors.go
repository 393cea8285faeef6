package httpserver

import (
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// requestError answers 400 with the contract's error body (reason, field, index).
func (h *Server) requestError(ctx *fasthttp.RequestCtx, e *httpapi.RequestError) {
	ctx.SetStatusCode(fasthttp.StatusBadRequest)
	h.writeMsgpack(ctx, httpapi.AppendRequestError(nil, e))
}

// serviceError maps a service-level failure to its HTTP status and body.
func (h *Server) serviceError(ctx *fasthttp.RequestCtx, e *service.Error) {
	switch e.Code {
	case service.CodeInvalidParams:
		if e.Reason != "" {
			idx := -1
			if e.HasIndex {
				idx = e.Index
			}
			h.requestError(ctx, &httpapi.RequestError{Msg: e.Msg, Reason: e.Reason, Field: e.Field, Index: idx})
			return
		}
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
	case service.CodeNotFound:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	case service.CodeUnavailable:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	default:
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
	}
	h.writeMsgpack(ctx, httpapi.AppendErrorMessage(nil, e.Msg))
}
