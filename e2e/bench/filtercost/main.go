// Command filtercost measures what one allowed request costs the filter
// inside wazero against the same logic compiled natively
// (BenchmarkAllowedPath), side by side: in the headless host as the gateway
// drives it (BenchmarkFilterRequest), and in a minimal host that calls the
// exports one after another on one goroutine, as an independent host would
// (BenchmarkFilterDirect). The benchmarks run in rotating order in rounds of
// the same run, and the medians and their ratios are reported.
//
//	go run ./e2e/bench/filtercost [-rounds 5] [-benchtime 1s] [-out FILE]
//
// The targets (issue "the limit must hold under bursts"): the whole request
// lifecycle in wazero at most 10 µs, and at most 15x the native path. The
// wasm figure includes the host's own work per request (entering exports,
// host calls), as Envoy's would include V8's.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"golang.org/x/perf/benchfmt"

	"github.com/edgelimit/edgelimit/e2e/bench/report"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/harness"
	"github.com/edgelimit/edgelimit/internal/gotool"
)

// The targets, from the issue that set them.
const (
	targetWasmNs = 10_000
	targetRatio  = 15
)

// bench is one of the two measured benchmarks.
type bench struct {
	name string // as go test prints it, without the -N suffix
	pkg  string
}

var (
	wasm    = bench{"BenchmarkFilterRequest", "./e2e/filterwasm"}
	direct  = bench{"BenchmarkFilterDirect", "./e2e/filterwasm"}
	native  = bench{"BenchmarkAllowedPath", "./filter/limiter"}
	benches = []bench{wasm, direct, native}
)

func main() {
	rounds := flag.Int("rounds", 5, "alternating rounds of both benchmarks; the report gives medians")
	benchtime := flag.String("benchtime", "1s", "go test -benchtime of each round")
	out := flag.String("out", "", "also write the report to this file, and its checks beside it (FILE without .txt + .checks.json)")
	flag.Parse()
	if err := run(*rounds, *benchtime, *out); err != nil {
		fmt.Fprintln(os.Stderr, "filtercost:", err)
		os.Exit(1)
	}
}

func run(rounds int, benchtime, out string) error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	m := report.StartMeter(report.Command("./e2e/bench/filtercost", os.Args[1:]))
	ns := make([][]float64, len(benches))
	for r := 0; r < rounds; r++ {
		// The order rotates, so that a machine getting busier or
		// quieter during the run weighs on each alike.
		for k := range benches {
			i := (r + k) % len(benches)
			b := benches[i]
			v, err := runBench(root, b, benchtime)
			if err != nil {
				return err
			}
			ns[i] = append(ns[i], v)
			fmt.Fprintf(os.Stderr, "filtercost: round %d/%d %s %.0f ns/op\n", r+1, rounds, b.name, v)
		}
	}
	w, d, n := stat.Median(ns[0]), stat.Median(ns[1]), stat.Median(ns[2])
	// Each round's ratio is of figures measured minutes apart at most,
	// where the medians may come from rounds far apart; the ratios
	// reported are the medians of the rounds' ratios.
	var ratios, dratios []float64
	for r := range rounds {
		ratios, dratios = append(ratios, ns[0][r]/ns[2][r]), append(dratios, ns[1][r]/ns[2][r])
	}
	ratio, dratio := stat.Median(ratios), stat.Median(dratios)
	ran := m.Stop()

	var buf bytes.Buffer
	fmt.Fprintf(&buf, "One allowed request through the filter: filter.wasm in wazero against the same logic natively\n")
	fmt.Fprintf(&buf, "go test -bench, %d rounds in rotating order of -benchtime %s, %s\n\n", rounds, benchtime, ran.Dated())
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "benchmark\tpackage\tns/op per round\tmedian ns/op\t")
	for i, b := range benches {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t\n", b.name, b.pkg, stat.Join(ns[i], 0, " "), stat.Median(ns[i]))
	}
	tw.Flush()
	fmt.Fprintf(&buf, "\nratio wasm / native, median of the rounds' ratios: %.2fx in the headless host (%s), %.2fx in the minimal host (%s)\n",
		ratio, stat.Join(ratios, 1, " "), dratio, stat.Join(dratios, 1, " "))
	fmt.Fprintf(&buf, "targets: wasm <= %d ns (headless host %s, minimal host %s), ratio <= %dx (headless host %s, minimal host %s)\n",
		targetWasmNs, report.Met(w <= targetWasmNs), report.Met(d <= targetWasmNs), targetRatio, report.Met(ratio <= targetRatio), report.Met(dratio <= targetRatio))
	os.Stdout.Write(buf.Bytes())
	if out == "" {
		return nil
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	checks := []report.Check{
		{Claim: "the filter's whole request in wazero, in the headless host as the gateway drives it", Target: fmt.Sprintf("<= %d µs", targetWasmNs/1000),
			Measured: fmt.Sprintf("%.0f ns (median of %d rounds)", w, rounds), Holds: w <= targetWasmNs},
		{Claim: "the filter in the headless host against the native path", Target: fmt.Sprintf("<= %dx", targetRatio),
			Measured: fmt.Sprintf("%.2fx (median of the %d rounds' ratios; medians %.0f ns / %.0f ns)", ratio, rounds, w, n), Holds: ratio <= targetRatio},
		{Claim: "the filter's whole request in a minimal wazero host (exports called in turn on one goroutine)", Target: fmt.Sprintf("<= %d µs", targetWasmNs/1000),
			Measured: fmt.Sprintf("%.0f ns (median of %d rounds)", d, rounds), Holds: d <= targetWasmNs},
		{Claim: "the filter in a minimal wazero host against the native path", Target: fmt.Sprintf("<= %dx", targetRatio),
			Measured: fmt.Sprintf("%.2fx (median of the %d rounds' ratios; medians %.0f ns / %.0f ns)", dratio, rounds, d, n), Holds: dratio <= targetRatio},
	}
	return report.SaveChecks(report.ChecksPath(out), report.Checked{Run: ran, Checks: checks})
}

// runBench runs one benchmark once and returns its ns/op.
func runBench(root string, b bench, benchtime string) (float64, error) {
	printed, err := gotool.Output(context.Background(), root, nil, "test", "-run", "^$", "-bench", "^"+b.name+"$", "-benchtime", benchtime, "-count", "1", b.pkg)
	if err != nil {
		return 0, err
	}
	r := benchfmt.NewReader(bytes.NewReader(printed), b.pkg)
	for r.Scan() {
		// benchfmt names a benchmark without its "Benchmark" prefix.
		res, ok := r.Result().(*benchfmt.Result)
		if !ok || string(res.Name.Base()) != strings.TrimPrefix(b.name, "Benchmark") {
			continue
		}
		if v, ok := res.Value("sec/op"); ok {
			return v * 1e9, nil
		}
	}
	if err := r.Err(); err != nil && err != io.EOF {
		return 0, err
	}
	return 0, fmt.Errorf("go test -bench %s %s printed no sec/op:\n%s", b.name, b.pkg, printed)
}
