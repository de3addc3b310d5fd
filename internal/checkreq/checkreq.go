// Package checkreq is the request a Check reads: the fields of Envoy's
// CheckRequest that the matcher uses. The wire decoder (package checkwire)
// fills it and the matcher (package match) reads it; neither imports the
// other. It holds no logic beyond name/value lookups.
package checkreq

import (
	"slices"
	"strings"
)

// Request is what a Check reads out of Envoy's CheckRequest. The matcher
// neither modifies nor retains it, but the keys it returns are substrings
// of its fields. Headers and ContextExtensions need hold only the names
// the matcher reads (its HeaderNames, ContextExtensionNames); others are
// ignored.
type Request struct {
	Method            string
	Path              string // raw :path as Envoy sends it: with the query string, not decoded
	Headers           Fields // lowercase names, as Envoy sends them (pseudo-headers included)
	PeerAddress       string // attributes.source socket address (the TCP peer)
	Body              string // with_request_body only; may be empty or partial; needed only when the matcher WantsBody
	ContextExtensions Fields // Envoy per-route check_settings.context_extensions
}

// Context extension keys Envoy may send (check_settings.context_extensions).
const (
	ExtBuckets = "ratelimit_buckets" // comma-separated bucket names, replacing the route's
	ExtRoute   = "ratelimit_route"   // a Route.Name, applied as if matched
)

// ContextExtensionNames returns the context extension keys the matcher reads.
func ContextExtensionNames() []string { return []string{ExtBuckets, ExtRoute} }

// Field is one name/value pair of a Request: a header (lowercase name, as
// Envoy sends it) or a context extension.
type Field struct {
	Name, Value string
}

// Fields is a small lookup of name/value pairs, names unique. The
// CheckRequest decoder fills it with only the names its consumer reads
// (the matcher's HeaderNames, ContextExtensionNames), so a lookup is a
// scan of a
// handful of entries, and the headers a request carries beyond those are
// never materialised.
type Fields []Field

// Get returns the value named name and whether it is present.
func (f Fields) Get(name string) (string, bool) {
	for i := range f {
		if f[i].Name == name {
			return f[i].Value, true
		}
	}
	return "", false
}

// Value returns the value named name, "" when absent.
func (f Fields) Value(name string) string {
	v, _ := f.Get(name)
	return v
}

// Set makes value the value named name: it replaces a present one (the
// last value of a name wins, as in a protobuf map) or appends a pair.
func (f Fields) Set(name, value string) Fields {
	for i := range f {
		if f[i].Name == name {
			f[i].Value = value
			return f
		}
	}
	return append(f, Field{name, value})
}

// AppendMap appends to dst the entries of m whose names are in names, or
// every entry when names is nil, in the order of names (sorted by name when
// names is nil, so the result is deterministic).
func AppendMap(dst Fields, m map[string]string, names []string) Fields {
	if names == nil {
		start := len(dst)
		for k, v := range m {
			dst = append(dst, Field{k, v})
		}
		slices.SortFunc(dst[start:], func(a, b Field) int { return strings.Compare(a.Name, b.Name) })
		return dst
	}
	for _, n := range names {
		if v, ok := m[n]; ok {
			dst = dst.Set(n, v)
		}
	}
	return dst
}
