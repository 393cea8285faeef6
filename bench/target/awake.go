package target

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
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
// printing awakeLine on out. Started by SpawnAwake, it gets SIGTERM (which ends ctx in
// conductor-bench) when the harness dies without stopping it (startTied).
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

// SpawnAwake runs "bin keep-awake N" (bin: a conductor-bench binary, usually the running
// one; n <= 0: one thread per CPU) and returns once its threads spin. Its stderr goes to
// logw; Stop ends it.
func SpawnAwake(bin string, n int, logw io.Writer) (*Child, error) {
	c, _, err := SpawnChild("awake process", bin, []string{AwakeCommand, strconv.Itoa(n)}, awakeLine, logw)
	return c, err
}
