package target

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// keepAwake starts n goroutines, each locked to a thread that spins at the SCHED_IDLE
// policy (it runs only when no other thread of the machine wants the CPU), until stop is
// called; stop waits for them to end. Each holds one of the process's Ps while it spins:
// RunAwake runs them in a process of their own.
func keepAwake(n int) (stop func(), err error) {
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
