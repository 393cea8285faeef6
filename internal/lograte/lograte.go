// Package lograte rate-limits log lines per kind (level and message), so that a client or
// a source sending garbage in a loop cannot flood the log: per kind and interval the
// first Burst lines pass, the rest are counted, and the next line let through carries the
// count. Counters elsewhere (metrics) keep the exact numbers. Used per subscription by
// ingest and for the RPC server's per-connection errors.
package lograte

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"
)

// Defaults of Config; a zero field takes them.
const (
	DefaultBurst    = 10
	DefaultInterval = 10 * time.Second
	// maxKinds bounds the distinct lines one limiter tracks; lines past it share
	// one entry (the messages are constant strings, so a real source has a few dozen).
	maxKinds = 256
)

// Config configures a Limiter.
type Config struct {
	// Burst is how many lines of one kind pass per Interval; 0 takes DefaultBurst,
	// negative turns limiting off.
	Burst int
	// Interval is the window; 0 takes DefaultInterval.
	Interval time.Duration
	// Now is the clock; nil is time.Now. Tests step it.
	Now func() time.Time
}

// Limiter rate-limits the lines of one logger (one subscription, one server). Lines are told
// apart by level and message (the reason: messages are constant, details are
// attributes). Per kind and Interval the first Burst lines pass; the rest are counted,
// and the first line of the kind after the Interval carries that count as
// "suppressed" (Flush reports what is left). Counters elsewhere keep the exact numbers.
type Limiter struct {
	cfg  Config
	next slog.Handler

	mu   sync.Mutex
	keys map[logKey]*logEntry
}

type logKey struct {
	level slog.Level
	msg   string
}

type logEntry struct {
	start      time.Time
	n          int
	suppressed uint64
	// h is the handler (attributes included) that last logged the kind, for Flush.
	h slog.Handler
}

// New wraps next; Logger gives the rate-limited logger.
func New(next slog.Handler, cfg Config) *Limiter {
	cfg.Burst = cmp.Or(cfg.Burst, DefaultBurst)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Limiter{cfg: cfg, next: next, keys: make(map[logKey]*logEntry)}
}

// Logger returns a logger whose lines go through the limiter.
func (l *Limiter) Logger() *slog.Logger { return slog.New(&limitedHandler{l: l, next: l.next}) }

// admit decides whether a line passes; summary is the count to report with it.
func (l *Limiter) admit(k logKey, h slog.Handler) (pass bool, summary uint64) {
	if l.cfg.Burst < 0 {
		return true, 0
	}
	now := l.cfg.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.keys[k]
	if e == nil {
		if len(l.keys) >= maxKinds {
			k = logKey{level: k.level, msg: "(other log lines)"}
			e = l.keys[k]
		}
		if e == nil {
			e = &logEntry{start: now}
			l.keys[k] = e
		}
	}
	e.h = h
	if now.Sub(e.start) >= l.cfg.Interval {
		summary = e.suppressed
		e.start, e.n, e.suppressed = now, 0, 0
	}
	if e.n >= l.cfg.Burst {
		e.suppressed++
		return false, 0
	}
	e.n++
	return true, summary
}

// Flush logs one summary line per kind with lines suppressed since its last line (for a
// source that stops).
func (l *Limiter) Flush(ctx context.Context) {
	type pending struct {
		k logKey
		e logEntry
	}
	var out []pending
	l.mu.Lock()
	for k, e := range l.keys {
		if e.suppressed > 0 {
			out = append(out, pending{k, *e})
			e.suppressed = 0
		}
	}
	l.mu.Unlock()
	for _, p := range out {
		r := slog.NewRecord(l.cfg.Now(), p.k.level, p.k.msg, 0)
		r.AddAttrs(slog.Bool("summary", true), slog.Uint64("suppressed", p.e.suppressed),
			slog.Duration("suppressed_window", l.cfg.Now().Sub(p.e.start)))
		if p.e.h.Enabled(ctx, p.k.level) {
			_ = p.e.h.Handle(ctx, r)
		}
	}
}

// limitedHandler is the slog.Handler of a Limiter's logger (and of its With clones).
type limitedHandler struct {
	l    *Limiter
	next slog.Handler
}

func (h *limitedHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.next.Enabled(ctx, level)
}

func (h *limitedHandler) Handle(ctx context.Context, r slog.Record) error {
	pass, summary := h.l.admit(logKey{level: r.Level, msg: r.Message}, h.next)
	if !pass {
		return nil
	}
	if summary > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Uint64("suppressed", summary), slog.Duration("suppressed_window", h.l.cfg.Interval))
	}
	return h.next.Handle(ctx, r)
}

func (h *limitedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &limitedHandler{l: h.l, next: h.next.WithAttrs(attrs)}
}

func (h *limitedHandler) WithGroup(name string) slog.Handler {
	return &limitedHandler{l: h.l, next: h.next.WithGroup(name)}
}
