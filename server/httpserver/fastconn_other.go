//go:build !linux

package httpserver

import "net"

// fastListener passes connections through: the raw non-blocking socket calls of
// fastconn_linux.go are Linux-only.
type fastListener struct{ net.Listener }
