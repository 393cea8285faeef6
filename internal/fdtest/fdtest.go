// Package fdtest runs test code while the process can open only a given number of new
// file descriptors, to prove what servers and subscribers do when descriptors run out.
package fdtest

import (
	"os"
	"strconv"
	"syscall"
	"testing"
)

// WithRoom runs fn while the process can open at most room more descriptors, and
// restores the limit afterwards.
//
// RLIMIT_NOFILE bounds descriptor numbers, not their count: a hole below the highest
// open descriptor would give fn one more than asked (and made such tests pass or fail
// with the layout of the descriptor table). So the holes are filled first with
// /dev/null, the limit is set just above the highest descriptor plus room, and the
// fillers are closed after fn. Descriptors that other goroutines close while fn runs
// can still open holes; tests keep their own activity quiet around the call.
func WithRoom(tb testing.TB, room int, fn func()) {
	tb.Helper()
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		tb.Fatal(err)
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatal(err)
	}
	highest := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > highest {
			highest = n
		}
	}
	var fillers []int
	defer func() {
		for _, fd := range fillers {
			syscall.Close(fd)
		}
	}()
	firstFree := 0
	for {
		fd, err := syscall.Open("/dev/null", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			tb.Fatal(err)
		}
		if fd > highest {
			// Every number below fd is taken now: fd is the first free one.
			syscall.Close(fd)
			firstFree = fd
			break
		}
		fillers = append(fillers, fd)
	}
	lim := orig
	lim.Cur = uint64(firstFree + room)
	if lim.Cur > orig.Max {
		tb.Fatalf("limit %d would exceed the hard limit %d", lim.Cur, orig.Max)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			tb.Fatal(err)
		}
	}()
	fn()
}
