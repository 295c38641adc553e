package report

import (
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/internal/vcpustall"
)

// BreaksACallout is vcpustall.BreaksACallout as the reports write it.
var BreaksACallout = fmt.Sprintf("%g ms", float64(vcpustall.BreaksACallout)/float64(time.Millisecond))

// Stalls sum up the times over a run that a vCPU stood still for
// vcpustall.BreaksACallout or more, as a real-time thread pinned to each
// CPU saw them: the host's hold on the machine where /proc/stat's steal
// reads zero (RATIONALE.md, "Where the hypervisor reports no steal").
type Stalls struct {
	Count   int           `json:"count"`
	Longest time.Duration `json:"longest_ns"`
}

// StallsOf sums up what w saw; nil where it could not watch.
func StallsOf(w *vcpustall.Watch) *Stalls {
	if w == nil || w.Unavailable() != "" {
		return nil
	}
	var s Stalls
	for _, st := range w.Stalls(vcpustall.BreaksACallout) {
		s.Count++
		s.Longest = max(s.Longest, st.Len())
	}
	return &s
}

// String is "N times, the longest L" (or "none").
func (s Stalls) String() string {
	if s.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("%d times, the longest %.1f ms", s.Count, float64(s.Longest)/float64(time.Millisecond))
}

// PerMinute is how often they came over a run that took d.
func (s Stalls) PerMinute(d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(s.Count) / d.Minutes()
}

// Meter measures a benchmark's run: when it ran and how busy the machine
// was besides.
type Meter struct {
	command string
	started time.Time
	load0   float64
	cpu0    CPUTime
	watch   *vcpustall.Watch // nil where it could not start
	// unwatched is why the watch did not start.
	unwatched string
}

// StartMeter starts measuring the run of command.
func StartMeter(command string) *Meter {
	m := &Meter{command: command, started: time.Now(), load0: LoadAverage(), cpu0: ReadCPUTime()}
	w, err := vcpustall.Start()
	if err != nil {
		m.unwatched = err.Error()
	}
	m.watch = w
	return m
}

// Watch is the meter's watch of the vCPUs, for a benchmark that asks it
// about its own moments; nil where it could not start.
func (m *Meter) Watch() *vcpustall.Watch { return m.watch }

// Stop ends the measurement and returns the run. Call it once.
func (m *Meter) Stop() Run {
	unwatched := m.unwatched
	if m.watch != nil {
		m.watch.Close()
		unwatched = m.watch.Unavailable()
	}
	return Run{
		Command: m.command, Started: m.started, Took: time.Since(m.started),
		Load:      [2]float64{m.load0, LoadAverage()},
		Steal:     ReadCPUTime().StealSince(m.cpu0),
		Stalls:    StallsOf(m.watch),
		Unwatched: unwatched,
	}
}
