package target

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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
	stop()
	// The spinners' threads go back to the normal policy before their goroutines end
	// (and then exit, or stay unused if it was the main thread); exiting is not
	// immediate, so /proc is polled.
	deadline := time.Now().Add(5 * time.Second)
	for schedPolicies(t)[unix.SCHED_IDLE] != before {
		if time.Now().After(deadline) {
			t.Fatalf("SCHED_IDLE threads left after stop: %d", schedPolicies(t)[unix.SCHED_IDLE])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAwakeEndsWhenOrphaned: an awake process spins until its context ends, or stops by
// itself once its parent is gone.
func TestAwakeEndsWhenOrphaned(t *testing.T) {
	var gone atomic.Bool
	var polls atomic.Int64
	orphaned := func() bool {
		polls.Add(1)
		return gone.Load()
	}
	done := make(chan error, 1)
	var out strings.Builder
	go func() {
		done <- runAwake(context.Background(), 1, &out, orphaned, time.Millisecond)
	}()
	for polls.Load() < 3 { // it has looked for its parent three times, and found it
		runtime.Gosched()
	}
	select {
	case err := <-done:
		t.Fatalf("ended with its parent there: %v", err)
	default:
	}
	gone.Store(true)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(out.String(), awakeLine) {
			t.Fatalf("orphaned: err %v, output %q", err, out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still spinning 10 s after its parent was gone")
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- runAwake(ctx, 1, io.Discard, func() bool { return false }, time.Millisecond) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ended by its context: %v", err)
	}
}
