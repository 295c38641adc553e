//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// setNice makes every thread of the process run at niceness n. Linux keeps
// the niceness per thread, and a new thread takes its creator's, so the
// threads there now are set, and the list read again until it holds none
// that was not: the runtime may start one meanwhile. With lowerOnly (the
// default, not a value given), a process already started nicer than n
// keeps its niceness: the default never raises a priority. A thread
// whose creation was under way when its creator was set can still come
// out with the creator's old niceness (the kernel copied it first), and
// so can the threads it makes: a second call, once such a creation has
// ended, sets them too, which run makes.
func setNice(n int, lowerOnly bool) error {
	done := map[int]bool{}
	for {
		tids, err := threads()
		if err != nil {
			return err
		}
		changed := false
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			done[tid], changed = true, true
			want := n
			if lowerOnly {
				// The raw syscall answers 20 - nice (1..40), as the
				// kernel keeps it; libc's getpriority converts, Go's
				// does not.
				raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, tid)
				if err == nil && 20-raw > want {
					want = 20 - raw
				}
			}
			err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, want)
			if errors.Is(err, syscall.ESRCH) {
				continue // the thread has ended
			}
			if err != nil {
				return fmt.Errorf("niceness %d: %w", want, err)
			}
		}
		if !changed {
			return nil
		}
	}
}

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
