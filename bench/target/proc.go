package target

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat; it is 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// Sample is a process's resident memory and consumed CPU time at one instant.
type Sample struct {
	RSSBytes uint64
	// PeakRSSBytes is the highest RSS since the process started or since ResetPeakRSS
	// (VmHWM; 0 where the kernel does not report it).
	PeakRSSBytes uint64
	CPU          time.Duration
}

// ResetPeakRSS restarts the process's peak RSS (Sample.PeakRSSBytes) from its current RSS,
// by writing 5 to /proc/<pid>/clear_refs (Linux 4.0 and later; the caller must own the
// process), so that a later sample's peak is the peak since now.
func ResetPeakRSS(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	return nil
}

// statusKB parses the value of a /proc/<pid>/status line such as "VmRSS:  1234 kB" (rest
// is what follows the colon) into bytes.
func statusKB(line, rest []byte) (uint64, error) {
	f := bytes.Fields(rest)
	if len(f) < 1 {
		return 0, fmt.Errorf("status line %q", line)
	}
	kb, err := strconv.ParseUint(string(f[0]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("status line %q: %w", line, err)
	}
	return kb << 10, nil
}

// ReadProc samples /proc/<pid>/status (VmRSS, VmHWM) and the process's CPU time: its
// process CPU clock, or else the sum of its live threads' schedstat run times, or else
// /proc/<pid>/stat (utime + stime, in 10 ms ticks).
func ReadProc(pid int) (Sample, error) {
	var s Sample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read process status: %w", err)
	}
	for _, line := range bytes.Split(status, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			if s.RSSBytes, err = statusKB(line, rest); err != nil {
				return s, err
			}
		} else if rest, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			if s.PeakRSSBytes, err = statusKB(line, rest); err != nil {
				return s, err
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read process stat: %w", err)
	}
	// The command name may contain spaces; fields are counted after its closing paren.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 13 {
		return s, fmt.Errorf("malformed /proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseUint(string(f[11]), 10, 64)
	st, err2 := strconv.ParseUint(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return s, fmt.Errorf("malformed cpu times in /proc/%d/stat", pid)
	}
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	if ns, ok := processCPUClock(pid); ok {
		s.CPU = ns
	} else if ns, ok := schedCPU(pid); ok {
		s.CPU = ns
	}
	return s, nil
}

// schedCPU sums the on-CPU time of the process's live threads from
// /proc/<pid>/task/*/schedstat (nanoseconds, where /proc/<pid>/stat counts 10 ms ticks),
// so that a cell of a few dozen queries still gets a usable CPU figure where the process
// CPU clock cannot be read. Threads that exited are not counted: Go ends a thread when a
// goroutine exits locked to it, and the sum then drops, so it is only the fallback.
func schedCPU(pid int) (time.Duration, bool) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var total uint64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited meanwhile
		}
		f := bytes.Fields(b)
		if len(f) < 1 {
			return 0, false
		}
		ns, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, false
		}
		total += ns
	}
	return time.Duration(total), true
}
