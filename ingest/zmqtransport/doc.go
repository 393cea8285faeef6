// Package zmqtransport is the libzmq layer of ingest: one shared ZMQ context (Transport)
// and, per subscription, a Conn holding its SUB socket, the socket's connection monitor
// and the DEALER of a replay attempt. A Conn receives a whole multipart message into a
// reused buffer with one cgo call, and waits for input in Go's network poller (the
// sockets' ZMQ_FD in an epoll set), so a subscription costs a few descriptors and no OS
// thread.
//
// It needs cgo (libzmq through pkg-config). Built with CGO_ENABLED=0 the package keeps
// its API, and NewTransport returns ErrNoCgo: the processes that import it still build,
// and a ZMQ subscription fails at run time with a clear error.
package zmqtransport

import (
	"errors"
	"syscall"
	"time"
)

// ErrNoCgo is what NewTransport returns in a binary built without cgo.
var ErrNoCgo = errors.New("ZMQ subscriptions need cgo (this binary was built with CGO_ENABLED=0)")

// Transport defaults; a zero TransportConfig field takes them.
const (
	// DefaultIOThreads is libzmq's I/O thread count for all subscriptions together (one
	// thread moves about a gigabyte per second).
	DefaultIOThreads = 1
	// DefaultMaxSockets bounds the sockets of the shared context (each subscription uses
	// three, four while it replays). libzmq's own default, 1023, would cap a conductor at
	// about 300 services.
	DefaultMaxSockets = 65535
	// DefaultReconnectInterval is libzmq's first pause before reconnecting a SUB socket
	// whose publisher is not there (ZMQ_RECONNECT_IVL, libzmq's own default).
	DefaultReconnectInterval = 100 * time.Millisecond
	// DefaultReconnectIntervalMax bounds the pause as it doubles after each failed
	// attempt (ZMQ_RECONNECT_IVL_MAX; libzmq's default, 0, never doubles it, so each dead
	// endpoint costs ten connection attempts a second). A publisher that comes back is
	// connected within this long; what it published meanwhile comes back through replay.
	DefaultReconnectIntervalMax = 5 * time.Second
)

// TransportConfig configures the ZMQ context shared by every subscriber.
type TransportConfig struct {
	// IOThreads is the number of libzmq I/O threads; 0 takes DefaultIOThreads.
	IOThreads int
	// MaxSockets bounds the open sockets (libzmq ZMQ_MAX_SOCKETS); 0 takes
	// DefaultMaxSockets, and libzmq lowers it to its own limit.
	MaxSockets int
	// ReconnectInterval and ReconnectIntervalMax set the reconnection back-off of every
	// socket opened in the transport (ZMQ_RECONNECT_IVL, ZMQ_RECONNECT_IVL_MAX, at
	// millisecond resolution): the pause before a reconnection starts at the first and
	// doubles after each failed attempt up to the second (libzmq adds up to one first
	// interval of jitter). 0 takes DefaultReconnectInterval and
	// DefaultReconnectIntervalMax.
	ReconnectInterval, ReconnectIntervalMax time.Duration
}

// PastDeadline is a poll-file deadline that wakes a waiting Conn at once.
var PastDeadline = time.Unix(1, 0)

// MappedAbove is the size above which a receive buffer is an anonymous mapping outside
// the Go heap, given back to the system as soon as it is released.
const MappedAbove = 1 << 20

// RecvBuf is a subscriber's receive buffer. Up to MappedAbove bytes it is Go memory with
// headroom; an outlier above that gets exactly its size in an anonymous mapping, so that
// giving it back (Release) returns the memory to the system at once instead of at some
// later garbage collection and scavenge.
type RecvBuf struct {
	// B is the buffer; Conn.Recv grows it (its contents are not kept) to fit a message.
	B      []byte
	mapped bool
}

// grow replaces the buffer with one of at least need bytes (its contents are not kept).
func (r *RecvBuf) grow(need int) []byte {
	r.Release()
	if need > MappedAbove {
		if m, err := syscall.Mmap(-1, 0, need, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON); err == nil {
			r.B, r.mapped = m, true
			return r.B
		}
	}
	r.B = make([]byte, need+need/2)
	return r.B
}

// Release unmaps a mapped buffer (nothing may refer to it any more) and drops B; Go
// memory is left to the collector.
func (r *RecvBuf) Release() {
	if r.mapped {
		_ = syscall.Munmap(r.B)
		r.mapped = false
	}
	r.B = nil
}
