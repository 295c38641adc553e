package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Scenario is one benchmark scenario's outcome, saved as <Name>.json beside
// its charts so that BENCHMARKS.md can be assembled from the latest run of
// each scenario.
type Scenario struct {
	Name   string `json:"name"`  // file stem, e.g. "incident"
	Title  string `json:"title"` // section heading
	Claim  string `json:"claim"` // what the scenario tests
	Method string `json:"method"`
	Run
	Tables []Table `json:"tables"`
	Charts []Chart `json:"charts"`
	Checks []Check `json:"checks"` // the claims, measured
}

// Run is how and when a benchmark ran: its command, and how busy the
// machine was besides.
type Run struct {
	Command string        `json:"command"`
	Started time.Time     `json:"started"`
	Took    time.Duration `json:"took_ns"`
	// Load is the machine's 1-minute load average at the start and the end
	// of the run.
	Load [2]float64 `json:"load"`
	// Steal is the share of the machine's CPU time over the run that the
	// hypervisor gave to others (/proc/stat's steal): on a shared VM, what
	// the load average cannot show. Nil where it was not measured.
	Steal *float64 `json:"steal,omitempty"`
	// Stalls are the times a vCPU stood still during the run; nil where
	// they were not watched.
	Stalls *Stalls `json:"vcpu_stalls,omitempty"`
	// Unwatched is why the vCPUs were not watched, where they were not.
	Unwatched string `json:"vcpu_unwatched,omitempty"`
}

// Command is the command line that runs the program of package pkg (as
// "./e2e/bench/sidecarbench") with args, as a Run records it: one a shell
// runs as it was run, an empty argument or one with a space quoted.
func Command(pkg string, args []string) string {
	line := []string{"go", "run", pkg}
	for _, a := range args {
		line = append(line, shellWord(a))
	}
	return strings.Join(line, " ")
}

// shellWord is a as one word of a POSIX shell's command line: as it is if
// it has only characters no shell treats specially, else in single quotes,
// each single quote in it closed, escaped and opened again.
func shellWord(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,@%+") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

// Note is the run's command, when, and the machine's load, as one line's
// text.
func (r Run) Note() string {
	return fmt.Sprintf("`%s` (took %s, %s; load average %.1f at the start, %.1f at the end%s)",
		r.Command, r.Took.Round(time.Second), r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Load[0], r.Load[1], r.BusyNote())
}

// Dated is "2006-01-02 15:04 UTC (load average N at the start, M at the
// end; ...)": when the run started and how busy the machine was, for a
// report's heading line.
func (r Run) Dated() string {
	return fmt.Sprintf("%s (load average %.1f at the start, %.1f at the end%s)",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Load[0], r.Load[1], r.BusyNote())
}

// BusyNote is "; the hypervisor took N% of the CPU time (steal); a vCPU
// stood still for 2.5 ms or more: ..." for what the run measured, to close
// a line that gives the load average; empty for what it did not.
func (r Run) BusyNote() string {
	var b strings.Builder
	if r.Steal != nil {
		fmt.Fprintf(&b, "; the hypervisor took %.1f%% of the CPU time (steal)", 100**r.Steal)
	}
	switch {
	case r.Stalls != nil:
		fmt.Fprintf(&b, "; a vCPU stood still for %s or more: %s", BreaksACallout, r.Stalls)
	case r.Unwatched != "":
		fmt.Fprintf(&b, "; the vCPUs not watched: %s", r.Unwatched)
	}
	return b.String()
}

// Chart is a PNG written beside the scenario's JSON.
type Chart struct {
	File string `json:"file"` // base name
	Alt  string `json:"alt"`
}

// Check is one claim or target against what the run measured.
type Check struct {
	Claim    string `json:"claim"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Holds    bool   `json:"holds"`
	// Info marks a comparison with no target (another implementation
	// measured beside ours): its "holds" cell is "-".
	Info bool `json:"info,omitempty"`
}

// Checked is what a benchmark that is not a Scenario (its report is an
// Attachment) puts in the summary: its lines, and how and when it ran.
type Checked struct {
	Run    Run     `json:"run"`
	Checks []Check `json:"checks"`
}

// ChecksPath is where a program that writes its report to out keeps the
// report's summary lines: out with its extension replaced by .checks.json.
func ChecksPath(out string) string {
	return strings.TrimSuffix(out, filepath.Ext(out)) + ".checks.json"
}

// SaveChecks writes c as JSON to path.
func SaveChecks(path string, c Checked) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// LoadChecks reads what SaveChecks wrote.
func LoadChecks(path string) (Checked, error) {
	var c Checked
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if c.Run.Command == "" {
		return c, fmt.Errorf("%s: no command: a file written before the run was recorded; run the benchmark again", path)
	}
	return c, nil
}

// Save writes the scenario to dir as <Name>.json and <Name>.md (its tables
// and charts in markdown).
func (s *Scenario) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, s.Name+".json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, s.Name+".md"), []byte(s.Markdown(".", 2)), 0o644)
}

// Markdown renders the scenario under a heading of the given level, its
// charts linked relative to chartDir.
func (s *Scenario) Markdown(chartDir string, level int) string {
	var b strings.Builder
	h := strings.Repeat("#", level)
	fmt.Fprintf(&b, "%s %s\n\n", h, s.Title)
	if s.Claim != "" {
		fmt.Fprintf(&b, "*Claim:* %s\n\n", s.Claim)
	}
	if s.Method != "" {
		fmt.Fprintf(&b, "*Method:* %s\n\n", s.Method)
	}
	fmt.Fprintf(&b, "*Command:* %s\n\n", s.Run.Note())
	for _, t := range s.Tables {
		b.WriteString(t.Markdown())
		b.WriteString("\n")
	}
	for _, c := range s.Charts {
		fmt.Fprintf(&b, "![%s](%s)\n\n", c.Alt, filepath.ToSlash(filepath.Join(chartDir, c.File)))
	}
	if len(s.Checks) > 0 {
		b.WriteString(checksTable(s.Checks).Markdown())
		b.WriteString("\n")
	}
	return b.String()
}

func checksTable(checks []Check) Table {
	t := Table{Header: []string{"claim", "target", "measured", "holds"}, TextColumns: 4}
	for _, c := range checks {
		t.Add(c.Claim, c.Target, c.Measured, c.holds())
	}
	return t
}

// Met is "met" or "not met": a target's verdict in a report's text.
func Met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

// holds is the check's "holds" cell.
func (c Check) holds() string {
	switch {
	case c.Info:
		return "-"
	case c.Holds:
		return "yes"
	}
	return "no"
}

// Load reads one saved scenario.
func Load(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Scenario
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &s, nil
}
