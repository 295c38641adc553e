// Package harness starts and owns the real processes of an end-to-end run
// (the sidecar, the gateway) for the e2e tests, the demo and the
// benchmarks. The upstream services behind the gateway come from package
// services; polling and reading /metrics, from internal/testkit.
// Everything it starts is stopped by its owner.
package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/internal/syncbuf"
	"github.com/edgelimit/edgelimit/internal/testkit"
)

// Process is a child process whose output is kept for diagnosis.
type Process struct {
	Name string
	cmd  *exec.Cmd
	out  syncbuf.Buffer
	done chan struct{}
	err  error
}

// StartProcess starts bin with args; its stdout and stderr are captured.
func StartProcess(name, bin string, args ...string) (*Process, error) {
	return StartProcessEnv(name, nil, bin, args...)
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits up to grace for the process to exit, then
// kills it. It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) error {
	if exited, err := p.Exited(); exited {
		return exitErr(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	// A paused process acts on SIGTERM only once continued.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-p.done:
		return exitErr(p.err)
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.Name, grace)
	}
}

// Kill ends the process (and its group) at once and waits for it.
func (p *Process) Kill() {
	if exited, _ := p.Exited(); exited {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Signal delivers sig to the process.
func (p *Process) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Pause stops the process (SIGSTOP) without closing its sockets: the
// kernel still accepts connections on its listeners, but nothing answers.
// It returns once the kernel reports the process stopped: until then it
// may still answer a request or two.
func (p *Process) Pause() error {
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return p.WaitStopped(10 * time.Second)
}

// Resume continues a paused process.
func (p *Process) Resume() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// Output returns everything the process wrote so far.
func (p *Process) Output() string { return p.out.String() }

func exitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Exited() && ee.ExitCode() == 0 {
		return nil
	}
	if errors.As(err, &ee) && !ee.Exited() {
		// Ended by a signal we sent: not a failure of the process.
		return nil
	}
	return err
}

// WaitHTTP polls url until it answers with status want, the process dies,
// or ctx ends. p may be nil.
func WaitHTTP(ctx context.Context, p *Process, url string, want int) error {
	client := &http.Client{Timeout: time.Second}
	var last, exited error
	err := testkit.Wait(ctx, func() bool {
		if p != nil {
			if done, err := p.Exited(); done {
				exited = fmt.Errorf("%s exited before %s was ready (%v); output:\n%s", p.Name, url, err, p.Output())
				return true
			}
		}
		resp, err := client.Get(url)
		if err != nil {
			last = err
			return false
		}
		resp.Body.Close()
		if resp.StatusCode == want {
			return true
		}
		last = fmt.Errorf("%s: status %d, want %d", url, resp.StatusCode, want)
		return false
	})
	switch {
	case exited != nil:
		return exited
	case err != nil:
		return fmt.Errorf("waiting for %s: %w (last: %v)", url, err, last)
	}
	return nil
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago. A process that fails to bind it should be started again with a new
// one.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
