package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestServicesCommand: registering services over HTTP shows up in the process's
// descriptors, and unregistering them gives the descriptors back.
func TestServicesCommand(t *testing.T) {
	var out, errOut strings.Builder
	code := run([]string{"services", "-n", "20", "-settle", "200ms"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	m := regexp.MustCompile(`per service: ([0-9.]+) fds, ([-0-9.]+) threads; left after unregister: (-?[0-9]+) fds`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output:\n%s", out.String())
	}
	perFD, _ := strconv.ParseFloat(m[1], 64)
	left, _ := strconv.Atoi(m[3])
	// The harness shares the process (in-process conductor), so allow its own noise.
	if perFD < 1 || left > 10 {
		t.Fatalf("per-service descriptors %v, left %d\n%s", perFD, left, out.String())
	}
}

// TestBigMessageCommand: the RSS samples around one big message are printed.
func TestBigMessageCommand(t *testing.T) {
	var out, errOut strings.Builder
	code := run([]string{"bigmsg", "-mb", "2", "-settle", "50ms"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	if n := strings.Count(out.String(), " RSS "); n != 4 {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestLogFloodNeedsBinary: logflood measures a spawned conductor's log, so it refuses to
// run without one.
func TestLogFloodNeedsBinary(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"logflood", "-n", "10"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "--conductor-bin") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}
