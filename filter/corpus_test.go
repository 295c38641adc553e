//go:build !wasip1

package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var fuzzTarget = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(f \*testing\.F\)`)

// TestEveryFuzzTargetHasACorpus: each fuzz target of the filter has seed
// inputs under testdata/fuzz/<target>/ next to it, so that a plain
// `go test` runs them and `go test -fuzz` starts from them.
func TestEveryFuzzTargetHasACorpus(t *testing.T) {
	targets := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range fuzzTarget.FindAllStringSubmatch(string(src), -1) {
			targets++
			dir := filepath.Join(filepath.Dir(path), "testdata", "fuzz", m[1])
			entries, err := os.ReadDir(dir)
			if err != nil || len(entries) == 0 {
				t.Errorf("%s in %s: no seed corpus in %s", m[1], path, dir)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if targets < 9 {
		t.Errorf("found %d fuzz targets, want at least the 9 the filter has", targets)
	}
}
