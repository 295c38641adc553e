package shadow

import (
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"
)

func TestParseEdge(t *testing.T) {
	tests := map[string]Edge{
		"": EdgeNone, "allow": EdgeAllow, "deny": EdgeDeny, "unknown": EdgeUnknown,
		"Allow": EdgeInvalid, "yes": EdgeInvalid, " deny": EdgeInvalid,
	}
	for v, want := range tests {
		if got := ParseEdge(v); got != want {
			t.Errorf("ParseEdge(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestRecord(t *testing.T) {
	type rec struct {
		edge    Edge
		allowed bool
	}
	tests := []struct {
		name string
		recs []rec
		want Counts
		rate float64
	}{
		{"both allow, both deny", []rec{{EdgeAllow, true}, {EdgeDeny, false}}, Counts{Agree: 2}, 0},
		{"edge would deny what the service allowed", []rec{{EdgeDeny, true}, {EdgeAllow, true}}, Counts{Agree: 1, EdgeDenied: 1}, 0.5},
		{"edge would allow what the service denied", []rec{{EdgeAllow, false}, {EdgeAllow, true}, {EdgeAllow, true}, {EdgeAllow, true}}, Counts{Agree: 3, EdgeAllowed: 1}, 0.25},
		{"unknown and invalid are not compared", []rec{{EdgeUnknown, true}, {EdgeInvalid, false}, {EdgeAllow, true}}, Counts{Agree: 1, Unknown: 1, Invalid: 1}, 0},
		{"requests not shadowed are not recorded", []rec{{EdgeNone, true}, {EdgeNone, false}}, Counts{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCounter()
			for _, r := range tt.recs {
				c.Record("k", r.edge, r.allowed)
			}
			rep := c.Report()
			if rep.Clients["k"] != tt.want || rep.Total != tt.want {
				t.Fatalf("client %+v total %+v, want %+v", rep.Clients["k"], rep.Total, tt.want)
			}
			if got := tt.want.DisagreementRate(); got != tt.rate {
				t.Fatalf("rate %v, want %v", got, tt.rate)
			}
		})
	}
}

func TestExitCriterion(t *testing.T) {
	tests := []struct {
		c    Counts
		want bool
	}{
		{Counts{}, false}, // nothing compared proves nothing
		{Counts{Agree: 999, EdgeDenied: 1}, false},
		{Counts{Agree: 1999, EdgeAllowed: 1}, true},
		{Counts{Agree: 10}, true},
	}
	for _, tt := range tests {
		if got := (Report{Total: tt.c}).MeetsExitCriterion(); got != tt.want {
			t.Errorf("%+v: meets %v, want %v", tt.c, got, tt.want)
		}
	}
}

func TestMergeAndWorst(t *testing.T) {
	a, b := NewCounter(), NewCounter()
	a.Record("x", EdgeDeny, true)
	a.Record("y", EdgeAllow, true)
	b.Record("x", EdgeDeny, true)
	b.Record("z", EdgeAllow, false)
	m := Merge(a.Report(), b.Report())
	want := Report{
		Total: Counts{Agree: 1, EdgeDenied: 2, EdgeAllowed: 1},
		Clients: map[string]Counts{
			"x": {EdgeDenied: 2},
			"y": {Agree: 1},
			"z": {EdgeAllowed: 1},
		},
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("Merge = %+v, want %+v", m, want)
	}
	if got := m.Worst(5); !reflect.DeepEqual(got, []string{"x", "z"}) {
		t.Fatalf("Worst = %v, want [x z]", got)
	}
	if got := m.Worst(1); !reflect.DeepEqual(got, []string{"x"}) {
		t.Fatalf("Worst(1) = %v", got)
	}
}

func TestHandlerJSONRoundTrip(t *testing.T) {
	c := NewCounter()
	for i := 0; i < 3; i++ {
		c.Record("k", EdgeAllow, true)
	}
	c.Record("k", EdgeDeny, true)
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/_shadow", nil))
	var doc struct {
		Total         Counts            `json:"total"`
		Clients       map[string]Counts `json:"clients"`
		ExitCriterion float64           `json:"exit_criterion"`
		Meets         bool              `json:"meets_exit_criterion"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("%v: %s", err, w.Body.String())
	}
	want := Counts{Agree: 3, EdgeDenied: 1}
	if doc.Total != want || doc.Clients["k"] != want || doc.ExitCriterion != 0.001 || doc.Meets {
		t.Fatalf("decoded %+v from %s", doc, w.Body.String())
	}
	var raw map[string]map[string]any
	json.Unmarshal(w.Body.Bytes(), &raw)
	if raw["total"]["disagreement_rate"] != 0.25 || raw["total"]["compared"] != 4.0 {
		t.Fatalf("derived fields missing: %s", w.Body.String())
	}
}

// TestHammer: replicas recording at once lose nothing.
func TestHammer(t *testing.T) {
	c := NewCounter()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				c.Record("k", EdgeDeny, i%2 == 0)
			}
		}()
	}
	wg.Wait()
	if got := c.Report().Total; got != (Counts{Agree: 2000, EdgeDenied: 2000}) {
		t.Fatalf("total %+v", got)
	}
}
