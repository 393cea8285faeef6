package floor

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/conductor-go/conductor/bench/target"
)

// Command is the conductor-bench command that runs a floor server (Run), which Spawn
// starts.
const Command = "floor-server"

// listeningPrefix starts the line a floor server prints once it accepts connections.
const listeningPrefix = "floor-server listening on "

// Run serves a floor server on a free 127.0.0.1 port until ctx ends, after printing
// "floor-server listening on ADDR" on out.
func Run(ctx context.Context, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("floor-server: %w", err)
	}
	s := New()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	if _, err := fmt.Fprintf(out, "%s%s\n", listeningPrefix, ln.Addr()); err != nil {
		_ = s.Shutdown()
		return fmt.Errorf("floor-server: %w", err)
	}
	select {
	case <-ctx.Done():
		_ = s.Shutdown()
		return nil
	case err := <-served:
		return fmt.Errorf("floor-server: %w", err)
	}
}

// Proc is a floor server running in a process of its own, so that its CPU time can be
// read apart from the harness's.
type Proc struct {
	// Addr is its HTTP address and PID its process.
	Addr  string
	PID   int
	child *target.Child
}

// Spawn runs "bin floor-server" (bin: a conductor-bench binary, usually the running
// one) and returns once it has printed its address. Its stderr goes to logw.
func Spawn(bin string, logw io.Writer) (*Proc, error) {
	c, addr, err := target.SpawnChild("floor server", bin, []string{Command}, listeningPrefix, logw)
	if err != nil {
		return nil, err
	}
	return &Proc{Addr: addr, PID: c.PID, child: c}, nil
}

// Stop ends the floor server (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (p *Proc) Stop() {
	if p.child != nil {
		p.child.Stop()
		p.child = nil
	}
}
