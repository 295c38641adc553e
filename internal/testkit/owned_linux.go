package testkit

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the kernel kill cmd's process if the process that
// started it dies first (a test binary killed by -timeout, a benchmark
// killed by a signal), so that no server outlives its owner. It keeps
// whatever else cmd.SysProcAttr sets; call it before cmd.Start.
//
// The kernel sends the signal when the thread that started the child
// exits; Go's runtime does not end its threads while the program runs,
// but for those of a goroutine that locked its thread and never unlocked.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
