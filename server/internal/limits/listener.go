package limits

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Accept back-off after a temporary failure, as net/http does: from 5 ms, doubling, up
// to 1 s, reset by the next successful accept.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// acceptLogEvery bounds the log of a persisting accept failure to one line per period
	// (the counter keeps the exact number).
	acceptLogEvery = 10 * time.Second
)

// RetryListener keeps a listener alive through temporary accept failures. Without it,
// "too many open files" (EMFILE) ends fasthttp's Serve and the RPC accept loop for good
// and the process stays up answering nothing; with it, Accept backs off and retries, and
// the server serves again once descriptors are free.
type RetryListener struct {
	net.Listener
	name     string
	log      *slog.Logger
	counters *Counters

	done      chan struct{}
	closeOnce sync.Once
	lastLog   time.Time // only the accepting goroutine touches it
	sinceLog  uint64
	logged    bool // a failure was logged and recovery not yet
}

// NewRetryListener wraps ln; name ("http", "rpc") is for logs, counters gets
// AcceptErrors.
func NewRetryListener(ln net.Listener, name string, log *slog.Logger, counters *Counters) *RetryListener {
	return &RetryListener{Listener: ln, name: name, log: log, counters: counters, done: make(chan struct{})}
}

// Accept returns the next connection, retrying temporary failures with back-off until
// the listener is closed.
func (l *RetryListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if l.logged {
				// At most once per logged failure line (lastLog is kept, so a listener
				// flapping at the limit logs once per acceptLogEvery).
				l.log.Info("accepting again", "listener", l.name, "failures_since_logged", l.sinceLog)
				l.logged = false
			}
			l.sinceLog = 0
			return c, nil
		}
		select {
		case <-l.done:
			return nil, net.ErrClosed
		default:
		}
		if !temporaryAcceptError(err) {
			return nil, err
		}
		l.counters.AcceptErrors.Add(1)
		l.sinceLog++
		if now := time.Now(); now.Sub(l.lastLog) >= acceptLogEvery {
			l.log.Error("accept failed; retrying with back-off", "listener", l.name, "err", err, "failures", l.sinceLog)
			l.lastLog = now
			l.logged = true
		}
		if delay == 0 {
			delay = acceptBackoffMin
		} else if delay *= 2; delay > acceptBackoffMax {
			delay = acceptBackoffMax
		}
		t := time.NewTimer(delay)
		select {
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		case <-t.C:
		}
	}
}

// Close stops accepting; a pending back-off ends at once.
func (l *RetryListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// temporaryAcceptError reports whether an accept failure is about the moment (descriptor
// or memory exhaustion, an aborted handshake, a timeout) rather than a dead listener.
func temporaryAcceptError(err error) bool {
	if errors.Is(err, net.ErrClosed) {
		return false
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		switch se {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED,
			syscall.ECONNRESET, syscall.EPROTO, syscall.EPERM, syscall.EAGAIN, syscall.EINTR:
			return true
		}
		return false
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}
