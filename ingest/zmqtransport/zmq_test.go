//go:build cgo

package zmqtransport_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/ingest/zmqtest"
	"github.com/conductor-go/conductor/ingest/zmqtransport"
)

// TestConnReceivesWholeMessages: a Conn subscribed to a publisher waits in the poller
// until a message is ready, receives all its frames back to back into the buffer (grown
// to fit, an outlier above MappedAbove mapped outside the heap), its SUB socket has the
// high-water mark it was opened with, and the transport counts the Conn until it is
// freed.
func TestConnReceivesWholeMessages(t *testing.T) {
	tr, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := zmqtest.NewForTest(t, zmqtest.Config{Topic: "kv"})
	z, err := zmqtransport.NewConn(tr, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := z.OpenSub(p.Endpoint(), 1000); err != nil {
		t.Fatal(err)
	}
	if hwm, err := z.RcvHWM(); hwm != 1000 || err != nil {
		t.Fatalf("RcvHWM = %d, %v; want the 1000 OpenSub set", hwm, err)
	}
	if !z.HasSub() || z.HasDealer() || tr.Open() != 1 {
		t.Fatalf("sub %v dealer %v open %d", z.HasSub(), z.HasDealer(), tr.Open())
	}
	if err := tr.Close(); err == nil || !strings.Contains(err.Error(), "still open") {
		t.Fatalf("Close with a Conn open = %v", err)
	}
	if err := p.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	buf := zmqtransport.RecvBuf{B: make([]byte, 16)}
	var sizes [zmqtransport.MaxFrames]int
	for _, size := range []int{100, 200 << 10, zmqtransport.MappedAbove + 1} {
		payload := bytes.Repeat([]byte{byte(size)}, size)
		seq, err := p.Publish(payload)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for deadline := time.Now().Add(5 * time.Second); n == 0 && time.Now().Before(deadline); {
			mask, err := z.Wait(time.Second, &stop)
			if err != nil {
				t.Fatal(err)
			}
			if mask&(1<<zmqtransport.SockSub) == 0 {
				continue
			}
			if n, err = z.Recv(zmqtransport.SockSub, &buf, &sizes); err != nil {
				t.Fatal(err)
			}
		}
		if n != 3 || sizes[0] != 2 || sizes[1] != 8 || sizes[2] != size || z.Used() != 10+size {
			t.Fatalf("size %d: %d frames, sizes %v, used %d", size, n, sizes[:3], z.Used())
		}
		b := buf.B
		if string(b[:2]) != "kv" || binary.BigEndian.Uint64(b[2:10]) != seq || !bytes.Equal(b[10:10+size], payload) {
			t.Fatalf("size %d: frames not back to back in the buffer", size)
		}
		if len(b) < 10+size {
			t.Fatalf("buffer of %d bytes for a %d-byte message", len(b), 10+size)
		}
	}
	if n, err := z.Recv(zmqtransport.SockSub, &buf, &sizes); n != 0 || err != nil {
		t.Fatalf("Recv with nothing ready = %d, %v", n, err)
	}
	buf.Release()
	z.Free()
	z.Free() // idempotent
	if tr.Open() != 0 {
		t.Fatalf("%d Conns open after Free", tr.Open())
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := zmqtransport.NewConn(tr, -1); err == nil {
		t.Fatal("NewConn on a closed transport")
	}
}

// openConn returns a Conn of a new transport of cfg; both are freed at the end of the
// test.
func openConn(t *testing.T, cfg zmqtransport.TransportConfig) *zmqtransport.Conn {
	t.Helper()
	tr, err := zmqtransport.NewTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	z, err := zmqtransport.NewConn(tr, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Free)
	return z
}

// TestWaitWokenByPastDeadline: a Wait parked in the poller returns at once when another
// goroutine moves the poll file's deadline to the past (how Stop wakes a subscriber).
func TestWaitWokenByPastDeadline(t *testing.T) {
	z := openConn(t, zmqtransport.TransportConfig{})
	if err := z.OpenSub("tcp://127.0.0.1:1", 1000); err != nil { // nobody there: never ready
		t.Fatal(err)
	}
	var stop atomic.Bool
	done := make(chan int)
	go func() {
		mask, _ := z.Wait(time.Minute, &stop)
		done <- mask
	}()
	// Set stop first: a Wait that has not armed its deadline yet sees it; one parked
	// already is woken by the deadline.
	stop.Store(true)
	_ = z.PollFile().SetReadDeadline(zmqtransport.PastDeadline)
	select {
	case m := <-done:
		if m&(1<<zmqtransport.SockSub) != 0 {
			t.Fatalf("mask %b: SUB ready with no publisher", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait not woken")
	}
}

// TestSubReconnectBacksOff: a SUB socket whose publisher is not there reconnects after
// pauses that double from ReconnectInterval up to ReconnectIntervalMax (libzmq reports
// each pause, jitter included, in its CONNECT_RETRIED event), instead of retrying every
// 100 ms for ever: a thousand dead endpoints then cost a few attempts a second, not ten
// thousand.
func TestSubReconnectBacksOff(t *testing.T) {
	const ivl, ivlMax = 10, 80 // milliseconds
	z := openConn(t, zmqtransport.TransportConfig{ReconnectInterval: ivl * time.Millisecond,
		ReconnectIntervalMax: ivlMax * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tcp://" + ln.Addr().String()
	ln.Close() // nobody listens there now: every attempt is refused
	if err := z.OpenSub(dead, 1000); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var pauses []uint32
	for deadline := time.Now().Add(30 * time.Second); len(pauses) < 7; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d reconnection attempts reported: %v", len(pauses), pauses)
		}
		if _, err := z.Wait(time.Second, &stop); err != nil {
			t.Fatal(err)
		}
		for {
			ev, v, err := z.MonEvent()
			if err != nil {
				t.Fatal(err)
			}
			if ev == 0 {
				break
			}
			if ev == zmqtransport.EvConnectRetried {
				pauses = append(pauses, v)
			}
		}
	}
	// Pause k is min(ivl·2^k, max) plus up to ivl of jitter.
	for k, p := range pauses {
		base := min(ivl<<k, ivlMax)
		if p < uint32(base) || p >= uint32(base+ivl) {
			t.Fatalf("pause %d = %d ms, want %d..%d (all: %v)", k, p, base, base+ivl-1, pauses)
		}
	}
	if _, err := zmqtransport.NewTransport(zmqtransport.TransportConfig{ReconnectInterval: time.Second,
		ReconnectIntervalMax: time.Millisecond}); err == nil {
		t.Fatal("a max below the interval accepted")
	}
}
