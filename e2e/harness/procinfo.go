package harness

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// StartProcessEnv is StartProcess with extra environment variables
// ("NAME=value") on top of the harness's own environment.
func StartProcessEnv(name string, env []string, bin string, args ...string) (*Process, error) {
	p := &Process{Name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	// Its own process group, so a signal to the harness's terminal does
	// not reach it twice and Kill takes any children with it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	testkit.DieWithParent(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// RSS returns the process's resident set size in bytes (VmRSS of
// /proc/<pid>/status; Linux only).
func (p *Process) RSS() (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			fields := strings.Fields(v)
			if len(fields) != 2 || fields[1] != "kB" {
				return 0, fmt.Errorf("VmRSS line %q", sc.Text())
			}
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.Pid())
}

// WaitStopped waits until the kernel reports every thread of the process
// stopped (testkit.ThreadsStopped), as it is some moment after Pause sent
// SIGSTOP.
func (p *Process) WaitStopped(within time.Duration) error {
	var last error
	if !testkit.Until(within, func() bool {
		last = testkit.ThreadsStopped(p.Pid())
		// A process that has ended is not waited for.
		return last == nil || errors.Is(last, fs.ErrNotExist)
	}) {
		return fmt.Errorf("%s not stopped within %v: %w", p.Name, within, last)
	}
	return last
}

// ListenAddrs returns the local addresses of the TCP sockets the process
// listens on, read from /proc (Linux only): the socket inodes among its file
// descriptors matched against /proc/net/tcp and tcp6.
func (p *Process) ListenAddrs() ([]string, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", p.Pid())
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", p.Pid(), table))
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		lines := strings.Split(string(b), "\n")
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			const listen = "0A"
			if len(f) < 10 || f[3] != listen || !inodes[f[9]] {
				continue
			}
			a, err := procNetAddr(f[1])
			if err != nil {
				return nil, fmt.Errorf("/proc/net/%s: %w", table, err)
			}
			addrs = append(addrs, a)
		}
	}
	return addrs, nil
}

// procNetAddr decodes "0100007F:1F91" (/proc/net/tcp's little-endian
// words) to "127.0.0.1:8081".
func procNetAddr(s string) (string, error) {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return "", fmt.Errorf("address %q", s)
	}
	raw, err := hex.DecodeString(hexIP)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return "", fmt.Errorf("address %q", s)
	}
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		for i := 0; i < 4; i++ {
			ip[w+i] = raw[w+3-i]
		}
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return "", fmt.Errorf("port in %q", s)
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10)), nil
}

// CPUTime returns the CPU time the process has used, user and system
// (CPUTimeOf).
func (p *Process) CPUTime() (time.Duration, error) { return CPUTimeOf(p.Pid()) }

// CPUTimeOf returns the CPU time process pid has used, user and system
// (utime + stime of /proc/<pid>/stat; Linux only, in clock ticks of 10 ms).
func CPUTimeOf(pid int) (time.Duration, error) {
	f, err := testkit.ProcStatFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, s := range f[11:13] { // utime and stime, fields 14 and 15
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / clockTicks), nil
}

// ThreadNiceness returns the scheduling niceness of each thread of process
// pid, by thread id (field 19 of /proc/<pid>/task/<tid>/stat; Linux only).
// Linux keeps a niceness per thread, so a process's own is not enough.
func ThreadNiceness(pid int) (map[int]int, error) {
	threads, err := testkit.ThreadStatFields(pid)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int, len(threads))
	for tid, f := range threads {
		if out[tid], err = strconv.Atoi(f[16]); err != nil {
			return nil, fmt.Errorf("/proc/%d/task/%d/stat: niceness: %w", pid, tid, err)
		}
	}
	return out, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100
