package limiter_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/edgelimit/edgelimit/filter/limiter"
)

// schemaProp is the part of a JSON Schema the probes below are made from:
// the fields, their types, enums and bounds. Whether the schema accepts a
// probe is the validator's answer (helmValidator), not this.
type schemaProp struct {
	Type       string                 `json:"type"`
	Enum       []string               `json:"enum"`
	Minimum    *int64                 `json:"minimum"`
	Maximum    *int64                 `json:"maximum"`
	Pattern    string                 `json:"pattern"`
	MinLength  *int                   `json:"minLength"`
	MaxLength  *int                   `json:"maxLength"`
	MaxItems   *int                   `json:"maxItems"`
	Properties map[string]*schemaProp `json:"properties"`
	Items      *schemaProp            `json:"items"`
}

// TestChartSchemaFollowsFilter holds the Helm chart's values.schema.json,
// which Helm checks the values against before it renders anything, to the
// filter's own parser: the schema's filter section has the fields the
// filter accepts and none other (in the cost rules and the breaker too);
// it accepts every probe value the filter accepts, so no working
// configuration is refused at install; and it refuses every probe the
// filter refuses at Envoy's start, so such a value fails `helm install`
// naming it rather than crashlooping the pods. api_key_header is checked
// one way only: its rule (a header name, neither authorization nor the
// filter's own header) is the filter's. canary_clients are API keys, which
// a schema error would quote (the filter names them without quoting): the
// schema asks only for a list of at most the filter's number of strings,
// and they are not probed; nor is sidecar_cluster, the chart's own
// cluster, the one value the schema takes.
func TestChartSchemaFollowsFilter(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/helm/edgelimit/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema schemaProp
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	validator := helmValidator(t, raw)
	filter := schema.Properties["filter"]
	if filter == nil {
		t.Fatal("values.schema.json: no filter section")
	}
	sameFields := func(where string, p *schemaProp, want []string) {
		t.Helper()
		if p == nil {
			t.Fatalf("values.schema.json: no %s", where)
		}
		if got := slices.Sorted(maps.Keys(p.Properties)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("values.schema.json's %s has %v, the filter accepts %v", where, got, want)
		}
	}
	sameFields("filter", filter, limiter.TopFields)
	// The count of canary keys is the one rule on them the schema can
	// give without quoting a key.
	if c := filter.Properties["canary_clients"]; c == nil || c.MaxItems == nil || *c.MaxItems != limiter.MaxCanaryClients {
		t.Errorf("values.schema.json: filter.canary_clients needs maxItems %d, the filter's bound", limiter.MaxCanaryClients)
	}
	costs, breaker := filter.Properties["costs"], filter.Properties["breaker"]
	if costs == nil || costs.Items == nil {
		t.Fatal("values.schema.json: filter.costs has no items")
	}
	sameFields("filter.costs[]", costs.Items, limiter.RuleFields)
	sameFields("filter.breaker", breaker, limiter.BreakerFields)
	if costs.MaxItems == nil || *costs.MaxItems != limiter.MaxCostRules {
		t.Errorf("values.schema.json: filter.costs maxItems %v, the filter takes at most %d rules", costs.MaxItems, limiter.MaxCostRules)
	}

	oneWay := map[string]bool{"api_key_header": true}
	strs := []string{"", "a", "A", "x-api-key", "enforce", "POST", "post", "Post", "/", "/orders", "orders", "eu-west-1",
		"a b", "a/b", "a\tb", "é", "a:b", "h:8081", "h:", "h:123456", "[::1]", "[::1]:8081", "[x]", "[]", "[::1]x", strings.Repeat("A", 32), strings.Repeat("A", 33),
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 255), strings.Repeat("a", 256),
		"/" + strings.Repeat("a", 1023), "/" + strings.Repeat("a", 1024)}
	// configuration places a field's value where the filter reads it, with
	// the other fields it needs (a rule's match and cost, the breaker's
	// other bound).
	configuration := func(where, field string, v any) []byte {
		var cfg any
		switch where {
		case "filter":
			cfg = map[string]any{field: v}
		case "filter.costs[]":
			rule := map[string]any{"path_prefix": "/x", "cost": 1}
			rule[field] = v
			cfg = map[string]any{"costs": []any{rule}}
		case "filter.breaker":
			b := map[string]any{"min_open_ms": 1, "max_open_ms": limiter.MaxBreakerOpenMs}
			b[field] = v
			cfg = map[string]any{"breaker": b}
		}
		js, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	check := func(where, field string, p *schemaProp) {
		t.Helper()
		var probes []any
		switch {
		case p.Type == "integer":
			for _, n := range []int64{-1, 0, 1, 2, 1 << 31} {
				probes = append(probes, n)
			}
			for _, b := range []*int64{p.Minimum, p.Maximum} {
				if b != nil {
					probes = append(probes, *b-1, *b, *b+1)
				}
			}
		case p.Type == "string" || p.Enum != nil:
			// And the values the filter's error names ("enforce",
			// "shadow" or "off"), which the schema may have left out.
			named := []string{}
			if _, err := limiter.Parse(configuration(where, field, "?")); err != nil {
				rule, _, _ := strings.Cut(err.Error(), ", got ")
				for _, m := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(rule, -1) {
					named = append(named, m[1])
				}
			}
			for _, s := range slices.Concat(strs, p.Enum, named) {
				probes = append(probes, s)
			}
			for _, e := range p.Enum {
				probes = append(probes, strings.ToUpper(e), e+"x")
			}
		default:
			return // objects and arrays (their parts are checked), sidecar_cluster (a const)
		}
		for _, v := range probes {
			cfg := configuration(where, field, v)
			_, err := limiter.Parse(cfg)
			switch schemaOK := validates(t, validator, cfg); {
			case err == nil && !schemaOK:
				t.Errorf("values.schema.json refuses %s.%s %s, which the filter accepts", where, field, shown(v))
			case err != nil && schemaOK && !oneWay[field]:
				t.Errorf("values.schema.json accepts %s.%s %s, which the filter refuses (%v): the pods would not start", where, field, shown(v), err)
			}
		}
	}
	for where, p := range map[string]*schemaProp{"filter": filter, "filter.costs[]": costs.Items, "filter.breaker": breaker} {
		for field, fp := range p.Properties {
			check(where, field, fp)
		}
	}
}

// helmValidator compiles the chart's values.schema.json as Helm does
// before it renders (helm.sh/helm/v3/pkg/chartutil.ValidateAgainstSingleSchema:
// the same library and version, the schema decoded with its numbers kept
// exact), so that a probe is accepted or refused here as `helm install`
// would accept or refuse it.
func helmValidator(t *testing.T, raw []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("file:///values.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("file:///values.schema.json")
	if err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return s
}

// validates reports whether values whose filter section is the filter
// configuration cfg pass the chart's schema.
func validates(t *testing.T, s *jsonschema.Schema, cfg []byte) bool {
	t.Helper()
	filter, err := jsonschema.UnmarshalJSON(bytes.NewReader(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return s.Validate(map[string]any{"filter": filter}) == nil
}

// shown is a probe for a message: quoted, cut after 20 bytes.
func shown(v any) string {
	s := fmt.Sprint(v)
	if len(s) > 20 {
		s = s[:20] + "..."
	}
	return strconv.Quote(s)
}
