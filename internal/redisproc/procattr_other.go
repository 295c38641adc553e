//go:build !linux

package redisproc

import "os/exec"

// setProcAttr has nothing to add outside Linux: servers are stopped by Stop.
func setProcAttr(cmd *exec.Cmd) {}
