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
	CPU      time.Duration
}

// ReadProc samples /proc/<pid>/status (VmRSS) and /proc/<pid>/stat (utime + stime).
func ReadProc(pid int) (Sample, error) {
	var s Sample
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read process status: %w", err)
	}
	for _, line := range bytes.Split(status, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(rest)
			if len(f) < 1 {
				return s, fmt.Errorf("VmRSS line %q", line)
			}
			kb, err := strconv.ParseUint(string(f[0]), 10, 64)
			if err != nil {
				return s, fmt.Errorf("VmRSS %q: %w", f[0], err)
			}
			s.RSSBytes = kb << 10
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
	return s, nil
}
