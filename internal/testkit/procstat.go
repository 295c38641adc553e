package testkit

import (
	"bytes"
	"fmt"
	"os"
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
