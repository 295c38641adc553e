package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestMain lets the test binary be the echoing child, as the command is.
func TestMain(m *testing.M) {
	if spec := os.Getenv(echoEnv); spec != "" {
		if err := echo(spec); err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestReport: a short run reports a positive cost for the system call and
// for every layout of the hop, each round trip's CPU at least its two
// hops' system calls, and the echo checked every byte it handed back
// (trip fails on a byte that is not the one sent). Its summary lines
// carry the same figures, with no target.
func TestReport(t *testing.T) {
	var b strings.Builder
	c, err := run(&b, 1000, 200, 1)
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	sys := regexp.MustCompile(`\(getppid\), 1000 calls: ([0-9.]+) µs`).FindStringSubmatch(out)
	if sys == nil {
		t.Fatalf("no system call line in:\n%s", out)
	}
	hops := regexp.MustCompile(`(?m)^  (both on one CPU|on two CPUs) +([0-9.]+) µs a round trip, +([0-9.]+) µs of CPU \(([0-9.]+) µs a one-way hop\)`).FindAllStringSubmatch(out, -1)
	if len(hops) == 0 {
		t.Fatalf("no hop lines in:\n%s", out)
	}
	call, _ := strconv.ParseFloat(sys[1], 64)
	if call <= 0 {
		t.Errorf("system call %v µs", call)
	}
	for _, h := range hops {
		wall, _ := strconv.ParseFloat(h[2], 64)
		cpu, _ := strconv.ParseFloat(h[3], 64)
		// A round trip is four system calls (a write and a read on each
		// side): its CPU is at least two of them, half of the four,
		// which leaves room for how the kernel rounds the child's times.
		if wall <= 0 || cpu < 4*call/2 {
			t.Errorf("%s: %v µs a round trip, %v µs of CPU, a system call %v µs", h[1], wall, cpu, call)
		}
	}
	if len(c.Checks) != 2 || c.Run.Command == "" {
		t.Fatalf("summary lines %+v", c)
	}
	for _, ch := range c.Checks {
		if !ch.Info || ch.Holds {
			t.Errorf("%q: a line with a target: %+v", ch.Claim, ch)
		}
	}
	if want := sys[1] + " µs (getppid"; !strings.HasPrefix(c.Checks[0].Measured, want) {
		t.Errorf("system call line %q, want it to start %q", c.Checks[0].Measured, want)
	}
	for _, h := range hops {
		if want := h[4] + " µs " + h[1]; !strings.Contains(c.Checks[1].Measured, want) {
			t.Errorf("hop line %q, want %q in it", c.Checks[1].Measured, want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	if _, err := run(&strings.Builder{}, 0, 1, 1); err == nil {
		t.Error("0 calls: no error")
	}
}
