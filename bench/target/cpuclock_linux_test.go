package target

import (
	"bufio"
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
// It spins until the thread's own CPU clock has advanced by d, so the thread spends d on
// a CPU however loaded the machine is (a wall-clock spin gets less under load). The
// main thread is the exception (Go parks it instead of ending it), so a goroutine that
// lands there unlocks and another is started.
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
			for start := threadCPUTime(); threadCPUTime()-start < d; {
			}
			tid <- unix.Gettid()
		}()
		if id := <-tid; id != 0 {
			return id
		}
	}
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
	// taken without it. (The sleep only paces the polling: how long the thread takes to
	// go decides nothing.)
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
	// The thread ran for spin of CPU by its own clock; the process clock counts every
	// thread's, the exited ones included, so it grew by at least that.
	if got := s1.CPU - s0.CPU; got < spin {
		t.Fatalf("CPU grew by %v over a %v spin on an exited thread", got, spin)
	}
}

// threadCPUTime is the calling thread's CPU time.
func threadCPUTime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(fmt.Sprintf("thread CPU clock: %v", err))
	}
	return time.Duration(ts.Nano())
}

// TestProcessCPUClockOfChild: another process's CPU clock is readable, and it agrees
// with that process's tick count in /proc/<pid>/stat.
func TestProcessCPUClockOfChild(t *testing.T) {
	// The child says when its loop (well over 20 ms of CPU on any machine) is done, and
	// then waits on its stdin, which the test closes at the end.
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo done; read x")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("no sh: %v", err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "done\n" {
		t.Fatalf("child said %q (%v)", line, err)
	}
	ns, ok := processCPUClock(cmd.Process.Pid)
	if !ok {
		t.Fatal("process CPU clock of a child unreadable")
	}
	if ns < 20*time.Millisecond {
		t.Fatalf("child's CPU clock read %v after its loop", ns)
	}
	if _, ok := processCPUClock(-1); ok {
		t.Fatal("a CPU clock for pid -1")
	}
}
