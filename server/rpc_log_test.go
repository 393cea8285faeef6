package server

import (
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/conductor-go/conductor/engine"
	"github.com/conductor-go/conductor/internal/lograte"
	"github.com/conductor-go/conductor/internal/syncbuf"
	"github.com/conductor-go/conductor/server/rpcserver"
	"github.com/conductor-go/conductor/service"
	"github.com/conductor-go/conductor/wire/cororpc"
)

// Lines that clients cause are rate-limited per kind: with a burst of 3 and a clock that
// stands still, 10 connections closed for a bad frame log 3 lines; once the window has
// passed, the next line carries the count of the 7 suppressed. Every connection is still
// closed.
func TestRPCClientLogsRateLimited(t *testing.T) {
	logs := &syncbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var now atomic.Int64 // the clock, in seconds; the connections' goroutines read it
	now.Store(1_700_000_000)
	clock := func() time.Time { return time.Unix(now.Load(), 0) }
	eng := engine.New(engine.Config{Logger: log})
	s := rpcserver.New(rpcserver.Options{Service: service.New(service.Options{Engine: eng, Logger: log}), Logger: log,
		ClientLogLimit: lograte.Config{Burst: 3, Interval: time.Minute, Now: clock}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	defer s.Close()
	badFrame := func(i int) {
		rc := dialRawRPC(t, ln.Addr().String())
		f := cororpc.AppendRequest(nil, uint32(i), cororpc.FuncListServices, nil)
		f[0] ^= 0xff // bad magic
		rc.write(f)
		rc.wantClosed("bad magic")
	}
	for i := range 10 {
		badFrame(i)
	}
	if n := logs.Count("bad frame"); n != 3 {
		t.Fatalf("%d lines for 10 bad frames, want 3:\n%s", n, logs)
	}
	now.Add(60) // the window has passed
	badFrame(10)
	if n := logs.Count("bad frame"); n != 4 || !strings.Contains(logs.String(), "suppressed=7") {
		t.Fatalf("after the window: %d lines, want 4 with suppressed=7:\n%s", n, logs)
	}
}
