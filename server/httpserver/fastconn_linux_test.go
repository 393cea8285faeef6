package httpserver

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// fastPair returns a fastConn and the plain TCP connection at the other end.
func fastPair(t *testing.T) (*fastConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := fastListener{ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	fc, ok := c.(*fastConn)
	if !ok {
		t.Fatalf("accepted %T, want *fastConn", c)
	}
	t.Cleanup(func() { fc.Close(); peer.Close() })
	return fc, peer
}

// TestFastConnRoundTrip: bytes go both ways intact; a write far larger than the socket
// buffers (the sender's shrunk to a few KiB) completes as the peer reads, through the
// waits for writability (EAGAIN), and reports its full length; a read that finds nothing
// waits (EAGAIN) and gets what the peer sends then; the
// peer's close reads as io.EOF.
func TestFastConnRoundTrip(t *testing.T) {
	fc, peer := fastPair(t)
	if err := fc.Conn.(*net.TCPConn).SetWriteBuffer(4096); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 512<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	type result struct {
		n   int
		err error
	}
	wrote := make(chan result, 1)
	go func() {
		n, err := fc.Write(big)
		wrote <- result{n, err}
	}()
	got, err := io.ReadAll(io.LimitReader(peer, int64(len(big))))
	if err != nil {
		t.Fatal(err)
	}
	if w := <-wrote; w.err != nil || w.n != len(big) {
		t.Fatalf("write: %d, %v", w.n, w.err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("peer read other bytes than written")
	}

	// A read that finds nothing waits in the poller; the peer writes once it does.
	waiting := make(chan struct{}, 1)
	fc.readWaits = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	buf := make([]byte, 16)
	read := make(chan result, 1)
	go func() {
		n, err := io.ReadAtLeast(fc, buf, 5)
		read <- result{n, err}
	}()
	<-waiting
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if r := <-read; r.err != nil || string(buf[:r.n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:r.n], r.err)
	}
	fc.readWaits = nil
	peer.Close()
	if n, err := fc.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want 0, EOF", n, err)
	}
}

// TestFastConnDeadlineAndClose: a read past its deadline fails as a timeout (what
// fasthttp's read timeout relies on), and a read or write after Close fails with
// net.ErrClosed, as on a plain connection.
func TestFastConnDeadlineAndClose(t *testing.T) {
	fc, _ := fastPair(t)
	if err := fc.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	_, err := fc.Read(buf)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
	fc.Close()
	if _, err := fc.Read(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if _, err := fc.Write(buf); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
}

// TestFastConnAllocs: a read and a write allocate nothing.
func TestFastConnAllocs(t *testing.T) {
	fc, peer := fastPair(t)
	msg := []byte("0123456789abcdef")
	buf := make([]byte, len(msg))
	n := testing.AllocsPerRun(100, func() {
		if _, err := fc.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(peer, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(fc, buf); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per write and read", n)
	}
}
