package limiter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/internal/region"
)

func TestParseJSONValues(t *testing.T) {
	for in, want := range map[string]any{
		`{"a": [1, -2.5e3, true, false, null, "x"]}`: map[string]any{"a": []any{json.Number("1"), json.Number("-2.5e3"), true, false, nil, "x"}},
		`"\u00e9\ud83d\ude00\n\/\\\""`:               "é😀\n/\\\"",
		` [ ] `:                                      []any{},
		`{}`:                                         map[string]any{},
		`0`:                                          json.Number("0"),
		`-0.0E+1`:                                    json.Number("-0.0E+1"),
		`"plain"`:                                    "plain",
	} {
		v, err := parseJSON([]byte(in))
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got, _ := toAny(v); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %#v, want %#v", in, got, want)
		}
	}
	for _, bad := range []string{``, ` `, `01`, `1.`, `.5`, `-`, `1e`, `+1`, `tru`, `nul`, `"\x"`, `"\u12"`, `"a`, `[1,]`,
		`{"a"}`, `{"a":1,}`, `{,}`, `[1 2]`, `"` + "\x01" + `"`, `"\udc00"`, `"\ud800\u0041"`, `NaN`, `Infinity`, `'a'`} {
		if v, err := parseJSON([]byte(bad)); err == nil {
			t.Errorf("%q parsed as %+v", bad, v)
		}
	}
}

// toAny converts a parsed value to what encoding/json decodes (with
// UseNumber); ok is false when an object repeats a name, which
// encoding/json would merge.
func toAny(v jsonValue) (any, bool) {
	switch v.kind {
	case jsonNull:
		return nil, true
	case jsonBool:
		return v.b, true
	case jsonNumber:
		return json.Number(v.text), true
	case jsonString:
		return v.text, true
	case jsonArray:
		out := []any{}
		for _, it := range v.items {
			a, ok := toAny(it)
			if !ok {
				return nil, false
			}
			out = append(out, a)
		}
		return out, true
	}
	out := map[string]any{}
	for _, f := range v.fields {
		if _, dup := out[f.name]; dup {
			return nil, false
		}
		a, ok := toAny(f.value)
		if !ok {
			return nil, false
		}
		out[f.name] = a
	}
	return out, true
}

// FuzzParseJSON compares the reader with encoding/json: whatever it accepts
// encoding/json accepts too and decodes to the same value; what it refuses
// and encoding/json accepts is one of its documented extra rules.
func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{`{"mode":"shadow","costs":[{"cost":2}]}`, `[1,2,{"a":"\u00e9"}]`, `"\ud800"`, `{"a":1,"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseJSON(data)
		checkSummaries(t, data, v, err)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "invalid JSON at offset ") {
				t.Fatalf("error %q", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted %q, which encoding/json refuses", data)
		}
		mine, ok := toAny(v)
		if !ok {
			return
		}
		d := json.NewDecoder(bytes.NewReader(data))
		d.UseNumber()
		var theirs any
		if err := d.Decode(&theirs); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(mine, theirs) {
			t.Fatalf("%q: %#v, encoding/json %#v", data, mine, theirs)
		}
	})
}

// checkSummaries holds the reader with summaries to the tree of the same
// text (tree and err, from parseJSON): the same error at every depth, and
// otherwise the same values, a summary having the tree's number of entries
// and written size and, read entry by entry, the same entries.
func checkSummaries(t *testing.T, data []byte, tree jsonValue, err error) {
	t.Helper()
	for depth := 1; depth <= 3; depth++ {
		v, serr := parseText(string(data), depth)
		if (serr == nil) != (err == nil) || serr != nil && serr.Error() != err.Error() {
			t.Fatalf("%q summarized from depth %d: error %v, the whole tree's %v", data, depth, serr, err)
		}
		if err == nil {
			if why := sameValue(tree, v); why != "" {
				t.Fatalf("%q summarized from depth %d: %s", data, depth, why)
			}
		}
	}
}

// sameValue says how v differs from tree, a value read whole, or "".
func sameValue(tree, v jsonValue) string {
	if tree.kind != v.kind || tree.text != v.text && !v.summary || tree.b != v.b {
		return fmt.Sprintf("%+v, want %+v", v, tree)
	}
	if !v.summary {
		if len(v.items) != len(tree.items) || len(v.fields) != len(tree.fields) {
			return fmt.Sprintf("%d items and %d fields, want %d and %d", len(v.items), len(v.fields), len(tree.items), len(tree.fields))
		}
		for i := range v.items {
			if why := sameValue(tree.items[i], v.items[i]); why != "" {
				return why
			}
		}
		for i := range v.fields {
			if v.fields[i].name != tree.fields[i].name {
				return fmt.Sprintf("field %q, want %q", v.fields[i].name, tree.fields[i].name)
			}
			if why := sameValue(tree.fields[i].value, v.fields[i].value); why != "" {
				return why
			}
		}
		return ""
	}
	if n := len(tree.items) + len(tree.fields); v.n != n || v.size != writtenSize(tree) || len(v.items)+len(v.fields) != 0 {
		return fmt.Sprintf("summary of %d entries, size %d, want %d and %d", v.n, v.size, n, writtenSize(tree))
	}
	why, i := "", 0
	var err error
	if v.kind == jsonArray {
		err = eachItem(v, 1, func(_ int, item jsonValue) error {
			if why == "" {
				why = sameValue(tree.items[i], item)
			}
			i++
			return nil
		})
	} else {
		err = eachField(v, func(name string, value jsonValue) error {
			if why == "" && name != tree.fields[i].name {
				why = fmt.Sprintf("field %q, want %q", name, tree.fields[i].name)
			}
			if why == "" {
				why = sameValue(tree.fields[i].value, value)
			}
			i++
			return nil
		})
	}
	switch {
	case err != nil:
		return "reading the summary: " + err.Error()
	case why == "" && i != v.n:
		return fmt.Sprintf("read %d entries of a summary of %d", i, v.n)
	}
	return why
}

func TestSummariesMatchTheTree(t *testing.T) {
	for _, in := range []string{`{"mode":"shadow","costs":[{"cost":2}]}`, `[1,2,{"a":"\u00e9"}]`, ` [ [ ] , { } , [[1, [2]], {"x": {"y": []}}] ] `,
		`{"a":1,"a":2}`, `{"canary_clients": ["k1", "k\u0032", "k3"], "breaker": {"failures": 3}}`, `[1,]`, `{"a": [1 2]}`, `"\ud800"`} {
		v, err := parseJSON([]byte(in))
		checkSummaries(t, []byte(in), v, err)
	}
}

// FuzzParse: the configuration parser never panics, every error names what
// it is about, and every accepted configuration is within its limits.
func FuzzParse(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"timeout_ms": -3}`, `{"mode": "shadow", "canary_clients": ["a", "b c"]}`,
		`{"costs": [{"method": "POST", "path_prefix": "/x", "cost": 2}]}`, `{"api_key_header": "X-Key", "region": "eu"}`,
		`{"breaker": {"failures": 3, "min_open_ms": 50, "max_open_ms": 2000}}`, `{"breaker": {"min_open_ms": 900}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			msg := err.Error()
			i := strings.Index(msg, ": ")
			if i <= 0 || !strings.HasPrefix(msg, "configuration") && !strings.ContainsAny(msg[:1], "abcdefghijklmnopqrstuvwxyz") {
				t.Fatalf("error %q does not start with the field", msg)
			}
			return
		}
		if c.TimeoutMs < 1 || c.TimeoutMs > MaxTimeoutMs || !isVisible(c.SidecarCluster) || c.SidecarCluster == "" ||
			!isAuthority(c.SidecarAuthority) || !isHeaderName(c.APIKeyHeader) || c.Mode > ModeOff ||
			!region.Valid(c.Region) || len(c.Costs) > MaxCostRules ||
			c.Breaker.Failures > MaxBreakerFailures || c.Breaker.MinOpenMs < 1 ||
			c.Breaker.MaxOpenMs < c.Breaker.MinOpenMs || c.Breaker.MaxOpenMs > MaxBreakerOpenMs {
			t.Fatalf("accepted out-of-range config %+v", c)
		}
		for k := range c.CanaryClients {
			if !ValidKey(k) {
				t.Fatalf("accepted canary key %q", k)
			}
		}
		for i, r := range c.Costs {
			if r.Cost < 1 || r.Cost > MaxCost || (r.Method == "" && r.PathPrefix == "") {
				t.Fatalf("accepted rule %+v", r)
			}
			for _, e := range c.Costs[:i] {
				if (e.Method == "" || e.Method == r.Method) && strings.HasPrefix(r.PathPrefix, e.PathPrefix) {
					t.Fatalf("accepted rule %+v, which %+v before it always wins over", r, e)
				}
			}
		}
	})
}
