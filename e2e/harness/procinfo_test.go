package harness

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

func TestProcNetAddr(t *testing.T) {
	tests := []struct{ in, want string }{
		{"0100007F:1F91", "127.0.0.1:8081"},
		{"00000000:0050", "0.0.0.0:80"},
		{"00000000000000000000000001000000:1F90", "[::1]:8080"},
		{"0000000000000000FFFF00000100007F:0016", "127.0.0.1:22"},
	}
	for _, tt := range tests {
		got, err := procNetAddr(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("procNetAddr(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "0100007F", "0100007:1F91", "zz00007F:1F91", "0100007F:1FFFF"} {
		if got, err := procNetAddr(bad); err == nil {
			t.Errorf("procNetAddr(%q) = %q, want an error", bad, got)
		}
	}
}

// TestHelperListener is not a test: run by TestProcessInfo as a child
// process (HARNESS_HELPER=listen), it listens on a loopback port, prints
// the address and waits to be stopped.
func TestHelperListener(t *testing.T) {
	if os.Getenv("HARNESS_HELPER") != "listen" {
		t.Skip("helper process for TestProcessInfo")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("listening on", ln.Addr())
	time.Sleep(time.Minute)
}

// A child's listening sockets and RSS, and Pause returning once the
// kernel reports it stopped.
func TestProcessInfo(t *testing.T) {
	p, err := StartProcessEnv("listener", []string{"HARNESS_HELPER=listen"}, os.Args[0], "-test.run=^TestHelperListener$")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Error(err)
		}
	})
	listening := regexp.MustCompile(`listening on (\S+)\n`)
	var addr string
	testkit.PollErr(t, 30*time.Second, "the helper to listen", func() error {
		if m := listening.FindStringSubmatch(p.Output()); m != nil {
			addr = m[1]
			return nil
		}
		if exited, err := p.Exited(); exited {
			t.Fatalf("helper exited (%v):\n%s", err, p.Output())
		}
		return fmt.Errorf("output so far:\n%s", p.Output())
	})
	addrs, err := p.ListenAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(addrs, []string{addr}) {
		t.Errorf("ListenAddrs = %v, want [%s]", addrs, addr)
	}
	if rss, err := p.RSS(); err != nil || rss <= 0 {
		t.Errorf("RSS = %d, %v", rss, err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := testkit.ThreadsStopped(p.Pid()); err != nil {
		t.Errorf("after Pause: %v", err)
	}
	// Stop (at cleanup) must end a paused process without waiting out
	// its grace period.
}

// TestHelperOwner is not a test: run by TestProcessDiesWithOwner as a
// child process (HARNESS_HELPER=owner), it starts a listener of its own
// through StartProcessEnv, prints the listener's pid once it listens and
// waits to be killed.
func TestHelperOwner(t *testing.T) {
	if os.Getenv("HARNESS_HELPER") != "owner" {
		t.Skip("helper process for TestProcessDiesWithOwner")
	}
	p, err := StartProcessEnv("listener", []string{"HARNESS_HELPER=listen"}, os.Args[0], "-test.run=^TestHelperListener$")
	if err != nil {
		t.Fatal(err)
	}
	// Once it has written its line, the listener writes nothing more: it
	// cannot die of a write to the dead owner's pipe, only of the signal.
	if !testkit.Until(30*time.Second, func() bool { return strings.Contains(p.Output(), "listening on") }) {
		t.Fatalf("the listener did not start:\n%s", p.Output())
	}
	fmt.Println("started", p.Pid())
	time.Sleep(time.Minute)
}

// A process the harness started does not outlive the process that started
// it, even when that one is killed and can run no cleanup (a test binary
// killed by -timeout): the kernel kills it too.
func TestProcessDiesWithOwner(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the parent-death signal is Linux's")
	}
	owner, err := StartProcessEnv("owner", []string{"HARNESS_HELPER=owner"}, os.Args[0], "-test.run=^TestHelperOwner$")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Kill)
	started := regexp.MustCompile(`started (\d+)\n`)
	var pid int
	testkit.PollErr(t, 30*time.Second, "the owner to start its listener", func() error {
		if m := started.FindStringSubmatch(owner.Output()); m != nil {
			pid, _ = strconv.Atoi(m[1])
			return nil
		}
		if exited, err := owner.Exited(); exited {
			t.Fatalf("owner exited (%v):\n%s", err, owner.Output())
		}
		return fmt.Errorf("output so far:\n%s", owner.Output())
	})
	// The listener is in a process group of its own: the owner's SIGKILL
	// (Kill signals the owner's group) does not reach it.
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the listener %d is not running: %v", pid, err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	owner.Kill()
	testkit.PollErr(t, 30*time.Second, "the listener to die with its owner", func() error {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("listener %d still runs", pid)
	})
}
