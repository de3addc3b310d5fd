package admin

import (
	"strings"
	"testing"
)

// FuzzParseQuery: any query string is either refused with a reason or
// gives parameters within their bounds.
func FuzzParseQuery(f *testing.F) {
	for _, s := range []string{"", "bucket=upload", "n=5", "bucket=a&n=100", "n=0", "bucket=%zz", "x=1", "bucket=a&bucket=b", "n=-1", "n=1e3", ";", "bucket=" + strings.Repeat("a", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, bad := parseQuery(raw)
		if bad != "" {
			return
		}
		if q.n < 1 || q.n > maxKeys || len(q.bucket) > maxBucketBytes {
			t.Fatalf("parseQuery(%q) = %+v: out of bounds", raw, q)
		}
	})
}
