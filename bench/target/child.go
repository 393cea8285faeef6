package target

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Child is a helper process of the harness (a floor server, an awake process): a
// conductor-bench binary run with a command of its own, ready once it has printed its
// ready line.
type Child struct {
	// PID is its process.
	PID    int
	cmd    *exec.Cmd
	exited <-chan error
}

// SpawnChild runs bin with args and returns once the process has printed a line that
// starts with prefix on its stdout, and the rest of that line; what names it in errors.
// Its stderr goes to logw. It gets SIGTERM if the harness dies without stopping it
// (startTied).
func SpawnChild(what, bin string, args []string, prefix string, logw io.Writer) (*Child, string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = logw
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", fmt.Errorf("spawn %s: %w", what, err)
	}
	ready := make(chan string, 1)
	exited, err := startTied(cmd, func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				ready <- rest
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // until it exits
	})
	if err != nil {
		return nil, "", fmt.Errorf("spawn %s %s: %w", what, bin, err)
	}
	c := &Child{PID: cmd.Process.Pid, cmd: cmd, exited: exited}
	select {
	case rest := <-ready:
		return c, rest, nil
	case err := <-c.exited:
		return nil, "", fmt.Errorf("spawn %s %s: exited before it was ready: %v", what, bin, err)
	case <-time.After(15 * time.Second):
		c.Stop()
		return nil, "", errors.New("spawn " + what + ": not ready within 15 s")
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (c *Child) Stop() {
	if c.cmd == nil {
		return
	}
	terminate(c.cmd, c.exited)
	c.cmd = nil
}

// terminate sends cmd's process SIGTERM, then SIGKILL if it has not exited 10 s later,
// and returns once exited (which receives cmd.Wait's result) has.
func terminate(cmd *exec.Cmd, exited <-chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}
