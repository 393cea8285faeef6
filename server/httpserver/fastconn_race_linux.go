//go:build linux && race

package httpserver

import "syscall"

// Under the race detector, fastConn goes through syscall.Read and syscall.Write (the
// same non-blocking calls, with the runtime's bookkeeping): they tell the detector that
// what one goroutine wrote to a socket happens before what another reads from it, which
// raw calls would hide (every test that synchronises through a connection would then
// report a race that is not there).

func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errnoOf(err)
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return err.(syscall.Errno)
}
