package target

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// KeepAwake starts n threads that spin at the SCHED_IDLE policy (they run only when no
// other thread of the machine wants the CPU) until stop is called, so that the machine's
// CPUs never go idle. On a VM an idle vCPU halts, and waking it again (an interrupt
// through the hypervisor) costs tens of microseconds that land on whichever process is
// woken: a server answering one request at a time then pays them per request, and its
// CPU per request drifts with the host's load. A loaded production host rarely idles;
// measured with KeepAwake, a cell compares what the server itself costs. The spinners
// are threads of the calling process, which must not be the one measured. stop waits for
// them to end.
func KeepAwake(n int) (stop func(), err error) {
	var quit atomic.Bool
	var wg sync.WaitGroup
	started := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Locked, and never unlocked: the thread ends with the goroutine, so its
			// policy never reaches another goroutine. (The runtime keeps the main
			// thread, unused, if the goroutine ran there: hence the reset after.)
			runtime.LockOSThread()
			if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
				started <- fmt.Errorf("keep awake: set SCHED_IDLE: %w", err)
				return
			}
			started <- nil
			for !quit.Load() {
			}
			_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0)
		}()
	}
	stop = func() {
		quit.Store(true)
		wg.Wait()
	}
	for range n {
		if e := <-started; e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}
