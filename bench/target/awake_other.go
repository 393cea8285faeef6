//go:build !linux

package target

import "errors"

// keepAwake needs Linux's SCHED_IDLE policy (see awake_linux.go).
func keepAwake(n int) (stop func(), err error) {
	return nil, errors.New("keep awake: SCHED_IDLE needs Linux")
}
