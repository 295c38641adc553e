package envoyconfig

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"
)

// knownTypes are the typed configs a bootstrap for the gateway may use. Any
// other @type is an error: the gateway could not honour it, and a typo in a
// type URL is caught here rather than by Envoy at start-up.
var knownTypes = func() *protoregistry.Types {
	var types protoregistry.Types
	for _, m := range []proto.Message{
		&hcmv3.HttpConnectionManager{},
		&wasmfilterv3.Wasm{},
		&routerv3.Router{},
		&corsv3.Cors{},
		&corsv3.CorsPolicy{},
		&streamv3.StdoutAccessLog{},
		&streamv3.StderrAccessLog{},
		&wrapperspb.StringValue{},
	} {
		if err := types.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			panic(err) // a duplicate in the list above: a programming error
		}
	}
	return &types
}()

// knownTypeNames lists knownTypes for error messages.
func knownTypeNames() string {
	var names []string
	knownTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		names = append(names, string(mt.Descriptor().FullName()))
		return true
	})
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// Load reads the Envoy bootstrap at path (YAML or JSON), checks it the way
// Envoy would (see the package comment) and extracts the Config. Errors
// start with the path and name the offending field.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parse is Load without the file.
func parse(data []byte) (*Config, error) {
	b, err := decode(data)
	if err != nil {
		return nil, err
	}
	if err := validate(b); err != nil {
		return nil, err
	}
	return extract(b)
}

// decode turns YAML into a Bootstrap. Envoy reads YAML by converting it to
// JSON and parsing that with the protobuf JSON mapping; so does this. The
// shape check first walks the JSON against the message descriptors, because
// protojson's own errors give a byte offset into the converted JSON instead
// of the field's path.
func decode(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	var tree any
	if err := json.Unmarshal(js, &tree); err != nil {
		return nil, fmt.Errorf("YAML: %w", err)
	}
	if tree == nil {
		return nil, errors.New("empty: want an Envoy bootstrap (admin, static_resources, …)")
	}
	b := &bootstrapv3.Bootstrap{}
	if err := checkShape(tree, b.ProtoReflect().Descriptor(), ""); err != nil {
		return nil, err
	}
	opts := protojson.UnmarshalOptions{Resolver: knownTypes}
	if err := opts.Unmarshal(js, b); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	return b, nil
}

// checkShape reports, with its path, the first JSON key that is not a field
// of md (or of the message an Any's @type names), an @type outside
// knownTypes, a list or object where the other belongs, and a leaf value
// (scalar, enum, Duration, wrapper, …) that does not parse.
func checkShape(v any, md protoreflect.MessageDescriptor, path string) error {
	if v == nil {
		return nil // JSON null: the field is unset
	}
	obj, ok := v.(map[string]any)
	if md.FullName() == "google.protobuf.Any" {
		if !ok {
			return fmt.Errorf("%s: want an object with an \"@type\", got %s", orRoot(path), jsonKind(v))
		}
		return checkAny(obj, path)
	}
	if md.ParentFile().Package() == "google.protobuf" {
		return nil
	}
	if !ok {
		return fmt.Errorf("%s: want an object (%s), got %s", orRoot(path), md.FullName(), jsonKind(v))
	}
	return checkFields(obj, md, path, "")
}

// checkFields checks every key of obj except skip against md's fields.
func checkFields(obj map[string]any, md protoreflect.MessageDescriptor, path, skip string) error {
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic first error
	for _, k := range keys {
		if k == skip {
			continue
		}
		fd := md.Fields().ByJSONName(k)
		if fd == nil {
			fd = md.Fields().ByTextName(k)
		}
		if fd == nil {
			return fmt.Errorf("%s: unknown field %q in %s", join(path, k), k, md.FullName())
		}
		if err := checkField(obj[k], fd, join(path, k)); err != nil {
			return err
		}
	}
	return nil
}

func checkField(v any, fd protoreflect.FieldDescriptor, path string) error {
	if v == nil {
		return nil
	}
	if !isStructured(fd) {
		return checkLeaf(v, fd, path)
	}
	switch {
	case fd.IsList():
		list, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want a list, got %s", path, jsonKind(v))
		}
		for i, e := range list {
			if err := checkShape(e, fd.Message(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		return nil
	case fd.IsMap():
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object (a map), got %s", path, jsonKind(v))
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if err := checkShape(m[k], fd.MapValue().Message(), path+"["+strconv.Quote(k)+"]"); err != nil {
				return err
			}
		}
		return nil
	default:
		return checkShape(v, fd.Message(), path)
	}
}

// isStructured says whether checkShape descends into the field's values:
// messages with an object JSON form (and Any). Scalars, enums and well-known
// types with their own JSON form (Duration "1.5s", wrappers, Struct, …) are
// leaves.
func isStructured(fd protoreflect.FieldDescriptor) bool {
	if fd.IsMap() {
		fd = fd.MapValue()
	}
	if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
		return false
	}
	md := fd.Message()
	return md.FullName() == "google.protobuf.Any" || md.ParentFile().Package() != "google.protobuf"
}

// checkLeaf parses one leaf field on its own, so that a bad value ("250ms"
// for a Duration, -1 for a uint32) is reported with its path rather than
// with protojson's offset into the whole document.
func checkLeaf(v any, fd protoreflect.FieldDescriptor, path string) error {
	if _, ok := v.([]any); fd.IsList() && !ok {
		return fmt.Errorf("%s: want a list, got %s", path, jsonKind(v))
	}
	if _, ok := v.(map[string]any); fd.IsMap() && !ok {
		return fmt.Errorf("%s: want an object (a map), got %s", path, jsonKind(v))
	}
	if fd.Kind() == protoreflect.EnumKind && !fd.IsMap() && !fd.IsList() {
		if err := checkEnumName(v, fd, path); err != nil {
			return err
		}
	}
	js, err := json.Marshal(map[string]any{fd.JSONName(): v})
	if err != nil {
		return fmt.Errorf("%s: %v", path, err)
	}
	if err := protojson.Unmarshal(js, dynamicpb.NewMessage(fd.ContainingMessage())); err != nil {
		return fmt.Errorf("%s: %s", path, protojsonReason(err))
	}
	return nil
}

// checkEnumName names the allowed values when an enum name is unknown.
func checkEnumName(v any, fd protoreflect.FieldDescriptor, path string) error {
	name, ok := v.(string)
	if !ok {
		return nil // a number: protojson checks it
	}
	vals := fd.Enum().Values()
	if vals.ByName(protoreflect.Name(name)) != nil {
		return nil
	}
	names := make([]string, 0, vals.Len())
	for i := range vals.Len() {
		names = append(names, string(vals.Get(i).Name()))
	}
	return fmt.Errorf("%s: unknown value %q of %s (one of %s)", path, name, fd.Enum().FullName(), strings.Join(names, ", "))
}

// protojsonReason strips protojson's "proto: (line 1:7): " prefix, which
// points into a one-field document and would only mislead.
func protojsonReason(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "proto:")
	msg = strings.TrimLeft(msg, " \u00a0")
	if strings.HasPrefix(msg, "(line ") {
		if _, rest, ok := strings.Cut(msg, "):"); ok {
			msg = strings.TrimSpace(rest)
		}
	}
	return msg
}

// checkAny resolves an Any's @type and checks its other keys against the
// resolved message.
func checkAny(obj map[string]any, path string) error {
	t, ok := obj["@type"].(string)
	if !ok {
		return fmt.Errorf("%s: missing \"@type\"", join(path, "@type"))
	}
	mt, err := knownTypes.FindMessageByURL(t)
	if err != nil {
		return fmt.Errorf("%s: unknown type %q (known: %s)", join(path, "@type"), t, knownTypeNames())
	}
	md := mt.Descriptor()
	if md.ParentFile().Package() == "google.protobuf" {
		// A well-known type inside an Any is {"@type": …, "value": <its JSON>}.
		for k := range obj {
			if k != "@type" && k != "value" {
				return fmt.Errorf("%s: unknown field %q in %s (want only \"value\")", join(path, k), k, md.FullName())
			}
		}
		return nil
	}
	return checkFields(obj, md, path, "@type")
}

// validate runs the protoc-gen-validate rules Envoy enforces on load:
// ValidateAll on the bootstrap, then on every message packed in an Any
// (ValidateAll does not look inside Any), depth first.
func validate(b *bootstrapv3.Bootstrap) error {
	if err := b.ValidateAll(); err != nil {
		return ruleErrors(err, "")
	}
	return walkAnys(b.ProtoReflect(), "", func(path string, m proto.Message) error {
		v, ok := m.(interface{ ValidateAll() error })
		if !ok {
			return nil // wrapperspb types carry no rules
		}
		if err := v.ValidateAll(); err != nil {
			return ruleErrors(err, path)
		}
		return nil
	})
}

// pgvError is the shape of every protoc-gen-validate error type.
type pgvError interface {
	Field() string
	Reason() string
	Cause() error
}

// ruleErrors turns protoc-gen-validate's nested "embedded message failed
// validation | caused by: …" chains into one line per broken rule, each with
// the path of its field in the file's own snake_case names.
func ruleErrors(err error, path string) error {
	var lines []string
	var collect func(err error, path string)
	collect = func(err error, path string) {
		if multi, ok := err.(interface{ AllErrors() []error }); ok {
			for _, e := range multi.AllErrors() {
				collect(e, path)
			}
			return
		}
		ve, ok := err.(pgvError)
		if !ok {
			lines = append(lines, orRoot(path)+": "+err.Error())
			return
		}
		p := join(path, snakeCase(ve.Field()))
		if cause := ve.Cause(); cause != nil {
			if _, nested := cause.(pgvError); nested {
				collect(cause, p)
				return
			}
			if _, nested := cause.(interface{ AllErrors() []error }); nested {
				collect(cause, p)
				return
			}
			lines = append(lines, p+": "+ve.Reason()+": "+cause.Error())
			return
		}
		lines = append(lines, p+": "+ve.Reason())
	}
	collect(err, path)
	return errors.New(strings.Join(lines, "; "))
}

// snakeCase maps a generated Go field name back to its proto name
// ("StaticResources" → "static_resources", "Clusters[0]" → "clusters[0]").
// Envoy's proto field names are snake_case, so the mapping is exact for them.
func snakeCase(goName string) string {
	name, index, _ := strings.Cut(goName, "[")
	var b strings.Builder
	for i, r := range name {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				prev := name[i-1]
				if prev >= 'a' && prev <= 'z' || prev >= '0' && prev <= '9' {
					b.WriteByte('_')
				}
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	if index != "" {
		b.WriteString("[" + index)
	}
	return b.String()
}

// walkAnys unpacks every Any under m and calls fn with its path and content,
// then descends into the content.
func walkAnys(m protoreflect.Message, path string, fn func(string, proto.Message) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		p := join(path, fd.TextName())
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				if err = walkMessage(l.Get(i).Message(), p+"["+strconv.Itoa(i)+"]", fn); err != nil {
					return false
				}
			}
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = walkMessage(mv.Message(), p+"["+strconv.Quote(k.String())+"]", fn)
				return err == nil
			})
			if err != nil {
				return false
			}
		default:
			err = walkMessage(v.Message(), p, fn)
		}
		return err == nil
	})
	return err
}

func walkMessage(m protoreflect.Message, path string, fn func(string, proto.Message) error) error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		return walkAnys(m, path, fn)
	}
	inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: knownTypes})
	if err != nil {
		return fmt.Errorf("%s: %q: %w", path, a.GetTypeUrl(), err)
	}
	if err := fn(path, inner); err != nil {
		return err
	}
	return walkAnys(inner.ProtoReflect(), path, fn)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "top level"
	}
	return path
}

func jsonKind(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}
