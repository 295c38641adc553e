package report

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sample() Table {
	t := Table{Title: "Incident", Header: []string{"design", "admitted", "ratio"}, Notes: []string{"contract 110"}}
	t.Add("per-service", 990, 9.0)
	t.Add("edge|gateway", 111, 1.0090909)
	return t
}

func TestMarkdown(t *testing.T) {
	want := "**Incident**\n\n" +
		"| design | admitted | ratio |\n" +
		"| :--- | ---: | ---: |\n" +
		"| per-service | 990 | 9 |\n" +
		"| edge\\|gateway | 111 | 1.01 |\n" +
		"\ncontract 110\n"
	if got := sample().Markdown(); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	sample().WriteText(&b)
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 5 || lines[0] != "Incident" || lines[4] != "contract 110" {
		t.Fatalf("text:\n%s", b.String())
	}
	// Right-aligned columns end at the same place.
	if len(lines[1]) != len(lines[2]) || len(lines[2]) != len(lines[3]) {
		t.Fatalf("columns not aligned:\n%s", b.String())
	}
}

func TestScenarioSaveLoad(t *testing.T) {
	dir := t.TempDir()
	steal := 0.125
	s := &Scenario{
		Name: "incident", Title: "Incident replay", Claim: "9x",
		Run: Run{Command: "go run ./e2e/bench incident", Started: time.Date(2025, 9, 1, 12, 0, 0, 0, time.UTC), Took: 42 * time.Second,
			Load: [2]float64{1.5, 2.5}, Steal: &steal},
		Tables: []Table{sample()},
		Charts: []Chart{{File: "incident.png", Alt: "admitted per design"}},
		Checks: []Check{{Claim: "edge admits 1.0x", Target: "within 5%", Measured: "1.01x", Holds: true}},
	}
	if err := s.Save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := Load(filepath.Join(dir, "incident.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip:\n%+v\nwant\n%+v", got, s)
	}
	md, err := os.ReadFile(filepath.Join(dir, "incident.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Incident replay", "![admitted per design](incident.png)", "| edge admits 1.0x | within 5% | 1.01x | yes |", "took 42s, 2025-09-01 12:00 UTC; load average 1.5 at the start, 2.5 at the end; the hypervisor took 12.5% of the CPU time (steal))"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("incident.md lacks %q:\n%s", want, md)
		}
	}
}

func TestCharts(t *testing.T) {
	dir := t.TempDir()
	bar := filepath.Join(dir, "bar.png")
	if err := BarChart(bar, "admitted", "requests", []string{"per-service", "edge"}, []Bars{{"admitted", []float64{990, 110}}, {"contract", []float64{110, 110}}}); err != nil {
		t.Fatal(err)
	}
	line := filepath.Join(dir, "line.png")
	if err := LineChart(line, "p99", "burst", "ms", []Line{{"edge", []float64{1, 2}, []float64{50, 60}}}, LineOptions{Reference: &Reference{"2 ms", 2}, LogX: true, LogY: true}); err != nil {
		t.Fatal(err)
	}
	if err := LineChart(line, "p99", "day", "ms", []Line{{"edge", []float64{0, 1}, []float64{5, 6}}}, LineOptions{XNames: []string{"Mon", "Tue"}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bar, line} {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n")) {
			t.Fatalf("%s is not a PNG (%v)", p, err)
		}
	}
	if err := BarChart(bar, "x", "y", []string{"a", "b"}, []Bars{{"s", []float64{1}}}); err == nil || !strings.Contains(err.Error(), `series "s" has 1 values for 2 categories`) {
		t.Fatalf("mismatched bars: %v", err)
	}
	if err := LineChart(line, "x", "x", "y", []Line{{"s", []float64{1}, nil}}, LineOptions{}); err == nil {
		t.Fatal("mismatched line accepted")
	}
	if err := LineChart(line, "x", "x", "y", []Line{{"s", []float64{1}, []float64{-1}}}, LineOptions{LogY: true}); err == nil || !strings.Contains(err.Error(), "log axis") {
		t.Fatalf("negative value on a log axis: %v", err)
	}
}

func TestBenchmarksMarkdown(t *testing.T) {
	dir := t.TempDir()
	att := filepath.Join(dir, "scriptbench.txt")
	os.WriteFile(att, []byte("script 100000/s\n"), 0o644)
	checks := filepath.Join(dir, "scriptbench.checks.json")
	lowSteal, highSteal := 0.02, 0.165
	scriptRun := Run{Command: "go run ./scriptbench", Started: time.Date(2025, 8, 31, 23, 0, 0, 0, time.UTC), Took: 61 * time.Second,
		Load: [2]float64{0.5, 1.25}, Unwatched: "cpu 1: real-time priority: operation not permitted"}
	if err := SaveChecks(checks, Checked{Run: scriptRun, Checks: []Check{{Claim: "beside", Target: "none", Measured: "1.5x", Info: true}}}); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(dir, "none.checks.json")
	if err := SaveChecks(orphan, Checked{Run: scriptRun, Checks: []Check{{Claim: "orphan", Target: "t", Measured: "m"}}}); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old.checks.json")
	os.WriteFile(old, []byte(`[{"claim": "c", "target": "t", "measured": "m"}]`), 0o644)
	if _, err := LoadChecks(old); err == nil {
		t.Error("checks saved without their run were read")
	}
	bm := Benchmarks{
		Command:   "make bench",
		Method:    []string{"side by side"},
		Machine:   Machine{CPU: "cpu", Cores: 2, OS: "linux/amd64", Kernel: "6", Go: "go1.26", Redis: "7.0"},
		Generated: time.Date(2025, 9, 1, 0, 0, 0, 0, time.UTC),
		Scenarios: []*Scenario{{Name: "incident", Title: "Incident replay", Charts: []Chart{{"incident.png", "chart"}},
			Checks: []Check{{Claim: "c", Target: "t", Measured: "m"}},
			Run: Run{Command: "go run ./bench", Started: time.Date(2025, 8, 31, 23, 30, 0, 0, time.UTC), Took: 30 * time.Second,
				Load: [2]float64{1.5, 2}, Steal: &lowSteal, Stalls: &Stalls{Count: 6, Longest: 9840 * time.Microsecond}}},
			{Name: "noisy", Title: "Canary", Run: Run{Steal: &highSteal}}, {Name: "old", Title: "Saved before steal was measured"}},
		ResultsDir: "e2e/bench/results",
		Attachments: []Attachment{{Title: "Script throughput", Path: att, Shown: "bench/results/scriptbench.txt", Checks: checks},
			{Title: "Missing", Path: filepath.Join(dir, "none.txt"), Checks: orphan}},
	}
	md := bm.Markdown()
	for _, want := range []string{
		"# Benchmarks", "the last of them ended 2025-09-01 00:00 UTC. `make bench` measures every one again",
		// The first run to start is the attachment's, not the first
		// scenario's.
		"| load average | 0.5 when the first run started (2025-08-31 23:00 UTC)",
		"| c | t | m | no | Incident replay |\n| beside | none | 1.5x | - | Script throughput |",
		"| Incident replay | `go run ./bench` | 2025-08-31 23:30 UTC | 30s | 1.5, 2.0 | 2.0% | 6 times, the longest 9.8 ms (12.0 a minute) |\n| Canary | not recorded | - | - | - | - | - |",
		"| Saved before steal was measured | not recorded | - | - | - | - | - |\n| Script throughput | `go run ./scriptbench` | 2025-08-31 23:00 UTC | 1m1s | 0.5, 1.2 | not measured | not watched: cpu 1: real-time priority: operation not permitted |",
		"*Command:* `go run ./bench` (took 30s, 2025-08-31 23:30 UTC; load average 1.5 at the start, 2.0 at the end; the hypervisor took 2.0% of the CPU time (steal); a vCPU stood still for 2.5 ms or more: 6 times, the longest 9.8 ms)",
		"| vCPU stood still >= 2.5 ms | 12.0 to 12.0 times a minute over the sections below |",
		"- side by side", "| cores | 2 |", "## Incident replay",
		"![chart](e2e/bench/results/incident.png)", "## Script throughput",
		"| CPU time taken by the hypervisor (steal) | 2.0% to 16.5% over the sections below", "From `bench/results/scriptbench.txt`", "script 100000/s",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
	if strings.Contains(md, "## Missing") {
		t.Error("a missing attachment got a section")
	}
	if strings.Contains(md, "orphan") {
		t.Error("the checks of a missing attachment reached the summary")
	}
}

func TestStalls(t *testing.T) {
	if got := (Stalls{}).String(); got != "none" {
		t.Errorf("no stalls: %q", got)
	}
	s := Stalls{Count: 3, Longest: 12345 * time.Microsecond}
	if got := s.String(); got != "3 times, the longest 12.3 ms" {
		t.Errorf("three stalls: %q", got)
	}
	if got := s.PerMinute(90 * time.Second); got != 2 {
		t.Errorf("3 in 90 s: %v a minute, want 2", got)
	}
	if got := s.PerMinute(0); got != 0 {
		t.Errorf("no time: %v a minute, want 0", got)
	}
	if StallsOf(nil) != nil {
		t.Error("no watch summed up as watched")
	}
}

func TestStealAndBusySince(t *testing.T) {
	// Of 400 ticks, 100 idle and 20 stolen: 280 used.
	t0 := CPUTime{Total: 1000, Steal: 10, Idle: 500, OK: true}
	t1 := CPUTime{Total: 1400, Steal: 30, Idle: 600, OK: true}
	if got := t1.StealSince(t0); got == nil || *got != 0.05 {
		t.Errorf("20 of 400 ticks stolen: got %v, want 0.05", got)
	}
	if got := t1.BusySince(t0); got == nil || *got != 0.7 {
		t.Errorf("280 of 400 ticks used: got %v, want 0.7", got)
	}
	for _, c := range []struct {
		name   string
		t0, t1 CPUTime
	}{
		{"unread before", CPUTime{}, t1},
		{"unread after", t0, CPUTime{}},
		{"no time passed", t0, t0},
		{"steal went back", t1, CPUTime{Total: 2000, Steal: 20, Idle: 700, OK: true}},
	} {
		if got := c.t1.StealSince(c.t0); got != nil {
			t.Errorf("%s: steal %v, want nil", c.name, *got)
		}
		if got := c.t1.BusySince(c.t0); got != nil {
			t.Errorf("%s: busy %v, want nil", c.name, *got)
		}
	}
	if got := (CPUTime{Total: 2000, Steal: 30, Idle: 100, OK: true}).BusySince(t1); got != nil {
		t.Errorf("idle went back: busy %v, want nil", *got)
	}
	if now := ReadCPUTime(); now.OK && (now.Total == 0 || now.Idle > now.Total) {
		t.Errorf("/proc/stat read as %d ticks, %d of them idle", now.Total, now.Idle)
	}
}

// TestCommand: the command a report gives runs as it was run. A shell
// given the recorded line hands the program back the same arguments,
// an empty one and ones with spaces and quotes included.
func TestCommand(t *testing.T) {
	args := []string{"-md", "", "-bin", "/work/main/build", "it's", "two words", `$HOME "x"`, "failopen"}
	line := Command("./e2e/bench", args)
	if want := "go run ./e2e/bench -md '' -bin /work/main/build"; !strings.HasPrefix(line, want) {
		t.Fatalf("command %q, want it to begin %q", line, want)
	}
	// The shell sets its arguments to the words after "go run pkg" and
	// prints them a line each.
	script := "set -- " + strings.TrimPrefix(line, "go run ./e2e/bench ") + `; printf '%s\n' "$@"`
	out, err := exec.Command("sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("sh -c %q: %v", script, err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"); !reflect.DeepEqual(got, args) {
		t.Fatalf("the shell read %q from %q, want %q", got, line, args)
	}
}
