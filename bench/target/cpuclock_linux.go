package target

import (
	"time"

	"golang.org/x/sys/unix"
)

// processCPUClock reads the CPU time of the whole process pid, the threads that exited
// included, from its POSIX process CPU clock (clock_getcpuclockid(3)): nanosecond
// resolution, and it never goes back, where a sum over the live threads does when a thread
// exits (a goroutine that ends while locked to its thread takes the thread with it).
func processCPUClock(pid int) (time.Duration, bool) {
	// The kernel's encoding of a process clock: the pid complemented, shifted past the
	// three clock bits, with CPUCLOCK_SCHED (2), which counts scheduled run time.
	const cpuClockSched = 2
	if pid <= 0 {
		return 0, false // the encoding of 0 and -1 reads the calling process's own clock
	}
	clock := int32(^pid<<3 | cpuClockSched)
	var ts unix.Timespec
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
