package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/edgelimit/edgelimit/e2e/harness"
)

// TestSetNice runs setNice in a child process (it changes the priority of
// the process it runs in, for good without privilege), started at a given
// niceness, and reads back the niceness of every thread of the child: the
// ones there before the call, and one started after it, which inherits.
func TestSetNice(t *testing.T) {
	if spec := os.Getenv("GATEWAY_SETNICE"); spec != "" {
		setNiceChild(spec)
		return
	}
	cases := []struct {
		start, n  int
		lowerOnly bool
		want      int
		raises    bool // needs the privilege to raise a priority
	}{
		{start: 0, n: 10, lowerOnly: true, want: 10},
		{start: 12, n: 10, lowerOnly: true, want: 12}, // the default never raises
		{start: 3, n: 7, lowerOnly: false, want: 7},
		// A value given raises a priority, where the default would keep
		// the threads at 12 (the case above).
		{start: 12, n: 10, lowerOnly: false, want: 10, raises: true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("from %d to %d lower-only %t", c.start, c.n, c.lowerOnly), func(t *testing.T) {
			if c.raises {
				if err := mayRaisePriority(c.start, c.n); err != nil {
					t.Skipf("raising a priority needs CAP_SYS_NICE or an RLIMIT_NICE that allows it, and this process may not: %v", err)
				}
			}
			cmd := exec.Command("nice", "-n", strconv.Itoa(c.start), os.Args[0], "-test.run=^TestSetNice$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("GATEWAY_SETNICE=%d,%t", c.n, c.lowerOnly))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			var threads, wrong []string
			for _, line := range strings.Split(string(out), "\n") {
				tid, n, ok := strings.Cut(strings.TrimPrefix(line, "thread "), " niceness ")
				if !strings.HasPrefix(line, "thread ") || !ok {
					continue
				}
				threads = append(threads, tid)
				if n != strconv.Itoa(c.want) {
					wrong = append(wrong, tid+"="+n)
				}
			}
			if len(threads) < 3 {
				t.Fatalf("the child reported %d threads: %s", len(threads), out)
			}
			if len(wrong) > 0 {
				t.Errorf("threads not at niceness %d: %v\n%s", c.want, wrong, out)
			}
		})
	}
}

// mayRaisePriority returns why this process may not take a thread from
// niceness from to a lower niceness to, nil if it may: it tries exactly
// that on a thread of its own, which the kernel allows only with
// CAP_SYS_NICE or an RLIMIT_NICE that reaches to (and going to from
// needs the same where the thread starts nicer than from). The thread ends
// with the goroutine, its niceness with it.
func mayRaisePriority(from, to int) error {
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		tid := syscall.Gettid()
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, from); err != nil {
			res <- fmt.Errorf("niceness %d: %w", from, err)
			return
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, to); err != nil {
			res <- fmt.Errorf("niceness %d to %d: %w", from, to, err)
			return
		}
		res <- nil
	}()
	return <-res
}

// setNiceChild is the child: more than one thread before setNice, one more
// after it, then the niceness of each.
func setNiceChild(spec string) {
	ns, lo, _ := strings.Cut(spec, ",")
	n, _ := strconv.Atoi(ns)
	hold := make(chan struct{})
	var started sync.WaitGroup
	thread := func() {
		started.Add(1)
		go func() {
			runtime.LockOSThread() // a thread of its own, kept until exit
			started.Done()
			<-hold
		}()
		started.Wait()
	}
	thread()
	thread()
	if err := setNice(n, lo == "true"); err != nil {
		fmt.Println("setNice:", err)
		os.Exit(1)
	}
	thread()
	nice, err := harness.ThreadNiceness(os.Getpid())
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	for tid, v := range nice {
		fmt.Printf("thread %d niceness %d\n", tid, v)
	}
	close(hold)
}
