package harness

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestMarkdownLinks: every relative link of the repository's markdown
// files leads to a file or folder that exists, and every #anchor to a
// heading of the file it names, by GitHub's rule for heading ids
// (lower case, punctuation dropped, spaces as hyphens, "-1", "-2" for
// repeats). Code blocks are left out: they show commands, not links.
func TestMarkdownLinks(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "build" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d markdown files under %s", len(files), root)
	}
	fence := regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	heading := regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*$`)
	mdLink := regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	text := map[string]string{}
	anchors := func(path string) map[string]bool {
		seen := map[string]int{}
		ids := map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(text[path], -1) {
			id := headingID(m[1])
			if n, ok := seen[id]; ok {
				seen[id] = n + 1
				id += "-" + strconv.Itoa(n+1)
			} else {
				seen[id] = 0
			}
			ids[id] = true
		}
		return ids
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text[f] = fence.ReplaceAllString(string(b), "")
	}
	links := 0
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		for _, m := range mdLink.FindAllStringSubmatch(text[f], -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			links++
			path, anchor, _ := strings.Cut(link, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
			}
			st, err := os.Stat(target)
			if err != nil {
				t.Errorf("%s: link %s: no such file or folder", rel, link)
				continue
			}
			if anchor == "" {
				continue
			}
			if st.IsDir() || !strings.HasSuffix(target, ".md") {
				t.Errorf("%s: link %s: an anchor into what is not a markdown file", rel, link)
				continue
			}
			if !anchors(target)[anchor] {
				t.Errorf("%s: link %s: %s has no heading #%s", rel, link, filepath.Base(target), anchor)
			}
		}
	}
	if links < 50 {
		t.Fatalf("checked %d links; the pattern no longer finds them", links)
	}
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// headingID is the id GitHub gives a heading: its text without inline
// markup, lower case, with every character but letters, digits, spaces,
// hyphens and underscores dropped and each space a hyphen.
func headingID(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
