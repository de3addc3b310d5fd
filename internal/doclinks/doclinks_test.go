// Package doclinks checks that every relative link of README.md and
// docs/**/*.md names a file that exists and, with a #fragment into a
// Markdown file, a heading of that file as GitHub renders its anchor; and
// that every package comment fits a screen of `go doc`.
package doclinks

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

// root is the module root, two levels above this package.
const root = "../.."

// link is an inline Markdown link or image: [text](target) or
// [text](target "title"). Reference-style links are not used in the docs.
var link = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// codeSpan is inline code, whose brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

func TestDocLinksResolve(t *testing.T) {
	files := markdownFiles(t)
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		anchors[f] = headingAnchors(readLines(t, f))
	}
	checked := 0
	for _, f := range files {
		for i, line := range prose(readLines(t, f)) {
			for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				if err := resolve(f, target, anchors); err != "" {
					t.Errorf("%s:%d: link %q: %s", rel(f), i+1, target, err)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d relative links found in %d files: the scan is broken", checked, len(files))
	}
}

// resolve reports what is wrong with target, a link found in file, or "".
func resolve(file, target string, anchors map[string]map[string]bool) string {
	path, frag, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), path)
		if strings.HasPrefix(path, "/") {
			return "absolute path: GitHub resolves it from the repository root, a reader's checkout does not"
		}
		if _, err := os.Stat(dest); err != nil {
			return "no such file " + rel(dest)
		}
	}
	if frag == "" {
		return ""
	}
	a, ok := anchors[dest]
	if !ok {
		if strings.HasSuffix(dest, ".md") {
			return "anchor into a Markdown file outside README.md and docs/"
		}
		return "" // a #L12 line anchor into source: not checked
	}
	if !a[frag] {
		return "no heading of " + rel(dest) + " has the anchor #" + frag
	}
	return ""
}

func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing docs: %v", err)
	}
	return files
}

func readLines(t *testing.T, f string) []string {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatalf("reading %s: %v", f, err)
	}
	return strings.Split(string(b), "\n")
}

// prose returns lines with fenced code blocks blanked, keeping line numbers.
func prose(lines []string) []string {
	out := make([]string, len(lines))
	fence := ""
	for i, l := range lines {
		s := strings.TrimSpace(l)
		switch {
		case fence == "" && (strings.HasPrefix(s, "```") || strings.HasPrefix(s, "~~~")):
			fence = s[:3]
		case fence != "" && strings.HasPrefix(s, fence):
			fence = ""
		case fence == "":
			out[i] = l
		}
	}
	return out
}

var atxHeading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// headingAnchors returns the anchors GitHub gives the file's headings:
// the rendered text lowercased, every character but letters, marks,
// numbers, connector punctuation ('_'), spaces and '-' dropped, spaces
// turned into '-'; a repeated anchor gets -1, -2, ….
func headingAnchors(lines []string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range prose(lines) {
		m := atxHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := slug(m[1])
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

var mdLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

func slug(heading string) string {
	text := mdLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsMark(r), unicode.IsNumber(r), unicode.Is(unicode.Pc, r), r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func rel(p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Envoy's ratelimit filter: a drop-in for envoyproxy/ratelimit": "envoys-ratelimit-filter-a-drop-in-for-envoyproxyratelimit",
		"Client → Envoy: headers, paths, bodies, addresses":            "client--envoy-headers-paths-bodies-addresses",
		"`serve` flags":                              "serve-flags",
		"The [lean](x.md) listener":                  "the-lean-listener",
		"Files upstream loads that are refused here": "files-upstream-loads-that-are-refused-here",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestContentsLists: every document under docs/ opens, before its first
// section, with a list linking each of its sections ("## " headings).
func TestContentsLists(t *testing.T) {
	for _, f := range markdownFiles(t)[1:] {
		lines := prose(readLines(t, f))
		var top strings.Builder
		var sections []string
		for _, l := range lines {
			if m := atxHeading.FindStringSubmatch(l); m != nil && strings.HasPrefix(l, "## ") {
				sections = append(sections, slug(m[1]))
			} else if len(sections) == 0 {
				top.WriteString(l + "\n")
			}
		}
		for _, a := range sections {
			if !strings.Contains(top.String(), "](#"+a+")") {
				t.Errorf("%s: the contents before the first section do not link #%s", rel(f), a)
			}
		}
	}
}
