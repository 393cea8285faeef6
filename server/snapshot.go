package server

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/snapshot"
)

// SnapshotPath serves the index snapshot: GET streams it, POST loads one.
const SnapshotPath = "/cluster/snapshot"

// DefaultMaxSnapshotDownloads bounds the snapshots served at once (max_snapshot_downloads).
const DefaultMaxSnapshotDownloads = 4

// maxSnapshotReceipts bounds the snapshot POSTs receiving their body at once: each may
// hold up to max_snapshot_bytes on disk until it is verified.
const maxSnapshotReceipts = 2

// Errors of a snapshot load that the POST answers with their own status.
var (
	// errSnapshotBusy: another load is being applied (503).
	errSnapshotBusy = errors.New("another snapshot is being loaded")
	// errNoSnapshotKey: the cluster key was not read yet (503).
	errNoSnapshotKey = errors.New("the cluster's snapshot key is not known yet (registry not loaded)")
)

// snapshotKey is the key snapshots are signed and checked with: the cluster's (from the
// registry's cluster key) on a replica, one derived from the admin token on a single
// node.
func (a *App) snapshotKey() ([]byte, error) {
	if a.registry == nil {
		return snapshot.KeyFromToken(a.adminTok), nil
	}
	info, ok := a.registry.Info()
	if !ok {
		return nil, errNoSnapshotKey
	}
	return info.Key(), nil
}

// WriteSnapshot writes the snapshot stream of every context to w, signed with the
// snapshot key, each context cut at the sequence numbers of the sources applied before
// its first step (snapshot.Write). It returns the stream's size.
func (a *App) WriteSnapshot(w io.Writer) (int64, error) {
	key, err := a.snapshotKey()
	if err != nil {
		return 0, err
	}
	return snapshot.Write(w, a.Engine, key, a.snapshotSources)
}

// snapshotSources lists the registered services of a context with the last batch applied
// from each (the snapshot's cut).
func (a *App) snapshotSources(key engine.ContextKey) []snapshot.Source {
	seqs := a.gates.Sequences()
	var out []snapshot.Source
	for _, c := range a.Service.Services() {
		if c.Context() != key {
			continue
		}
		src := snapshot.Source{Endpoint: c.Endpoint, Shared: !c.Kind.IsEngine()}
		if c.Kind.IsEngine() {
			src.Slot = c.Slot()
		}
		src.Seq, src.HasSeq = seqs[c.Endpoint]
		out = append(out, src)
	}
	return out
}

// owned is what of a snapshot the registrations cfgs let this node apply.
func (a *App) owned(cfgs []service.Config) snapshot.Owned {
	o := snapshot.Owned{RequireCut: a.registry != nil}
	for i := range cfgs {
		c := &cfgs[i]
		if c.Kind.IsEngine() {
			o.AddSlot(c.Context(), c.Profile, c.Slot(), c.Endpoint)
		} else {
			o.AddSource(c.Context(), c.Profile, c.Endpoint)
		}
	}
	return o
}

// LoadSnapshot loads a snapshot stream (LoadSnapshotFrom without replace).
func (a *App) LoadSnapshot(r io.Reader) (snapshot.Loaded, error) {
	res, _, err := a.loadSnapshot(r, false, nil)
	return res, err
}

// loadSnapshot receives a stream (bounded by max_snapshot_bytes, in a temporary file),
// checks its checksum and signature, applies what this node's registrations own of it
// into a stage and swaps the stage in whole, or nothing. Without replace, an index that
// already holds blocks or bindings refuses it (engine.ErrIndexNotEmpty): a load is a
// bootstrap or a restore. It also returns, per source endpoint, the lowest last applied
// sequence number over the snapshot's contexts. accept, when set, is asked with those
// numbers before the swap: an error from it discards the stage (nothing applied) and is
// returned.
func (a *App) loadSnapshot(r io.Reader, replace bool, accept func(seqs map[string]uint64) error) (snapshot.Loaded, map[string]uint64, error) {
	key, err := a.snapshotKey()
	if err != nil {
		return snapshot.Loaded{}, nil, err
	}
	started := time.Now()
	sp, err := snapshot.Receive(r, snapshot.ReceiveOptions{MaxBytes: a.maxSnapshotBytes, Key: key})
	if err != nil {
		return snapshot.Loaded{}, nil, err
	}
	defer sp.Close()
	// Only the apply is one at a time: a slow upload holds nobody up.
	if !a.snapshotLoading.TryLock() {
		return snapshot.Loaded{Stats: snapshot.Stats{Bytes: sp.Size()}}, nil, errSnapshotBusy
	}
	defer a.snapshotLoading.Unlock()
	// The memory the load used (decoding buffers) goes back to the system at once rather
	// than after the runtime's own delay; the index it built stays.
	defer debug.FreeOSMemory()
	if !replace {
		has, err := a.Engine.HoldsData()
		if err != nil {
			return snapshot.Loaded{Stats: snapshot.Stats{Bytes: sp.Size()}}, nil, err
		}
		if has {
			return snapshot.Loaded{Stats: snapshot.Stats{Bytes: sp.Size()}}, nil,
				fmt.Errorf("%w: this node already serves an index (load with replace to swap it)", engine.ErrIndexNotEmpty)
		}
	}
	stage := a.Engine.NewStage()
	defer stage.Discard() // a no-op after Commit
	res, seqs, err := snapshot.Load(sp, stage, a.owned(a.Service.Services()))
	if err != nil {
		return res, nil, err
	}
	if accept != nil {
		if err := accept(seqs); err != nil {
			return res, nil, err
		}
	}
	// Swapped in with registrations held off: the staged contexts get the slots
	// registered now, and lose what was unregistered during the load.
	var cerr error
	a.Service.Apply(func(tx *service.Tx) {
		now := a.owned(tx.Services())
		cerr = stage.Commit(replace, func(k engine.ContextKey, s engine.Slot) bool { return now.Slots[k][s] != "" },
			func(k engine.ContextKey, src string) bool { return now.Sources[k][src] })
	})
	if cerr != nil {
		return res, nil, cerr
	}
	a.log.Info("snapshot loaded", "bytes", res.Bytes, "contexts", res.Contexts, "entries", res.Entries,
		"bindings", res.Bindings, "applied", res.Applied, "skipped", res.Skipped, "replace", replace,
		"took", time.Since(started).Round(time.Millisecond).String())
	for _, s := range res.SkippedServices {
		a.log.Info("snapshot: service skipped", "service", s)
	}
	return res, seqs, nil
}

// snapshotHandler serves SnapshotPath. Both methods need the admin token when one is set
// (the snapshot is for peers and operators), and POST is refused altogether without one:
// a load replaces what the engines' events built.
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
			if token == "" {
				snapshotError(ctx, fasthttp.StatusForbidden, "loading a snapshot needs admin_token to be set", snapshot.Loaded{})
				return
			}
			a.receiveSnapshot(ctx)
		default:
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			ctx.Response.Header.Set("Allow", "GET, POST")
		}
	}
}

// serveSnapshot streams this node's snapshot (GET), once it is ready. At most
// max_snapshot_downloads at once (more get 503). A failure after the answer's header
// went out (a context changing faster than its snapshot could record) aborts the
// chunked body, closing the connection without its last chunk: every HTTP client sees
// an incomplete body, not a short 200.
func (a *App) serveSnapshot(ctx *fasthttp.RequestCtx) {
	if !a.Ready() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("not ready\n")
		return
	}
	select {
	case a.snapshotDownloads <- struct{}{}:
	default:
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.Response.Header.Set("Retry-After", "1")
		ctx.SetBodyString("too many snapshots are being served (max_snapshot_downloads)\n")
		return
	}
	ctx.SetContentType("application/octet-stream")
	started := time.Now()
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer func() { <-a.snapshotDownloads }()
		var out io.Writer = w
		if a.snapshotWriteHook != nil {
			out = hookWriter{w, a.snapshotWriteHook}
		}
		n, err := a.WriteSnapshot(out)
		if err != nil {
			a.snapshotsFailed.Add(1)
			a.log.Error("snapshot stream failed; connection aborted", "err", err, "bytes", n)
			// Abort: the client must not mistake the body for a complete one.
			_ = conn.Close()
			return
		}
		a.log.Info("snapshot served", "bytes", n, "took", time.Since(started).String())
	})
}

// receiveSnapshot loads a posted snapshot (POST) and answers what it applied, in JSON.
// ?replace=true swaps the snapshot's contexts in over an index that holds data (without
// it such a load is refused with 409).
func (a *App) receiveSnapshot(ctx *fasthttp.RequestCtx) {
	replace := false
	if v := ctx.QueryArgs().Peek("replace"); v != nil {
		b, err := strconv.ParseBool(string(v))
		if err != nil {
			snapshotError(ctx, fasthttp.StatusBadRequest, "replace must be true or false", snapshot.Loaded{})
			return
		}
		replace = b
	}
	if n := ctx.Request.Header.ContentLength(); n > 0 && int64(n) > a.maxSnapshotBytes {
		ctx.SetConnectionClose()
		snapshotError(ctx, fasthttp.StatusRequestEntityTooLarge,
			fmt.Sprintf("snapshot of %d bytes is larger than max_snapshot_bytes (%d)", n, a.maxSnapshotBytes), snapshot.Loaded{})
		return
	}
	select {
	case a.snapshotReceipts <- struct{}{}:
		defer func() { <-a.snapshotReceipts }()
	default:
		ctx.Response.Header.Set("Retry-After", "1")
		snapshotError(ctx, fasthttp.StatusServiceUnavailable, "too many snapshots are being received", snapshot.Loaded{})
		return
	}
	// The stream, not PostBody, which would read a large body whole into memory first.
	var body io.Reader
	if s := ctx.RequestBodyStream(); s != nil {
		body = s
	} else {
		body = bytes.NewReader(ctx.PostBody())
	}
	res, _, err := a.loadSnapshot(body, replace, nil)
	if err != nil {
		status := fasthttp.StatusInternalServerError
		switch {
		case errors.Is(err, snapshot.ErrTooLarge):
			status = fasthttp.StatusRequestEntityTooLarge
			ctx.SetConnectionClose() // the rest of the body is not read
		case errors.Is(err, snapshot.ErrCorrupt):
			status = fasthttp.StatusBadRequest
		case errors.Is(err, snapshot.ErrUnauthenticated):
			status = fasthttp.StatusForbidden
		case errors.Is(err, engine.ErrIndexNotEmpty), errors.Is(err, engine.ErrProfileConflict), errors.Is(err, snapshot.ErrMismatch):
			status = fasthttp.StatusConflict
		case errors.Is(err, errSnapshotBusy), errors.Is(err, errNoSnapshotKey):
			status = fasthttp.StatusServiceUnavailable
			ctx.Response.Header.Set("Retry-After", "1")
		}
		snapshotError(ctx, status, err.Error(), res)
		return
	}
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(map[string]any{"bytes": res.Bytes, "contexts": res.Contexts, "entries": res.Entries,
		"bindings": res.Bindings, "applied": res.Applied, "skipped": res.Skipped, "replaced": replace,
		"skipped_services": res.SkippedServices})
	ctx.SetBody(b)
}

// snapshotError answers a refused load in JSON: nothing was applied.
func snapshotError(ctx *fasthttp.RequestCtx, status int, msg string, res snapshot.Loaded) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(map[string]any{"error": msg, "applied": 0, "bytes": res.Bytes})
	ctx.SetBody(b)
}

// hookWriter calls hook before each write (tests: a change in the middle of a stream).
type hookWriter struct {
	w    io.Writer
	hook func()
}

func (h hookWriter) Write(p []byte) (int, error) {
	h.hook()
	return h.w.Write(p)
}
