package target

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Keeping a VM's CPUs awake while measuring.
//
// On a VM an idle vCPU halts, and waking it again (an interrupt through the hypervisor)
// costs tens of microseconds that land on whichever process is woken: a server answering
// one request at a time pays them per request, and its CPU per request drifts with the
// host's load. A loaded production host rarely idles. An awake process (RunAwake) spins
// one thread per CPU at the SCHED_IDLE policy, which takes a CPU only when no other
// thread of the machine wants it, so the CPUs never idle and a cell measures what the
// server's own work costs. It is a process of its own: a spinning goroutine holds one of
// its process's Ps, which would starve the harness's clients.

// AwakeCommand is the conductor-bench command that runs an awake process (RunAwake),
// which SpawnAwake starts.
const AwakeCommand = "keep-awake"

// awakeLine is what an awake process prints once all its threads spin.
const awakeLine = "keep-awake: spinning"

// RunAwake spins n threads at SCHED_IDLE (n <= 0: one per CPU) until ctx ends, after
// printing awakeLine on out.
func RunAwake(ctx context.Context, n int, out io.Writer) error {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	// One P more than the spinners, for the goroutine that waits for ctx.
	runtime.GOMAXPROCS(n + 1)
	stop, err := keepAwake(n)
	if err != nil {
		return err
	}
	defer stop()
	if _, err := fmt.Fprintln(out, awakeLine); err != nil {
		return fmt.Errorf("keep awake: %w", err)
	}
	<-ctx.Done()
	return nil
}

// AwakeProc is a running awake process.
type AwakeProc struct {
	cmd    *exec.Cmd
	exited chan error
}

// SpawnAwake runs "bin keep-awake N" (bin: a conductor-bench binary, usually the running
// one; n <= 0: one thread per CPU) and returns once its threads spin. Its stderr goes to
// logw.
func SpawnAwake(bin string, n int, logw io.Writer) (*AwakeProc, error) {
	cmd := exec.Command(bin, AwakeCommand, strconv.Itoa(n))
	cmd.Stderr = logw
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("spawn awake process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("spawn awake process %s: %w", bin, err)
	}
	p := &AwakeProc{cmd: cmd, exited: make(chan error, 1)}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == awakeLine {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, out) // until it exits
		p.exited <- cmd.Wait()
	}()
	select {
	case <-ready:
		return p, nil
	case err := <-p.exited:
		return nil, fmt.Errorf("spawn awake process %s: exited before spinning: %v", bin, err)
	case <-time.After(15 * time.Second):
		p.Stop()
		return nil, errors.New("spawn awake process: not spinning within 15 s")
	}
}

// Stop ends the awake process (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (p *AwakeProc) Stop() {
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
