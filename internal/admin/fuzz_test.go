package admin

import (
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
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

// FuzzDecodeAnswer: a peer's answer either decodes within its bounds or
// is refused; merging what decodes does not panic.
func FuzzDecodeAnswer(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"buckets":[]}`, `{"buckets":[{"bucket":"a","minute":{"admitted":3,"top_admitted":[{"key":"k","hits":3,"error":9}]},"epochs":[{"admitted":3}]}]}`,
		`{"buckets":[{"bucket":"a","window":null,"minute":{"denied":18446744073709551615,"unlisted_denied":18446744073709551615}}]}`,
		`[`, `{"buckets":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeAnswer(b)
		if err != nil {
			return
		}
		if len(r.Buckets) > maxAnswerBuckets {
			t.Fatalf("%d buckets accepted", len(r.Buckets))
		}
		for _, bt := range r.Buckets {
			if len(bt.Epochs) > top.Epochs || len(bt.Minute.TopAdmitted) > maxKeys || len(bt.Minute.TopDenied) > maxKeys {
				t.Fatalf("bucket out of bounds accepted: %+v", bt)
			}
			if len(bt.Bucket) > maxBucketBytes {
				t.Fatalf("bucket name of %d bytes accepted", len(bt.Bucket))
			}
			for _, k := range append(bt.Minute.TopAdmitted, bt.Minute.TopDenied...) {
				if len(k.Key) > top.MaxMaxKeyBytes {
					t.Fatalf("key of %d bytes accepted", len(k.Key))
				}
			}
			top.Merge([]top.Tops{bt.Tops, bt.Tops}, 3)
		}
	})
}

// A peer's answer with a key or a bucket name longer than any node keeps
// is refused, not merged and shown.
func TestDecodeAnswerRefusesLongNames(t *testing.T) {
	long := strings.Repeat("k", top.MaxMaxKeyBytes+1)
	for name, s := range map[string]string{
		"key":    `{"buckets":[{"bucket":"a","minute":{"denied":1,"top_denied":[{"key":"` + long + `","hits":1}]}}]}`,
		"bucket": `{"buckets":[{"bucket":"` + strings.Repeat("b", maxBucketBytes+1) + `","minute":{}}]}`,
	} {
		if _, err := decodeAnswer([]byte(s)); err == nil {
			t.Errorf("%s too long: accepted", name)
		}
	}
	ok := `{"buckets":[{"bucket":"a","minute":{"denied":1,"top_denied":[{"key":"` + long[:top.MaxMaxKeyBytes] + `","hits":1}]}}]}`
	if _, err := decodeAnswer([]byte(ok)); err != nil {
		t.Errorf("a key of MaxMaxKeyBytes: %v", err)
	}
}
