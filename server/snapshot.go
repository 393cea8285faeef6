package server

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/cluster"
	"github.com/conductor-go/conductor/engine"
)

// SnapshotPath serves the index snapshot: GET streams it, POST loads one.
const SnapshotPath = "/cluster/snapshot"

// MaxSnapshotBytes bounds a snapshot loaded over POST (it is held in memory whole while
// its checksum is verified, before anything is applied): about 75M blocks.
const MaxSnapshotBytes = 1 << 30

// WriteSnapshot writes the snapshot stream of every context to w: each context is copied
// by its own writer in steps of engine.DefaultSnapshotStep records, so that no writer
// pauses longer than one step. It returns the stream's size.
func (a *App) WriteSnapshot(w io.Writer) (int64, error) {
	sw := cluster.NewSnapshotWriter(w)
	for _, cv := range a.Engine.GlobalView() {
		// Read before the context's first step: every batch counted here was applied
		// before it, so the copy (as of its last step) holds it.
		hdr := cluster.SnapshotContext{Key: cv.Key, Profile: cv.Profile, Sequences: a.gates.sequences()}
		if err := sw.Context(&hdr); err != nil {
			return 0, err
		}
		err := a.Engine.SnapshotContext(cv.Key, 0, sw.Chunk)
		if errors.Is(err, engine.ErrUnknownContext) {
			continue // dropped meanwhile: the header stands for an empty context
		}
		if err != nil {
			return 0, fmt.Errorf("snapshot context %s/%s: %w", cv.Key.TenantID, cv.Key.ModelName, err)
		}
	}
	return sw.Close()
}

// SnapshotLoad reports what LoadSnapshot applied.
type SnapshotLoad struct {
	cluster.SnapshotStats
	// Applied counts the block entries and bindings applied; Skipped those of slots or
	// sources that no service of this node registers (never indexed: they could not be
	// kept current).
	Applied, Skipped int64
}

// LoadSnapshot verifies a whole snapshot stream (version, checksum, structure) and then
// applies it to the index: the blocks of registered engine slots and the bindings of
// registered Mooncake sources, through the engine's normal write path. A stream that does
// not verify applies nothing.
func (a *App) LoadSnapshot(r io.Reader) (SnapshotLoad, error) {
	res, _, err := a.loadSnapshot(r)
	return res, err
}

// loadSnapshot is LoadSnapshot that also returns, per source endpoint, the lowest last
// applied sequence number over the snapshot's contexts.
func (a *App) loadSnapshot(r io.Reader) (SnapshotLoad, map[string]uint64, error) {
	l := &snapshotLoader{seqs: map[string]uint64{}, app: a, slots: map[engine.ContextKey]map[engine.Slot]bool{}, sources: map[engine.ContextKey]map[string]bool{}}
	for _, c := range a.Service.Services() {
		ctx := c.Context()
		if c.Kind.IsEngine() {
			if l.slots[ctx] == nil {
				l.slots[ctx] = map[engine.Slot]bool{}
			}
			l.slots[ctx][c.Slot()] = true
		} else {
			if l.sources[ctx] == nil {
				l.sources[ctx] = map[string]bool{}
			}
			l.sources[ctx][c.Endpoint] = true
		}
	}
	// First pass: verify everything; second: apply.
	data, err := io.ReadAll(io.LimitReader(r, MaxSnapshotBytes+1))
	if err != nil {
		return SnapshotLoad{}, nil, fmt.Errorf("read snapshot: %w", err)
	}
	if _, err := cluster.ReadSnapshot(bytes.NewReader(data), MaxSnapshotBytes, nopVisitor{}); err != nil {
		return SnapshotLoad{}, nil, err
	}
	st, err := cluster.ReadSnapshot(bytes.NewReader(data), MaxSnapshotBytes, l)
	out := SnapshotLoad{SnapshotStats: st, Applied: l.applied, Skipped: l.skipped}
	if err != nil {
		return out, nil, err
	}
	a.log.Info("snapshot loaded", "bytes", st.Bytes, "contexts", st.Contexts, "entries", st.Entries,
		"bindings", st.Bindings, "applied", l.applied, "skipped", l.skipped)
	return out, l.seqs, nil
}

type nopVisitor struct{}

func (nopVisitor) Context(*cluster.SnapshotContext) error                      { return nil }
func (nopVisitor) Chunk(*cluster.SnapshotContext, *engine.SnapshotChunk) error { return nil }

type snapshotLoader struct {
	app              *App
	seqs             map[string]uint64
	slots            map[engine.ContextKey]map[engine.Slot]bool
	sources          map[engine.ContextKey]map[string]bool
	applied, skipped int64
}

func (l *snapshotLoader) Context(c *cluster.SnapshotContext) error {
	for ep, seq := range c.Sequences {
		if cur, ok := l.seqs[ep]; !ok || seq < cur {
			l.seqs[ep] = seq
		}
	}
	return nil
}

func (l *snapshotLoader) Chunk(c *cluster.SnapshotContext, ch *engine.SnapshotChunk) error {
	slots, sources := l.slots[c.Key], l.sources[c.Key]
	applied, skipped, err := l.app.Engine.LoadSnapshotChunk(c.Key, c.Profile, ch,
		func(s engine.Slot) bool { return slots[s] }, func(src string) bool { return sources[src] })
	l.applied += int64(applied)
	l.skipped += int64(skipped)
	if err != nil {
		return fmt.Errorf("load snapshot context %s/%s: %w", c.Key.TenantID, c.Key.ModelName, err)
	}
	return nil
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
		case fasthttp.MethodPost:
			if !a.snapshotLoading.TryLock() {
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
				ctx.Response.Header.Set("Retry-After", "1")
				ctx.SetBodyString("another snapshot is being loaded\n")
				return
			}
			defer a.snapshotLoading.Unlock()
			// The stream first: PostBody would read a large body whole into the
			// request first (LoadSnapshot reads it once, up to MaxSnapshotBytes).
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
				if !errors.Is(err, cluster.ErrSnapshotCorrupt) && res.Bytes > 0 {
					ctx.SetStatusCode(fasthttp.StatusInternalServerError)
				}
				b, _ := json.Marshal(map[string]any{"error": err.Error(), "applied": res.Applied})
				ctx.SetBody(b)
				return
			}
			b, _ := json.Marshal(map[string]any{"bytes": res.Bytes, "contexts": res.Contexts, "entries": res.Entries,
				"bindings": res.Bindings, "applied": res.Applied, "skipped": res.Skipped})
			ctx.SetBody(b)
		default:
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			ctx.Response.Header.Set("Allow", "GET, POST")
		}
	}
}
