package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/edgelimit/edgelimit/e2e/bench/stat"
)

// floors are the two servers the sidecar's CPU per check is read beside
// (./floor): its own server and handler with each check decided at once in
// the process instead of in Redis, and the same fasthttp server sending
// one fixed answer. Loaded like the sidecar, the first costs what a check
// costs the sidecar short of Redis, the second what the HTTP server alone
// costs; the sidecar's figure less the first is what deciding on Redis
// adds (the queue, the pipelines, the replies, the handler's wait).
type floors struct{ decided, fixed *sidecar }

// startFloors builds ./floor into dir and starts both, on the sidecar's
// plans file.
func startFloors(dir, plans string) (*floors, error) {
	bin := filepath.Join(dir, "floor")
	if err := goBuild(bin, "", "./e2e/bench/sidecarbench/floor"); err != nil {
		return nil, err
	}
	decided, err := startServer("floor", bin, "-plans", plans, "-answer", "decided")
	if err != nil {
		return nil, err
	}
	fixed, err := startServer("floor", bin, "-plans", plans, "-answer", "fixed")
	if err != nil {
		decided.stop()
		return nil, err
	}
	return &floors{decided, fixed}, nil
}

func (f *floors) stop() {
	f.decided.stop()
	f.fixed.stop()
}

// floorFigures are the rounds' CPU per check of the sidecar and of its
// floors, and the floors' checks/s.
type floorFigures struct {
	sidecar, decided, fixed []float64 // µs
	decidedRate, fixedRate  []float64
}

func (f *floorFigures) add(sidecarCPU float64, dec figures, decCPU perCheck, fix figures, fixCPU perCheck) {
	f.sidecar = append(f.sidecar, sidecarCPU)
	f.decided = append(f.decided, decCPU.service)
	f.fixed = append(f.fixed, fixCPU.service)
	f.decidedRate = append(f.decidedRate, dec.rps)
	f.fixedRate = append(f.fixedRate, fix.rps)
}

func (f *floorFigures) print(out io.Writer) {
	fmt.Fprintf(out, "the sidecar's CPU per check beside its floors, medians of the rounds: %.1f µs; deciding at once without Redis %.1f µs (%.0f checks/s); one fixed answer %.1f µs (%.0f checks/s)\n",
		stat.Median(f.sidecar), stat.Median(f.decided), stat.Median(f.decidedRate), stat.Median(f.fixed), stat.Median(f.fixedRate))
	fmt.Fprintf(out, "  each floor loaded as the sidecar is, at its own full load (a higher rate than the sidecar's); the sidecar's figure less the first is what deciding on Redis adds\n")
}
