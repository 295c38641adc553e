package testkit

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcStatFields reads a stat file of /proc (/proc/PID/stat, or a thread's
// /proc/PID/task/TID/stat; proc(5)) and returns its fields from the third
// on: f[0] is field 3, the state, f[11] and f[12] the user and system
// clock ticks, f[16] the niceness. It asks for at least 17 of them.
func ProcStatFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 17 {
		return nil, fmt.Errorf("%s: %d fields", path, len(f)+2)
	}
	return f, nil
}

// ThreadStatFields reads the stat file of every thread of process pid
// (/proc/PID/task/TID/stat) and returns each one's fields as
// ProcStatFields does, by thread id. A thread that ends meanwhile is left
// out; an error that is fs.ErrNotExist says the process has ended.
func ThreadStatFields(pid int) (map[int][]string, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[int][]string, len(tasks))
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		f, err := ProcStatFields(filepath.Join(dir, task.Name(), "stat"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread has ended
		}
		if err != nil {
			return nil, err
		}
		out[tid] = f
	}
	return out, nil
}

// ThreadsStopped returns nil once every thread of process pid is stopped
// by a signal (state T), and otherwise an error that names one that is
// not. A SIGSTOP stops a process's threads one by one: each stops when it
// next runs, and on a busy machine one may run on for milliseconds after
// another has stopped, so the process's own state (its main thread's) is
// not enough.
func ThreadsStopped(pid int) error {
	threads, err := ThreadStatFields(pid)
	if err != nil {
		return err
	}
	for tid, f := range threads {
		switch f[0] {
		case "T", "Z", "X": // stopped, or ended and not yet reaped
		default:
			return fmt.Errorf("process %d: thread %d is in state %s", pid, tid, f[0])
		}
	}
	return nil
}
