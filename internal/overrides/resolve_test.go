package overrides_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestCache(t testing.TB, r *configfile.Rules) *overrides.Cache {
	t.Helper()
	c, err := overrides.NewCache(overrides.Config{URL: "postgres://127.0.0.1:1/none"}, snapshottest.ByIndex(t, r), newRegistry(), discardLog())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestResolve covers how stored values become overrides, without a
// database: what is skipped never hides what is good.
func TestResolve(t *testing.T) {
	yaml := `
buckets:
  fixed:   {limit: 10, per: 1s, key: tenant, overridable: true}
  sliding: {limit: 10, per: 1m, key: tenant, overridable: true, algorithm: sliding}
  closed:  {limit: 10, per: 1s, key: tenant}
routes: [{path: /x, buckets: [fixed, sliding, closed]}]`
	r, err := configfile.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fixed, sliding, closed := counter.Bucket(r.BucketIndex("fixed")), counter.Bucket(r.BucketIndex("sliding")), counter.Bucket(r.BucketIndex("closed"))
	c := newTestCache(t, r)
	c.PublishForTest(map[string]string{
		"good":    `{"fixed": {"limit": 200, "scale_ms": 1000}, "sliding": {"limit": 7, "scale_ms": 3600000}}`,
		"partly":  `{"fixed": {"limit": 0, "scale_ms": 1000}, "sliding": {"limit": 9, "scale_ms": 60000}, "closed": {"limit": 1, "scale_ms": 1000}}`,
		"unknown": `{"gone": {"limit": 5, "scale_ms": 1000}, "fixed": {"limit": 5, "scale_ms": 60000}}`,
		"extra":   `{"fixed": {"limit": 5, "scale_ms": 1000, "burst": 3}}`,
		"float":   `{"fixed": {"limit": 5.5, "scale_ms": 1000}}`,
		"string":  `{"fixed": {"limit": "5", "scale_ms": 1000}}`,
		"scale":   `{"fixed": {"limit": 5, "scale_ms": 1500}}`,
		"array":   `[1, 2]`,
		"garbage": `{not json`,
	})
	for _, tc := range []struct {
		tenant string
		bucket counter.Bucket
		want   counter.Limit
		ok     bool
	}{
		{"good", fixed, counter.Limit{Limit: 200, ScaleMS: 1000}, true},
		{"good", sliding, counter.Limit{Limit: 7, ScaleMS: 3_600_000, Algorithm: counter.Sliding}, true},
		{"good", closed, counter.Limit{}, false},
		{"partly", fixed, counter.Limit{}, false},
		{"partly", sliding, counter.Limit{Limit: 9, ScaleMS: 60_000, Algorithm: counter.Sliding}, true},
		{"partly", closed, counter.Limit{}, false},
		{"unknown", fixed, counter.Limit{Limit: 5, ScaleMS: 60_000}, true},
		{"extra", fixed, counter.Limit{}, false},
		{"float", fixed, counter.Limit{}, false},
		{"string", fixed, counter.Limit{}, false},
		{"scale", fixed, counter.Limit{}, false},
		{"array", fixed, counter.Limit{}, false},
		{"garbage", fixed, counter.Limit{}, false},
		{"nobody", fixed, counter.Limit{}, false},
		{"", fixed, counter.Limit{}, false},
		{strings.Repeat("g", 1<<20), fixed, counter.Limit{}, false},
	} {
		got, ok := c.Override(tc.tenant, tc.bucket)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Override(%.20q, %d) = %+v, %v; want %+v, %v", tc.tenant, tc.bucket, got, ok, tc.want, tc.ok)
		}
	}
}

// The Check path's budget: a lookup allocates nothing, hit or miss.
func TestOverrideAllocs(t *testing.T) {
	r := shippedRules(t)
	c := newTestCache(t, r)
	c.PublishForTest(map[string]string{"acme": `{"activity_create": {"limit": 200, "scale_ms": 1000}}`})
	act := counter.Bucket(r.BucketIndex("activity_create"))
	for _, tenant := range []string{"acme", "other"} {
		if n := testing.AllocsPerRun(1000, func() { c.Override(tenant, act) }); n != 0 {
			t.Errorf("Override(%q) allocates %v times", tenant, n)
		}
	}
}
