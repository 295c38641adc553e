package filtertest

import "testing"

// TestEveryFixtureIsInATable: each file under testdata/config has its entry
// in InvalidConfigs or ValidConfigs, and each entry its file.
func TestEveryFixtureIsInATable(t *testing.T) {
	listed := map[string]bool{}
	for _, c := range InvalidConfigs {
		listed["invalid/"+c.File] = true
	}
	for _, f := range ValidConfigs {
		listed["valid/"+f] = true
	}
	files := ConfigFixtures()
	for _, f := range files {
		if !listed[f] {
			t.Errorf("fixture %s has no entry in filtertest's tables", f)
		}
	}
	if len(files) != len(listed) {
		t.Errorf("%d fixture files, %d table entries", len(files), len(listed))
	}
}
