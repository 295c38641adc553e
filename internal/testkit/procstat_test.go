package testkit

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProcStatFields(t *testing.T) {
	f, err := ProcStatFields("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// This thread reads it, so the process runs.
	if f[0] != "R" && f[0] != "S" {
		t.Errorf("state %q, want R or S", f[0])
	}
	if _, err := ProcStatFields("/proc/self/nonexistent"); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v", err)
	}
}

// A process is stopped once every thread is, and not once continued.
func TestThreadsStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	if err := ThreadsStopped(pid); err == nil || !strings.Contains(err.Error(), "in state") {
		t.Errorf("a running process: %v, want a thread named not stopped", err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	PollErr(t, 5*time.Second, "every thread stopped", func() error { return ThreadsStopped(pid) })
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	PollErr(t, 5*time.Second, "a thread running again", func() error {
		if ThreadsStopped(pid) == nil {
			return errors.New("every thread still stopped")
		}
		return nil
	})
	// An ended process is not a stopped one, and says it has ended.
	cmd.Process.Kill()
	cmd.Wait()
	if err := ThreadsStopped(pid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("an ended process: %v, want one that is fs.ErrNotExist", err)
	}
}
