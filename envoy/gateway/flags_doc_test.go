package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEListsEveryFlag holds envoy/README.md's table of build/gateway's
// flags to what -h prints: one row per flag, with the flag's default where
// it has one, and no row for a flag the gateway does not have.
func TestREADMEListsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	// "  -name [type]" then "    \tusage [(default x)]".
	help := map[string]string{}
	flagLine := regexp.MustCompile(`^  -([a-z-]+)`)
	defaultOf := regexp.MustCompile(`\(default "?([^")]*)"?\)$`)
	name := ""
	for _, line := range strings.Split(out.String(), "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			name = m[1]
			help[name] = ""
			continue
		}
		if m := defaultOf.FindStringSubmatch(line); m != nil && name != "" && !strings.Contains(m[1], "the file's") {
			help[name] = m[1]
		}
	}
	if len(help) < 10 {
		t.Fatalf("read %d flags from -h, want every one:\n%s", len(help), out.String())
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `-([a-z-]+)[^`]*` \\| ([^|]+) \\|")
	documented := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		name, def := m[1], strings.TrimSpace(m[2])
		documented[name] = true
		h, ok := help[name]
		if !ok {
			t.Errorf("envoy/README.md documents -%s, which -h does not list", name)
			continue
		}
		if h != "" && def != "`"+h+"`" {
			t.Errorf("envoy/README.md: -%s's default is %s, -h says %q", name, def, h)
		}
		if h == "" && strings.HasPrefix(def, "`") {
			t.Errorf("envoy/README.md: -%s's default is %s, -h shows none", name, def)
		}
	}
	for name := range help {
		if !documented[name] {
			t.Errorf("-h lists -%s, which envoy/README.md's table of the gateway's flags does not", name)
		}
	}
}
