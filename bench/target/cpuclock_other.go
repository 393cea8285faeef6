//go:build !linux

package target

import "time"

// processCPUClock is Linux-only; elsewhere ReadProc falls back to the /proc files.
func processCPUClock(pid int) (time.Duration, bool) { return 0, false }
