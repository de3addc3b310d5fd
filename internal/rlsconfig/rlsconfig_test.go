package rlsconfig_test

import (
	"encoding/binary"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

func TestCounterKeyEncoding(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "basic_config.yaml", "wildcard.yaml")[:1]...)
	// One entry: the raw value, appended to what key held.
	_, k, _ := c.Match("test-domain", entries("key2", "some\x00value"), []byte("pre"))
	if string(k) != "presome\x00value" {
		t.Errorf("one entry: %q", k)
	}
	// Several: each value length-prefixed, so moving a byte between
	// values changes the key.
	_, k1, _ := c.Match("test-domain", entries("key1", "value1", "subkey1", "ab"), nil)
	want := binary.AppendUvarint(nil, 6)
	want = append(want, "value1"...)
	want = binary.AppendUvarint(want, 2)
	want = append(want, "ab"...)
	if string(k1) != string(want) {
		t.Errorf("two entries: %q, want %q", k1, want)
	}
	// The appended key reuses key's storage when it has room.
	buf := make([]byte, 0, 64)
	_, k2, _ := c.Match("test-domain", entries("key1", "value1", "subkey1", "ab"), buf)
	if &k2[0] != &buf[:1][0] {
		t.Error("Match did not append in place")
	}
	// A nil entry is an empty key and value, not a crash.
	if i, _, _ := c.Match("test-domain", []*ratelimitv3.RateLimitDescriptor_Entry{nil}, nil); i != -1 {
		t.Errorf("nil entry matched rule %d", i)
	}
}

func TestBucketNames(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{},
		file("1.yaml", "domain: a.b\ndescriptors:\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("2.yaml", "domain: a\ndescriptors:\n  - key: b.c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("3.yaml", "domain: \"a/b\"\ndescriptors:\n  - key: \"c/d%\"\n    value: \"e f\\u00e9\\u0000\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("4.yaml", "domain: "+strings.Repeat("x", 300)+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
	)
	seen := map[string]string{}
	hashed := regexp.MustCompile(`^rls(-limit)?/#[0-9a-f]{32}$`)
	check := func(name, what string) {
		if len(name) > rlsconfig.MaxBucketName {
			t.Errorf("%s: %d bytes", what, len(name))
		}
		if match.ValidBucketName(name) {
			t.Errorf("%s: %q is a valid ext_authz bucket name", what, name)
		}
		if prev, dup := seen[name]; dup {
			t.Errorf("%s and %s share bucket %q", prev, what, name)
		}
		seen[name] = what
		if strings.Contains(name, "#") && !hashed.MatchString(name) {
			t.Errorf("%s: %q", what, name)
		}
	}
	for _, r := range c.Rules() {
		check(r.Bucket, r.StatsKey)
	}
	for _, lb := range c.LimitBuckets() {
		check(lb.Bucket, lb.Domain+" "+lb.Unit.String())
	}
	names := map[string]bool{}
	for _, r := range c.Rules() {
		names[r.Bucket] = true
	}
	for _, want := range []string{"rls/a.b/c", "rls/a/b.c", "rls/a/b/c", "rls/a%2Fb/c%2Fd%25_e%20f%C3%A9%00"} {
		if !names[want] {
			t.Errorf("no bucket %q in %v", want, names)
		}
	}
	if len(c.LimitBuckets()) != 4*7 {
		t.Errorf("%d limit buckets, want 7 units × 4 domains", len(c.LimitBuckets()))
	}
	// Names are deterministic: the same files in another order name the
	// same buckets at the same indices.
	c2 := mustParse(t, rlsconfig.Options{},
		file("4.yaml", "domain: "+strings.Repeat("x", 300)+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("3.yaml", "domain: \"a/b\"\ndescriptors:\n  - key: \"c/d%\"\n    value: \"e f\\u00e9\\u0000\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("2.yaml", "domain: a\ndescriptors:\n  - key: b.c\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n"),
		file("1.yaml", "domain: a.b\ndescriptors:\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
	)
	for i, r := range c2.Rules() {
		if r.Bucket != c.Rules()[i].Bucket {
			t.Errorf("rule %d: %q then %q", i, c.Rules()[i].Bucket, r.Bucket)
		}
	}
}

func TestExtensions(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{DefaultAlgorithm: counter.Fixed}, file("e.yaml", `domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding, overridable: true, name: per_tenant}
  - key: other
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: per_tenant}]}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 10000, charge: true}
`))
	r := c.Rules()[0]
	if r.Algorithm != counter.Sliding || !r.Overridable || r.Charge || r.Name != "per_tenant" || r.File != "e.yaml" || r.Line != 3 || r.Column != 5 {
		t.Errorf("rule 0: %+v", r)
	}
	r = c.Rules()[1]
	if r.Algorithm != counter.Fixed || r.Overridable || !r.Shadow || len(r.Replaces) != 1 || r.Replaces[0] != "per_tenant" {
		t.Errorf("rule 1: %+v", r)
	}
	if r = c.Rules()[2]; !r.Charge || r.RequestsPerUnit != 10000 {
		t.Errorf("rule 2: %+v", r)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: leaky}\n", "x.yaml:4:65: rate_limit.algorithm must be fixed or sliding, not 'leaky'"},
		{"    rate_limit: {unit: minute, requests_per_unit: 1, overridable: true, name: Bad-Name}\n", "x.yaml:4:79: an overridable rule needs rate_limit.name to be a bucket name ([a-z][a-z0-9_]{0,62}), not 'Bad-Name': tenant overrides name it"},
		{"    rate_limit: {unit: minute, requests_per_unit: 1, overridable: true}\n", "x.yaml:4:67: an overridable rule needs rate_limit.name to be a bucket name ([a-z][a-z0-9_]{0,62}), not '': tenant overrides name it"},
		{"    rate_limit: {unlimited: true, overridable: true, name: x}\n", "x.yaml:4:48: an unlimited rule cannot be overridable: a tenant override sets a limit"},
		{"    rate_limit: {unlimited: true, charge: true}\n", "x.yaml:4:43: an unlimited rule cannot charge: it counts nothing"},
		{"    rate_limit: {unit: minute, requests_per_unit: 1, charge: maybe}\n", "x.yaml:4:62: error loading config file: cannot unmarshal \"maybe\" into bool"},
		{"    rate_limit: {unit: minute, requests_per_unit: 1, overridable: true, name: x}\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 1, overridable: true, name: x}\n", "x.yaml:6:79: rate_limit.name 'x' is overridable in two rules (first at x.yaml:4:79): tenant overrides could not tell them apart"},
		{"    value: \"*\"\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1, overridable: true, name: x}\n", "x.yaml:6:67: an overridable rule's first descriptor cannot have share_threshold: its value is the tenant, and every tenant it matches would share one count under the limit of whichever tenant a request names"},
		{"    quota_mode: true\n", "x.yaml:4:5: quota_mode is not supported by ratelimit-authz: remove it, or set it to false (an over-limit quota descriptor would fail the request here)"},
		{"    unit: second\n", "x.yaml:4:5: config error, key 'unit' does not belong in a descriptor (envoyproxy/ratelimit ignores it there): move it to rate_limit, or remove it"},
		{"    rate_limit: {unit: second, shadow_mode: true}\n", "x.yaml:4:32: config error, key 'shadow_mode' does not belong in rate_limit (envoyproxy/ratelimit ignores it there): move it to a descriptor, or remove it"},
		{"    key: again\n", "x.yaml:4:5: config error, key 'key' given twice in a descriptor (first at x.yaml:3:5): remove one (envoyproxy/ratelimit uses the last)"},
		{"    metadata: [1]\n", "x.yaml:4:15: error parsing metadata: !!seq is not a mapping"},
		{"    metadata: {[1]: a}\n", "x.yaml:4:16: error parsing metadata: invalid map key: !!seq: a key is a string, a number or a boolean"},
		{"    metadata: {x: !!binary /w==}\n", "x.yaml:4:19: error parsing metadata: proto: invalid UTF-8 in string: \"\\xff\": metadata holds text"},
		{"    value: [a]\n", "x.yaml:4:12: error loading config file: cannot unmarshal !!seq into string"},
		{"    rate_limit: 5\n", "x.yaml:4:17: error loading config file: cannot unmarshal !!int into rate_limit (a mapping)"},
		{"    descriptors: {a: b}\n", "x.yaml:4:18: error loading config file: cannot unmarshal !!map into a list"},
	} {
		got := problemsOf(t, []rlsconfig.File{file("x.yaml", "domain: d\ndescriptors:\n  - key: k\n"+tc.yaml)}, rlsconfig.Options{})
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.yaml, got, tc.want)
		}
	}
	// Accepted as upstream: metadata of any shape inside, YAML 1.1 booleans,
	// quota_mode false, a rule without limit or children.
	c = mustParse(t, rlsconfig.Options{}, file("ok.yaml", `domain: d
descriptors:
  - key: a
    quota_mode: false
    value_to_metric: yes
    metadata: {team: x, n: 1.5, list: [1, {b: c}]}
    rate_limit: {unit: second, requests_per_unit: 1, unlimited: off}
  - key: b
`))
	if len(c.Rules()) != 1 {
		t.Errorf("%d rules", len(c.Rules()))
	}
}

// Every problem of every file at once, files in name order.
func TestParseReportsEveryProblem(t *testing.T) {
	got := problemsOf(t, []rlsconfig.File{
		file("b.yaml", "domain: b\ndescriptors:\n  - key: \"\"\n  - key: k\n    rate_limit: {unit: fortnight}\n"),
		file("a.yaml", "domain: a\nbogus: 1\n"),
	}, rlsconfig.Options{})
	want := []string{
		"a.yaml:2:1: config error, unknown key 'bogus'",
		"b.yaml:3:5: descriptor has empty key",
		"b.yaml:5:18: invalid rate limit unit 'fortnight'",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := rlsconfig.Parse(nil, rlsconfig.Options{DefaultAlgorithm: 9}); err == nil {
		t.Error("an unknown default algorithm was accepted")
	}
}

// Every kind of file envoyproxy/ratelimit loads and ratelimit-authz
// refuses, as docs/migrating-from-envoyproxy-ratelimit.md lists them: each
// is refused with a problem that says how to fix it. (Upstream's verdict
// on each was checked by loading the same file with its loader, at the
// commit docs/envoyproxy-ratelimit.md names.) The bounds on size, count
// and nesting are TestHostileFiles' and TestLoadHostileDirectories'.
func TestRefusedThoughUpstreamLoads(t *testing.T) {
	const d = "domain: d\ndescriptors:\n  - key: k\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"unit in a descriptor", d + "    unit: second\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"x.yaml:4:5: config error, key 'unit' does not belong in a descriptor (envoyproxy/ratelimit ignores it there): move it to rate_limit, or remove it"},
		{"shadow_mode in rate_limit", d + "    rate_limit: {unit: second, requests_per_unit: 1, shadow_mode: true}\n",
			"x.yaml:4:54: config error, key 'shadow_mode' does not belong in rate_limit (envoyproxy/ratelimit ignores it there): move it to a descriptor, or remove it"},
		{"descriptors in rate_limit", d + "    rate_limit: {unit: second, requests_per_unit: 1, descriptors: [{key: b}]}\n",
			"x.yaml:4:54: config error, key 'descriptors' does not belong in rate_limit (envoyproxy/ratelimit ignores it there): move it to a descriptor, or remove it"},
		{"domain in a descriptor", d + "    domain: e\n",
			"x.yaml:4:5: config error, key 'domain' does not belong in a descriptor (envoyproxy/ratelimit ignores it there): move it to the top level, or remove it"},
		{"key at the top level", "domain: d\nkey: a\n",
			"x.yaml:2:1: config error, key 'key' does not belong in the top level (envoyproxy/ratelimit ignores it there): move it to a descriptor, or remove it"},
		{"unit in a replaces entry", d + "    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: m, unit: second}]}\n",
			"x.yaml:4:75: config error, key 'unit' does not belong in a replaces entry (envoyproxy/ratelimit ignores it there): move it to rate_limit, or remove it"},
		{"a key twice", d + "    key: again\n",
			"x.yaml:4:5: config error, key 'key' given twice in a descriptor (first at x.yaml:3:5): remove one (envoyproxy/ratelimit uses the last)"},
		{"rate_limit twice", d + "    rate_limit: {unit: second}\n    rate_limit: {requests_per_unit: 4}\n",
			"x.yaml:5:5: config error, key 'rate_limit' given twice in a descriptor (first at x.yaml:4:5): remove one (envoyproxy/ratelimit combines their fields)"},
		{"share_threshold with a '*' in the key", "domain: d\ndescriptors:\n  - key: \"k*\"\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"x.yaml:4:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'k*': a key is matched literally here, so write the '*' in value (key: k, value: \"*\")"},
		{"unit year", d + "    rate_limit: {unit: year, requests_per_unit: 12}\n",
			"x.yaml:4:18: unit YEAR (31536000 s) is longer than the longest window ratelimit-authz counts (4294967295 ms, about 49 days: counter.MaxScaleMS): use month with a twelfth of the limit"},
		{"quota_mode", d + "    quota_mode: true\n",
			"x.yaml:4:5: quota_mode is not supported by ratelimit-authz: remove it, or set it to false (an over-limit quota descriptor would fail the request here)"},
		{"requests_per_unit above counter.MaxLimit", d + "    rate_limit: {unit: second, requests_per_unit: 4294967295}\n",
			"x.yaml:4:51: requests_per_unit 4294967295 is above the largest limit ratelimit-authz counts (2147483647: counter.MaxLimit): lower it, or write unlimited: true (without unit) for no limit"},
		{"a mistake in a value a merge replaces", "domain: d\ndescriptors:\n  - &b {key: a, rate_limit: ~}\n  - rate_limit: {unit: second, requests_per: 5}\n    <<: *b\n    key: b\n",
			"x.yaml:4:32: config error, unknown key 'requests_per'"},
		{"a directive inside a document", "domain: d\ndescriptors:\n%YAML 1.1\n  - key: a\n",
			"x.yaml: error loading config file: yaml: line 4: block sequence entries are not allowed in this context"},
		{"a second document that does not parse", "domain: d\ndescriptors: []\n---\n\"domain: e\n",
			"x.yaml: error loading config file: yaml: line 4: found unexpected end of stream"},
		{"descriptors nested 65 deep", "domain: d\ndescriptors: " + strings.Repeat("[{key: k, descriptors: ", 65) + "[{key: k}]" + strings.Repeat("}]", 65) + "\n",
			"x.yaml:2:1487: config error, descriptors nest deeper than 64 levels: Envoy sends one entry per level, so flatten them"},
		{"metadata nested 65 deep", d + "    metadata: " + strings.Repeat("{a: ", 65) + "1" + strings.Repeat("}", 65) + "\n",
			"x.yaml:4:271: error parsing metadata: nested deeper than 64 levels: flatten it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, []rlsconfig.File{file("x.yaml", tc.yaml)}, rlsconfig.Options{})
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("problems %q\nwant [%q]", got, tc.want)
			}
		})
	}
}

// What upstream's decoder reads and ratelimit-authz refused before:
// metadata keys that are numbers, booleans or null, a signed
// requests_per_unit, a !!binary value (its bytes).
func TestScalarsAsUpstreamReadsThem(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, file("s.yaml", `domain: d
descriptors:
  - key: a
    metadata: {1: team-a, true: x, 1.5: y, ~: z, nested: {2: b, 3.5: c}}
    rate_limit: {unit: second, requests_per_unit: +5}
  - key: b
    value: !!binary aGVsbG8=
    rate_limit: {unit: second, requests_per_unit: -0}
`))
	if got, want := rulesText(c), "d.a: 5/SECOND\nd.b_hello: 0/SECOND"; got != want {
		t.Errorf("rules:\n%s\nwant:\n%s", got, want)
	}
}

// A concurrency rule (rate_limit.count: concurrency) limits requests in
// flight; its descriptor's entry is the request id, left out of the
// counter key, which is that of the entries before it.
func TestConcurrencyRules(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "concurrency.yaml")...)
	for _, tc := range []struct {
		name    string
		entries []*ratelimitv3.RateLimitDescriptor_Entry
		limit   uint32
		ttl     time.Duration
		key     string
	}{
		{"the domain", entries("request_id", "r1"), 100, time.Minute, ""},
		{"a tenant", entries("tenant", "acme", "request_id", "r1"), 5, 30 * time.Second, "acme"},
		{"a tenant's route", entries("tenant", "acme", "route", "r", "request_id", "r1"), 2, time.Minute, "\x04acme\x01r"},
		{"a shared pool", entries("shared", "pool-7", "request_id", "r1"), 3, time.Minute, "pool-*"},
	} {
		i, key, found := c.Match("inflight", tc.entries, []byte("prefix"))
		if i < 0 || !found {
			t.Errorf("%s: no rule", tc.name)
			continue
		}
		r := c.Rules()[i]
		if !r.Concurrency || r.RequestsPerUnit != tc.limit || r.LeaseTTL != tc.ttl || r.Unit != 0 {
			t.Errorf("%s: rule %+v", tc.name, r)
		}
		if string(key) != "prefix"+tc.key {
			t.Errorf("%s: key %q, want %q", tc.name, key, "prefix"+tc.key)
		}
		if got := rlsconfig.RequestID(tc.entries); got != "r1" {
			t.Errorf("%s: request id %q", tc.name, got)
		}
		if l, ok := r.Limit(); !ok || l.Limit != int64(tc.limit) || l.Validate() != nil {
			t.Errorf("%s: limit %+v %v", tc.name, l, ok)
		}
	}
	// Two requests of one tenant share a key; two tenants do not.
	_, k1, _ := c.Match("inflight", entries("tenant", "acme", "request_id", "r1"), nil)
	_, k2, _ := c.Match("inflight", entries("tenant", "acme", "request_id", "r2"), nil)
	_, k3, _ := c.Match("inflight", entries("tenant", "other", "request_id", "r1"), nil)
	if string(k1) != string(k2) || string(k1) == string(k3) {
		t.Errorf("keys %q %q %q", k1, k2, k3)
	}

	head := "domain: d\ndescriptors:\n  - key: k\n"
	for _, tc := range []struct{ yaml, want string }{
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, unit: second}\n", "x.yaml:4:60: a concurrency rule has no unit: requests_per_unit is the requests in flight at once"},
		{"    rate_limit: {count: concurrency, unlimited: true}\n", "x.yaml:4:25: a concurrency rule cannot be unlimited: it limits requests in flight"},
		{"    rate_limit: {count: concurrency}\n", "x.yaml:4:17: a concurrency rule needs requests_per_unit of at least 1: the requests in flight at once"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 0}\n", "x.yaml:4:57: a concurrency rule needs requests_per_unit of at least 1: the requests in flight at once"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, charge: true}\n", "x.yaml:4:68: a concurrency rule cannot charge: a request holds one lease, whatever its cost"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, algorithm: fixed}\n", "x.yaml:4:71: a concurrency rule has no window: remove algorithm"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, overridable: true, name: x}\n", "x.yaml:4:73: a concurrency rule cannot be overridable in an envoyproxy/ratelimit file: use a count: concurrency bucket of the rules file for per-tenant limits"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, lease_ttl: 500ms}\n", "x.yaml:4:71: rate_limit.lease_ttl must be a duration of whole seconds from 1s to 24h0m0s (e.g. 60s, 5m), not '500ms'"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, lease_ttl: 25h}\n", "x.yaml:4:71: rate_limit.lease_ttl must be a duration of whole seconds from 1s to 24h0m0s (e.g. 60s, 5m), not '25h'"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5, lease_ttl: soon}\n", "x.yaml:4:71: rate_limit.lease_ttl must be a duration of whole seconds from 1s to 24h0m0s (e.g. 60s, 5m), not 'soon'"},
		{"    rate_limit: {unit: second, requests_per_unit: 5, lease_ttl: 10s}\n", "x.yaml:4:65: only a concurrency rule (count: concurrency) has leases: remove lease_ttl"},
		{"    rate_limit: {count: parallel, unit: second, requests_per_unit: 5}\n", "x.yaml:4:25: rate_limit.count must be requests or concurrency, not 'parallel'"},
		{"    value: v\n    rate_limit: {count: concurrency, requests_per_unit: 5}\n", "x.yaml:3:5: a concurrency rule's descriptor is the request id (e.g. key: request_id from x-request-id): give it no value"},
		{"    rate_limit: {count: concurrency, requests_per_unit: 5}\n    descriptors: [{key: x}]\n", "x.yaml:3:5: a concurrency rule's descriptor is the request id, the descriptor's last entry: nothing may be below it"},
	} {
		got := problemsOf(t, []rlsconfig.File{file("x.yaml", head+tc.yaml)}, rlsconfig.Options{})
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%q:\n got %q\nwant %q", tc.yaml, got, tc.want)
		}
	}
	// count: requests is the default, written out.
	c = mustParse(t, rlsconfig.Options{}, file("x.yaml", head+"    rate_limit: {count: requests, unit: second, requests_per_unit: 5}\n"))
	if r := c.Rules()[0]; r.Concurrency || r.Unit != rlsconfig.Second {
		t.Errorf("count: requests: %+v", r)
	}
}
