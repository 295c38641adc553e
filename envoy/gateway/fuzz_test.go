package main

import (
	"strings"
	"testing"
)

// FuzzNormalizePath: the request target is the client's; whatever it is,
// normalizePath does not panic, accepts exactly the targets that start
// with "/", and returns a path that starts with "/", has no empty, "." or
// ".." segment (so no prefix route can be escaped), keeps the query as
// sent, and normalizes to itself again. Seeds are in
// testdata/fuzz/FuzzNormalizePath.
func FuzzNormalizePath(f *testing.F) {
	f.Add("/orders/1")
	f.Add("/a/../../b/./c//d/")
	f.Add("/x?y=/../z")
	f.Fuzz(func(t *testing.T, target string) {
		got, ok := normalizePath(target)
		path, _, _ := strings.Cut(target, "?")
		if ok != strings.HasPrefix(path, "/") {
			t.Fatalf("normalizePath(%q) ok = %t", target, ok)
		}
		if !ok {
			return
		}
		p, query, hasQuery := strings.Cut(got, "?")
		if !strings.HasPrefix(p, "/") {
			t.Fatalf("normalizePath(%q) = %q: no leading /", target, got)
		}
		segs := strings.Split(strings.TrimSuffix(p[1:], "/"), "/")
		for _, seg := range segs {
			if (seg == "" && p != "/") || seg == "." || seg == ".." {
				t.Fatalf("normalizePath(%q) = %q: segment %q left", target, got, seg)
			}
		}
		if _, q, hq := strings.Cut(target, "?"); hq != hasQuery || q != query {
			t.Fatalf("normalizePath(%q) = %q: query changed", target, got)
		}
		if again, ok := normalizePath(got); !ok || again != got {
			t.Fatalf("normalizePath(%q) = %q, but that normalizes to %q", target, got, again)
		}
	})
}
