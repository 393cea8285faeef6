package floor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"time"
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
	Addr   string
	PID    int
	cmd    *exec.Cmd
	exited chan error
}

// Spawn runs "bin floor-server" (bin: a conductor-bench binary, usually the running
// one) and returns once it has printed its address. Its stderr goes to logw.
func Spawn(bin string, logw io.Writer) (*Proc, error) {
	cmd := exec.Command(bin, Command)
	cmd.Stderr = logw
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("spawn floor server: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("spawn floor server %s: %w", bin, err)
	}
	p := &Proc{PID: cmd.Process.Pid, cmd: cmd, exited: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), listeningPrefix); ok {
				addr <- a
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // until it exits
		p.exited <- cmd.Wait()
	}()
	select {
	case p.Addr = <-addr:
		return p, nil
	case err := <-p.exited:
		return nil, fmt.Errorf("spawn floor server %s: exited before listening: %v", bin, err)
	case <-time.After(15 * time.Second):
		p.Stop()
		return nil, errors.New("spawn floor server: no address within 15 s")
	}
}

// Stop ends the floor server (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}
