package httpserver

import (
	"io"
	"net"
	"os"
	"syscall"
)

// fastListener hands out fastConns for the TCP connections it accepts (on Linux; a
// listener of another kind passes its connections through).
type fastListener struct{ net.Listener }

func (l fastListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	return newFastConn(c), nil
}

// fastConn is an HTTP connection whose reads and writes are the socket's non-blocking
// system calls made as raw calls (syscall.RawSyscall) inside the poller's RawConn, instead
// of net.Conn's blocking-call path. A blocking call (syscall.Syscall) tells the runtime
// it may block: it wakes the runtime's monitor thread (sysmon) when the process was idle,
// and a call that lasts past the monitor's tick (a loopback write delivers to the reader
// inline, tens of microseconds) has its P handed to another thread, which finds nothing
// to do and sleeps again. For a request that arrives at an idle process that is two to
// four thread wake-ups, measured at about a sixth of the server CPU of a /query miss,
// none of which upstream pays. A non-blocking socket call returns at once (data, or
// EAGAIN), so the raw form is safe: when nothing is ready the RawConn parks the
// goroutine in the poller as Read and Write do, honouring deadlines and Close (the
// descriptor is used under the connection's read or write lock, never after Close).
type fastConn struct {
	net.Conn
	rc syscall.RawConn
	// rd and wr are bound once, so that a call allocates nothing.
	rd, wr func(fd uintptr) bool
	// The operation in progress: its buffer, bytes done and error (one reader and one
	// writer at a time, as the RawConn's locks guarantee).
	rbuf, wbuf []byte
	rn, wn     int
	rerr, werr error
	// readWaits (tests) is called each time a read finds nothing and goes to wait.
	readWaits func()
}

// newFastConn wraps c when it is a TCP connection that exposes its descriptor.
func newFastConn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	fc := &fastConn{Conn: c, rc: rc}
	fc.rd, fc.wr = fc.readFD, fc.writeFD
	return fc
}

// Read reads into p as net.Conn's Read does.
func (c *fastConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return c.Conn.Read(p)
	}
	c.rbuf, c.rn, c.rerr = p, 0, nil
	err := c.rc.Read(c.rd)
	n, rerr := c.rn, c.rerr
	c.rbuf, c.rerr = nil, nil
	if err != nil {
		return n, err
	}
	return n, rerr
}

// readFD is one attempt: false (wait until readable) on EAGAIN.
func (c *fastConn) readFD(fd uintptr) bool {
	for {
		n, e := sysRead(fd, c.rbuf)
		switch e {
		case 0:
			if n == 0 {
				c.rerr = io.EOF
			}
			c.rn = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if c.readWaits != nil {
				c.readWaits()
			}
			return false
		}
		c.rerr = os.NewSyscallError("read", e)
		return true
	}
}

// Write writes all of p as net.Conn's Write does.
func (c *fastConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return c.Conn.Write(p)
	}
	c.wbuf, c.wn, c.werr = p, 0, nil
	err := c.rc.Write(c.wr)
	n, werr := c.wn, c.werr
	c.wbuf, c.werr = nil, nil
	if err != nil {
		return n, err
	}
	return n, werr
}

// writeFD writes what is left of the buffer; false (wait until writable) on EAGAIN.
func (c *fastConn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		left := c.wbuf[c.wn:]
		n, e := sysWrite(fd, left)
		switch e {
		case 0:
			c.wn += n
			continue
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.werr = os.NewSyscallError("write", e)
		return true
	}
	return true
}
