package floor

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestMain lets Spawn's test run this test binary as the floor server: the way
// conductor-bench runs it ("<bin> floor-server").
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Command {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		if err := Run(ctx, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func startServer(t *testing.T) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	done := make(chan struct{})
	go func() { _ = s.Serve(ln); close(done) }()
	t.Cleanup(func() { _ = s.Shutdown(); <-done })
	return s, ln.Addr().String()
}

func do(t *testing.T, c *fasthttp.HostClient, method, path string, body []byte, chunked bool) (int, []byte) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + path)
	req.Header.SetMethod(method)
	if chunked {
		req.SetBodyStream(bytes.NewReader(body), -1)
	} else {
		req.SetBody(body)
	}
	if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// TestServerReadsWholeBodies: the floor server reads every body in full (declared
// length, larger than its read buffer, and chunked), answers each request with the reply
// last set (SetReply; an empty msgpack map before), and counts requests and bytes.
func TestServerReadsWholeBodies(t *testing.T) {
	s, addr := startServer(t)
	c := &fasthttp.HostClient{Addr: addr}
	if code, got := do(t, c, fasthttp.MethodPost, "/query", []byte{1, 2, 3}, false); code != 200 || !bytes.Equal(got, []byte{0x80}) {
		t.Fatalf("before a reply: %d %x", code, got)
	}
	reply := []byte("the conductor's answer")
	if err := SetReply(addr, reply); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte{0xcd, 0x12, 0x34}, 100_000) // 300 KB: many reads of the 4 KiB buffer
	before := s.Bytes.Load()
	for i, chunked := range []bool{false, true, false} {
		code, got := do(t, c, fasthttp.MethodPost, "/query", big, chunked)
		if code != 200 || !bytes.Equal(got, reply) {
			t.Fatalf("request %d (chunked %v): %d %q", i, chunked, code, got)
		}
	}
	if read := s.Bytes.Load() - before; read != 3*int64(len(big)) {
		t.Fatalf("read %d body bytes, want %d", read, 3*len(big))
	}
	for range 50 { // keep-alive: one connection, many requests
		if code, got := do(t, c, fasthttp.MethodPost, "/query_by_hash", []byte{9}, false); code != 200 || !bytes.Equal(got, reply) {
			t.Fatalf("keep-alive request: %d %q", code, got)
		}
	}
	// The PUT is not counted as a request answered.
	if n := s.Requests.Load(); n != 1+3+50 {
		t.Fatalf("%d requests counted, want 54", n)
	}
	// The requests started the pulse, as queries start the conductor's (a quiet second
	// between two of them would start it again).
	if n := s.PulseStarts(); n < 1 {
		t.Fatal("the requests did not start the pulse")
	}
}

// TestSpawn runs the floor server in a process of its own (this test binary, as
// conductor-bench runs itself), queries it and stops it.
func TestSpawn(t *testing.T) {
	var logw bytes.Buffer
	p, err := Spawn(os.Args[0], &logw)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if p.PID == os.Getpid() || p.PID <= 0 {
		t.Fatalf("pid %d", p.PID)
	}
	c := &fasthttp.HostClient{Addr: p.Addr}
	if code, got := do(t, c, fasthttp.MethodPost, "/query", make([]byte, 10_000), false); code != 200 || !bytes.Equal(got, []byte{0x80}) {
		t.Fatalf("spawned server: %d %x", code, got)
	}
	p.Stop()
	if err := syscall.Kill(p.PID, 0); err == nil {
		t.Fatalf("process %d still running after Stop", p.PID)
	}
	if _, err := net.DialTimeout("tcp", p.Addr, time.Second); err == nil {
		t.Fatal("still accepting after Stop")
	}
	p.Stop() // a second Stop is a no-op
}

// TestSpawnFailure: a binary that exits without listening is an error, not a hang.
func TestSpawnFailure(t *testing.T) {
	if _, err := Spawn("/bin/false", os.Stderr); err == nil {
		t.Fatal("spawned /bin/false")
	}
}
