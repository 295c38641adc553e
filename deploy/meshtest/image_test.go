package meshtest

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

const (
	dockerfile = "../Dockerfile"
	meshDir    = "../mesh"
	// The target building the Wasm OCI image.
	wasmTarget = "wasm-plugin"
)

// imageRepo is the Wasm image's repository; every mention of it must carry
// the same reference.
var imageRefRE = regexp.MustCompile(`ghcr\.io/edgelimit/filter-wasm[^\s"'` + "`" + `)\]]*`)

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// imageRef is the reference the Dockerfile's build command tags the image
// with; every example must pull that one.
func imageRef(t *testing.T) string {
	t.Helper()
	refs := imageRefRE.FindAllString(string(readFile(t, dockerfile)), -1)
	if len(refs) != 1 {
		t.Fatalf("%s: want one mention of the Wasm image in its build command, found %v", dockerfile, refs)
	}
	return refs[0]
}

func checkImageRef(t *testing.T, what, ref string) {
	t.Helper()
	if want := imageRef(t); ref != want {
		t.Errorf("%s %q, the Dockerfile builds %q", what, ref, want)
	}
}

// TestImageEverywhere: every file under deploy/mesh (examples and READMEs)
// names the image the Dockerfile builds, and no other tag of it.
func TestImageEverywhere(t *testing.T) {
	want := imageRef(t)
	seen := 0
	err := filepath.WalkDir(meshDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		for _, ref := range imageRefRE.FindAllString(string(readFile(t, path)), -1) {
			seen++
			if ref != want {
				t.Errorf("%s names %q, the Dockerfile builds %q", path, ref, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen < 2 {
		t.Errorf("the image %s is named %d times under %s, want at least the two examples", want, seen, meshDir)
	}
}

// TestWasmImageTarget parses the Dockerfile with BuildKit's own parser and
// checks the wasm-plugin stage against the layout Istio and Envoy Gateway
// read (the "compat" variant): FROM scratch and one COPY, so one layer,
// holding the module the build stage compiles, as plugin.wasm.
func TestWasmImageTarget(t *testing.T) {
	data := readFile(t, dockerfile)
	ast, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]instructions.Stage{}
	for _, s := range stages {
		byName[s.Name] = s
	}
	st, ok := byName[wasmTarget]
	if !ok {
		t.Fatalf("%s has no stage %s", dockerfile, wasmTarget)
	}
	if st.BaseName != "scratch" {
		t.Errorf("stage %s is FROM %s, want scratch: no layer but the module's", wasmTarget, st.BaseName)
	}
	if len(st.Commands) != 1 {
		t.Fatalf("stage %s has %d instructions, want exactly one COPY (one layer)", wasmTarget, len(st.Commands))
	}
	cp, ok := st.Commands[0].(*instructions.CopyCommand)
	if !ok {
		t.Fatalf("stage %s: %s, want a COPY", wasmTarget, st.Commands[0].Name())
	}
	if len(cp.SourcePaths) != 1 || cp.DestPath != "/plugin.wasm" {
		t.Errorf("stage %s copies %v to %s, want one file to /plugin.wasm", wasmTarget, cp.SourcePaths, cp.DestPath)
	}
	build, ok := byName[cp.From]
	if !ok {
		t.Fatalf("stage %s copies from %q, not a stage", wasmTarget, cp.From)
	}
	// The source is the module the build stage compiles, the one way the
	// project builds it (internal/gotool/wasmbuild: go build, wasm-opt).
	built := false
	for _, c := range build.Commands {
		run, ok := c.(*instructions.RunCommand)
		if !ok {
			continue
		}
		script := strings.Join(run.CmdLine, " ")
		built = built || strings.Contains(script, "go run ./internal/gotool/wasmbuild") &&
			strings.Contains(script, "-o "+cp.SourcePaths[0]+" ./filter")
	}
	if !built {
		t.Errorf("stage %s does not build %s from ./filter for wasip1", cp.From, cp.SourcePaths[0])
	}
	// Adding the stage kept the default target (the last stage).
	if last := stages[len(stages)-1].Name; last != "sidecar" {
		t.Errorf("the last stage (docker build's default target) is %s, want sidecar", last)
	}
	// The build command in the comment names this target.
	if !regexp.MustCompile(`(?m)^#.*--target ` + wasmTarget + `\b`).Match(data) {
		t.Errorf("%s: no build command for --target %s in its comments", dockerfile, wasmTarget)
	}
}
