package match

import (
	"strings"
	"testing"
)

func TestRoutePath(t *testing.T) {
	tests := []struct {
		raw, want string
		ok        bool
	}{
		{"/", "/", true},
		{"/a/b", "/a/b", true},
		{"/a/b/", "/a/b/", true},
		{"/a/b?x=/../y", "/a/b", true},
		{"/a/b#/../y", "/a/b", true},
		{"/a?b#c", "/a", true},
		{"?x", "", false},
		{"", "", false},
		{"*", "", false},
		{"a/b", "", false},
		{"http://h/a", "", false},

		// merge_slashes
		{"//", "/", true},
		{"//a///b//", "/a/b/", true},
		// dot segments, never above the root
		{"/.", "/", true},
		{"/..", "/", true},
		{"/./", "/", true},
		{"/../", "/", true},
		{"/../../a", "/a", true},
		{"/a/.", "/a/", true},
		{"/a/..", "/", true},
		{"/a/b/..", "/a/", true},
		{"/a/b/../", "/a/", true},
		{"/a/./b/./c", "/a/b/c", true},
		{"/a/b/../../c", "/c", true},
		{"/a/b/../../../../c", "/c", true},
		{"/a/.b/..c/.../c.", "/a/.b/..c/.../c.", true},
		// dots resolve before slashes merge, as in Envoy: the empty segment
		// is the one ".." removes.
		{"/a//../b", "/a/b", true},
		{"/a/b//..", "/a/b/", true},
		// normalize_path decodes escaped unreserved characters, keeps the rest
		{"/%61%62%63", "/abc", true},
		{"/a/%2e%2E/b", "/b", true},
		{"/a/%2E/b", "/a/b", true},
		{"/a%2Eb", "/a.b", true},
		{"/%7e%5F-%2d", "/~_--", true},
		{"/a%2fb%2F%20%3f%25", "/a%2fb%2F%20%3f%25", true},
		{"/a%2", "/a%2", true},
		{"/a%zz%", "/a%zz%", true},
		{"/%2561", "/%2561", true}, // no double decoding
		{"/%%341", "/%2541", true}, // nor a decoded escape
		{"/%%34%31/x", "/%2541/x", true},
		{"/%4%31", "/%2541", true},
		{"/%%2e", "/%.", true}, // "%." is no escape
		// backslash is a slash
		{`/a\b`, "/a/b", true},
		{`\a`, "", false},
		{`/a\..\b`, "/b", true},
	}
	for _, tt := range tests {
		got, tooLong, ok := routePath(tt.raw)
		if got != tt.want || ok != tt.ok || tooLong {
			t.Errorf("routePath(%q) = %q, %v, %v, want %q, false, %v", tt.raw, got, tooLong, ok, tt.want, tt.ok)
		}
	}
}

func TestRoutePathNoCopyWhenNormal(t *testing.T) {
	for _, p := range []string{"/api/activities", "/api/inbound/abc123/status", "/a.b/c..d/.e/", "/a%20b%2F", "/"} {
		got, _, ok := routePath(p + "?q=1")
		if !ok || got != p || needsNormalize(p) {
			t.Errorf("routePath(%q) = %q, %v; needsNormalize = %v", p, got, ok, needsNormalize(p))
		}
		raw := p + "?q=1"
		if n := testing.AllocsPerRun(100, func() { routePath(raw) }); n != 0 {
			t.Errorf("routePath(%q) allocates %v times", raw, n)
		}
	}
}

func TestRoutePathTooLong(t *testing.T) {
	p := "/" + strings.Repeat("a", maxPathBytes)
	if _, tooLong, ok := routePath(p); !tooLong || ok {
		t.Errorf("routePath(%d bytes) = tooLong %v, ok %v", len(p), tooLong, ok)
	}
	if _, tooLong, ok := routePath(p[:maxPathBytes] + "?" + p); tooLong || !ok {
		t.Errorf("routePath(8 KiB + query) = tooLong %v, ok %v", tooLong, ok)
	}
}

// FuzzNormalizePath checks that normalisation is idempotent, leaves nothing
// for needsNormalize to find, and agrees with needsNormalize about
// untouched paths.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "//a//b", "/a/../b", "/./", "/%2e%2E/", `/a\..\b`, "/a/b/..", "/%%341", "/a%2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if p == "" || p[0] != '/' || len(p) > maxPathBytes {
			return
		}
		n := normalizePath(p)
		if needsNormalize(p) != (n != p) {
			t.Errorf("needsNormalize(%q) = %v but normalizePath = %q", p, needsNormalize(p), n)
		}
		if n == "" || n[0] != '/' {
			t.Fatalf("normalizePath(%q) = %q, not absolute", p, n)
		}
		if len(n) > len(p) {
			t.Errorf("normalizePath(%q) = %q grew", p, n)
		}
		if needsNormalize(n) {
			t.Errorf("normalizePath(%q) = %q still needs normalising (%q)", p, n, normalizePath(n))
		}
	})
}
