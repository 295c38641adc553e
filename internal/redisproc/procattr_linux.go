package redisproc

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill redis-server if the process that started
// it dies first (a test binary killed by -timeout, say), so no server
// outlives its owner.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
