package limiter_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/filter/filtertest"
	"github.com/edgelimit/edgelimit/filter/limiter"
)

// TestREADMEConfiguration holds filter/README.md's Configuration section to
// the parser: its table has a row for every field the filter accepts and
// none other, each row's default parses to the default configuration, and
// each error line it shows is one the filter gives for a fixture.
func TestREADMEConfiguration(t *testing.T) {
	data, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	start := strings.Index(readme, "\n## Configuration\n")
	end := strings.Index(readme, "\n## What happens to a request\n")
	if start < 0 || end < start {
		t.Fatal("filter/README.md: no Configuration section")
	}
	section := readme[start:end]
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| `([^|]*)` \\|")
	var fields []string
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		field, def := m[1], m[2]
		fields = append(fields, field)
		cfg, err := limiter.Parse([]byte(`{"` + field + `": ` + def + `}`))
		if err != nil {
			t.Errorf("filter/README.md: %s's default %s: %v", field, def, err)
			continue
		}
		if cfg.Summary() != limiter.DefaultConfig().Summary() {
			t.Errorf("filter/README.md: %s's default %s is not the default: %s, want %s", field, def, cfg.Summary(), limiter.DefaultConfig().Summary())
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(fields)), slices.Sorted(slices.Values(limiter.TopFields))) {
		t.Errorf("filter/README.md's Configuration table lists %v, the filter accepts %v", fields, limiter.TopFields)
	}
	errLine := regexp.MustCompile(`(?m)^edgelimit: invalid configuration: (.*)$`)
	lines := errLine.FindAllStringSubmatch(section, -1)
	if len(lines) == 0 {
		t.Error("filter/README.md shows no invalid configuration line")
	}
	for _, m := range lines {
		if !slices.ContainsFunc(filtertest.InvalidConfigs, func(c filtertest.ConfigCase) bool { return c.Error == m[1] }) {
			t.Errorf("filter/README.md shows %q, which the filter gives for no fixture of filtertest.InvalidConfigs", m[0])
		}
	}
}

// TestEnvoyYAMLCommentsEveryField holds the field list in the comment above
// envoy/envoy.yaml's filter configuration to the fields the filter accepts.
func TestEnvoyYAMLCommentsEveryField(t *testing.T) {
	data, err := os.ReadFile("../../envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	yaml := string(data)
	start := strings.Index(yaml, "naming the field. Fields:\n")
	end := strings.Index(yaml, "configuration:\n")
	if start < 0 || end < start {
		t.Fatal("envoy/envoy.yaml: no field list above the filter's configuration")
	}
	item := regexp.MustCompile(`(?m)^\s+#   ([a-z_]+) `)
	var fields []string
	for _, m := range item.FindAllStringSubmatch(yaml[start:end], -1) {
		fields = append(fields, m[1])
	}
	if !slices.Equal(slices.Sorted(slices.Values(fields)), slices.Sorted(slices.Values(limiter.TopFields))) {
		t.Errorf("envoy/envoy.yaml's comment lists %v, the filter accepts %v", fields, limiter.TopFields)
	}
}
