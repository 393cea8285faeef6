package limits

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestBudget: small bodies may use the whole budget, large ones (above SmallBodyBytes)
// only 7/8 of it, a large body bigger than that takes all of that part, and what is
// released can be taken again.
func TestBudget(t *testing.T) {
	var c Counters
	b := NewBudget(8*SmallBodyBytes, &c)
	big, ok := b.Acquire(4 * SmallBodyBytes)
	if !ok || big != 4*SmallBodyBytes {
		t.Fatalf("first large body: %d %v", big, ok)
	}
	if _, ok := b.Acquire(3*SmallBodyBytes + 1); ok {
		t.Fatal("a large body took the last eighth")
	}
	small, ok := b.Acquire(SmallBodyBytes)
	if !ok {
		t.Fatal("a small body did not fit in the last part")
	}
	if c.InflightBody.Load() != 5*SmallBodyBytes {
		t.Fatalf("in flight %d", c.InflightBody.Load())
	}
	b.Release(big)
	b.Release(small)
	if huge, ok := b.Acquire(100 * SmallBodyBytes); !ok || huge != 7*SmallBodyBytes {
		t.Fatalf("a body above the large part: %d %v, want all of the 7/8", huge, ok)
	}
}

// TestBudgetAcquireByGivesUpWhenDone: a wait for bytes that do not come ends when done
// is closed.
func TestBudgetAcquireByGivesUpWhenDone(t *testing.T) {
	var c Counters
	b := NewBudget(SmallBodyBytes, &c)
	held, _ := b.Acquire(SmallBodyBytes)
	done := make(chan struct{})
	close(done)
	if _, ok := b.AcquireBy(1, time.Now().Add(time.Hour), done); ok {
		t.Fatal("acquired bytes that are held")
	}
	b.Release(held)
	if _, ok := b.AcquireBy(1, time.Now().Add(time.Hour), done); !ok {
		t.Fatal("free bytes not acquired")
	}
}

// failingListener fails Accept with the queued errors, then accepts pipes.
type failingListener struct {
	mu   sync.Mutex
	errs []error
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	c, _ := net.Pipe()
	return c, nil
}
func (l *failingListener) Close() error   { return nil }
func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{} }

// TestRetryListener: temporary accept failures (out of descriptors) are counted and
// retried until a connection comes; any other failure ends Accept.
func TestRetryListener(t *testing.T) {
	var c Counters
	inner := &failingListener{errs: []error{syscall.EMFILE, syscall.ENFILE, syscall.ECONNABORTED}}
	l := NewRetryListener(inner, "test", slog.New(slog.DiscardHandler), &c)
	conn, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if n := c.AcceptErrors.Load(); n != 3 {
		t.Fatalf("AcceptErrors = %d, want 3", n)
	}
	inner.errs = []error{errors.New("listener broken")}
	if _, err := l.Accept(); err == nil {
		t.Fatal("a permanent failure was retried")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	inner.errs = []error{syscall.EMFILE}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}
