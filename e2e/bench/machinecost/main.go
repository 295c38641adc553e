// Command machinecost measures what this machine charges for the two things
// every check pays for besides its own work: a system call, and a hand-off
// between two processes (one writes, the other wakes up and reads). The
// sidecar's and the gateway's CPU per request in BENCHMARKS.md are mostly
// made of these (sidecar/RATIONALE.md, "What a check costs when checks do
// not queue"), so their cost here is what those figures are read against.
//
//	go run ./e2e/bench/machinecost [-calls 2000000] [-trips 100000] [-runs 3] [-out FILE]
//
// A system call: getppid, which does nothing, called in a loop. A hop: a
// byte written into a pipe that another process, blocked in read, reads
// and writes back through a second pipe; both sides use blocking reads and
// writes on plain file descriptors, as raw system calls the Go runtime does
// not see, so that a round trip is two wake-ups and four system calls and
// nothing else (as the same loop in C measures it). It is run
// with both processes on one CPU (a context switch each way) and on two
// (a wake-up of the other CPU each way). CPU time is both processes' user
// and system time over the round trips.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
)

// echoEnv, set in the child's environment, makes this program the echoing
// side of a hop: "TRIPS,CPU" (CPU -1: anywhere).
const echoEnv = "EDGELIMIT_MACHINECOST_ECHO"

func main() {
	if spec := os.Getenv(echoEnv); spec != "" {
		if err := echo(spec); err != nil {
			fmt.Fprintln(os.Stderr, "machinecost echo:", err)
			os.Exit(1)
		}
		return
	}
	calls := flag.Int("calls", 2_000_000, "system calls per run")
	trips := flag.Int("trips", 100_000, "round trips per run")
	runs := flag.Int("runs", 3, "runs of each measurement; the report gives medians")
	out := flag.String("out", "", "also write the report to this file, and its summary lines beside it (FILE with .checks.json in place of its extension)")
	flag.Parse()
	w, closer, err := report.Tee(*out)
	if err == nil {
		var c report.Checked
		c, err = run(w, *calls, *trips, *runs)
		if cerr := closer.Close(); err == nil {
			err = cerr
		}
		if err == nil && *out != "" {
			err = report.SaveChecks(report.ChecksPath(*out), c)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "machinecost:", err)
		os.Exit(1)
	}
}

// hop is one measured set of round trips.
type hop struct {
	wall, cpu time.Duration // per round trip
}

// run measures, writes the report to w and returns its lines for
// BENCHMARKS.md's summary: no targets, the machine's prices that the CPU
// per request of the other sections is read against.
func run(w io.Writer, calls, trips, runs int) (report.Checked, error) {
	if calls <= 0 || trips <= 0 || runs <= 0 {
		return report.Checked{}, errors.New("-calls, -trips and -runs must be positive")
	}
	m := report.StartMeter(report.Command("./e2e/bench/machinecost", os.Args[1:]))
	var sys []float64
	for range runs {
		sys = append(sys, syscallCost(calls).Seconds()*1e6)
	}
	cpus, err := allowedCPUs()
	if err != nil {
		return report.Checked{}, err
	}
	type layout struct {
		name        string
		here, there int
	}
	layouts := []layout{{"both on one CPU", cpus[0], cpus[0]}}
	if len(cpus) > 1 {
		layouts = append(layouts, layout{"on two CPUs", cpus[0], cpus[1]})
	}
	wall := make([][]float64, len(layouts))
	cpu := make([][]float64, len(layouts))
	for range runs { // the layouts in turn, so that both see the same moments
		for i, l := range layouts {
			h, err := roundTrips(trips, l.here, l.there)
			if err != nil {
				return report.Checked{}, fmt.Errorf("%s: %w", l.name, err)
			}
			wall[i] = append(wall[i], h.wall.Seconds()*1e6)
			cpu[i] = append(cpu[i], h.cpu.Seconds()*1e6)
		}
	}
	ran := m.Stop()
	fmt.Fprintf(w, "what a system call and a hop between processes cost: go run ./e2e/bench/machinecost, %s\n\n", ran.Dated())
	fmt.Fprintf(w, "a system call that does nothing (getppid), %d calls: %.2f µs (median of %d runs: %s)\n\n", calls, stat.Median(sys), runs, stat.Join(sys, 2, ", "))
	fmt.Fprintf(w, "a byte handed to another process and back through two pipes, %d round trips, median of %d runs:\n", trips, runs)
	var hops []string
	for i, l := range layouts {
		c := stat.Median(cpu[i])
		fmt.Fprintf(w, "  %-16s %6.2f µs a round trip, %6.2f µs of CPU (%.2f µs a one-way hop); CPU per run: %s\n",
			l.name, stat.Median(wall[i]), c, c/2, stat.Join(cpu[i], 2, ", "))
		hops = append(hops, fmt.Sprintf("%.2f µs %s", c/2, l.name))
	}
	// No target: what the machine charges. Machines of the same size
	// have differed here sixfold in a system call and threefold in a hop
	// on one CPU, and every figure of CPU per request, and the burst
	// capacity, with them.
	const target = "none: the machine's price, which this file's CPU per request and burst capacity are read against"
	return report.Checked{
		Run: ran,
		Checks: []report.Check{
			{Claim: "this machine: a system call that does nothing", Target: target, Info: true,
				Measured: fmt.Sprintf("%.2f µs (getppid, median of %d runs)", stat.Median(sys), runs)},
			{Claim: "this machine: a hop to another process (a write, its wake-up, its read)", Target: target, Info: true,
				Measured: fmt.Sprintf("CPU per one-way hop: %s (median of %d runs of %d round trips)", strings.Join(hops, ", "), runs, trips)},
		},
	}, nil
}

// syscallCost is the time of one getppid, over calls of them on one
// thread.
func syscallCost(calls int) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	for range calls {
		syscall.Getppid()
	}
	return time.Since(start) / time.Duration(calls)
}

// roundTrips hands a byte to a child process and back trips times, this
// thread on CPU here and the child on CPU there.
func roundTrips(trips, here, there int) (hop, error) {
	var toChild, fromChild [2]int
	if err := unix.Pipe2(toChild[:], unix.O_CLOEXEC); err != nil {
		return hop{}, err
	}
	if err := unix.Pipe2(fromChild[:], unix.O_CLOEXEC); err != nil {
		unix.Close(toChild[0])
		unix.Close(toChild[1])
		return hop{}, err
	}
	// The child's ends become its fds 3 and 4; the parent keeps the others.
	childIn, childOut := os.NewFile(uintptr(toChild[0]), "in"), os.NewFile(uintptr(fromChild[1]), "out")
	w, r := toChild[1], fromChild[0]
	defer unix.Close(w)
	defer unix.Close(r)
	self, err := os.Executable()
	if err != nil {
		childIn.Close()
		childOut.Close()
		return hop{}, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d", echoEnv, trips, there))
	cmd.ExtraFiles = []*os.File{childIn, childOut}
	cmd.Stderr = os.Stderr
	err = cmd.Start()
	childIn.Close()
	childOut.Close()
	if err != nil {
		return hop{}, err
	}

	stop := func(err error) (hop, error) {
		cmd.Process.Kill()
		cmd.Wait()
		return hop{}, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := pin(here); err != nil {
		return stop(err)
	}
	// One round trip first: the child is up and pinned before the clock starts.
	buf := []byte{0}
	if err := trip(w, r, buf, 0); err != nil {
		return stop(err)
	}
	var ru0 unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru0)
	start := time.Now()
	for i := 1; i < trips; i++ {
		if err := trip(w, r, buf, byte(i)); err != nil {
			return stop(err)
		}
	}
	elapsed := time.Since(start)
	var ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru1)
	if err := cmd.Wait(); err != nil {
		return hop{}, fmt.Errorf("echo: %w", err)
	}
	// The child's CPU covers its whole life, start-up and the first trip
	// included: a few hundred µs against seconds of round trips.
	child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	n := time.Duration(trips - 1)
	return hop{wall: elapsed / n, cpu: (rusageTime(ru1) - rusageTime(ru0) + child) / n}, nil
}

// trip sends b and waits for it to come back.
func trip(w, r int, buf []byte, b byte) error {
	buf[0] = b
	if n, err := rawIO(unix.SYS_WRITE, w, buf); n != 1 {
		return fmt.Errorf("write: %d, %v", n, err)
	}
	if n, err := rawIO(unix.SYS_READ, r, buf); n != 1 || buf[0] != b {
		return fmt.Errorf("read: %d bytes, %v, got %d want %d", n, err, buf[0], b)
	}
	return nil
}

// rawIO reads or writes one buffer with a raw system call: the Go runtime
// is not told the thread blocks, so it neither hands the thread's work to
// another thread nor wakes one, and the hop is the kernel's alone. Both
// sides run one goroutine on a locked thread, which is what makes that
// safe here.
func rawIO(trap uintptr, fd int, buf []byte) (int, error) {
	n, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	if e != 0 {
		return int(n), e
	}
	return int(n), nil
}

func rusageTime(ru unix.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// allowedCPUs lists the CPUs this process may run on (a container's cpuset
// need not start at 0).
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for c := 0; c < len(set)*int(unsafe.Sizeof(set[0]))*8; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("no CPU in this process's affinity")
	}
	return cpus, nil
}

// pin keeps the calling thread on cpu; -1 leaves it anywhere.
func pin(cpu int) error {
	if cpu < 0 {
		return nil
	}
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}

// echo is the child: it reads each byte from fd 3 and writes it back on
// fd 4, trips times.
func echo(spec string) error {
	var trips, cpu int
	if _, err := fmt.Sscanf(spec, "%d,%d", &trips, &cpu); err != nil {
		return fmt.Errorf("%s=%q: %w", echoEnv, spec, err)
	}
	runtime.LockOSThread()
	if err := pin(cpu); err != nil {
		return err
	}
	buf := []byte{0}
	for range trips {
		if n, err := rawIO(unix.SYS_READ, 3, buf); n != 1 {
			return fmt.Errorf("read: %d, %v", n, err)
		}
		if n, err := rawIO(unix.SYS_WRITE, 4, buf); n != 1 {
			return fmt.Errorf("write: %d, %v", n, err)
		}
	}
	return nil
}
