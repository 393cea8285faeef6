package target

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// schedPolicies counts this process's threads by scheduling policy (field 41 of
// /proc/self/task/<tid>/stat).
func schedPolicies(t *testing.T) map[int]int {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/stat")
	if err != nil {
		t.Fatal(err)
	}
	n := map[int]int{}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 on
		pol, err := strconv.Atoi(f[41-3])
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		n[pol]++
	}
	return n
}

// TestKeepAwakeSpinsAtIdlePolicy: keepAwake(n) runs n threads at SCHED_IDLE and no other
// thread of the process changes policy; after stop none is left.
func TestKeepAwakeSpinsAtIdlePolicy(t *testing.T) {
	before := schedPolicies(t)[unix.SCHED_IDLE]
	stop, err := keepAwake(2)
	if err != nil {
		t.Skip(err) // a sandbox that forbids sched_setattr
	}
	if got := schedPolicies(t)[unix.SCHED_IDLE]; got != before+2 {
		stop()
		t.Fatalf("%d SCHED_IDLE threads while keeping awake, want %d", got, before+2)
	}
	if schedPolicies(t)[0] == 0 { // 0: SCHED_OTHER
		t.Error("no thread left at the normal policy")
	}
	// stop returns once the spinners' goroutines have ended, each after it set its thread
	// back to the normal policy: a thread still exiting (or the main thread, kept
	// unused) reads as normal already.
	stop()
	if got := schedPolicies(t)[unix.SCHED_IDLE]; got != before {
		t.Fatalf("SCHED_IDLE threads left after stop: %d, want %d", got, before)
	}
}
