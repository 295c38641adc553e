//go:build !linux

package testkit

import "os/exec"

// DieWithParent has no equivalent outside Linux: there the processes are
// ended by their owner's Stop or Kill only.
func DieWithParent(cmd *exec.Cmd) {}
