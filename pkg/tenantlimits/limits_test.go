package tenantlimits_test

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in           string
		limit, scale int64
		err          string
	}{
		{in: "200/1s", limit: 200, scale: 1000},
		{in: "10/1m", limit: 10, scale: 60_000},
		{in: "5/hour", limit: 5, scale: 3_600_000},
		{in: "1000/1d", limit: 1000, scale: 86_400_000},
		{in: "7/60s", limit: 7, scale: 60_000},
		{in: "2147483647/s", limit: counter.MaxLimit, scale: 1000},
		{in: "200", err: "is not LIMIT/WINDOW"},
		{in: "0/1s", err: "from 1 to 2147483647"},
		{in: "-3/1s", err: "from 1 to 2147483647"},
		{in: "2147483648/1s", err: "from 1 to 2147483647"},
		{in: "1.5/1s", err: "from 1 to 2147483647"},
		{in: "/1s", err: "from 1 to 2147483647"},
		{in: "10/10s", err: "must be one of 1s, 1m, 1h, 1d"},
		{in: "10/500ms", err: "must be one of 1s, 1m, 1h, 1d"},
		{in: "10/", err: "must be one of"},
	} {
		l, s, err := tenantlimits.ParseRate(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, tenantlimits.ErrInvalid) {
				t.Errorf("ParseRate(%q) = %d, %d, %v; want error with %q", tc.in, l, s, err, tc.err)
			}
			continue
		}
		if err != nil || l != tc.limit || s != tc.scale {
			t.Errorf("ParseRate(%q) = %d, %d, %v; want %d, %d", tc.in, l, s, err, tc.limit, tc.scale)
		}
		if got := tenantlimits.FormatRate(l, s); tc.in == "200/1s" && got != "200/1s" {
			t.Errorf("FormatRate: %q", got)
		}
	}
}

func TestValidate(t *testing.T) {
	r := shippedRules(t)
	if got := strings.Join(tenantlimits.OverridableBuckets(wiring.Limits(r, nil)), ","); got != "activity_create,inbound,token_generate,upload" {
		t.Fatalf("overridable buckets of the shipped config: %s", got)
	}
	allowed := "activity_create, inbound, token_generate, upload"
	for _, tc := range []struct {
		o   tenantlimits.Override
		err string
	}{
		{o: tenantlimits.Override{Bucket: "activity_create", Limit: 200, ScaleMS: 1000}},
		{o: tenantlimits.Override{Bucket: "token_generate", Limit: 50, ScaleMS: 60_000}},
		{o: tenantlimits.Override{Bucket: "login_ip", Limit: 50, ScaleMS: 60_000}, err: `bucket "login_ip" does not accept tenant overrides; buckets that do: ` + allowed},
		{o: tenantlimits.Override{Bucket: "nope", Limit: 50, ScaleMS: 60_000}, err: `unknown bucket "nope"; buckets that accept tenant overrides: ` + allowed},
		{o: tenantlimits.Override{Bucket: "upload", Limit: 0, ScaleMS: 1000}, err: "limit 0"},
		{o: tenantlimits.Override{Bucket: "upload", Limit: 5, ScaleMS: 1500}, err: "window 1500 ms is not one of 1s, 1m, 1h, 1d"},
	} {
		err := tenantlimits.Validate(wiring.Limits(r, nil), tc.o)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, tenantlimits.ErrInvalid)):
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", 257), "a\nb", "\xff"} {
		if err := tenantlimits.ValidateTenant(bad); !errors.Is(err, tenantlimits.ErrInvalid) {
			t.Errorf("tenant %q: %v", bad, err)
		}
	}
	if err := tenantlimits.ValidateTenant("acme-ü"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "  ", "a\x00"} {
		if err := tenantlimits.ValidateActor(bad); !errors.Is(err, tenantlimits.ErrInvalid) {
			t.Errorf("actor %q: %v", bad, err)
		}
	}
}

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newTestCache(t testing.TB, r *rules.Rules) *tenantlimits.Cache {
	t.Helper()
	c, err := tenantlimits.NewCache(tenantlimits.Config{URL: "postgres://127.0.0.1:1/none"}, wiring.Limits(r, nil), newRegistry(), discardLog())
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
	r, err := rules.Parse([]byte(yaml), "test.yaml")
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
