package ingest

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
#cgo nocallback cz_poll
#include <zmq.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CZ_MAXF 4
#define CZ_SUB 0
#define CZ_DEALER 1
#define CZ_MON 2

typedef struct {
	void *ctx;
	void *sock[3];
	zmq_msg_t parts[CZ_MAXF];
	int nparts;
	size_t sizes[CZ_MAXF];
	size_t need;
	int mongen;
} cz_conn;

static cz_conn *cz_new(void) {
	cz_conn *c = calloc(1, sizeof(cz_conn));
	if (c == NULL) return NULL;
	c->ctx = zmq_ctx_new();
	if (c->ctx == NULL) { free(c); return NULL; }
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

static void cz_close_sock(cz_conn *c, int which) {
	if (c->sock[which] != NULL) {
		zmq_close(c->sock[which]);
		c->sock[which] = NULL;
	}
}

// cz_open_sub creates the SUB socket and its connection monitor and connects.
// Returns 0, or an errno with *step naming what failed.
static int cz_open_sub(cz_conn *c, const char *endpoint, int rcvhwm, const char **step) {
	void *s = zmq_socket(c->ctx, ZMQ_SUB);
	if (s == NULL) { *step = "create SUB socket"; return zmq_errno(); }
	c->sock[CZ_SUB] = s;
	if (cz_setint(s, ZMQ_LINGER, 0) || cz_setint(s, ZMQ_IPV6, 1) || cz_setint(s, ZMQ_RCVHWM, rcvhwm)) {
		*step = "set SUB options"; return zmq_errno();
	}
	if (zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0)) { *step = "subscribe"; return zmq_errno(); }
	char addr[64];
	snprintf(addr, sizeof addr, "inproc://conductor-sub-monitor-%d", c->mongen++);
	if (zmq_socket_monitor(s, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED)) {
		*step = "monitor SUB socket"; return zmq_errno();
	}
	void *m = zmq_socket(c->ctx, ZMQ_PAIR);
	if (m == NULL) { *step = "create monitor socket"; return zmq_errno(); }
	c->sock[CZ_MON] = m;
	if (cz_setint(m, ZMQ_LINGER, 0) || zmq_connect(m, addr)) { *step = "connect monitor socket"; return zmq_errno(); }
	if (zmq_connect(s, endpoint)) { *step = "connect"; return zmq_errno(); }
	return 0;
}

// cz_open_dealer creates the DEALER for one replay attempt. RCVHWM 0 (unlimited) because a
// ROUTER silently drops replies to a peer whose pipe is full, which would show up as a
// skipped sequence; the publisher's replay ring bounds the volume anyway.
static int cz_open_dealer(cz_conn *c, const char *endpoint, const char **step) {
	void *s = zmq_socket(c->ctx, ZMQ_DEALER);
	if (s == NULL) { *step = "create DEALER socket"; return zmq_errno(); }
	c->sock[CZ_DEALER] = s;
	if (cz_setint(s, ZMQ_LINGER, 0) || cz_setint(s, ZMQ_IPV6, 1) || cz_setint(s, ZMQ_RCVHWM, 0)) {
		*step = "set DEALER options"; return zmq_errno();
	}
	if (zmq_connect(s, endpoint)) { *step = "connect replay"; return zmq_errno(); }
	return 0;
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

// cz_poll waits up to timeout_ms for input on the open sockets and on wakefd (if >= 0).
// Returns a bit mask (1 << which, 1 << 3 for wakefd), 0 on timeout or EINTR (the caller
// loops), or -errno.
static int cz_poll(cz_conn *c, long timeout_ms, int wakefd) {
	zmq_pollitem_t items[4];
	int which[4];
	int n = 0;
	for (int i = 0; i < 3; i++) {
		if (c->sock[i] == NULL) continue;
		items[n].socket = c->sock[i];
		items[n].fd = 0;
		items[n].events = ZMQ_POLLIN;
		items[n].revents = 0;
		which[n++] = i;
	}
	if (wakefd >= 0) {
		items[n].socket = NULL;
		items[n].fd = wakefd;
		items[n].events = ZMQ_POLLIN;
		items[n].revents = 0;
		which[n++] = 3;
	}
	int rc = zmq_poll(items, n, timeout_ms);
	if (rc < 0) {
		int e = zmq_errno();
		return e == EINTR ? 0 : -e;
	}
	int mask = 0;
	for (int i = 0; i < n; i++) if (items[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) mask |= 1 << which[i];
	return mask;
}

// cz_mon_event reads one monitor event: its id (> 0), 0 if none, or -errno.
static int cz_mon_event(cz_conn *c) {
	int n = cz_recv(c, CZ_MON, NULL, 0);
	if (n <= 0) return n;
	int ev = -EPROTO;
	if (c->nparts >= 1 && c->sizes[0] >= 6) {
		uint16_t v;
		memcpy(&v, zmq_msg_data(&c->parts[0]), sizeof v);
		if (v != 0) ev = v;
	}
	cz_release(c);
	return ev;
}

static void cz_free(cz_conn *c) {
	cz_release(c);
	for (int i = 0; i < 3; i++) cz_close_sock(c, i);
	int rc;
	do { rc = zmq_ctx_term(c->ctx); } while (rc < 0 && zmq_errno() == EINTR);
	free(c);
}

static const char *cz_strerror(int e) { return zmq_strerror(e); }
*/
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// Socket slots inside a zconn.
const (
	sockSub    = C.CZ_SUB
	sockDealer = C.CZ_DEALER
	sockMon    = C.CZ_MON
)

// Monitor event ids the subscriber reacts to.
const (
	evConnected    = C.ZMQ_EVENT_CONNECTED
	evDisconnected = C.ZMQ_EVENT_DISCONNECTED
)

// maxKeptFrames is how many frames of one message are kept; the rest are only counted.
const maxKeptFrames = C.CZ_MAXF

// zconn is one subscriber's private libzmq context and sockets. It must be created,
// used and freed by a single goroutine (libzmq sockets are not thread-safe).
type zconn struct {
	c *C.cz_conn
}

func zerr(e C.int) error {
	return errors.New(C.GoString(C.cz_strerror(e)))
}

func newZconn() (*zconn, error) {
	c := C.cz_new()
	if c == nil {
		return nil, errors.New("create ZMQ context")
	}
	return &zconn{c: c}, nil
}

// openSub creates and connects the SUB socket (and its monitor).
func (z *zconn) openSub(endpoint string, rcvhwm int) error {
	cs := C.CString(endpoint)
	defer C.free(unsafe.Pointer(cs))
	var step *C.char
	if e := C.cz_open_sub(z.c, cs, C.int(rcvhwm), &step); e != 0 {
		err := fmt.Errorf("%s %q: %w", C.GoString(step), endpoint, zerr(e))
		z.closeSub()
		return err
	}
	return nil
}

func (z *zconn) closeSub() {
	C.cz_close_sock(z.c, sockMon)
	C.cz_close_sock(z.c, sockSub)
}

func (z *zconn) hasSub() bool { return z.c.sock[sockSub] != nil }

// openDealer creates a DEALER connected to the replay endpoint.
func (z *zconn) openDealer(endpoint string) error {
	cs := C.CString(endpoint)
	defer C.free(unsafe.Pointer(cs))
	var step *C.char
	if e := C.cz_open_dealer(z.c, cs, &step); e != 0 {
		err := fmt.Errorf("%s %q: %w", C.GoString(step), endpoint, zerr(e))
		z.closeDealer()
		return err
	}
	return nil
}

func (z *zconn) closeDealer() { C.cz_close_sock(z.c, sockDealer) }

func (z *zconn) hasDealer() bool { return z.c.sock[sockDealer] != nil }

func (z *zconn) sendReplay(from uint64) error {
	if e := C.cz_send_replay(z.c, C.uint64_t(from)); e != 0 {
		return fmt.Errorf("send replay request from %d: %w", from, zerr(e))
	}
	return nil
}

// recv reads one whole message from socket `which` into *buf (grown when needed, then
// reused) without waiting. It returns the frame count, 0 when nothing is ready, and the
// sizes of the first maxKeptFrames frames, which lie back to back at the start of *buf.
func (z *zconn) recv(which C.int, buf *[]byte, sizes *[maxKeptFrames]int) (int, error) {
	b := *buf
	n := C.cz_recv(z.c, which, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(b))), C.size_t(len(b)))
	if n < 0 {
		return 0, fmt.Errorf("receive: %w", zerr(-n))
	}
	if n == 0 {
		return 0, nil
	}
	if need := int(z.c.need); need > len(b) {
		b = make([]byte, need+need/2)
		*buf = b
		C.cz_copy(z.c, (*C.uchar)(unsafe.Pointer(unsafe.SliceData(b))))
	}
	kept := min(int(n), maxKeptFrames)
	for i := range kept {
		sizes[i] = int(z.c.sizes[i])
	}
	return int(n), nil
}

// wakeBit is set in poll's mask when the wake fd became readable.
const wakeBit = 1 << 3

// poll waits up to d for input on the sockets or on wakeFD (-1: none) and returns a mask
// of 1<<socket | wakeBit.
func (z *zconn) poll(d time.Duration, wakeFD int) (int, error) {
	ms := d.Milliseconds()
	if ms <= 0 && d > 0 {
		ms = 1
	}
	r := C.cz_poll(z.c, C.long(ms), C.int(wakeFD))
	if r < 0 {
		return 0, fmt.Errorf("poll: %w", zerr(-r))
	}
	return int(r), nil
}

// monEvent returns the next monitor event id, or 0 when none is queued.
func (z *zconn) monEvent() (int, error) {
	if z.c.sock[sockMon] == nil {
		return 0, nil
	}
	r := C.cz_mon_event(z.c)
	if r < 0 {
		return 0, fmt.Errorf("read monitor event: %w", zerr(-r))
	}
	return int(r), nil
}

// free closes every socket and terminates the context; linger is 0 so it does not block.
func (z *zconn) free() {
	if z.c != nil {
		C.cz_free(z.c)
		z.c = nil
	}
}
