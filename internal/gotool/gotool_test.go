package gotool

import (
	"context"
	"runtime"
	"strings"
	"testing"
)

// TestOutput: the go tool is this test's own toolchain, it runs in the
// directory asked for with the environment added, and a failure names the
// command and carries what it printed.
func TestOutput(t *testing.T) {
	ctx := context.Background()
	out, err := Output(ctx, t.TempDir(), []string{"GOOS=wasip1", "GOARCH=wasm"}, "env", "GOOS", "GOARCH", "GOVERSION")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(out)), []string{"wasip1", "wasm", runtime.Version()}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("go env printed %q, want %q", got, want)
	}
	// Outside any module, go build says so on its standard error.
	err = Run(ctx, t.TempDir(), nil, "build", "./nothing-here")
	if err == nil {
		t.Fatal("go build outside a module: no error")
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "go build ./nothing-here: ") || !strings.Contains(msg, "\ngo: go.mod file not found") {
		t.Errorf("error %q does not name the command and carry what it printed", msg)
	}
}
