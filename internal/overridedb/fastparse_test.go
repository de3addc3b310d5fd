package overridedb

import (
	"slices"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// FuzzFastEntries holds the fast decoder to the general one: whatever it
// accepts, ParseLimits reads the same way.
func FuzzFastEntries(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"activity_create": {"limit": 200, "scale_ms": 1000}}`,
		`{"a": {"scale_ms": 60000, "limit": 5}, "upload": {"limit": 20, "scale_ms": 1000}}`,
		"{\n\t\"b\" : { \"limit\" :1,\"scale_ms\":1000 } }",
		`{"a": {"limit": 0200, "scale_ms": 1000}}`,
		`{"a": {"limit": 2e2, "scale_ms": 1000}}`,
		`{"a": {"limit": 1, "limit": 2}}`,
		`{"a": {"limit": 1, "scale_ms": 1000}, "a": {"limit": 2, "scale_ms": 1000}}`,
		`{"A": {"limit": 1, "scale_ms": 1000}}`,
		`{"a": {"limit": 99999999999999999999, "scale_ms": 1000}}`,
		`[1]`, `null`, `{"a": 5}`, `{"a": {"limit": 1, "scale_ms": 1000}} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var buf [MaxFastEntries]FastEntry
		fast, ok := FastEntries(raw, &buf)
		if !ok {
			return
		}
		entries, problems, err := ParseLimits(raw)
		if err != nil {
			t.Fatalf("fast path accepted %q, general path refused it: %v", raw, err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Bucket)
		}
		for _, p := range problems {
			names = append(names, p.Bucket)
		}
		if len(names) != len(fast) {
			t.Fatalf("%q: fast path %d entries, general path %d", raw, len(fast), len(names))
		}
		for _, fe := range fast {
			o := limits.Override{Bucket: string(fe.Bucket), Limit: fe.Limit, ScaleMS: fe.ScaleMS}
			i := slices.IndexFunc(entries, func(e limits.Override) bool { return e.Bucket == o.Bucket })
			good := o.Valid() && match.ValidBucketName(o.Bucket)
			switch {
			case good && (i < 0 || entries[i] != o):
				t.Fatalf("%q: fast path %+v, general path %v / problems %v", raw, o, entries, problems)
			case !good && i >= 0:
				t.Fatalf("%q: general path accepted %+v, which the fast path's caller refuses", raw, entries[i])
			}
		}
	})
}
