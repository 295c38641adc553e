package plans

import (
	"math"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the plans parser. Seeds are the files
// under testdata/fuzz/FuzzParse. Whatever the input, Parse must not panic,
// and whatever it accepts must satisfy the limits it promises.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz.yaml", data)
		if err != nil {
			if p != nil {
				t.Fatalf("Parse returned plans and an error: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if len(p.ByName) == 0 {
			t.Fatal("accepted a file without plans")
		}
		for name, plan := range p.ByName {
			if plan.Name != name || !validName(name) {
				t.Fatalf("plan %q has name %q", name, plan.Name)
			}
			if plan.Capacity < 1 || plan.Capacity > MaxCapacity || plan.Capacity != math.Trunc(plan.Capacity) {
				t.Fatalf("plan %q: capacity %v accepted", name, plan.Capacity)
			}
			if !(plan.Rate > 0) || plan.Rate > MaxRate || plan.Capacity/plan.Rate > MaxRefillSecs {
				t.Fatalf("plan %q: rate %v accepted", name, plan.Rate)
			}
		}
		for key, plan := range p.clients {
			if p.ByName[plan.Name] != plan {
				t.Fatalf("a client points at a plan not in ByName: %q", plan.Name)
			}
			if len(key) == 0 || len(key) > 256 {
				t.Fatalf("accepted a client key of %d bytes", len(key))
			}
		}
		for key, h := range p.hot {
			if p.clients[key] == nil || len(h.Regions) < MinRegions || len(h.Regions) > MaxRegions ||
				p.clients[key].Capacity < float64(len(h.Regions)) {
				t.Fatalf("hot client with plan %v and regions %v accepted", p.clients[key], h.Regions)
			}
		}
		if p.Default != nil && p.ByName[p.Default.Name] != p.Default {
			t.Fatalf("default plan %q is not in ByName", p.Default.Name)
		}
	})
}
