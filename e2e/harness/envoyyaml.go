package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// WithFilterConfig writes a copy of the Envoy bootstrap at src into dir with
// the fields of overrides (a JSON object) set in the wasm filter's plugin
// configuration, and returns its path. Every field overrides does not name
// keeps the value src gives it, so a test runs the deployed envoy.yaml with
// only the fields it is about changed. A value of JSON null removes the
// field, leaving it to the filter's default.
func WithFilterConfig(src, dir, overrides string) (string, error) {
	var doc map[string]any
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	var patch map[string]json.RawMessage
	if err := json.Unmarshal([]byte(overrides), &patch); err != nil {
		return "", fmt.Errorf("filter configuration overrides %q: want a JSON object: %w", overrides, err)
	}
	if err := onlyPluginConfig(doc, src, func(m map[string]any) error {
		// With nothing to change the text stays as written, even one
		// that is not JSON: the plugin itself is what rejects it.
		if len(patch) == 0 {
			return nil
		}
		text, _ := m["value"].(string)
		cfg := map[string]json.RawMessage{}
		if err := json.Unmarshal([]byte(text), &cfg); err != nil {
			return fmt.Errorf("%s: the plugin configuration is not a JSON object: %w", src, err)
		}
		for k, v := range patch {
			if string(v) == "null" {
				delete(cfg, k)
				continue
			}
			cfg[k] = v
		}
		merged, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		m["value"] = string(merged)
		return nil
	}); err != nil {
		return "", err
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "envoy.yaml")
	return dst, os.WriteFile(dst, out, 0o644)
}

// onlyPluginConfig calls edit on the one StringValue (the plugin
// configuration) of doc, and fails unless there is exactly one.
func onlyPluginConfig(doc map[string]any, src string, edit func(map[string]any) error) error {
	var found []map[string]any
	walk(doc, func(m map[string]any) {
		if m["@type"] == "type.googleapis.com/google.protobuf.StringValue" {
			found = append(found, m)
		}
	})
	if len(found) != 1 {
		return fmt.Errorf("%s: want exactly one StringValue plugin configuration, found %d", src, len(found))
	}
	return edit(found[0])
}

func walk(v any, visit func(map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		visit(v)
		for _, c := range v {
			walk(c, visit)
		}
	case []any:
		for _, c := range v {
			walk(c, visit)
		}
	}
}
