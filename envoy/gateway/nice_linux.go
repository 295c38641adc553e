//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// setNice makes every thread of the process run at niceness n. Linux keeps
// the niceness per thread, and a new thread takes its creator's, so the
// threads there now are set. With lowerOnly (the default, not a value
// given), a thread already nicer than n keeps its niceness: the default
// never raises a priority.
//
// The runtime may start a thread meanwhile, and Linux copies the creator's
// niceness early in a thread's creation but lists the thread only at its
// end: a thread whose creation was under way while its creator was set
// comes out with the old niceness, after the pass that could have seen it.
// So passes repeat, each reading back the niceness of every thread listed
// and setting the ones that are not at their target, until none has
// needed setting for settleTime. A second call, once start-up has made its
// threads, sets any that came later still (run makes it).
func setNice(n int, lowerOnly bool) error {
	target := map[int]int{}
	last := time.Now()
	for {
		tids, err := threads()
		if err != nil {
			return err
		}
		for _, tid := range tids {
			// The raw syscall answers 20 - nice (1..40), as the kernel
			// keeps it; libc's getpriority converts, Go's does not.
			raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
			if errors.Is(err, syscall.ESRCH) {
				continue // the thread has ended
			}
			if err != nil {
				return fmt.Errorf("niceness of thread %d: %w", tid, err)
			}
			want, seen := target[tid]
			if !seen {
				want = n
				if lowerOnly && 20-raw > want {
					want = 20 - raw
				}
				target[tid] = want
			}
			if 20-raw == want {
				continue
			}
			err = syscall.Setpriority(syscall.PRIO_PROCESS, tid, want)
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			if err != nil {
				return fmt.Errorf("niceness %d: %w", want, err)
			}
			last = time.Now()
		}
		if time.Since(last) >= settleTime {
			return nil
		}
		time.Sleep(settleTime / 8)
	}
}

// settleTime is how long setNice goes on reading the threads back after
// the last one it had to set: far longer than a thread's creation takes.
const settleTime = 2 * time.Millisecond

// threads lists the process's thread ids.
func threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
