package target

import (
	"os/exec"
	"runtime"
)

// startTied starts cmd so that it is stopped (SIGTERM, where the OS can: deathSignal)
// when the harness dies without stopping it, as a SIGKILL or a crash would leave it,
// and returns a channel that receives cmd.Wait's result once it exits. drain, if not nil,
// runs after the start and before Wait (reading cmd's pipes to their end, as Wait
// requires).
//
// Linux ties the death signal to the thread that forked the child, not to the process:
// so the child is started from a goroutine locked to its thread, which then drains and
// waits for it there and never unlocks. That thread lives exactly as long as the child,
// whatever else the runtime does with its threads.
func startTied(cmd *exec.Cmd, drain func()) (<-chan error, error) {
	deathSignal(cmd)
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		if drain != nil {
			drain()
		}
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
