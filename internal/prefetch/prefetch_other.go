//go:build !amd64

package prefetch

// lines does nothing where there is no prefetch instruction in assembly here: the
// callers' later loads find the lines as they would have without it.
func lines(*uintptr, int) {}
