package server

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/server/httpserver"
	"github.com/conductor-go/conductor/service"
)

// TestHTTPShutdownBeforeServe: App.Stop right after Start can run Shutdown before the
// serving goroutine reaches Serve. fasthttp's Shutdown knows nothing of that listener, so
// Serve used to accept for ever and Stop waited for it. Serve after Shutdown must return
// at once and close its listener; Shutdown during Serve must end it.
func TestHTTPShutdownBeforeServe(t *testing.T) {
	eng := engine.New(engine.Config{})
	defer eng.Close()
	svc := service.New(service.Options{Engine: eng, Logger: testLogger()})
	for _, order := range []string{"shutdown-first", "serve-first"} {
		h := httpserver.New(httpserver.Options{Service: svc, Logger: testLogger()})
		inner, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln := &acceptSignal{Listener: inner, accepting: make(chan struct{})}
		served := make(chan error, 1)
		if order == "shutdown-first" {
			if err := h.Shutdown(); err != nil {
				t.Fatal(err)
			}
			go func() { served <- h.Serve(ln) }()
		} else {
			go func() { served <- h.Serve(ln) }()
			// Shut down once Serve is in its accept loop (a dial would not tell: the
			// kernel accepts into the backlog before Serve gets there).
			<-ln.accepting
			if err := h.Shutdown(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-served:
		case <-time.After(time.Minute):
			t.Fatalf("%s: Serve still running a minute after Shutdown", order)
		}
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
			t.Errorf("%s: listener still open after Serve returned", order)
		}
	}
}

// acceptSignal closes accepting when Accept is first called.
type acceptSignal struct {
	net.Listener
	once      sync.Once
	accepting chan struct{}
}

func (l *acceptSignal) Accept() (net.Conn, error) {
	l.once.Do(func() { close(l.accepting) })
	return l.Listener.Accept()
}
