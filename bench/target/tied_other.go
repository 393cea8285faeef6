//go:build !linux

package target

import "os/exec"

// deathSignal does nothing where the OS has no parent-death signal: a harness that dies
// without stopping its children leaves them running.
func deathSignal(cmd *exec.Cmd) {}
