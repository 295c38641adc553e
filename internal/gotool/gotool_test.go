package gotool

import (
	"context"
	"os/exec"
	"path/filepath"
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

// TestGoCommandWithoutGOROOT: a program built with -trimpath (GOFLAGS, say)
// knows no GOROOT, and runs the go on the PATH, which for a test is its own
// toolchain's: go test puts GOROOT/bin first on the PATH of what it runs.
func TestGoCommandWithoutGOROOT(t *testing.T) {
	if got, want := goCommand("/opt/go"), filepath.Join("/opt/go", "bin", "go"); got != want {
		t.Errorf("goCommand(/opt/go) = %q, want %q", got, want)
	}
	cmd := goCommand("")
	if cmd != "go" {
		t.Fatalf("goCommand(\"\") = %q, want the go on the PATH", cmd)
	}
	out, err := exec.Command(cmd, "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != runtime.Version() {
		t.Errorf("the go on the PATH is %s, want this test's toolchain, %s", got, runtime.Version())
	}
}
