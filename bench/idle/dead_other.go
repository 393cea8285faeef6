//go:build !linux

package idle

import "errors"

// DeadEndpoints are loopback TCP ports that nobody listens on; only Linux has them here.
type DeadEndpoints struct{}

// ReserveDeadEndpoints fails: only Linux is supported.
func ReserveDeadEndpoints(int) (*DeadEndpoints, error) {
	return nil, errors.New("dead endpoints are only reserved on Linux")
}

// Endpoints returns nothing.
func (d *DeadEndpoints) Endpoints() []string { return nil }

// Close does nothing.
func (d *DeadEndpoints) Close() {}
