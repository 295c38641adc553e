package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/edgelimit/edgelimit/envoy/wasmhost"
)

// A generation built from a module file with the bytes a running
// generation was built from gets that generation's compiled module; a file
// with other bytes is compiled anew; a module is closed when the last
// generation using it lets go of it, and not before.
func TestModuleSharedWhileTheFileIsUnchanged(t *testing.T) {
	_, probe := modules(t)
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "module.wasm")
	write := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	g := &gateway{}
	load := func() (*wasmhost.Module, func()) {
		t.Helper()
		m, drop, err := g.module(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		return m, drop
	}
	usable := func(m *wasmhost.Module) bool {
		vm, err := m.NewVM(ctx, wasmhost.Options{Log: func(wasmhost.LogLevel, string) {}})
		if err != nil {
			return false
		}
		vm.Close()
		return true
	}

	write(b)
	first, dropFirst := load()
	second, dropSecond := load()
	if second != first {
		t.Error("the same file compiled again for the second generation")
	}
	// The same module with a custom section appended (id 0, its size, the
	// name's size, the name and one byte): other bytes, still valid.
	name := "edgelimit-test"
	write(append(append(append(b, 0, byte(1+len(name)+1), byte(len(name))), name...), 1))
	changed, dropChanged := load()
	if changed == first {
		t.Error("a changed file was given the module of its old bytes")
	}

	dropFirst()
	dropFirst() // a generation lets go once, however often it is closed
	if !usable(first) {
		t.Fatal("the module was closed while a generation still used it")
	}
	dropSecond()
	if usable(first) {
		t.Error("the module is still open after the last generation using it let go")
	}
	if !usable(changed) {
		t.Error("letting go of one module closed another")
	}
	dropChanged()
	if len(g.modules) != 0 {
		t.Errorf("%d modules kept after every generation let go", len(g.modules))
	}
}
