package target

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tiedHelperEnv makes the test binary act as a harness: TestTiedChildHelper spawns a
// child through SpawnChild, prints its pid and blocks.
const tiedHelperEnv = "CONDUCTOR_TIED_HELPER"

// TestTiedChildHelper is the harness of TestChildEndsWithHarness (it runs only when
// that test starts this binary with tiedHelperEnv set).
func TestTiedChildHelper(t *testing.T) {
	if os.Getenv(tiedHelperEnv) == "" {
		t.Skip("helper process only")
	}
	c, _, err := SpawnChild("sleeper", "sh", []string{"-c", "echo ready; exec sleep 60"}, "ready", os.Stderr)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("child", c.PID)
	time.Sleep(time.Minute) // until the test kills this process
}

// TestChildEndsWithHarness: a child spawned by a harness that is then killed with
// SIGKILL (it stops nothing) ends too, from its parent-death signal, though the harness
// started it from a goroutine of its own.
func TestChildEndsWithHarness(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	h := exec.Command(os.Args[0], "-test.run=^TestTiedChildHelper$", "-test.count=1")
	h.Env = append(os.Environ(), tiedHelperEnv+"=1")
	out, err := h.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Process.Kill(); _ = h.Wait() }()
	sc := bufio.NewScanner(out)
	child := 0
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "child "); ok {
			child, _ = strconv.Atoi(rest)
			break
		}
		if strings.HasPrefix(sc.Text(), "error") {
			t.Fatalf("helper: %s", sc.Text())
		}
	}
	if child <= 0 {
		t.Fatal("helper printed no child pid")
	}
	// If the child outlives the test, end it here rather than leave it behind.
	defer func() { _ = syscall.Kill(child, syscall.SIGKILL) }()
	// A pidfd of the child (not ours to wait for: its parent is the harness) becomes
	// readable when it exits.
	pidfd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	defer unix.Close(pidfd)
	if !alive(child) {
		t.Fatalf("child %d not running before the harness was killed", child)
	}
	if err := h.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.Wait()
	// Wait for the child's exit itself. The timeout only keeps a broken parent-death
	// signal from hanging the test run.
	const hangGuard = time.Minute
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(hangGuard/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("poll the child's pidfd: %v", err)
		}
		if n == 0 {
			t.Fatalf("child %d still running %v after its harness was killed", child, hangGuard)
		}
		break
	}
}

// alive reports whether pid runs: it exists and is not a zombie waiting to be reaped
// (an orphan's new parent may be slow to reap it, or never, in a container).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}
