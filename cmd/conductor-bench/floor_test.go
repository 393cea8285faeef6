package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestLoadCommandFloor: load --floor against a spawned conductor prints, for every cell,
// the floor server's CPU per query and the cell's CPU above it; without a conductor
// process of its own to sample it refuses. --keep-awake (with it here) is named in the
// title, and refused in process too (its spinners would be counted).
func TestLoadCommandFloor(t *testing.T) {
	bin := conductorBinary(t)
	var out, errOut strings.Builder
	code := run([]string{"load", "--conductor-bin", bin, "--floor", "--keep-awake", "--instances", "2", "--blocks", "500", "--prompt-tokens", "512",
		"--shapes", "hit,miss", "--concurrency", "1", "--duration", "50ms", "--binary-tokens", "--results", t.TempDir()}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "floor CPU/q us") || !strings.Contains(out.String(), "above floor us") {
		t.Fatalf("no floor columns:\n%s", out.String())
	}
	if !strings.Contains(out.String(), ", CPUs kept awake") {
		t.Fatalf("--keep-awake not in the title:\n%s", out.String())
	}
	rows := 0
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) != 13 || f[0] != "512" {
			continue
		}
		rows++
		cpu, err1 := strconv.ParseFloat(f[8], 64)
		fl, err2 := strconv.ParseFloat(f[11], 64)
		above, err3 := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil || err3 != nil || fl <= 0 || cpu <= 0 {
			t.Errorf("row %q", line)
		}
		if d := cpu - fl - above; d > 0.11 || d < -0.11 {
			t.Errorf("row %q: above floor is not CPU - floor", line)
		}
	}
	if rows != 2 {
		t.Fatalf("%d cell rows, want 2:\n%s", rows, out.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"load", "--floor", "--instances", "2", "--blocks", "500", "--prompt-tokens", "512"}, &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "--floor needs") {
		t.Fatalf("--floor in process: exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"load", "--keep-awake", "--instances", "2", "--blocks", "500", "--prompt-tokens", "512"}, &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "--keep-awake needs") {
		t.Fatalf("--keep-awake in process: exit %d, stderr %q", code, errOut.String())
	}
}

// TestLoadCommandAlternate: load --alternate runs the grid against two spawned binaries in
// turn (A B, then B A) and prints each cell's medians per binary, the floor's among them;
// --alternate excludes --conductor-bin.
func TestLoadCommandAlternate(t *testing.T) {
	bin := conductorBinary(t)
	var out, errOut strings.Builder
	code := run([]string{"load", "--alternate", bin + "," + bin, "--rounds", "2", "--floor", "--instances", "2", "--blocks", "500",
		"--prompt-tokens", "512", "--shapes", "hit,miss", "--memo", "cold", "--cold-prompts", "4", "--concurrency", "1",
		"--duration", "50ms", "--binary-tokens", "--results", t.TempDir()}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"round 1 of 2: A", "round 2 of 2: B", "load: medians of 2 alternated runs per binary",
		"512 hit cold x1 CPU/q", "512 miss cold x1 floor CPU/q", "CPU per block indexed", "A = " + bin} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if i, j := strings.Index(out.String(), "round 2 of 2: B"), strings.Index(out.String(), "round 2 of 2: A"); i < 0 || i > j {
		t.Errorf("round 2 does not start with B:\n%s", out.String())
	}
	errOut.Reset()
	if code := run([]string{"load", "--alternate", bin + "," + bin, "--conductor-bin", bin}, &out, &errOut); code == 0 ||
		!strings.Contains(errOut.String(), "excludes --conductor and --conductor-bin") {
		t.Fatalf("--alternate with --conductor-bin: exit %d, stderr %q", code, errOut.String())
	}
}
