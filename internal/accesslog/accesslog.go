// Package accesslog writes one JSON line per served request (HTTP route or RPC call):
// formatted into a bounded in-memory buffer without allocation or I/O on the request
// path, written out by a background goroutine. Both transports (server/httpserver,
// server/rpcserver) log through it.
package accesslog

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/deferred"
)

// Defaults (config keys access_log_trace_header, access_log_buffer_bytes,
// access_log_flush_interval_ms).
const (
	DefaultTraceHeader = "x-trace-id"
	DefaultBufferBytes = 1 << 20
	DefaultFlush       = time.Second
	// maxTraceIDBytes caps the trace id copied from a request header into a line.
	maxTraceIDBytes = 128
)

// Config configures the access log. It is off unless Path is set.
type Config struct {
	// Path is the file lines are appended to; "-" means standard output; "" disables.
	Path string
	// TraceHeader names the request header whose value is logged as trace_id.
	TraceHeader string
	// BufferBytes bounds the lines held in memory between flushes; a line that does not
	// fit is dropped and counted (conductor_access_log_dropped_lines_total).
	BufferBytes int
	// FlushInterval is how long after its first line the buffer is written out (at once
	// when half full).
	FlushInterval time.Duration
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	if c.TraceHeader == "" {
		c.TraceHeader = DefaultTraceHeader
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = DefaultFlush
	}
	return c
}

// Log writes one JSON line per request. A request appends its line to a
// bounded in-memory buffer under a mutex (no allocation, no I/O on the request path); a
// background goroutine writes the buffer out FlushInterval after its first line, or at
// once when it is half full, and sleeps while no request is served. When the writer falls
// behind and the buffer is full, lines are dropped and counted.
type Log struct {
	w           io.Writer
	closer      io.Closer
	traceHeader string
	limit       int
	interval    time.Duration

	flushMu sync.Mutex // one Flush at a time
	lines   sync.Pool  // *[]byte: per-request line scratch

	mu      sync.Mutex
	buf     []byte
	spare   []byte
	dropped atomic.Uint64
	written atomic.Uint64
	errs    atomic.Uint64

	flusher *deferred.Runner
	once    sync.Once
}

// Open opens cfg.Path for appending and starts the flusher; nil, nil when the log is
// disabled.
func Open(cfg Config) (*Log, error) {
	if cfg.Path == "" {
		return nil, nil
	}
	if cfg.Path == "-" {
		return New(os.Stdout, nil, cfg), nil
	}
	f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open access_log %s: %w", cfg.Path, err)
	}
	return New(f, f, cfg), nil
}

// New starts an access log writing to w (closed by Close when closer is set).
func New(w io.Writer, closer io.Closer, cfg Config) *Log {
	cfg = cfg.withDefaults()
	l := &Log{
		w: w, closer: closer, traceHeader: cfg.TraceHeader, limit: cfg.BufferBytes, interval: cfg.FlushInterval,
		buf: make([]byte, 0, cfg.BufferBytes), spare: make([]byte, 0, cfg.BufferBytes),
	}
	l.lines.New = func() any { b := make([]byte, 0, 512); return &b }
	l.flusher = deferred.Start(l.interval, l.Flush)
	return l
}

// Flush writes out what is buffered: the full buffer is swapped for the empty spare under
// the lock, and written outside it, so requests never wait for I/O.
func (l *Log) Flush() {
	l.flushMu.Lock()
	defer l.flushMu.Unlock()
	l.mu.Lock()
	out := l.buf
	l.buf, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	if len(out) > 0 {
		if _, err := l.w.Write(out); err != nil {
			l.errs.Add(1)
		} else {
			l.written.Add(uint64(len(out)))
		}
	}
	l.mu.Lock()
	l.spare = out[:0]
	l.mu.Unlock()
}

// Close flushes and stops the flusher, then closes the file; it is idempotent.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	var err error
	l.once.Do(func() {
		l.flusher.Close()
		l.Flush()
		if l.closer != nil {
			err = l.closer.Close()
		}
	})
	return err
}

// Dropped is the number of lines dropped because the buffer was full.
func (l *Log) Dropped() uint64 { return l.dropped.Load() }

// WriteErrors is the number of failed writes of the buffer.
func (l *Log) WriteErrors() uint64 { return l.errs.Load() }

// TraceHeader is the request header whose value an HTTP line logs as trace_id.
func (l *Log) TraceHeader() string { return l.traceHeader }

// commit appends one finished line (a copy: line is the caller's scratch). The buffer
// never grows past its capacity, so this allocates nothing.
func (l *Log) commit(line []byte) {
	l.mu.Lock()
	if len(l.buf)+len(line) > l.limit {
		l.mu.Unlock()
		l.dropped.Add(1)
		return
	}
	first := len(l.buf) == 0
	l.buf = append(l.buf, line...)
	half := len(l.buf) > l.limit/2
	l.mu.Unlock()
	switch {
	case half:
		l.flusher.Now()
	case first:
		l.flusher.Request() // written FlushInterval from now
	}
}

// Entry is what a handler reports about one request. Route names the HTTP route or the
// RPC function; the rest is set by Fill for an answered query.
type Entry struct {
	Route        string
	model        string // aliases the request body: log before the handler returns
	tokens       int64
	blocksHashed int
	matched      int64
	query        bool // model, tokens, blocks_hashed and matched are meaningful
}

// Fill records an answered query: its model (aliasing the request body), prompt length
// in tokens, blocks hashed and the longest match over the instances.
func (e *Entry) Fill(model string, tokens int64, hashed int, res *engine.Result) {
	e.query, e.model, e.tokens, e.blocksHashed, e.matched = true, model, tokens, hashed, 0
	for i := range res.Instances {
		e.matched = max(e.matched, res.Instances[i].Disk)
	}
}

// HTTP formats the line of one finished HTTP request and commits it: its route, status
// and the value of the trace header (traceID, may be nil). A nil log does nothing.
func (l *Log) HTTP(start time.Time, e *Entry, status int, traceID []byte) {
	if l == nil {
		return
	}
	l.line(start, `","route":`, e, int64(status), traceID)
}

// RPC writes the line of one RPC call: "function" instead of "route", and the RPC
// result code (0 = OK) as status; RPC carries no headers, hence no trace id. A nil log
// does nothing.
func (l *Log) RPC(start time.Time, e *Entry, code int64) {
	if l == nil {
		return
	}
	l.line(start, `","function":`, e, code, nil)
}

// line formats one access line and commits it; nameKey introduces the route or function.
func (l *Log) line(start time.Time, nameKey string, e *Entry, status int64, tid []byte) {
	now := time.Now()
	bp := l.lines.Get().(*[]byte)
	b := append((*bp)[:0], `{"time":"`...)
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, nameKey...)
	b = appendJSONString(b, e.Route, 256)
	if e.query {
		b = append(b, `,"model":`...)
		b = appendJSONString(b, e.model, 256)
		b = append(b, `,"tokens":`...)
		b = strconv.AppendInt(b, e.tokens, 10)
		b = append(b, `,"blocks_hashed":`...)
		b = strconv.AppendInt(b, int64(e.blocksHashed), 10)
		b = append(b, `,"matched":`...)
		b = strconv.AppendInt(b, e.matched, 10)
	}
	b = append(b, `,"latency_us":`...)
	b = strconv.AppendFloat(b, float64(now.Sub(start).Nanoseconds())/1e3, 'f', 1, 64)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, status, 10)
	if len(tid) > 0 {
		b = append(b, `,"trace_id":`...)
		b = appendJSONString(b, unsafe.String(&tid[0], len(tid)), maxTraceIDBytes)
	}
	b = append(b, "}\n"...)
	l.commit(b)
	*bp = b
	l.lines.Put(bp)
}

// appendJSONString appends s (at most max bytes of it, cut at a character boundary) as a
// JSON string: quotes, backslashes and control characters escaped, invalid UTF-8 replaced.
func appendJSONString(b []byte, s string, max int) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		if i >= max {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
