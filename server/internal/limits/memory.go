package limits

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// PhysicalMemory is the memory the process may use: the machine's (MemTotal in
// /proc/meminfo), or its control group's limit when that is lower (cgroup v2
// memory.max, v1 memory.limit_in_bytes), as a container sees it.
func PhysicalMemory() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("physical memory: %w", err)
	}
	defer f.Close()
	total := int64(0)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("physical memory: MemTotal %q: %w", rest, err)
			}
			total = kb << 10
			break
		}
	}
	if total <= 0 {
		return 0, fmt.Errorf("physical memory: no MemTotal in /proc/meminfo")
	}
	if lim := cgroupLimit(); lim > 0 && lim < total {
		total = lim
	}
	return total, nil
}

// cgroupLimit is the memory limit of the process's control group, 0 when none is set
// or it cannot be read.
func cgroupLimit() int64 {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	best := int64(0)
	for _, line := range bytes.Split(data, []byte("\n")) {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(string(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[0] == "0" && parts[1] == "":
			file = "/sys/fs/cgroup" + parts[2] + "/memory.max"
		case strings.Contains(","+parts[1]+",", ",memory,"):
			file = "/sys/fs/cgroup/memory" + parts[2] + "/memory.limit_in_bytes"
		default:
			continue
		}
		raw, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		if err != nil || v <= 0 || v >= 1<<62 { // "max", or v1's "unlimited" page-rounded MaxInt64
			continue
		}
		if best == 0 || v < best {
			best = v
		}
	}
	return best
}
