package harness

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// WithFilterConfig writes a copy of the Envoy bootstrap at src into dir with
// the wasm filter's plugin configuration replaced by config (JSON), and
// returns its path. Tests use it to run the deployed envoy.yaml with
// another mode, timeout or canary list without keeping a second file.
func WithFilterConfig(src, dir, config string) (string, error) {
	raw, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", src, err)
	}
	replaced := 0
	walk(doc, func(m map[string]any) {
		if m["@type"] == "type.googleapis.com/google.protobuf.StringValue" {
			m["value"] = config
			replaced++
		}
	})
	if replaced != 1 {
		return "", fmt.Errorf("%s: want exactly one StringValue plugin configuration, found %d", src, replaced)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "envoy.yaml")
	return dst, os.WriteFile(dst, out, 0o644)
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
