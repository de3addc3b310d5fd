package configfile_test

import (
	"os"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

func TestShippedConfig(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatalf("shipped config: %v", err)
	}
	// The file in the tree and the embedded copy are the same file.
	onDisk, err := os.ReadFile("../../config/ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(onDisk) != string(config.Default()) {
		t.Fatal("config/ratelimit.yaml differs from the embedded default")
	}

	want := map[string]struct {
		limit, scale int64
		key          match.KeySpec
		count        configfile.Counting
		overridable  bool
	}{
		"activity_create": {100, 1000, match.KeySpec{Kind: match.KeyTenant}, configfile.CountRequests, true},
		"upload":          {10, 1000, match.KeySpec{Kind: match.KeyTenant}, configfile.CountRequests, true},
		"inbound":         {500, 1000, match.KeySpec{Kind: match.KeyPathParam, Name: "channel"}, configfile.CountRequests, true},
		"token_generate":  {10, 60000, match.KeySpec{Kind: match.KeyPathParam, Name: "channel"}, configfile.CountRequests, true},
		"token_create":    {10, 60000, match.KeySpec{Kind: match.KeyIP}, configfile.CountRequests, false},
		"login_ip":        {5, 60000, match.KeySpec{Kind: match.KeyIP}, configfile.CountFailures, false},
		"login_account":   {5, 60000, match.KeySpec{Kind: match.KeyAccount}, configfile.CountFailures, false},
	}
	if len(r.Buckets) != len(want) {
		t.Fatalf("got %d buckets, want %d", len(r.Buckets), len(want))
	}
	for i, b := range r.Buckets {
		w, ok := want[b.Name]
		if !ok {
			t.Errorf("unexpected bucket %q", b.Name)
			continue
		}
		l, ok := limitOf(r, i)
		if !ok || l.Limit != w.limit || l.ScaleMS != w.scale || l.Algorithm != counter.Fixed {
			t.Errorf("%s: limit %+v, want %d per %d ms fixed", b.Name, l, w.limit, w.scale)
		}
		if b.Key != w.key || b.Count != w.count || b.Overridable != w.overridable || b.Shadow {
			t.Errorf("%s: got %+v", b.Name, b)
		}
	}
	// Ten route paths: the login rule holds two.
	if len(r.Routes) != 10 {
		t.Errorf("got %d routes, want 10", len(r.Routes))
	}
	if len(r.Failures.StatusCodes) != 1 || r.Failures.StatusCodes[0] != 401 {
		t.Errorf("failure codes %v, want [401]", r.Failures.StatusCodes)
	}
	if r.Keys.TenantHeader != "x-tenant-id" || r.Keys.AccountHeader != "x-login-account" || r.Keys.AccountBodyField != "email" || r.Keys.TrustedHops != 0 ||
		r.Keys.IPv6Prefix != 64 || r.Keys.UnreadableAccount != configfile.AccountShared {
		t.Errorf("keys: %+v", r.Keys)
	}
	// The lockout fails closed on a full key table; request buckets do not.
	for _, b := range r.Buckets {
		if want := map[bool]configfile.Action{true: configfile.Deny, false: configfile.Allow}[b.Count == configfile.CountFailures]; b.OnOverflow != want {
			t.Errorf("%s: on_overflow %v, want %v", b.Name, b.OnOverflow, want)
		}
	}
}

const minimal = `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes:
  - {method: POST, path: /x, buckets: [b]}
`

func TestParseFeatures(t *testing.T) {
	r, err := configfile.Parse([]byte(`
keys: {tenant_header: x-org, trusted_hops: 2, use_external_address_header: false}
counter: {max_keys: 5000, max_key_bytes: 64}
failures: {status_codes: [401, 403, 401]}
buckets:
  sliding_one: {limit: 3, per: 500ms, algorithm: sliding, key: "header:x-api-key", mode: shadow, on_missing_key: deny, on_overflow: deny}
  from_route: {key: tenant}
  activity_create: {key: tenant}
routes:
  - name: a
    paths: ["/a/{id}", "/b/{id}"]
    buckets: [sliding_one, from_route]
    defaults:
      from_route: {limit: 7, per: minute}
  - {path: /c, buckets: [activity_create]}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if r.Keys.TenantHeader != "x-org" || r.Keys.TrustedHops != 2 || r.Keys.UseExternalAddressHeader {
		t.Errorf("keys: %+v", r.Keys)
	}
	if len(r.Failures.StatusCodes) != 2 || r.Failures.StatusCodes[1] != 403 {
		t.Errorf("failure codes %v", r.Failures.StatusCodes)
	}
	if r.Counter.MaxKeys != 5000 || r.Counter.MaxKeyBytes != 64 {
		t.Errorf("counter: %+v", r.Counter)
	}
	b := r.Buckets[0]
	if !b.Shadow || b.OnMissingKey != configfile.Deny || b.OnOverflow != configfile.Deny || b.Key.Kind != match.KeyHeader || b.Key.Name != "x-api-key" {
		t.Errorf("bucket: %+v", b)
	}
	if l, _ := limitOf(r, 0); l != (counter.Limit{Limit: 3, ScaleMS: 500, Algorithm: counter.Sliding}) {
		t.Errorf("sliding limit: %+v", l)
	}
	if len(r.Routes) != 3 || r.Routes[0].Name != "a" || r.Routes[1].Name != "a" || r.Routes[1].Path != "/b/{id}" {
		t.Fatalf("routes: %+v", r.Routes)
	}
	// Resolution: route default when the bucket has none — on every route
	// and without one (Envoy naming the bucket), since the client picks the
	// route; the built-in table for a shipped bucket name.
	for _, route := range []int{0, 1, 2, -1} {
		if l, ok := limitOf(r, 1); !ok || l.Limit != 7 || l.ScaleMS != 60000 {
			t.Errorf("route default on route %d: %+v %v", route, l, ok)
		}
	}
	if l, ok := limitOf(r, 2); !ok || l.Limit != 100 || l.ScaleMS != 1000 {
		t.Errorf("built-in default: %+v %v", l, ok)
	}
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings, each must appear in the problems
	}{
		{"empty", ``, []string{"empty"}},
		{"not yaml", "buckets: [", []string{"invalid YAML"}},
		{"unknown top field", minimal + "extra: 1\n", []string{`unknown field "extra"`}},
		{"reserve not below max_keys", minimal + "counter: {max_keys: 100, reserved_keys: 100}\n", []string{"counter.reserved_keys 100 must be below counter.max_keys 100"}},
		{"unknown bucket field", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, limt: 3}
routes: [{path: /x, buckets: [b]}]`, []string{`buckets.b: unknown field "limt"`, ":3:"}},
		{"unknown bucket in route", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes:
  - {path: /x, buckets: [nope]}`, []string{`unknown bucket "nope" (known: b)`, ":5:"}},
		{"bad duration", `
buckets:
  b: {limit: 5, per: 1 sec, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{`buckets.b.per: "1 sec" is not a duration`}},
		{"sub-millisecond duration", `
buckets:
  b: {limit: 5, per: 1500us, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{"whole number of milliseconds"}},
		{"zero limit", `
buckets:
  b: {limit: 0, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.limit must be between 1 and"}},
		{"limit not a number", `
buckets:
  b: {limit: lots, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.limit must be a whole number"}},
		{"limit without per", `
buckets:
  b: {limit: 5, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{"give both limit and per"}},
		{"no limit anywhere", `
buckets:
  custom: {key: tenant}
routes: [{path: /x, buckets: [custom]}]`, []string{`bucket "custom" has no limit`}},
		{"bad key", `
buckets:
  b: {limit: 5, per: 1s, key: "path:"}
routes: [{path: /x, buckets: [b]}]`, []string{`"path:" is not a key`}},
		{"no key", `
buckets:
  b: {limit: 5, per: 1s}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b: no key"}},
		{"bad enum", `
buckets:
  b: {limit: 5, per: 1s, key: tenant, mode: loud}
routes: [{path: /x, buckets: [b]}]`, []string{"buckets.b.mode must be one of enforce, shadow"}},
		{"duplicate routes", `
buckets:
  b: {limit: 5, per: 1s, key: "path:id"}
routes:
  - {method: POST, path: "/x/{id}", buckets: [b]}
  - {method: POST, path: "/x/{other}", buckets: [b]}`, []string{"repeats the route at line 5"}},
		{"template never matches", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes:
  - {path: "/a//b", buckets: [b]}
  - {path: "/a/../b", buckets: [b]}
  - {path: "/a?x=1", buckets: [b]}
  - {path: "a/b", buckets: [b]}
  - {path: "/a/{x", buckets: [b]}`, []string{":5:", ":6:", ":7:", ":8:", ":9:", "can never match"}},
		{"param not captured", `
buckets:
  inbound: {limit: 5, per: 1s, key: "path:channel"}
routes:
  - {path: "/in/{id}", buckets: [inbound]}`, []string{`keyed by path parameter {channel}, which this path does not capture`}},
		{"bad method", minimal + "  - {method: post, path: /y, buckets: [b]}\n", []string{`"post" is not an uppercase HTTP method`}},
		{"uppercase header", `
keys: {tenant_header: X-Tenant}
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{`"X-Tenant" is not a lowercase header name`}},
		{"route without buckets", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x}]`, []string{"routes[0]: no buckets"}},
		{"duplicate bucket key", `
buckets:
  b: {limit: 5, per: 1s, key: tenant}
  b: {limit: 6, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{`"b" given twice`}},
		{"bad bucket name", `
buckets:
  Big-Name: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [Big-Name]}]`, []string{`bucket name "Big-Name"`}},
		{"bad failure code", minimal + "failures: {status_codes: [99]}\n", []string{"failures.status_codes must be between 100 and 599"}},
		{"routes give one bucket different defaults", `
buckets:
  shared: {key: tenant}
routes:
  - {path: /a, buckets: [shared], defaults: {shared: {limit: 5, per: 1s}}}
  - {path: /b, buckets: [shared], defaults: {shared: {limit: 500, per: 1s}}}`, []string{":6:", "defaults.shared (500 per 1s fixed) differs from the default the route at line 5 gives it (5 per 1s fixed)"}},
		{"routes give one bucket different windows", `
buckets:
  shared: {key: tenant}
routes:
  - {path: /a, buckets: [shared], defaults: {shared: {limit: 5, per: 1s}}}
  - {path: /b, buckets: [shared], defaults: {shared: {limit: 5, per: 1m}}}`, []string{"differs from the default"}},
		{"routes give one bucket different algorithms", `
buckets:
  shared: {key: tenant}
routes:
  - {path: /a, buckets: [shared], defaults: {shared: {limit: 5, per: 1s}}}
  - {path: /b, buckets: [shared], defaults: {shared: {limit: 5, per: 1s, algorithm: sliding}}}`, []string{"differs from the default"}},
		{"route default of a bucket with its own limit", `
buckets:
  own: {limit: 5, per: 1s, key: tenant}
routes:
  - {path: /a, buckets: [own], defaults: {own: {limit: 50, per: 1s}}}`, []string{"defaults.own is never used: the bucket has its own limit"}},
		{"ipv6 prefix too short", `
keys: {ipv6_prefix: 16}
buckets:
  b: {limit: 5, per: 1s, key: ip}
routes: [{path: /x, buckets: [b]}]`, []string{"keys.ipv6_prefix must be between 32 and 128"}},
		{"unreadable account policy", `
keys: {unreadable_account: allow}
buckets:
  b: {limit: 5, per: 1s, key: ip}
routes: [{path: /x, buckets: [b]}]`, []string{"keys.unreadable_account must be one of shared_key, deny"}},
		{"trusted hops negative", `
keys: {trusted_hops: -1}
buckets:
  b: {limit: 5, per: 1s, key: tenant}
routes: [{path: /x, buckets: [b]}]`, []string{"keys.trusted_hops must be between 0 and 16"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := configfile.Parse([]byte(tc.yaml), "t.yaml")
			if err == nil {
				t.Fatalf("no error; rules %+v", r)
			}
			if r != nil {
				t.Error("rules returned along with problems")
			}
			ps, ok := problem.As(err)
			if !ok || len(ps) == 0 {
				t.Fatalf("error is not Problems: %v", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("problems do not mention %q:\n%s", w, msg)
				}
			}
			for _, p := range ps {
				if !strings.HasPrefix(p.String(), "t.yaml") {
					t.Errorf("problem without file: %s", p)
				}
			}
		})
	}
}

// Several problems in one file are all reported, in one pass.
func TestParseReportsEveryProblem(t *testing.T) {
	_, err := configfile.Parse([]byte(`
buckets:
  a: {limit: -1, per: 1s, key: tenant}
  b: {limit: 5, per: soon, key: tenant}
routes:
  - {path: /x, buckets: [c]}
`), "t.yaml")
	ps, _ := problem.As(err)
	if len(ps) < 3 {
		t.Fatalf("want at least 3 problems, got %d:\n%v", len(ps), err)
	}
}

// Routes may share a bucket's default when they agree, and a failure
// bucket fails closed on a full key table unless told otherwise.
func TestParseSafeDefaults(t *testing.T) {
	r, err := configfile.Parse([]byte(`
keys: {ipv6_prefix: 56, unreadable_account: deny}
buckets:
  shared: {key: tenant}
  fails: {limit: 5, per: 1m, key: ip, count: failures}
  fails_open: {limit: 5, per: 1m, key: ip, count: failures, on_overflow: allow}
  reqs: {limit: 5, per: 1m, key: ip}
routes:
  - {path: /a, buckets: [shared, fails, fails_open, reqs], defaults: {shared: {limit: 5, per: 1s}}}
  - {path: /b, buckets: [shared], defaults: {shared: {limit: 5, per: 1s}}}
  - {path: /c, buckets: [shared]}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if r.Keys.IPv6Prefix != 56 || r.Keys.UnreadableAccount != configfile.AccountDeny {
		t.Errorf("keys: %+v", r.Keys)
	}
	if l, ok := limitOf(r, 0); !ok || l.Limit != 5 || l.ScaleMS != 1000 {
		t.Errorf("route /c without a default: %+v %v, want the bucket's one default", l, ok)
	}
	for i, want := range []configfile.Action{configfile.Allow, configfile.Deny, configfile.Allow, configfile.Allow} {
		if got := r.Buckets[i].OnOverflow; got != want {
			t.Errorf("%s: on_overflow %v, want %v", r.Buckets[i].Name, got, want)
		}
	}
	d, err := configfile.Parse([]byte(minimal), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d.Keys.IPv6Prefix != 64 || d.Keys.UnreadableAccount != configfile.AccountShared {
		t.Errorf("default keys: %+v", d.Keys)
	}
}

// limitOf is bucket b's configured limit: the one a node counts it under
// without an override.
func limitOf(r *configfile.Rules, b int) (counter.Limit, bool) {
	return r.Buckets[b].Configured()
}

// The configuration holds windows, header names and methods to the one
// rule each that the rest of the product uses (limits.ParseWindow,
// match.HeaderNameProblem, match.ValidMethod).
func TestSharedRules(t *testing.T) {
	r, err := configfile.Parse([]byte(`
buckets:
  daily: {limit: 5, per: 1d, key: "header::authority"}
  minutely: {limit: 5, per: Minute, key: tenant}
routes: [{method: GET, path: /x, buckets: [daily, minutely]}]`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := limitOf(r, 0); l.ScaleMS != 86_400_000 || r.Buckets[0].Key.Name != ":authority" {
		t.Errorf("daily: %+v %+v", l, r.Buckets[0].Key)
	}
	if l, _ := limitOf(r, 1); l.ScaleMS != 60_000 {
		t.Errorf("minutely: %+v", l)
	}
	for _, bad := range []string{
		`{method: M-SEARCH, path: /x, buckets: [b]}`,
		`{method: "", path: /x, buckets: [b]}`,
	} {
		if _, err := configfile.Parse([]byte("buckets: {b: {limit: 1, per: 1s, key: tenant}}\nroutes: ["+bad+"]"), "t.yaml"); err == nil || !strings.Contains(err.Error(), "is not an uppercase HTTP method") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := configfile.Parse([]byte(`
buckets: {b: {limit: 1, per: 1s, key: "header:a:b"}}
routes: [{path: /x, buckets: [b]}]`), "t.yaml"); err == nil {
		t.Error("a colon inside a header name accepted")
	}
}
