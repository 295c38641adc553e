package main

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/e2e/bench/rig"
	"github.com/edgelimit/edgelimit/e2e/bench/stat"
	"github.com/edgelimit/edgelimit/e2e/services/bucket"
	"github.com/edgelimit/edgelimit/e2e/services/safety"
)

// unlimitedPlan admits every request a run sends: each is a callout the
// sidecar allows, the script's writing path.
var unlimitedPlan = bucket.Limit{Capacity: 1e9, Rate: 1e9}

// plans is a plans file: the sidecar reads it, and the services read the
// same limits through Lookup.
type plans struct {
	Default string
	Plans   map[string]bucket.Limit
	Clients map[string]string // API key → plan name
}

// YAML renders the sidecar's plans file.
func (p plans) YAML() string {
	var b strings.Builder
	if p.Default != "" {
		fmt.Fprintf(&b, "default_plan: %s\n", p.Default)
	}
	b.WriteString("plans:\n")
	for _, name := range sortedKeys(p.Plans) {
		l := p.Plans[name]
		fmt.Fprintf(&b, "  %s: {capacity: %s, rate: %s}\n", name, num(l.Capacity), num(l.Rate))
	}
	if len(p.Clients) > 0 {
		b.WriteString("clients:\n")
		for _, k := range sortedKeys(p.Clients) {
			fmt.Fprintf(&b, "  %q: %s\n", k, p.Clients[k])
		}
	}
	return b.String()
}

// Lookup is the services' view of the same plans.
func (p plans) Lookup() safety.Plans {
	return func(client string) (bucket.Limit, bool) {
		name, ok := p.Clients[client]
		if !ok {
			name = p.Default
		}
		l, ok := p.Plans[name]
		return l, ok
	}
}

func num(x float64) string { return fmt.Sprintf("%g", x) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// servicePaths spreads a client's requests over the services in turn, as
// the incident's client did.
func servicePaths(services []string, suffix string) []string {
	out := make([]string, len(services))
	for i, s := range services {
		out[i] = "/" + s + suffix
	}
	return out
}

// ms formats a duration in milliseconds with sensible precision.
func ms(d time.Duration) string { return msv(stat.Ms(d)) }

// msv formats milliseconds as ms does, "-" for NaN (no value: nothing
// was answered).
func msv(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// ratio formats a ratio such as 9.02x.
func ratio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	if x >= 10 {
		return fmt.Sprintf("%.1fx", x)
	}
	return fmt.Sprintf("%.2fx", x)
}

// counterDelta returns after-before for every counter in after.
func counterDelta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// callouts counts the requests a counter delta says went to the sidecar
// (decided by a callout, or failed open trying).
func callouts(d map[string]int64) int64 {
	return d["requests.allowed"] + d["requests.denied"] + d["requests.shadow_allowed"] +
		d["requests.shadow_would_deny"] + rig.FailedOpen(d)
}
