package server

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/engine"
)

// Access log defaults (config keys access_log_trace_header, access_log_buffer_bytes,
// access_log_flush_interval_ms).
const (
	DefaultAccessLogTraceHeader = "x-trace-id"
	DefaultAccessLogBufferBytes = 1 << 20
	DefaultAccessLogFlush       = time.Second
	// maxTraceIDBytes caps the trace id copied from a request header into a line.
	maxTraceIDBytes = 128
)

// AccessLogConfig configures the HTTP access log. It is off unless Path is set.
type AccessLogConfig struct {
	// Path is the file lines are appended to; "-" means standard output; "" disables.
	Path string
	// TraceHeader names the request header whose value is logged as trace_id.
	TraceHeader string
	// BufferBytes bounds the lines held in memory between flushes; a line that does not
	// fit is dropped and counted (conductor_access_log_dropped_lines_total).
	BufferBytes int
	// FlushInterval is how often the buffer is written out (also when half full).
	FlushInterval time.Duration
}

// withDefaults fills the zero fields.
func (c AccessLogConfig) withDefaults() AccessLogConfig {
	if c.TraceHeader == "" {
		c.TraceHeader = DefaultAccessLogTraceHeader
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = DefaultAccessLogBufferBytes
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = DefaultAccessLogFlush
	}
	return c
}

// AccessLog writes one JSON line per HTTP request. A request appends its line to a
// bounded in-memory buffer under a mutex (no allocation, no I/O on the request path); a
// background goroutine writes the buffer out every FlushInterval or when it is half full.
// When the writer falls behind and the buffer is full, lines are dropped and counted.
type AccessLog struct {
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

	kick chan struct{}
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

// OpenAccessLog opens cfg.Path for appending and starts the flusher; nil, nil when the
// log is disabled.
func OpenAccessLog(cfg AccessLogConfig) (*AccessLog, error) {
	if cfg.Path == "" {
		return nil, nil
	}
	if cfg.Path == "-" {
		return NewAccessLog(os.Stdout, nil, cfg), nil
	}
	f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open access_log %s: %w", cfg.Path, err)
	}
	return NewAccessLog(f, f, cfg), nil
}

// NewAccessLog starts an access log writing to w (closed by Close when closer is set).
func NewAccessLog(w io.Writer, closer io.Closer, cfg AccessLogConfig) *AccessLog {
	cfg = cfg.withDefaults()
	l := &AccessLog{
		w: w, closer: closer, traceHeader: cfg.TraceHeader, limit: cfg.BufferBytes, interval: cfg.FlushInterval,
		buf: make([]byte, 0, cfg.BufferBytes), spare: make([]byte, 0, cfg.BufferBytes),
		kick: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
	l.lines.New = func() any { b := make([]byte, 0, 512); return &b }
	go l.run()
	return l
}

func (l *AccessLog) run() {
	defer close(l.done)
	t := time.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-l.kick:
		case <-l.quit:
			l.Flush()
			return
		}
		l.Flush()
	}
}

// Flush writes out what is buffered: the full buffer is swapped for the empty spare under
// the lock, and written outside it, so requests never wait for I/O.
func (l *AccessLog) Flush() {
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
func (l *AccessLog) Close() error {
	if l == nil {
		return nil
	}
	var err error
	l.once.Do(func() {
		close(l.quit)
		<-l.done
		if l.closer != nil {
			err = l.closer.Close()
		}
	})
	return err
}

// Dropped is the number of lines dropped because the buffer was full.
func (l *AccessLog) Dropped() uint64 { return l.dropped.Load() }

// commit appends one finished line (a copy: line is the caller's scratch). The buffer
// never grows past its capacity, so this allocates nothing.
func (l *AccessLog) commit(line []byte) {
	l.mu.Lock()
	if len(l.buf)+len(line) > l.limit {
		l.mu.Unlock()
		l.dropped.Add(1)
		return
	}
	l.buf = append(l.buf, line...)
	half := len(l.buf) > l.limit/2
	l.mu.Unlock()
	if half {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// accessEntry is what the query handlers report about one request.
type accessEntry struct {
	route        string
	model        string // aliases the request body: log before the handler returns
	tokens       int64
	blocksHashed int
	matched      int64
	query        bool // model, tokens, blocks_hashed and matched are meaningful
}

// fill records an answered query: its model (aliasing the request body), prompt length
// in tokens, blocks hashed and the longest match over the instances.
func (e *accessEntry) fill(model string, tokens int64, hashed int, res *engine.Result) {
	e.query, e.model, e.tokens, e.blocksHashed, e.matched = true, model, tokens, hashed, 0
	for i := range res.Instances {
		e.matched = max(e.matched, res.Instances[i].Disk)
	}
}

// logAccess writes the access line of a contract route request when the log is on.
func (h *HTTPServer) logAccess(ctx *fasthttp.RequestCtx, start time.Time, route string, e *accessEntry) {
	if h.access == nil {
		return
	}
	e.route = route
	h.access.log(ctx, start, e)
}

// logQuery writes the access line of an RPC Query call when the log is on.
func (s *RPCServer) logQuery(start time.Time, model string, tokens int, res *engine.Result, serr *Error) {
	if s.access == nil {
		return
	}
	e := accessEntry{route: "Query"}
	code := int64(0)
	if serr != nil {
		code = int64(rpcCode(serr))
	} else {
		e.fill(model, int64(tokens), res.BlocksHashed(), res)
	}
	s.access.logRPC(start, &e, code)
}

// log formats the line of one finished HTTP request and commits it.
func (l *AccessLog) log(ctx *fasthttp.RequestCtx, start time.Time, e *accessEntry) {
	l.line(start, `","route":`, e, int64(ctx.Response.StatusCode()), ctx.Request.Header.Peek(l.traceHeader))
}

// logRPC writes the line of one RPC call: "function" instead of "route", and the RPC
// result code (0 = OK) as status; RPC carries no headers, hence no trace id.
func (l *AccessLog) logRPC(start time.Time, e *accessEntry, code int64) {
	l.line(start, `","function":`, e, code, nil)
}

// line formats one access line and commits it; nameKey introduces the route or function.
func (l *AccessLog) line(start time.Time, nameKey string, e *accessEntry, status int64, tid []byte) {
	now := time.Now()
	bp := l.lines.Get().(*[]byte)
	b := append((*bp)[:0], `{"time":"`...)
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, nameKey...)
	b = appendJSONString(b, e.route, 256)
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

// registerAccessLog exports the access log's dropped lines and write errors.
func (m *Metrics) registerAccessLog(l *AccessLog) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_access_log_dropped_lines_total",
			Help: "Access log lines dropped because the buffer was full (the writer fell behind)."},
			func() float64 { return float64(l.dropped.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "conductor_access_log_write_errors_total",
			Help: "Failed writes of the access log buffer."},
			func() float64 { return float64(l.errs.Load()) }))
}

// parseAccessLogConfig reads the access_log* keys of the config file.
func parseAccessLogConfig(path string, root map[string]json.RawMessage, cfg *AccessLogConfig) error {
	for _, k := range []struct {
		key string
		dst *string
	}{{"access_log", &cfg.Path}, {"access_log_trace_header", &cfg.TraceHeader}} {
		if raw, ok := root[k.key]; ok {
			s, ok := jsonString(raw)
			if !ok {
				return fmt.Errorf("config file %s: %s must be a string", path, k.key)
			}
			*k.dst = s
		}
	}
	if raw, ok := root["access_log_buffer_bytes"]; ok {
		v, err := jsonInt(raw)
		if err != nil || v < 4096 || v > 1<<30 {
			return fmt.Errorf("config file %s: access_log_buffer_bytes must be an integer in 4096..1073741824", path)
		}
		cfg.BufferBytes = int(v)
	}
	if raw, ok := root["access_log_flush_interval_ms"]; ok {
		v, err := jsonInt(raw)
		if err != nil || v < 1 || v > 60000 {
			return fmt.Errorf("config file %s: access_log_flush_interval_ms must be an integer in 1..60000", path)
		}
		cfg.FlushInterval = time.Duration(v) * time.Millisecond
	}
	return nil
}
