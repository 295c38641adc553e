package main

import (
	"fmt"
	"io"

	"github.com/edgelimit/edgelimit/e2e/bench/stat"
)

// cpuBusy is how much CPU each side of a round kept busy: its CPU per
// check times its answers per second, for Redis alone and for every
// process of the side together (Redis, the load generator, and the
// sidecar). Redis runs its commands on one thread, and every process
// shares the machine's CPUs, so a side near 1 in the first or near the
// CPU count in the second has met that limit: the figures say which one
// a side's checks/s stopped at. The sidecar's CPU per check counts every
// answer, its 503s included, so its answers per second are its decisions
// and its 503s together.
type cpuBusy struct {
	ncpu                    int
	rawRedis, rawAll        []float64 // seconds of CPU per second, per round
	scRedis, scAll          []float64
	rawPerCheck, scPerCheck []float64 // µs of every process together per check
}

func (b *cpuBusy) add(raw figures, rawCPU perCheck, full figures, fullCPU perCheck) {
	rawAll := rawCPU.redis + rawCPU.loadgen
	scAll := fullCPU.service + fullCPU.redis + fullCPU.loadgen
	// Answers a second: the decisions' rate over their share of the answers.
	answered := full.rps * float64(full.decisions+full.errors) / float64(max(full.decisions, 1))
	b.rawRedis, b.rawAll = append(b.rawRedis, rawCPU.redis*raw.rps/1e6), append(b.rawAll, rawAll*raw.rps/1e6)
	b.scRedis, b.scAll = append(b.scRedis, fullCPU.redis*answered/1e6), append(b.scAll, scAll*answered/1e6)
	b.rawPerCheck, b.scPerCheck = append(b.rawPerCheck, rawAll), append(b.scPerCheck, scAll)
}

func (b *cpuBusy) print(out io.Writer, loader string) {
	m := stat.Median
	fmt.Fprintf(out, "CPU kept busy, seconds a second, medians of the rounds (Redis runs its commands on one thread; every process shares the %d CPUs):\n", b.ncpu)
	fmt.Fprintf(out, "  redis-benchmark's side: Redis %.2f, Redis and redis-benchmark %.2f (%.1f µs a check)\n", m(b.rawRedis), m(b.rawAll), m(b.rawPerCheck))
	fmt.Fprintf(out, "  the sidecar's side: Redis %.2f, the sidecar, Redis and %s %.2f (%.1f µs a check)\n", m(b.scRedis), loader, m(b.scAll), m(b.scPerCheck))
}
