package rlsconfig_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// Hostile files: each is refused with a clear problem, without a panic;
// BenchmarkParseHostile shows what each costs.
var hostile = []struct {
	name string
	data func() string
	want string
}{
	{"descriptors nested 10k levels", func() string {
		return "domain: d\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", 10_000) + "[]" + strings.Repeat("}]", 10_000) + "\n"
	}, "error loading config file: yaml: line 2: exceeded max depth of 10000"},
	{"descriptors nested 1k levels", func() string {
		return "domain: d\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", 1_000) + "[]" + strings.Repeat("}]", 1_000) + "\n"
	}, fmt.Sprintf("descriptors nest deeper than %d levels", rlsconfig.MaxDepth)},
	{"metadata nested 10k levels", func() string {
		return "domain: d\ndescriptors:\n  - key: k\n    metadata: " + strings.Repeat("{a: ", 10_000) + "1" + strings.Repeat("}", 10_000) + "\n"
	}, "error parsing metadata: nested deeper than"},
	{"100 MB file", func() string { return "domain: d\n#" + strings.Repeat("x", 100<<20) }, "error loading config file: 104857611 bytes is larger than"},
	{"billion laughs in metadata", func() string {
		var b strings.Builder
		b.WriteString("domain: d\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
		for i := 1; i < 10; i++ {
			fmt.Fprintf(&b, "l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
		}
		b.WriteString("descriptors:\n  - key: k\n    metadata: {x: *l9}\n")
		return b.String()
	}, "the YAML expands to more than"},
	{"billion laughs in descriptors", func() string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    descriptors: &l0 [{key: a}, {key: b}, {key: c}, {key: d}, {key: e}, {key: f}, {key: g}, {key: h}, {key: i}]\n")
		for i := 1; i < 10; i++ {
			fmt.Fprintf(&b, "  - key: k%d\n    descriptors: &l%d [", i, i)
			for j := range 9 {
				fmt.Fprintf(&b, "{key: x%d, descriptors: *l%d}, ", j, i-1)
			}
			b.WriteString("]\n")
		}
		return b.String()
	}, "more than"},
	{"billion laughs by merge keys in rate_limit", func() string {
		return mergeLaughs("domain: d\ndescriptors:\n  - key: k0\n    rate_limit: &l0 {unit: second, requests_per_unit: 1}\n",
			func(i int) string { return fmt.Sprintf("  - key: k%d\n    rate_limit: ", i) })
	}, "the YAML expands to more than"},
	{"billion laughs by merge keys in metadata", func() string {
		return mergeLaughs("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      l0: &l0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}\n",
			func(i int) string { return fmt.Sprintf("      l%d: ", i) })
	}, "the YAML expands to more than"},
	{"merges nested 100 deep", func() string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n  - key: k\n    metadata:\n      m0: &m0 {a: 1}\n")
		for i := 1; i < 100; i++ {
			fmt.Fprintf(&b, "      m%d: &m%d {<<: *m%d}\n", i, i, i-1)
		}
		return b.String()
	}, "merges (<<) nest deeper than"},
	{"self-referencing alias", func() string { return "domain: d\ndescriptors: &a [{key: k, descriptors: *a}]\n" }, "descriptors nest deeper than"},
	{"1M sibling descriptors", func() string {
		return "domain: d\ndescriptors:\n" + strings.Repeat("- {key: k}\n", 1_000_000)
	}, "bytes is larger than"},
	{"a problem in every one of 100k siblings", func() string {
		return "domain: d\ndescriptors: [" + strings.Repeat("{key: k},", 100_000) + "]\n"
	}, fmt.Sprintf("config error, more than %d problems: fix these first", rlsconfig.MaxProblems)},
	{"invalid UTF-8", func() string { return "domain: d\ndescriptors:\n  - key: \xff\xfe\n" }, "error loading config file: yaml: invalid leading UTF-8 octet"},
	{"raw NUL", func() string { return "domain: d\x00\n" }, "error loading config file: yaml: control characters are not allowed"},
}

// mergeLaughs is head (which anchors l0) and nine mappings l1…l9, each
// after its entry text, merging the one before nine times: expanded, 9⁹
// copies of l0's pairs.
func mergeLaughs(head string, entry func(i int) string) string {
	var b strings.Builder
	b.WriteString(head)
	for i := 1; i < 10; i++ {
		b.WriteString(entry(i))
		fmt.Fprintf(&b, "&l%d {<<: [%s]}\n", i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 9), ", "))
	}
	return b.String()
}

// MaxDescriptors bounds all files together, each file within its size.
func TestMaxDescriptorsOverFiles(t *testing.T) {
	var files []rlsconfig.File
	for f := range 2 {
		var b strings.Builder
		fmt.Fprintf(&b, "domain: d%d\ndescriptors: [", f)
		for i := range rlsconfig.MaxDescriptors/2 + 1 {
			fmt.Fprintf(&b, "{key: k%d},", i)
		}
		b.WriteString("]\n")
		files = append(files, file(fmt.Sprintf("f%d.yaml", f), b.String()))
	}
	got := problemsOf(t, files, rlsconfig.Options{})
	if want := fmt.Sprintf("config error, more than %d descriptors in all files", rlsconfig.MaxDescriptors); len(got) != 1 || !strings.HasPrefix(got[0], "f1.yaml:2:") || !strings.HasSuffix(got[0], want) {
		t.Errorf("problems %q, want f1.yaml: %s", got, want)
	}
}

func TestHostileFiles(t *testing.T) {
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, []rlsconfig.File{file("h.yaml", tc.data())}, rlsconfig.Options{})
			if len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), tc.want) {
				t.Errorf("problems %.500q, want one containing %q", got, tc.want)
			}
			if len(got) > rlsconfig.MaxProblems+1 {
				t.Errorf("%d problems: a hostile file must not flood the output", len(got))
			}
		})
	}
}

func BenchmarkParseHostile(b *testing.B) {
	for _, tc := range hostile {
		data := []byte(tc.data())
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rlsconfig.Parse([]rlsconfig.File{{Name: "h.yaml", Data: data}}, rlsconfig.Options{}); err == nil {
					b.Fatal("accepted")
				}
			}
		})
	}
}

// Escaped NUL and non-ASCII bytes are legal values: they match
// byte-exactly and are escaped in bucket names.
func TestNULAndNonASCIIValues(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, file("n.yaml", "domain: d\ndescriptors:\n  - key: \"k\\0\"\n    value: \"v\\u00e9\\0\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	i, key, _ := c.Match("d", entries("k\x00", "v\u00e9\x00"), nil)
	if i != 0 || string(key) != "v\u00e9\x00" {
		t.Fatalf("match %d %q", i, key)
	}
	if i, _, _ := c.Match("d", entries("k", "v\u00e9"), nil); i != -1 {
		t.Error("a value without its NUL matched")
	}
	if b := c.Rules()[0].Bucket; b != "rls/d/k%00_v%C3%A9%00" {
		t.Errorf("bucket %q", b)
	}
}
