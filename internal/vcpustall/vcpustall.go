// Package vcpustall watches for the times this machine's vCPUs did not run.
//
// On a VM the hypervisor can stop a vCPU, or all of them, for milliseconds
// to run other tenants; whatever was on it waits with it, and no request
// with a 5 ms budget survives a stall of 10. Some hypervisors report that
// time to the guest as steal in /proc/stat; others do not, and there steal
// reads 0% while the vCPUs stand still (the root RATIONALE.md, "Why do the
// tests allow for the host's steal?", has the measurements).
//
// A Watch sees the stalls from inside: one thread per CPU, pinned to it at
// the highest real-time priority but one, asks to wake every period and
// records how late it woke. A thread of that class takes its CPU from any
// ordinary thread as soon as the kernel lets go of the CPU, so it is late
// by more than a millisecond only when the CPU did not run, or ran the
// kernel all along: the hypervisor had stopped the vCPU, or the kernel held
// it (an interrupt's deferred work gives the CPU back after 2 ms; a kernel
// built without preemption runs a system call on to its end or its next
// yield).
//
// A stall shows from the first wake-up it delays, so the watch sees one of
// length L as one of L less up to a period, or not at all when it fits
// between two wake-ups: it sees less than there was, never more.
//
// The watching threads run in a process of their own, the calling program
// started again with an environment variable that this package's init
// recognises, so that no goroutine of the caller's shares their Ps.
package vcpustall

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/edgelimit/edgelimit/internal/testkit"
)

// envWatch set to "1" makes init run the watch and exit.
const envWatch = "EDGELIMIT_VCPUSTALL_WATCH"

// period is how often each watching thread asks to run. Every wake-up
// takes the CPU from whatever ran there, and costs more than its own
// microseconds: at a millisecond, bursts through the gateway took 0.4 ms
// more at p50 with the watch than without (ten runs of each, in turn); at
// five, no more than the noise (RATIONALE.md, "Where the hypervisor
// reports no steal"). least is the lateness it reports, above the
// wake-up's own jitter (tens of µs).
const (
	period = 5 * time.Millisecond
	least  = time.Millisecond
)

// BreaksACallout is a stall long enough to make a burst's callout miss its
// 5 ms timeout: undisturbed, one has 2.5 ms left at p90 (RATIONALE.md,
// "Why do the tests allow for the host's steal?"). It is also past the 2
// ms after which the kernel hands an interrupt's deferred work to a thread
// the watch preempts.
const BreaksACallout = 2500 * time.Microsecond

// priority is the watching threads' SCHED_FIFO priority: above every
// thread of the programs watched, below the kernel's own (99).
const priority = 98

// Stall is a time a CPU did not run a thread that was due on it.
type Stall struct {
	CPU      int
	From, To time.Time
}

// Len is how long the CPU stood still.
func (s Stall) Len() time.Duration { return s.To.Sub(s.From) }

// A program started by Start to watch runs the watch here, before its own
// main or TestMain, and exits: any program that can start a watch (it
// imports this package) can be the watcher, and never runs its own code a
// second time as one.
func init() {
	if os.Getenv(envWatch) != "1" {
		return
	}
	if err := watch(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stdout, "unavailable: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Watch is a running watch, started by Start.
type Watch struct {
	cmd  *exec.Cmd
	read chan struct{} // closed when the watcher's output is read to its end

	syncMu sync.Mutex     // one Sync at a time
	ask    io.WriteCloser // the watcher's input: a line asks it to answer synced
	synced chan struct{}  // the reader saw the answer

	mu          sync.Mutex
	stalls      []Stall
	unavailable string
}

// Start starts the watch, in a process that is this program run again
// (this package's init runs the watch there), and returns once every CPU is
// watched. Where the threads cannot have real-time priority (no
// CAP_SYS_NICE, or an RT budget of zero), the watch is unavailable:
// Unavailable says why, and it records nothing. Close stops it.
func Start() (*Watch, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	// The watching goroutines never yield (watchCPU), and without
	// asyncpreemptoff sysmon would signal each of them every 10 ms to
	// preempt it: a wake-up more for nothing.
	cmd.Env = append(os.Environ(), envWatch+"=1", "GODEBUG=asyncpreemptoff=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	ask, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	testkit.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &Watch{cmd: cmd, read: make(chan struct{}), ask: ask, synced: make(chan struct{}, 1)}
	lines := bufio.NewScanner(out)
	if w.stalls, w.unavailable, err = readStart(lines); err != nil {
		close(w.read)
		w.Close()
		return nil, err
	}
	go func() {
		defer close(w.read)
		for lines.Scan() {
			if lines.Text() == "synced" {
				w.synced <- struct{}{}
				continue
			}
			s, err := parse(lines.Text())
			w.mu.Lock()
			if err != nil && w.unavailable == "" {
				w.unavailable = err.Error()
			}
			if err == nil {
				w.stalls = append(w.stalls, s)
			}
			w.mu.Unlock()
		}
	}()
	return w, nil
}

// readStart reads the watcher's output up to the line that says whether
// the watch runs: the stalls before it, and why the watch is unavailable
// ("" when it runs). Stalls can come first: the threads watch from the
// moment each has its priority, and on a loaded machine the goroutine that
// writes "ready", of ordinary priority, can wait for a CPU longer than a
// period.
func readStart(lines *bufio.Scanner) (stalls []Stall, unavailable string, err error) {
	for {
		line := ""
		if lines.Scan() {
			line = lines.Text()
		}
		if line == "ready" {
			return stalls, "", nil
		}
		if why, ok := strings.CutPrefix(line, "unavailable: "); ok {
			return stalls, why, nil
		}
		s, err := parse(line)
		if err != nil {
			return nil, "", fmt.Errorf("the watcher said %q (%v), not ready", line, lines.Err())
		}
		stalls = append(stalls, s)
	}
}

// Unavailable is why the watch records nothing, or "" when it watches.
func (w *Watch) Unavailable() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unavailable
}

// Close stops the watch, once what it reported is read. It is safe to call
// more than once.
func (w *Watch) Close() {
	if w.cmd.ProcessState == nil {
		_ = w.cmd.Process.Kill() // its threads sleep in a system call; nothing to flush
		<-w.read
		_ = w.cmd.Wait()
	}
}

// Stalls are the stalls of at least min recorded so far, in the order they
// ended.
func (w *Watch) Stalls(min time.Duration) []Stall {
	return w.kept(func(s Stall) bool { return s.Len() >= min })
}

// Within are the stalls of at least min recorded so far that overlap
// [from, to], in the order they ended.
func (w *Watch) Within(from, to time.Time, min time.Duration) []Stall {
	return w.kept(func(s Stall) bool { return s.Len() >= min && s.From.Before(to) && s.To.After(from) })
}

// kept are the stalls recorded so far that keep says to keep.
func (w *Watch) kept(keep func(Stall) bool) []Stall {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Stall
	for _, s := range w.stalls {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// During reports whether a CPU stood still for at least min within
// [from, to].
func (w *Watch) During(from, to time.Time, min time.Duration) bool {
	return len(w.Within(from, to, min)) > 0
}

// Sync returns once every stall whose thread had woken from it when Sync
// was called is recorded, so that a watch kept running can be asked about
// a moment just past. A watching thread writes its stall's line as it
// wakes, before anything else runs on its CPU (a request that waited
// through the stall is answered after that); the watcher answers Sync on
// the same output, behind every line written before it. It returns at once
// where the watch has ended.
func (w *Watch) Sync() {
	w.syncMu.Lock()
	defer w.syncMu.Unlock()
	if _, err := io.WriteString(w.ask, "sync\n"); err != nil {
		return
	}
	select {
	case <-w.synced:
	case <-w.read:
	}
}

// Broke reports whether a CPU stood still within [from, to] for
// BreaksACallout or more: long enough to make a callout waiting then miss
// its timeout.
func (w *Watch) Broke(from, to time.Time) bool { return w.During(from, to, BreaksACallout) }

// A stall's line: the CPU, and its start and end in µs since the epoch.
func format(b []byte, cpu int, from, to time.Time) []byte {
	b = strconv.AppendInt(b, int64(cpu), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, from.UnixMicro(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, to.UnixMicro(), 10)
	return append(b, '\n')
}

func parse(line string) (Stall, error) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return Stall{}, fmt.Errorf("the watcher said %q", line)
	}
	var n [3]int64
	for i := range f {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return Stall{}, fmt.Errorf("the watcher said %q: %w", line, err)
		}
		n[i] = v
	}
	return Stall{CPU: int(n[0]), From: time.UnixMicro(n[1]), To: time.UnixMicro(n[2])}, nil
}

// watch runs a watching thread on every CPU this process may use, writes
// "ready" once all of them run, then one line per stall and "synced" for
// each line read from in (Sync), until in ends or the process is killed.
func watch(in io.Reader, out io.Writer) error {
	// Nothing the loop does allocates, and a collection would stop the
	// watching threads: no collections.
	debug.SetGCPercent(-1)
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for cpu := range 1024 {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	// A P for each watching thread, which holds it while it sleeps, and
	// some for the rest of the runtime.
	runtime.GOMAXPROCS(len(cpus) + 2)
	var mu sync.Mutex // one stall's line is one write
	ready := make(chan error, len(cpus))
	for _, cpu := range cpus {
		go func() {
			runtime.LockOSThread() // and never unlocked: the thread is the watch's
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				ready <- fmt.Errorf("cpu %d: sched_setaffinity: %w", cpu, err)
				return
			}
			attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: priority}
			if err := unix.SchedSetAttr(0, &attr, 0); err != nil {
				ready <- fmt.Errorf("cpu %d: real-time priority: %w", cpu, err)
				return
			}
			ready <- nil
			var line [64]byte
			watchCPU(func(from, to time.Time) {
				mu.Lock()
				_, _ = out.Write(format(line[:0], cpu, from, to))
				mu.Unlock()
			})
		}()
	}
	var errs []error
	for range cpus {
		errs = append(errs, <-ready)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if _, err := io.WriteString(out, "ready\n"); err != nil {
		return err
	}
	var buf [64]byte
	for {
		n, err := in.Read(buf[:])
		for _, c := range buf[:n] {
			if c == '\n' {
				mu.Lock()
				_, _ = io.WriteString(out, "synced\n")
				mu.Unlock()
			}
		}
		if err != nil { // the caller is gone, or closed the watch
			return nil
		}
	}
}

// watchCPU asks to wake every period on the calling thread and reports
// each wake-up later than least.
//
// The sleep is a raw system call: the goroutine keeps its P and the
// runtime is not told, where a plain one would hand the P over and take
// one back at each wake-up, and wake sysmon to watch, which cost a CPU
// more than a tenth of its time at a thousand wake-ups a second. The
// clock is Go's own (the vDSO's CLOCK_MONOTONIC), the one the sleep's
// deadline is set on.
func watchCPU(stalled func(from, to time.Time)) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	base, start := ts.Nano(), time.Now()
	next := time.Duration(0) // since start
	for {
		next += period
		ts = unix.NsecToTimespec(base + int64(next))
		// An interrupted sleep (a preemption signal) wakes early, and is
		// not late.
		_, _, _ = unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		now := time.Now()
		late := now.Sub(start) - next
		if late < least {
			continue
		}
		stalled(now.Add(-late), now)
		// The wake-ups missed are not owed: start again from now.
		next += late
	}
}
