//go:build cgo

package zmqtransport

// The subscriber talks to libzmq through this small shim instead of pebbe/zmq4's Socket:
// pebbe allocates a fresh []byte per frame and makes about five cgo calls per frame
// (msg init, recv, memcpy, close, RCVMORE), while the shim receives a whole multipart
// message into a reused Go buffer with one cgo call. It links the same libzmq pebbe does.

/*
#cgo !windows pkg-config: libzmq
#cgo noescape cz_recv
#cgo nocallback cz_recv
#cgo noescape cz_copy
#cgo nocallback cz_copy
#cgo nocallback cz_ready
#include <zmq.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#define CZ_MAXF 4
#define CZ_SUB 0
#define CZ_DEALER 1
#define CZ_MON 2

// The monitor reports connects, disconnects and scheduled reconnects: a disconnect that
// is not followed by a scheduled reconnect was a protocol error (a message over
// ZMQ_MAXMSGSIZE, or malformed ZMTP), after which libzmq gives the connection up.
#define CZ_MON_EVENTS (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED)

typedef struct {
	void *ctx;
	void *sock[3];
	zmq_msg_t parts[CZ_MAXF];
	int nparts;
	size_t sizes[CZ_MAXF];
	size_t need;
} cz_conn;

// cz_ctx_new creates the shared context; NULL (errno set) on failure.
static void *cz_ctx_new(int io_threads, int max_sockets) {
	void *ctx = zmq_ctx_new();
	if (ctx == NULL) return NULL;
	int limit = zmq_ctx_get(ctx, ZMQ_SOCKET_LIMIT);
	if (limit > 0 && max_sockets > limit) max_sockets = limit;
	if (zmq_ctx_set(ctx, ZMQ_IO_THREADS, io_threads) || zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, max_sockets)) {
		int e = zmq_errno();
		zmq_ctx_term(ctx);
		errno = e;
		return NULL;
	}
	// libzmq starts its threads with the first socket, and aborts if it cannot create
	// their poll sets then: start them now, while descriptors are known to be there,
	// rather than at a subscription that may find the process out of them.
	void *s = zmq_socket(ctx, ZMQ_PAIR);
	if (s == NULL) {
		int e = zmq_errno();
		zmq_ctx_term(ctx);
		errno = e;
		return NULL;
	}
	zmq_close(s);
	return ctx;
}

static int cz_ctx_term(void *ctx) {
	int rc;
	do { rc = zmq_ctx_term(ctx); } while (rc < 0 && zmq_errno() == EINTR);
	return rc < 0 ? zmq_errno() : 0;
}

static int cz_errno(void) { return zmq_errno(); }

static cz_conn *cz_new(void *ctx) {
	cz_conn *c = calloc(1, sizeof(cz_conn));
	if (c == NULL) return NULL;
	c->ctx = ctx;
	for (int i = 0; i < CZ_MAXF; i++) zmq_msg_init(&c->parts[i]);
	return c;
}

static void cz_release(cz_conn *c) {
	for (int i = 0; i < c->nparts; i++) {
		zmq_msg_close(&c->parts[i]);
		zmq_msg_init(&c->parts[i]);
	}
	c->nparts = 0;
}

static int cz_setint(void *s, int opt, int v) { return zmq_setsockopt(s, opt, &v, sizeof v); }

static int cz_setmax(void *s, int64_t maxmsg) { return zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg); }

static void cz_close_sock(cz_conn *c, int which) {
	if (c->sock[which] != NULL) {
		// Stopping the monitor closes libzmq's end of the monitor pipe now, from this
		// thread; left to the reaper, neither end of the pipe is ever destroyed in a
		// shared context, which leaks two descriptors per closed SUB. The reader must
		// still be open then (callers close the SUB first): libzmq's end may be in a
		// blocking send to it from the I/O thread, holding the lock this waits for.
		if (which == CZ_SUB) zmq_socket_monitor(c->sock[which], NULL, 0);
		zmq_close(c->sock[which]);
		c->sock[which] = NULL;
	}
}

// cz_open_sub creates the SUB socket and its connection monitor (bound at the unique
// inproc address monaddr) and connects. Returns 0, or an errno with *step naming what
// failed.
static int cz_open_sub(cz_conn *c, const char *endpoint, int rcvhwm, int64_t maxmsg, int ivl, int ivlmax, const char *monaddr, const char **step) {
	void *s = zmq_socket(c->ctx, ZMQ_SUB);
	if (s == NULL) { *step = "create SUB socket"; return zmq_errno(); }
	c->sock[CZ_SUB] = s;
	if (cz_setint(s, ZMQ_LINGER, 0) || cz_setint(s, ZMQ_IPV6, 1) || cz_setint(s, ZMQ_RCVHWM, rcvhwm) || cz_setmax(s, maxmsg) ||
	    cz_setint(s, ZMQ_RECONNECT_IVL, ivl) || cz_setint(s, ZMQ_RECONNECT_IVL_MAX, ivlmax)) {
		*step = "set SUB options"; return zmq_errno();
	}
	if (zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0)) { *step = "subscribe"; return zmq_errno(); }
	if (zmq_socket_monitor(s, monaddr, CZ_MON_EVENTS)) {
		*step = "monitor SUB socket"; return zmq_errno();
	}
	void *m = zmq_socket(c->ctx, ZMQ_PAIR);
	if (m == NULL) { *step = "create monitor socket"; return zmq_errno(); }
	c->sock[CZ_MON] = m;
	// libzmq's end sends events from the I/O thread with blocking sends: an unlimited
	// pipe (RCVHWM 0 here) keeps a reader that is slow to drain from stalling the I/O
	// thread that every subscription shares.
	if (cz_setint(m, ZMQ_LINGER, 0) || cz_setint(m, ZMQ_RCVHWM, 0) || zmq_connect(m, monaddr)) {
		*step = "connect monitor socket"; return zmq_errno();
	}
	if (zmq_connect(s, endpoint)) { *step = "connect"; return zmq_errno(); }
	return 0;
}

// cz_open_dealer creates the DEALER for one replay attempt. RCVHWM 0 (unlimited) because a
// ROUTER silently drops replies to a peer whose pipe is full, which would show up as a
// skipped sequence; the publisher's replay ring bounds the volume anyway.
static int cz_open_dealer(cz_conn *c, const char *endpoint, int64_t maxmsg, int ivl, int ivlmax, const char **step) {
	void *s = zmq_socket(c->ctx, ZMQ_DEALER);
	if (s == NULL) { *step = "create DEALER socket"; return zmq_errno(); }
	c->sock[CZ_DEALER] = s;
	if (cz_setint(s, ZMQ_LINGER, 0) || cz_setint(s, ZMQ_IPV6, 1) || cz_setint(s, ZMQ_RCVHWM, 0) || cz_setmax(s, maxmsg) ||
	    cz_setint(s, ZMQ_RECONNECT_IVL, ivl) || cz_setint(s, ZMQ_RECONNECT_IVL_MAX, ivlmax)) {
		*step = "set DEALER options"; return zmq_errno();
	}
	if (zmq_connect(s, endpoint)) { *step = "connect replay"; return zmq_errno(); }
	return 0;
}

// cz_fd returns the ZMQ_FD of socket `which` (an edge-triggered signal: ZMQ_EVENTS tells
// what is ready), or -errno.
static int cz_fd(cz_conn *c, int which) {
	int fd;
	size_t len = sizeof fd;
	if (zmq_getsockopt(c->sock[which], ZMQ_FD, &fd, &len)) return -zmq_errno();
	return fd;
}

// cz_ready returns a mask (1 << which) of the open sockets that have a message to read,
// or -errno. Asking ZMQ_EVENTS also processes the socket's pending commands, which is
// what consumes the ZMQ_FD signal.
static int cz_ready(cz_conn *c) {
	int mask = 0;
	for (int i = 0; i < 3; i++) {
		if (c->sock[i] == NULL) continue;
		int ev = 0;
		size_t len = sizeof ev;
		int rc;
		do { rc = zmq_getsockopt(c->sock[i], ZMQ_EVENTS, &ev, &len); } while (rc < 0 && zmq_errno() == EINTR);
		if (rc < 0) return -zmq_errno();
		if (ev & ZMQ_POLLIN) mask |= 1 << i;
	}
	return mask;
}

// cz_send_replay sends the legacy replay request ["", u64be(from)]; 0 or an errno.
static int cz_send_replay(cz_conn *c, uint64_t from) {
	unsigned char be[8];
	for (int i = 0; i < 8; i++) be[i] = (unsigned char)(from >> (56 - 8 * i));
	int rc;
	do { rc = zmq_send(c->sock[CZ_DEALER], "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT); } while (rc < 0 && zmq_errno() == EINTR);
	if (rc < 0) return zmq_errno();
	do { rc = zmq_send(c->sock[CZ_DEALER], be, 8, ZMQ_DONTWAIT); } while (rc < 0 && zmq_errno() == EINTR);
	if (rc < 0) return zmq_errno();
	return 0;
}

static void cz_copy(cz_conn *c, unsigned char *buf) {
	size_t off = 0;
	for (int i = 0; i < c->nparts; i++) {
		if (c->sizes[i] > 0) memcpy(buf + off, zmq_msg_data(&c->parts[i]), c->sizes[i]);
		off += c->sizes[i];
	}
	cz_release(c);
}

// cz_recv reads one whole multipart message from socket `which` without waiting. It
// returns the frame count (> 0), 0 when nothing is ready, or -errno. The first CZ_MAXF
// frames are kept (sizes[]), the rest are drained but counted. When the kept frames fit in
// cap bytes they are copied back to back into buf; otherwise they stay held and `need`
// says how big buf must be for cz_copy.
static int cz_recv(cz_conn *c, int which, unsigned char *buf, size_t cap) {
	void *s = c->sock[which];
	cz_release(c);
	int total = 0;
	size_t need = 0;
	for (;;) {
		zmq_msg_t scratch;
		zmq_msg_t *m = &scratch;
		if (total < CZ_MAXF) m = &c->parts[total]; else zmq_msg_init(&scratch);
		int rc;
		do { rc = zmq_msg_recv(m, s, ZMQ_DONTWAIT); } while (rc < 0 && zmq_errno() == EINTR);
		if (rc < 0) {
			int e = zmq_errno();
			if (m == &scratch) zmq_msg_close(&scratch);
			c->nparts = total < CZ_MAXF ? total : CZ_MAXF;
			cz_release(c);
			if (total == 0 && e == EAGAIN) return 0;
			return -e;
		}
		int more = zmq_msg_more(m);
		if (m == &scratch) {
			zmq_msg_close(&scratch);
		} else {
			c->sizes[total] = zmq_msg_size(m);
			need += c->sizes[total];
		}
		total++;
		if (!more) break;
	}
	c->nparts = total < CZ_MAXF ? total : CZ_MAXF;
	c->need = need;
	if (need <= cap) cz_copy(c, buf);
	return total;
}

// cz_mon_event reads one monitor event: its id (> 0), 0 if none, or -errno; *value is
// the event's value (for ZMQ_EVENT_CONNECT_RETRIED, the pause before the next attempt in
// milliseconds).
static int cz_mon_event(cz_conn *c, uint32_t *value) {
	int n = cz_recv(c, CZ_MON, NULL, 0);
	if (n <= 0) return n;
	int ev = -EPROTO;
	if (c->nparts >= 1 && c->sizes[0] >= 6) {
		uint16_t v;
		memcpy(&v, zmq_msg_data(&c->parts[0]), sizeof v);
		memcpy(value, (char *)zmq_msg_data(&c->parts[0]) + 2, sizeof *value);
		if (v != 0) ev = v;
	}
	cz_release(c);
	return ev;
}

// cz_free closes the sockets (linger 0) and frees c; the context is shared and stays.
static void cz_free(cz_conn *c) {
	cz_release(c);
	cz_close_sock(c, CZ_SUB);
	cz_close_sock(c, CZ_MON);
	cz_close_sock(c, CZ_DEALER);
	free(c);
}

static const char *cz_strerror(int e) { return zmq_strerror(e); }

// cz_rcvhwm reads the SUB socket's ZMQ_RCVHWM back from libzmq, or -errno.
static int cz_rcvhwm(cz_conn *c) {
	int v;
	size_t len = sizeof v;
	if (zmq_getsockopt(c->sock[CZ_SUB], ZMQ_RCVHWM, &v, &len)) return -zmq_errno();
	return v;
}

// cz_trim gives the free memory of every malloc arena back to the system (glibc's
// malloc_trim: free pages inside an arena too, not only at its top); elsewhere nothing.
static void cz_trim(void) {
#if defined(__GLIBC__)
	malloc_trim(0);
#endif
}
*/
import "C"

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Socket names one of a Conn's sockets.
type Socket int

// The sockets of a Conn.
const (
	// SockSub is the SUB socket connected to the publisher.
	SockSub Socket = C.CZ_SUB
	// SockDealer is the DEALER of the replay attempt in progress.
	SockDealer Socket = C.CZ_DEALER
	// SockMon is the reader of the SUB socket's connection monitor.
	SockMon Socket = C.CZ_MON
)

// Monitor event ids a subscriber reacts to (MonEvent).
const (
	// EvConnected: the SUB socket (re)connected to its publisher.
	EvConnected = C.ZMQ_EVENT_CONNECTED
	// EvDisconnected: the connection was lost.
	EvDisconnected = C.ZMQ_EVENT_DISCONNECTED
	// EvConnectRetried: libzmq scheduled a reconnect.
	EvConnectRetried = C.ZMQ_EVENT_CONNECT_RETRIED
)

// MaxFrames is how many frames of one message are kept; the rest are only counted.
const MaxFrames = C.CZ_MAXF

// Transport owns the one libzmq context (its I/O and reaper threads) that every
// subscriber given it opens its sockets in. A subscriber costs its sockets' descriptors
// and no OS thread of its own: its goroutine waits in Go's network poller.
type Transport struct {
	ctx    unsafe.Pointer
	monSeq atomic.Uint64
	// ivl and ivlMax are the reconnection back-off of every socket, in milliseconds.
	ivl, ivlMax int
	// trim gives libzmq's freed receive memory back to the system after bursts
	// (NoteReceived).
	trim *trimmer

	mu     sync.Mutex
	closed bool
	conns  int
}

// NewTransport creates the shared context. Close it after every subscriber using it has
// stopped.
func NewTransport(cfg TransportConfig) (*Transport, error) {
	if cfg.IOThreads < 0 || cfg.MaxSockets < 0 || cfg.ReconnectInterval < 0 || cfg.ReconnectIntervalMax < 0 {
		return nil, errors.New("new ZMQ transport: negative io_threads, max_sockets or reconnect interval")
	}
	ivl := cmp.Or(cfg.ReconnectInterval, DefaultReconnectInterval).Milliseconds()
	ivlMax := cmp.Or(cfg.ReconnectIntervalMax, DefaultReconnectIntervalMax).Milliseconds()
	if ivl < 1 || ivlMax < ivl || ivlMax > math.MaxInt32 {
		return nil, fmt.Errorf("new ZMQ transport: reconnect interval %d ms, max %d ms: want 1 <= interval <= max", ivl, ivlMax)
	}
	ctx := C.cz_ctx_new(C.int(cmp.Or(cfg.IOThreads, DefaultIOThreads)), C.int(cmp.Or(cfg.MaxSockets, DefaultMaxSockets)))
	if ctx == nil {
		return nil, fmt.Errorf("new ZMQ transport: create context: %w", zerr(C.cz_errno()))
	}
	return &Transport{ctx: ctx, ivl: int(ivl), ivlMax: int(ivlMax), trim: newTrimmer(func() { C.cz_trim() }, time.After)}, nil
}

// NoteReceived tells the transport that a subscriber read n bytes of messages and has
// drained its sockets; once subscribers have read enough since the last time, the C
// heap's free memory (libzmq's received messages, freed) is given back to the system a
// little later (see trimmer).
func (t *Transport) NoteReceived(n int64) { t.trim.note(n) }

// Trims counts the times the C heap was trimmed.
func (t *Transport) Trims() uint64 { return t.trim.trims() }

// Close terminates the context. It fails while a subscriber still holds sockets in it.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	if t.conns > 0 {
		return fmt.Errorf("close ZMQ transport: %d subscribers still open", t.conns)
	}
	t.closed = true
	t.trim.close()
	if e := C.cz_ctx_term(t.ctx); e != 0 {
		return fmt.Errorf("close ZMQ transport: %w", zerr(e))
	}
	return nil
}

// Open reports how many subscribers hold sockets in the transport.
func (t *Transport) Open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.conns
}

// Conn is one subscriber's sockets in the shared context, and the epoll set of their
// ZMQ_FD signals, which Go's network poller watches: waiting for input parks the
// goroutine instead of blocking an OS thread in zmq_poll. It must be used by a single
// goroutine at a time (libzmq sockets are not thread-safe; Go's scheduler gives the full
// memory barrier libzmq asks for when a socket moves between threads). Only the poll
// file's read deadline may be set from elsewhere, to wake the owner (Wake).
type Conn struct {
	t      *Transport
	c      *C.cz_conn
	epfd   int
	ep     *os.File
	rc     syscall.RawConn
	fds    [3]int
	maxMsg int64
}

// zmqError is a libzmq error: its message as libzmq prints it, and its errno, so that
// callers can tell resource exhaustion (errors.Is(err, syscall.EMFILE)) from the rest.
type zmqError struct {
	errno syscall.Errno
	msg   string
}

func (e *zmqError) Error() string { return e.msg }
func (e *zmqError) Unwrap() error { return e.errno }

func zerr(e C.int) error {
	return &zmqError{errno: syscall.Errno(e), msg: C.GoString(C.cz_strerror(e))}
}

// NewConn registers a connection with t and creates its poll set; maxMsg bounds one
// message on its sockets (ZMQ_MAXMSGSIZE, -1 unlimited).
func NewConn(t *Transport, maxMsg int64) (*Conn, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errors.New("ZMQ transport closed")
	}
	t.conns++
	t.mu.Unlock()
	z := &Conn{t: t, epfd: -1, fds: [3]int{-1, -1, -1}, maxMsg: maxMsg}
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		z.Free()
		return nil, fmt.Errorf("create poll set: %w", err)
	}
	z.epfd = epfd
	if err := syscall.SetNonblock(epfd, true); err != nil {
		z.Free()
		return nil, fmt.Errorf("create poll set: %w", err)
	}
	// Non-blocking, so os.NewFile hands it to the network poller.
	z.ep = os.NewFile(uintptr(epfd), "zmq-poll")
	if z.rc, err = z.ep.SyscallConn(); err != nil {
		z.Free()
		return nil, fmt.Errorf("create poll set: %w", err)
	}
	c := C.cz_new(t.ctx)
	if c == nil {
		z.Free()
		return nil, errors.New("allocate ZMQ connection")
	}
	z.c = c
	return z, nil
}

// PollFile is the poll set the owner waits on; Wake moves its deadline.
func (z *Conn) PollFile() *os.File { return z.ep }

// watch adds socket which's ZMQ_FD to the poll set.
func (z *Conn) watch(which Socket) error {
	fd := int(C.cz_fd(z.c, C.int(which)))
	if fd < 0 {
		return fmt.Errorf("get ZMQ_FD: %w", zerr(C.int(-fd)))
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
	if err := syscall.EpollCtl(z.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("watch ZMQ_FD: %w", err)
	}
	z.fds[which] = fd
	return nil
}

// closeSock stops watching a socket and closes it.
func (z *Conn) closeSock(which Socket) {
	if fd := z.fds[which]; fd >= 0 {
		_ = syscall.EpollCtl(z.epfd, syscall.EPOLL_CTL_DEL, fd, nil)
		z.fds[which] = -1
	}
	C.cz_close_sock(z.c, C.int(which))
}

// OpenSub creates and connects the SUB socket (and its monitor).
func (z *Conn) OpenSub(endpoint string, rcvhwm int) error {
	cs := C.CString(endpoint)
	defer C.free(unsafe.Pointer(cs))
	ma := C.CString("inproc://conductor-sub-monitor-" + strconv.FormatUint(z.t.monSeq.Add(1), 10))
	defer C.free(unsafe.Pointer(ma))
	var step *C.char
	if e := C.cz_open_sub(z.c, cs, C.int(rcvhwm), C.int64_t(z.maxMsg), C.int(z.t.ivl), C.int(z.t.ivlMax), ma, &step); e != 0 {
		err := fmt.Errorf("%s %q: %w", C.GoString(step), endpoint, zerr(e))
		z.CloseSub()
		return err
	}
	for _, w := range []Socket{SockSub, SockMon} {
		if err := z.watch(w); err != nil {
			z.CloseSub()
			return err
		}
	}
	return nil
}

// CloseSub closes the SUB socket, then its monitor reader (see cz_close_sock).
func (z *Conn) CloseSub() {
	z.closeSock(SockSub)
	z.closeSock(SockMon)
}

// RcvHWM reads the open SUB socket's receive high-water mark back from libzmq.
func (z *Conn) RcvHWM() (int, error) {
	v := C.cz_rcvhwm(z.c)
	if v < 0 {
		return 0, fmt.Errorf("get ZMQ_RCVHWM: %w", zerr(-v))
	}
	return int(v), nil
}

// HasSub tells whether the SUB socket is open.
func (z *Conn) HasSub() bool { return z.c.sock[SockSub] != nil }

// OpenDealer creates a DEALER connected to the replay endpoint.
func (z *Conn) OpenDealer(endpoint string) error {
	cs := C.CString(endpoint)
	defer C.free(unsafe.Pointer(cs))
	var step *C.char
	if e := C.cz_open_dealer(z.c, cs, C.int64_t(z.maxMsg), C.int(z.t.ivl), C.int(z.t.ivlMax), &step); e != 0 {
		err := fmt.Errorf("%s %q: %w", C.GoString(step), endpoint, zerr(e))
		z.CloseDealer()
		return err
	}
	if err := z.watch(SockDealer); err != nil {
		z.CloseDealer()
		return err
	}
	return nil
}

// CloseDealer closes the replay DEALER, discarding replies still queued.
func (z *Conn) CloseDealer() { z.closeSock(SockDealer) }

// HasDealer tells whether a replay DEALER is open.
func (z *Conn) HasDealer() bool { return z.c.sock[SockDealer] != nil }

// SendReplay sends the legacy replay request ["", u64be(from)] on the DEALER.
func (z *Conn) SendReplay(from uint64) error {
	if e := C.cz_send_replay(z.c, C.uint64_t(from)); e != 0 {
		return fmt.Errorf("send replay request from %d: %w", from, zerr(e))
	}
	return nil
}

// Recv reads one whole message from socket which into buf (grown when needed, then
// reused) without waiting. It returns the frame count, 0 when nothing is ready, and the
// sizes of the first MaxFrames frames, which lie back to back at the start of buf.B.
func (z *Conn) Recv(which Socket, buf *RecvBuf, sizes *[MaxFrames]int) (int, error) {
	b := buf.B
	n := C.cz_recv(z.c, C.int(which), (*C.uchar)(unsafe.Pointer(unsafe.SliceData(b))), C.size_t(len(b)))
	if n < 0 {
		return 0, fmt.Errorf("receive: %w", zerr(-n))
	}
	if n == 0 {
		return 0, nil
	}
	if need := int(z.c.need); need > len(b) {
		b = buf.grow(need)
		C.cz_copy(z.c, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(b))))
	}
	kept := min(int(n), MaxFrames)
	for i := range kept {
		sizes[i] = int(z.c.sizes[i])
	}
	return int(n), nil
}

// Used is the size of the kept frames of the last message Recv returned.
func (z *Conn) Used() int { return int(z.c.need) }

// ready returns the mask (1<<socket) of sockets with a message to read.
func (z *Conn) ready() (int, error) {
	r := C.cz_ready(z.c)
	if r < 0 {
		return 0, fmt.Errorf("poll: %w", zerr(-r))
	}
	return int(r), nil
}

// Wait returns the mask (1<<Socket) of sockets with input, waiting up to d for one in
// the network poller; 0 when d passed, stop was set, or Wake moved the poll file's
// deadline to the past.
func (z *Conn) Wait(d time.Duration, stop *atomic.Bool) (int, error) {
	if d <= 0 {
		return z.ready()
	}
	if err := z.ep.SetReadDeadline(time.Now().Add(d)); err != nil {
		return 0, fmt.Errorf("poll: %w", err)
	}
	// Checked after the deadline is set: a wake that came before it is seen here, one
	// that comes after it moves the deadline to the past.
	if stop.Load() {
		return 0, nil
	}
	var mask int
	var err error
	// Read calls the function before it parks, so a socket that is ready already costs
	// no wait.
	rerr := z.rc.Read(func(uintptr) bool {
		// ZMQ_FD is edge-triggered and consumed by ZMQ_EVENTS; asking after the poller
		// was armed means an edge after this check wakes the wait.
		mask, err = z.ready()
		return mask != 0 || err != nil
	})
	if rerr != nil && !errors.Is(rerr, os.ErrDeadlineExceeded) {
		return 0, fmt.Errorf("poll: %w", rerr)
	}
	return mask, err
}

// MonEvent returns the next monitor event id and its value (for EvConnectRetried, the
// pause before the next attempt, in milliseconds), or 0 when none is queued.
func (z *Conn) MonEvent() (ev int, value uint32, err error) {
	if z.c.sock[SockMon] == nil {
		return 0, 0, nil
	}
	var v C.uint32_t
	r := C.cz_mon_event(z.c, &v)
	if r < 0 {
		return 0, 0, fmt.Errorf("read monitor event: %w", zerr(-r))
	}
	return int(r), uint32(v), nil
}

// Free closes every socket (linger 0, so it does not block) and the poll set, and lets
// the transport go. It is idempotent.
func (z *Conn) Free() {
	if z.t == nil {
		return
	}
	if z.c != nil {
		for _, w := range []Socket{SockSub, SockMon, SockDealer} {
			z.closeSock(w)
		}
		C.cz_free(z.c)
		z.c = nil
	}
	if z.ep != nil {
		_ = z.ep.Close()
	} else if z.epfd >= 0 {
		_ = syscall.Close(z.epfd)
	}
	z.epfd = -1
	z.t.mu.Lock()
	z.t.conns--
	z.t.mu.Unlock()
	z.t = nil
}
