package httpserver

import (
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/httpapi"
)

// register answers POST /register.
func (h *Server) register(ctx *fasthttp.RequestCtx, body []byte) {
	req, rerr := httpapi.DecodeRegisterRequest(body)
	if rerr != nil {
		h.requestError(ctx, rerr)
		return
	}
	r := service.Registration{
		Endpoint: req.Endpoint, ReplayEndpoint: req.ReplayEndpoint, Type: req.Type, ModelName: req.ModelName,
		LoraName: req.LoraName, TenantID: req.TenantID, InstanceID: req.InstanceID, BlockSize: req.BlockSize,
		DPRank: int64(req.DPRank), CacheGroup: req.CacheGroup,
		Strategy: req.HashProfile.Strategy, Algorithm: req.HashProfile.Algorithm,
		PythonHashSeed: req.HashProfile.PythonHashSeed, IndexProjection: req.HashProfile.IndexProjection,
		ExtraKeys: req.HashProfile.ExtraKeys, LoraPath: req.HashProfile.LoraPath,
		LookaheadTokens: req.HashProfile.LookaheadTokens, IndexMedia: req.IndexMedia,
	}
	cfg, _, serr := h.svc.RegisterInput(&r)
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, httpapi.AppendStatusRegistered(nil, cfg.InstanceID))
}

// unregister answers POST /unregister.
func (h *Server) unregister(ctx *fasthttp.RequestCtx, body []byte) {
	req, rerr := httpapi.DecodeUnregisterRequest(body)
	if rerr != nil {
		h.requestError(ctx, rerr)
		return
	}
	var key string
	var serr *service.Error
	if req.HasLoraName {
		key, serr = h.svc.UnregisterAdapter(req.InstanceID, req.TenantID, req.DPRank, req.LoraName)
	} else {
		key, serr = h.svc.Unregister(req.InstanceID, req.TenantID, req.DPRank)
	}
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, httpapi.AppendStatusUnregistered(nil, key))
}

// globalView answers GET /global_view.
func (h *Server) globalView(ctx *fasthttp.RequestCtx) {
	views, serr := h.svc.GlobalView()
	if serr != nil {
		h.serviceError(ctx, serr)
		return
	}
	h.writeMsgpack(ctx, appendGlobalView(nil, views))
}

// services answers GET /services.
func (h *Server) services(ctx *fasthttp.RequestCtx) {
	if h.svc.Stopping() {
		h.serviceError(ctx, service.StoppingError())
		return
	}
	h.writeMsgpack(ctx, appendServices(nil, h.svc.Views()))
}
