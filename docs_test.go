package pgclaim_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A guide's Go code is an Example's or a test's: a fenced Go block after
// <!-- code: PATH --> must appear, line by line (indentation and blank
// lines aside), in that file of this repository, which the tests compile
// and run.
var codeRE = regexp.MustCompile("(?s)(<!-- code: (\\S+) -->\n)?```go\n(.*?)```\n")

// guides are the documents whose every Go block must name its source.
var guides = []string{
	"docs/getting-started.md", "docs/schedules.md", "docs/gates.md",
	"docs/production.md", "docs/troubleshooting.md",
}

func TestGuideCode(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range append(docs, "README.md") {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		strict := false
		for _, g := range guides {
			strict = strict || g == doc
		}
		for _, m := range codeRE.FindAllStringSubmatch(string(text), -1) {
			src, code := m[2], m[3]
			if src == "" {
				if strict {
					t.Errorf("%s: a Go block without <!-- code: PATH -->:\n%s", doc, code)
				}
				continue
			}
			file, err := os.ReadFile(src)
			if err != nil {
				t.Errorf("%s: %v", doc, err)
				continue
			}
			if !strings.Contains(squash(string(file)), squash(code)) {
				t.Errorf("%s: this block is not in %s:\n%s", doc, src, code)
			}
		}
	}
	for _, g := range guides {
		if _, err := os.Stat(g); err != nil {
			t.Error(err)
		}
	}
}

// squash trims every line and drops the blank ones.
func squash(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if line = strings.TrimSpace(line); line != "" {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
