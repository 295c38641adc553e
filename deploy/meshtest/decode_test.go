// Package meshtest decodes the examples in ../mesh with the projects' own Go
// API types (Istio's client-go and api, Envoy Gateway's api/v1alpha1, the
// Gateway API, Kubernetes, Envoy's go-control-plane), strictly, and checks
// that their pieces fit: the filter configuration, the callout's cluster,
// the image, the sidecar's plans and secrets. It is a module of its own so
// that the main module does not depend on those APIs.
package meshtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// doc is one YAML document of an example file.
type doc struct {
	file       string
	apiVersion string
	kind       string
	name       string
	body       []byte
}

func (d doc) String() string {
	return fmt.Sprintf("%s: %s %s/%s", d.file, d.apiVersion, d.kind, d.name)
}

// readDocs splits every .yaml file of dir into its documents.
func readDocs(t *testing.T, dir string) []doc {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML in %s: %v", dir, err)
	}
	var docs []doc
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := yaml.Unmarshal([]byte(part), &head); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if head.Kind == "" && head.APIVersion == "" {
				// Comments only, or a file that is not a Kubernetes object
				// (Helm values): the caller reads those itself.
				if strings.TrimSpace(stripComments(part)) != "" && !strings.HasSuffix(f, "-values.yaml") {
					t.Fatalf("%s: a document without apiVersion and kind:\n%s", f, part)
				}
				continue
			}
			docs = append(docs, doc{filepath.Base(f), head.APIVersion, head.Kind, head.Metadata.Name, []byte(part)})
		}
	}
	return docs
}

func stripComments(s string) string {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(s, "")
}

// toJSON converts YAML to JSON, refusing duplicate keys.
func toJSON(t *testing.T, what string, y []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return j
}

// decodeStrict decodes JSON into a Go API type the way the Kubernetes API
// server does with strict field validation: an unknown field, a field
// spelled in another case or a duplicate field is an error.
func decodeStrict(t *testing.T, what string, j []byte, obj any) {
	t.Helper()
	strict, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowUnknownFields, sigsjson.DisallowDuplicateFields)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(strict) > 0 {
		t.Fatalf("%s: strict decoding: %v", what, strict)
	}
}

// decode decodes a Kubernetes object (k8s.io/api, Gateway API, Envoy
// Gateway: plain Go structs) strictly.
func decode(t *testing.T, d doc, obj any) {
	t.Helper()
	decodeStrict(t, d.String(), toJSON(t, d.String(), d.body), obj)
}

// decodeIstio decodes an Istio object: metadata strictly into meta, spec
// with protojson into spec (the istio.io/api message inside the client-go
// type). Istio's generated UnmarshalJSON ignores unknown fields, so the
// spec is decoded here without it: an unknown field is an error, and so is
// a field given by its proto name instead of its JSON name (protojson takes
// both; the API server's schema only the JSON name).
func decodeIstio(t *testing.T, d doc, tm *metav1.TypeMeta, meta *metav1.ObjectMeta, spec proto.Message) {
	t.Helper()
	var obj struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              json.RawMessage `json:"spec"`
	}
	decodeStrict(t, d.String(), toJSON(t, d.String(), d.body), &obj)
	*tm, *meta = obj.TypeMeta, obj.ObjectMeta
	decodeProto(t, d.String(), "spec", obj.Spec, spec)
}

// decodeProto decodes JSON (the value of root in what) into an Istio API
// message with protojson: an unknown field is an error, and so is a field
// given by its proto name.
func decodeProto(t *testing.T, what, root string, j []byte, msg proto.Message) {
	t.Helper()
	if err := (protojson.UnmarshalOptions{}).Unmarshal(j, msg); err != nil {
		t.Fatalf("%s: %s: %v", what, root, err)
	}
	var generic any
	if err := json.Unmarshal(j, &generic); err != nil {
		t.Fatal(err)
	}
	if err := jsonNames(root, msg.ProtoReflect().Descriptor(), generic); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// jsonNames fails on a key that is not the JSON name of a field of md,
// walking nested messages; google.protobuf types (Struct, Duration,
// wrappers) have JSON forms of their own and are not walked.
func jsonNames(path string, md protoreflect.MessageDescriptor, v any) error {
	if strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	for k, val := range m {
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			return fmt.Errorf("%s.%s: not the JSON name of a field of %s", path, k, md.FullName())
		}
		p := path + "." + k
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				continue
			}
			vals, _ := val.(map[string]any)
			for mk, mv := range vals {
				if err := jsonNames(p+"."+mk, fd.MapValue().Message(), mv); err != nil {
					return err
				}
			}
		case fd.Kind() != protoreflect.MessageKind:
		case fd.IsList():
			items, _ := val.([]any)
			for i, item := range items {
				if err := jsonNames(fmt.Sprintf("%s[%d]", p, i), fd.Message(), item); err != nil {
					return err
				}
			}
		default:
			if err := jsonNames(p, fd.Message(), val); err != nil {
				return err
			}
		}
	}
	return nil
}

// compactJSON is j without insignificant white space, for messages.
func compactJSON(j []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, j) != nil {
		return string(j)
	}
	return b.String()
}
