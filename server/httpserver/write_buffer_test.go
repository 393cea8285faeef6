package httpserver

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/conductor-go/conductor/server/internal/limits"
)

// writeCounting hands out connections that count the writes made on them. Its
// connections are not TCP connections, so Serve serves them as they are (no fastConn):
// each count is one flush of fasthttp's write buffer.
type writeCounting struct {
	net.Listener
	writes *atomic.Int64
}

func (l writeCounting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countedConn{c, l.writes}, nil
}

type countedConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countedConn) Write(p []byte) (int, error) {
	c.writes.Add(1) // before the bytes leave: a client that has them has seen the count
	return c.Conn.Write(p)
}

// TestHTTPWriteBufferBytes: Limits.HTTPWriteBufferBytes (http_write_buffer_bytes) is the
// server's write buffer: a 12 KiB answer leaves in two writes with the 4 KiB default and
// in one with a 64 KiB buffer, and arrives whole either way.
func TestHTTPWriteBufferBytes(t *testing.T) {
	answer := bytes.Repeat([]byte("conductor"), 12<<10/9)
	for _, c := range []struct {
		buffer, writes int
	}{{0, 2}, {64 << 10, 1}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var writes atomic.Int64
		h := New(Options{Limits: limits.Config{HTTPWriteBufferBytes: c.buffer},
			Extra: map[string]fasthttp.RequestHandler{"/big": func(ctx *fasthttp.RequestCtx) { ctx.SetBody(answer) }}})
		served := make(chan error, 1)
		go func() { served <- h.Serve(writeCounting{ln, &writes}) }()
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		for i := range 3 {
			before := writes.Load()
			if _, err := io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, answer) {
				t.Fatalf("buffer %d, answer %d: %d bytes, %v", c.buffer, i, len(got), err)
			}
			if n := writes.Load() - before; n != int64(c.writes) {
				t.Errorf("buffer %d, answer %d of %d bytes: %d writes, want %d", c.buffer, i, len(answer), n, c.writes)
			}
		}
		conn.Close()
		if err := h.Shutdown(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	}
}
