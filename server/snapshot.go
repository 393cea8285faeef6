package server

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/snapshot"
)

// SnapshotPath serves the index snapshot: GET streams it, POST loads one.
const SnapshotPath = "/cluster/snapshot"

// WriteSnapshot writes the snapshot stream of every context to w, each context cut at
// the sequence numbers of the sources applied before its first step (snapshot.Write).
// It returns the stream's size.
func (a *App) WriteSnapshot(w io.Writer) (int64, error) {
	return snapshot.Write(w, a.Engine, a.gates.Sequences)
}

// LoadSnapshot verifies a whole snapshot stream and then applies what this node's
// registrations own of it (snapshot.Load). A stream that does not verify applies nothing.
func (a *App) LoadSnapshot(r io.Reader) (snapshot.Loaded, error) {
	res, _, err := a.loadSnapshot(r)
	return res, err
}

// loadSnapshot is LoadSnapshot that also returns, per source endpoint, the lowest last
// applied sequence number over the snapshot's contexts.
func (a *App) loadSnapshot(r io.Reader) (snapshot.Loaded, map[string]uint64, error) {
	var owned snapshot.Owned
	for _, c := range a.Service.Services() {
		if c.Kind.IsEngine() {
			owned.AddSlot(c.Context(), c.Slot())
		} else {
			owned.AddSource(c.Context(), c.Endpoint)
		}
	}
	res, seqs, err := snapshot.Load(r, a.Engine, owned)
	if err == nil {
		a.log.Info("snapshot loaded", "bytes", res.Bytes, "contexts", res.Contexts, "entries", res.Entries,
			"bindings", res.Bindings, "applied", res.Applied, "skipped", res.Skipped)
	}
	return res, seqs, err
}

// snapshotHandler serves SnapshotPath. Both methods need the admin token when one is set
// (the snapshot is for peers and operators). One POST loads at a time; another meanwhile
// gets 503 with Retry-After.
func (a *App) snapshotHandler(token string) fasthttp.RequestHandler {
	want := []byte("Bearer " + token)
	return func(ctx *fasthttp.RequestCtx) {
		if token != "" && subtle.ConstantTimeCompare(ctx.Request.Header.Peek("Authorization"), want) != 1 {
			ctx.SetStatusCode(fasthttp.StatusUnauthorized)
			ctx.SetBodyString("Unauthorized: " + SnapshotPath + " requires Authorization: Bearer <admin_token>\n")
			return
		}
		switch string(ctx.Method()) {
		case fasthttp.MethodGet:
			a.serveSnapshot(ctx)
		case fasthttp.MethodPost:
			a.receiveSnapshot(ctx)
		default:
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			ctx.Response.Header.Set("Allow", "GET, POST")
		}
	}
}

// serveSnapshot streams this node's snapshot (GET), once it is ready.
func (a *App) serveSnapshot(ctx *fasthttp.RequestCtx) {
	if !a.Ready() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("not ready\n")
		return
	}
	ctx.SetContentType("application/octet-stream")
	started := time.Now()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		n, err := a.WriteSnapshot(w)
		if err != nil {
			// The stream is cut short: its checksum cannot verify.
			a.log.Error("snapshot stream failed", "err", err, "bytes", n)
			return
		}
		a.log.Info("snapshot served", "bytes", n, "took", time.Since(started).String())
	})
}

// receiveSnapshot loads a posted snapshot (POST) and answers what it applied, in JSON.
func (a *App) receiveSnapshot(ctx *fasthttp.RequestCtx) {
	if !a.snapshotLoading.TryLock() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.Response.Header.Set("Retry-After", "1")
		ctx.SetBodyString("another snapshot is being loaded\n")
		return
	}
	defer a.snapshotLoading.Unlock()
	// The stream first: PostBody would read a large body whole into the request first
	// (LoadSnapshot reads it once, up to snapshot.MaxBytes).
	var body io.Reader
	if s := ctx.RequestBodyStream(); s != nil {
		body = s
	} else {
		body = bytes.NewReader(ctx.PostBody())
	}
	res, err := a.LoadSnapshot(body)
	ctx.SetContentType("application/json")
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		if !errors.Is(err, snapshot.ErrCorrupt) && res.Bytes > 0 {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		}
		b, _ := json.Marshal(map[string]any{"error": err.Error(), "applied": res.Applied})
		ctx.SetBody(b)
		return
	}
	b, _ := json.Marshal(map[string]any{"bytes": res.Bytes, "contexts": res.Contexts, "entries": res.Entries,
		"bindings": res.Bindings, "applied": res.Applied, "skipped": res.Skipped})
	ctx.SetBody(b)
}
