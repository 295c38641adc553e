package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
)

// The shadow comparison counts for the exit criterion only when a side
// denied some of the compared requests: agreement where neither denied
// anything holds whatever the limiters do.
func TestShadowCheckNeedsDenials(t *testing.T) {
	header := []string{"requests compared", "agree", "disagreement", "exit criterion", "edge would deny", "services denied"}
	for _, c := range []struct {
		edge, service, crit string
		holds, info         bool
	}{
		{"0", "0", "< 0.1%: met", false, true},
		{"12", "11", "< 0.1%: met", true, false},
		{"12", "0", "< 0.1%: not met", false, false},
	} {
		tb := report.Table{Title: shadowTitle, Header: header}
		tb.Add(570, 570, "0.000%", c.crit, c.edge, c.service)
		got := noisyDerived(&report.Scenario{Tables: []report.Table{tb}})
		if len(got) != 1 || got[0].Holds != c.holds || got[0].Info != c.info {
			t.Errorf("edge denied %s, services %s, %q: %+v, want holds %v, info %v", c.edge, c.service, c.crit, got, c.holds, c.info)
		}
	}
}

// A saved noisy scenario gets its claim from the code and the shadow
// comparison's check from its table, once; BENCHMARKS.md rebuilt from the
// same results is the same file, dated when the last scenario ended.
func TestBenchmarksFromSavedResults(t *testing.T) {
	out := t.TempDir()
	shadow := report.Table{Title: shadowTitle + ": the edge against the services",
		Header: []string{"requests compared", "agree", "disagreement", "exit criterion"}}
	shadow.Add(563, 562, "0.178%", "< 0.1%: not met")
	saved := &report.Scenario{Name: "noisy", Title: "Noisy", Claim: "an old claim",
		Run:    report.Run{Command: "go run ./e2e/bench -runs 1", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Took: 90 * time.Second},
		Tables: []report.Table{shadow},
		Checks: []report.Check{{Claim: "p99 falls", Target: "< 0.5", Measured: "0.1x", Holds: true}}}
	if err := saved.Save(out); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	e := &env{out: out}
	if err := writeBenchmarks(t.TempDir(), md, e); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"the last of them ended 2026-01-02 03:05 UTC",
		"# this run: go run ./e2e/bench -runs 1",
		"*Claim:* " + noisyClaim,
		"| the edge's shadow decisions agree with the per-service limiters' (the rollout's exit criterion) | < 0.1% of the compared decisions disagree | 0.178% of 563 compared; the table does not say how many either side denied, so this run cannot show the criterion | - |",
	} {
		if !strings.Contains(string(first), want) {
			t.Errorf("BENCHMARKS.md lacks %q:\n%s", want, first)
		}
	}
	if strings.Contains(string(first), "an old claim") {
		t.Error("the saved claim was shown, not the code's")
	}
	if n := strings.Count(string(first), "0.178% of 563 compared"); n != 2 { // the summary and the scenario
		t.Errorf("the derived check is shown %d times, want 2", n)
	}

	// A run's own result already has the check: it is not added twice.
	r, err := report.Load(filepath.Join(out, "noisy.json"))
	if err != nil {
		t.Fatal(err)
	}
	noisy := scenarios[slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == "noisy" })]
	noisy.complete(r)
	noisy.complete(r)
	if len(r.Checks) != 2 {
		t.Errorf("%d checks after completing twice, want 2", len(r.Checks))
	}

	if err := writeBenchmarks(t.TempDir(), md, e); err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	if string(second) != string(first) {
		t.Error("BENCHMARKS.md rebuilt from the same results differs")
	}
}
