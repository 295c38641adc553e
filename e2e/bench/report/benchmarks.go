package report

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where the benchmarks ran.
type Machine struct {
	CPU    string
	Cores  int
	OS     string
	Kernel string
	Go     string
	Redis  string
}

// ThisMachine describes the machine running this program.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m.Redis = strings.TrimSpace(string(out))
	}
	return m
}

// Attachment is another benchmark's report to include as it is (for example
// the script's and the sidecar's throughput against redis-benchmark).
type Attachment struct {
	Title string
	Path  string // text file, shown preformatted
	Shown string // the path the page names; defaults to Path
	// Checks, when set, is a JSON file of Checks (SaveChecks) the summary
	// lists after the scenarios' own; read only when Path exists.
	Checks string
}

// Benchmarks is everything BENCHMARKS.md shows.
type Benchmarks struct {
	Command string // the command that regenerates the file
	Run     string // the command line of the run, when it differs
	Method  []string
	Machine Machine
	// Generated is when the measurements the file shows ended (the last
	// run's end, a scenario's or an attached report's), so that
	// rebuilding the file from the same results gives the same file.
	Generated   time.Time
	Scenarios   []*Scenario
	ResultsDir  string // relative to the file, where the charts are
	Attachments []Attachment
}

// Markdown renders BENCHMARKS.md.
func (bm Benchmarks) Markdown() string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	fmt.Fprintf(&b, "Written from the stored results of the runs listed under the summary, each with its own command, start and load; the last of them ended %s. `%s` measures every one again and writes this file; `go run ./e2e/bench report` writes it from the stored results. Never edit it by hand.\n\n",
		bm.Generated.UTC().Format("2006-01-02 15:04 UTC"), bm.Command)

	b.WriteString("## Summary: every target, met or not\n\n")
	// Each target with the section that measured it; then, for each
	// section, its command and how busy the machine was while it ran.
	sum := Table{Header: []string{"claim", "target", "measured", "holds", "measured in"}, TextColumns: 5}
	stallsHead := "vCPU stood still >= " + BreaksACallout
	runs := Table{Header: []string{"section", "command", "started", "took", "load average (start, end)", "steal", stallsHead}, TextColumns: 7}
	var lo, hi float64 = 1, 0             // the least and the most steal over the runs
	var slo, shi float64 = math.Inf(1), 0 // the fewest and the most stalls a minute
	var first Run                         // the run that started first
	add := func(title string, r Run, checks []Check) {
		if r.Command != "" && (first.Command == "" || r.Started.Before(first.Started)) {
			first = r
		}
		if r.Steal != nil {
			lo, hi = min(lo, *r.Steal), max(hi, *r.Steal)
		}
		for _, c := range checks {
			sum.Add(c.Claim, c.Target, c.Measured, c.holds(), title)
		}
		if r.Command == "" { // saved by a version that did not record its run
			runs.Add(title, "not recorded", "-", "-", "-", "-", "-")
			return
		}
		steal, stalls := "not measured", "not measured"
		if r.Steal != nil {
			steal = fmt.Sprintf("%.1f%%", 100**r.Steal)
		}
		if r.Unwatched != "" {
			stalls = "not watched: " + r.Unwatched
		}
		if r.Stalls != nil {
			perMin := r.Stalls.PerMinute(r.Took)
			slo, shi = min(slo, perMin), max(shi, perMin)
			stalls = fmt.Sprintf("%s (%.1f a minute)", r.Stalls, perMin)
		}
		runs.Add(title, "`"+r.Command+"`", r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Took.Round(time.Second).String(),
			fmt.Sprintf("%.1f, %.1f", r.Load[0], r.Load[1]), steal, stalls)
	}
	for _, s := range bm.Scenarios {
		add(s.Title, s.Run, s.Checks)
	}
	for _, a := range bm.Attachments {
		if a.Checks == "" {
			continue
		}
		if _, err := os.Stat(a.Path); err != nil {
			continue
		}
		if c, err := LoadChecks(a.Checks); err == nil {
			add(a.Title, c.Run, c.Checks)
		}
	}
	if len(sum.Rows) > 0 {
		b.WriteString(sum.Markdown())
		fmt.Fprintf(&b, "\nWhere each was measured: the section's command, and how busy the machine was besides while it ran: the 1-minute load average, the CPU time the hypervisor says it gave to other machines (steal), and the times a real-time thread pinned to a CPU woke %s or more late, that is the vCPU stood still that long, which steal does not show on every hypervisor (RATIONALE.md, \"Where the hypervisor reports no steal\"). A burst's callout that meets such a stall can miss its 5 ms.\n\n", BreaksACallout)
		b.WriteString(runs.Markdown())
		b.WriteString("\n")
	}

	b.WriteString("## Method\n\n")
	for _, m := range bm.Method {
		b.WriteString("- " + m + "\n")
	}
	b.WriteString("\n## Machine\n\n")
	b.WriteString("As read where this file was written; the runs are read against it, and each gives its own load above.\n\n")
	mt := Table{Header: []string{"", ""}, TextColumns: 2}
	mt.Add("CPU", bm.Machine.CPU)
	mt.Add("cores", bm.Machine.Cores)
	mt.Add("OS", bm.Machine.OS+", kernel "+bm.Machine.Kernel)
	mt.Add("Go", bm.Machine.Go)
	mt.Add("Redis", bm.Machine.Redis)
	if first.Command != "" {
		mt.Add("load average", fmt.Sprintf("%.1f when the first run started (%s): the machine is shared, and each run gives its own", first.Load[0], first.Started.UTC().Format("2006-01-02 15:04 UTC")))
	}
	if len(bm.Scenarios) > 0 {
		if lo <= hi {
			mt.Add("CPU time taken by the hypervisor (steal)", fmt.Sprintf("%.1f%% to %.1f%% over the sections below: a virtual machine's CPUs are shared with others the load average does not show", 100*lo, 100*hi))
		}
		if slo <= shi {
			mt.Add(stallsHead, fmt.Sprintf("%.1f to %.1f times a minute over the sections below", slo, shi))
		}
	}
	b.WriteString(mt.Markdown())
	fmt.Fprintf(&b, "\n## Command\n\n```\n%s\n", bm.Command)
	if bm.Run != "" && bm.Run != bm.Command {
		fmt.Fprintf(&b, "# this run: %s\n", bm.Run)
	}
	b.WriteString("```\n\n")

	for _, s := range bm.Scenarios {
		b.WriteString(s.Markdown(bm.ResultsDir, 2))
	}
	for _, a := range bm.Attachments {
		text, err := os.ReadFile(a.Path)
		if err != nil {
			continue
		}
		shown := a.Shown
		if shown == "" {
			shown = a.Path
		}
		fmt.Fprintf(&b, "## %s\n\nFrom `%s`:\n\n```\n%s\n```\n\n", a.Title, filepath.ToSlash(shown), strings.TrimRight(string(text), "\n"))
	}
	return b.String()
}

// LoadAverage returns the 1-minute load average, 0 where it cannot be read.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var v float64
	fmt.Sscan(string(b), &v)
	return v
}

// CPUTime is the machine's CPU time so far, in clock ticks, from
// /proc/stat's cpu line: all of it, what the hypervisor gave to others
// (steal), and what no process used (idle and waiting for I/O). OK is
// false where it could not be read.
type CPUTime struct {
	Total, Steal, Idle uint64
	OK                 bool
}

// ReadCPUTime reads the machine's CPU time so far.
func ReadCPUTime() CPUTime {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTime{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice]:
	// guest time is counted in user already.
	if len(f) < 9 || f[0] != "cpu" {
		return CPUTime{}
	}
	var t CPUTime
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return CPUTime{}
		}
		t.Total += n
		switch i {
		case 3, 4: // idle, iowait
			t.Idle += n
		case 7:
			t.Steal = n
		}
	}
	t.OK = true
	return t
}

// StealSince is the share of the CPU time from earlier to t that was
// stolen; nil when either reading failed or no time passed.
func (t CPUTime) StealSince(earlier CPUTime) *float64 {
	if !t.OK || !earlier.OK || t.Total <= earlier.Total || t.Steal < earlier.Steal {
		return nil
	}
	v := float64(t.Steal-earlier.Steal) / float64(t.Total-earlier.Total)
	return &v
}

// BusySince is the share of the CPU time from earlier to t that the
// machine's processes used (neither idle nor stolen); nil when either
// reading failed or no time passed.
func (t CPUTime) BusySince(earlier CPUTime) *float64 {
	if !t.OK || !earlier.OK || t.Total <= earlier.Total || t.Steal < earlier.Steal || t.Idle < earlier.Idle {
		return nil
	}
	v := 1 - float64(t.Idle-earlier.Idle+t.Steal-earlier.Steal)/float64(t.Total-earlier.Total)
	return &v
}
