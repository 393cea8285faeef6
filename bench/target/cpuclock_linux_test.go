package target

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// spinLockedThread burns d of CPU on a goroutine locked to its thread and returns
// without unlocking, so that Go ends the thread with it; it returns the thread's id.
// The main thread is the exception (Go parks it instead of ending it), so a goroutine
// that lands there unlocks and another is started. The spin is measured on the thread's
// own CPU clock, not the wall clock: on a loaded machine a wall-clock spin gets only a
// share of a CPU.
func spinLockedThread(d time.Duration) int {
	for {
		tid := make(chan int, 1)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == os.Getpid() {
				runtime.UnlockOSThread()
				tid <- 0
				return
			}
			start := threadCPU()
			for threadCPU()-start < d {
			}
			tid <- unix.Gettid()
		}()
		if id := <-tid; id != 0 {
			return id
		}
	}
}

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(err)
	}
	return time.Duration(ts.Nano())
}

// TestReadProcCountsExitedThreads: the CPU time a thread spent stays counted after the
// thread exits (a sum over the live threads' schedstat lost it, and ReadProc once read
// less CPU after work than before).
func TestReadProcCountsExitedThreads(t *testing.T) {
	s0, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const spin = 80 * time.Millisecond
	tid := spinLockedThread(spin)
	// Wait until the thread has gone from the task list, so that the reading below is
	// taken without it.
	task := fmt.Sprintf("/proc/self/task/%d", tid)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s1, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// The spinning thread spent spin on a CPU (its own clock says so), so the process's
	// CPU grew by at least that; half of it is a bound a lost thread cannot meet.
	if got := s1.CPU - s0.CPU; got < spin/2 {
		t.Fatalf("CPU grew by %v over a %v spin on an exited thread", got, spin)
	}
}

// TestProcessCPUClockOfChild: another process's CPU clock is readable, and it agrees
// with that process's tick count in /proc/<pid>/stat.
func TestProcessCPUClockOfChild(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var ns time.Duration
	for i := 0; i < 500; i++ {
		var ok bool
		if ns, ok = processCPUClock(cmd.Process.Pid); !ok {
			t.Fatal("process CPU clock of a child unreadable")
		}
		if ns >= 20*time.Millisecond {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ns < 20*time.Millisecond {
		t.Fatalf("child's CPU clock read %v after its loop", ns)
	}
	if _, ok := processCPUClock(-1); ok {
		t.Fatal("a CPU clock for pid -1")
	}
}
