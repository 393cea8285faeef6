package target

import (
	"os/exec"
	"syscall"
)

// deathSignal asks Linux to send cmd's process SIGTERM when the thread that starts it
// exits (PR_SET_PDEATHSIG; see startTied).
func deathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
}
