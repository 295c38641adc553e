package plans

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"testing"
)

// TestHotChanges: the clients whose layout two files differ on, listed by
// key or by digest, with their regions and plans in each; a client whose
// regions stay is not one, whatever its plan.
func TestHotChanges(t *testing.T) {
	sum := sha256.Sum256([]byte("by-digest"))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	old, err := Parse("old.yaml", []byte(`
default_plan: free
plans:
  free: {capacity: 10, rate: 1}
  pro: {capacity: 100, rate: 50}
clients:
  "marked": pro
  "unmarked": {plan: pro, regions: [eu, us]}
  "moved": {plan: pro, regions: [eu, us]}
  "same": {plan: pro, regions: [eu, us]}
  "dropped": {plan: pro, regions: [eu, us]}
  "`+digest+`": pro
`))
	if err != nil {
		t.Fatal(err)
	}
	new, err := Parse("new.yaml", []byte(`
default_plan: free
plans:
  free: {capacity: 10, rate: 1}
  pro: {capacity: 100, rate: 50}
  big: {capacity: 1000, rate: 500}
clients:
  "marked": {plan: big, regions: [eu, us]}
  "unmarked": pro
  "moved": {plan: pro, regions: [us, eu]}
  "same": {plan: big, regions: [eu, us]}
  "new": {plan: pro, regions: [eu, us]}
  "`+digest+`": {plan: pro, regions: [eu, ap]}
`))
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		from, to         []string
		fromPlan, toPlan string
	}
	wants := map[string]want{
		"marked":   {nil, []string{"eu", "us"}, "pro", "big"},
		"unmarked": {[]string{"eu", "us"}, nil, "pro", "pro"},
		"moved":    {[]string{"eu", "us"}, []string{"us", "eu"}, "pro", "pro"},
		"dropped":  {[]string{"eu", "us"}, nil, "pro", "free"},
		"new":      {nil, []string{"eu", "us"}, "free", "pro"},
		digest:     {nil, []string{"eu", "ap"}, "pro", "pro"},
	}
	got := HotChanges(old, new)
	if len(got) != len(wants) {
		t.Errorf("%d changes, want %d: %+v", len(got), len(wants), got)
	}
	for _, c := range got {
		name := c.Key
		if name == "" {
			name = "sha256:" + hex.EncodeToString(c.Sum[:])
		}
		w, ok := wants[name]
		if !ok {
			t.Errorf("unexpected change of %q", name)
			continue
		}
		if !slices.Equal(c.From, w.from) || !slices.Equal(c.To, w.to) || c.FromPlan.Name != w.fromPlan || c.ToPlan.Name != w.toPlan {
			t.Errorf("%s: %v on %s to %v on %s, want %v on %s to %v on %s", name, c.From, c.FromPlan.Name, c.To, c.ToPlan.Name, w.from, w.fromPlan, w.to, w.toPlan)
		}
	}
}
