package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// sampleRounds are sampleReport's rows for redis-benchmark and the
// sidecar, with 3 s of decisions at each sidecar row's checks/s.
var sampleRounds = []struct {
	raw, full       figures
	rawCPU, fullCPU perCheck
}{
	{figures{rps: 55804}, figures{rps: 29523, decisions: 3 * 29523, errors: 64}, perCheck{redis: 24.1, loadgen: 10.2}, perCheck{service: 26.3, redis: 17.8, loadgen: 9.9}},
	{figures{rps: 41046}, figures{rps: 29571, decisions: 3 * 29571, errors: 266}, perCheck{redis: 25.0, loadgen: 10.9}, perCheck{service: 8.4, redis: 17.9, loadgen: 10.4}},
	{figures{rps: 50947}, figures{rps: 28134, decisions: 3 * 28134, errors: 1}, perCheck{redis: 24.6, loadgen: 10.4}, perCheck{service: 9.1, redis: 19.1, loadgen: 10.5}},
}

// The CPU a side kept busy is its CPU per check times its answers a
// second, 503s included; sampleReport's lines are what print makes of
// its rounds, so the parser is tested on what the program writes.
func TestCPUBusy(t *testing.T) {
	var b cpuBusy
	// 20,000 decisions a second and as many 503s: 40,000 answers at 10 µs
	// of Redis and 50 µs in all are 0.4 and 2 seconds a second.
	b.add(figures{rps: 50000}, perCheck{redis: 20, loadgen: 10}, figures{rps: 20000, decisions: 60000, errors: 60000}, perCheck{service: 30, redis: 10, loadgen: 10})
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"redis-benchmark's Redis", b.rawRedis[0], 1}, {"redis-benchmark's side", b.rawAll[0], 1.5},
		{"the sidecar's Redis", b.scRedis[0], 0.4}, {"the sidecar's side", b.scAll[0], 2}} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s: %v seconds a second, want %v", c.name, c.got, c.want)
		}
	}

	b = cpuBusy{ncpu: 2}
	for _, r := range sampleRounds {
		b.add(r.raw, r.rawCPU, r.full, r.fullCPU)
	}
	var out bytes.Buffer
	b.print(&out, "wrk")
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if !strings.Contains(sampleReport, line+"\n") {
			t.Errorf("sampleReport lacks the line %q", line)
		}
	}
}
