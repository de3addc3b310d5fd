package rlsconfig_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// The conformance cases of docs/envoyproxy-ratelimit.md §6; each test
// name carries its case number.

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	out := make([]*ratelimitv3.RateLimitDescriptor_Entry, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func testdata(t *testing.T, names ...string) []rlsconfig.File {
	t.Helper()
	var fs []rlsconfig.File
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, rlsconfig.File{Name: n, Data: b})
	}
	return fs
}

func mustParse(t *testing.T, opts rlsconfig.Options, files ...rlsconfig.File) *rlsconfig.Config {
	t.Helper()
	c, err := rlsconfig.Parse(files, opts)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func problemsOf(t *testing.T, files []rlsconfig.File, opts rlsconfig.Options) []string {
	t.Helper()
	c, err := rlsconfig.Parse(files, opts)
	if err == nil {
		t.Fatalf("Parse accepted it: %d rules", len(c.Rules()))
	}
	if c != nil {
		t.Errorf("Parse returned a Config with its problems")
	}
	ps, ok := problem.As(err)
	if !ok {
		t.Fatalf("Parse error %v is not problem.List", err)
	}
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

func file(name, yaml string) rlsconfig.File {
	return rlsconfig.File{Name: name, Data: []byte(yaml)}
}

func TestConformanceParseProblems(t *testing.T) {
	basic := testdata(t, "basic_config.yaml")[0]
	for _, tc := range []struct {
		name  string
		files []rlsconfig.File
		merge bool
		want  []string // every problem, in order
	}{
		{"case1_bad_yaml", []rlsconfig.File{file("bad_yaml.yaml", "domain: test-domain\ndescriptors: \"\n")},
			false, []string{"bad_yaml.yaml: error loading config file: yaml: line 2: found unexpected end of stream"}},
		{"case2_misspelled_ratelimit", []rlsconfig.File{file("misspelled_key.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n")},
			false, []string{"misspelled_key.yaml:4:5: config error, unknown key 'ratelimit'"}},
		{"case2_misspelled_requestsperunit", []rlsconfig.File{file("misspelled_key2.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n")},
			false, []string{"misspelled_key2.yaml:6:7: config error, unknown key 'requestsperunit'"}},
		{"case3_non_string_key", []rlsconfig.File{file("non_string_key.yaml", "0.25: test-domain\ndescriptors: []\n")},
			false, []string{`non_string_key.yaml:1:1: config error, key is not of type string: "0.25"`, "non_string_key.yaml:1:1: config file cannot have empty domain"}},
		{"case4_non_map_list", []rlsconfig.File{file("non_map_list.yaml", "domain: test-domain\ndescriptors:\n  - a\n")},
			false, []string{`non_map_list.yaml:3:5: config error, yaml file contains list of type other than map: "a"`}},
		{"case5_empty_domain", []rlsconfig.File{file("empty_domain.yaml", "domain: \"\"\ndescriptors: []\n")},
			false, []string{"empty_domain.yaml:1:1: config file cannot have empty domain"}},
		{"case5_empty_file", []rlsconfig.File{file("empty.yaml", "")},
			false, []string{"empty.yaml: config file cannot have empty domain"}},
		{"case6_duplicate_domain", []rlsconfig.File{basic, file("duplicate_domain.yaml", "domain: test-domain\n")},
			false, []string{"duplicate_domain.yaml:1:1: duplicate domain 'test-domain' in config file"}},
		{"case6_duplicate_domain_order_by_name", []rlsconfig.File{file("b.yaml", "domain: d\n"), file("a.yaml", "domain: d\n")},
			false, []string{"b.yaml:1:1: duplicate domain 'd' in config file"}},
		{"case7_duplicate_key", []rlsconfig.File{file("duplicate_key.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")},
			false, []string{"duplicate_key.yaml:6:5: duplicate descriptor composite key 'test-domain.key1_value1'"}},
		{"case7_duplicate_key_merged", []rlsconfig.File{
			file("m1.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: second, requests_per_unit: 5}\n"),
			file("m2.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: second, requests_per_unit: 7}\n")},
			true, []string{"m2.yaml:3:5: duplicate descriptor composite key 'test-domain.key1_value1'"}},
		{"case7_composite_key_of_key_and_value", []rlsconfig.File{file("c.yaml", "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n")},
			false, []string{"c.yaml:4:5: duplicate descriptor composite key 'd.a_b'"}},
		{"case8_bad_unit", []rlsconfig.File{file("badunit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n")},
			false, []string{"badunit.yaml:5:7: invalid rate limit unit 'foo'"}},
		{"case8_missing_unit", []rlsconfig.File{file("nounit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n")},
			false, []string{"nounit.yaml:5:7: invalid rate limit unit ''"}},
		{"case9_unlimited_with_unit", []rlsconfig.File{file("unlimited_with_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n")},
			false, []string{"unlimited_with_unit.yaml:6:7: should not specify rate limit unit when unlimited"}},
		{"case10_replaces_self", []rlsconfig.File{file("replaces_self.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces: [{name: self}]\n      name: self\n      unit: day\n      requests_per_unit: 1\n")},
			false, []string{"replaces_self.yaml:5:18: replaces should not contain name of same descriptor"}},
		{"case10_replaces_empty", []rlsconfig.File{file("replaces_empty.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: x\n      unit: day\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n        - {}\n")},
			false, []string{"replaces_empty.yaml:9:11: should not have an empty replaces entry", "replaces_empty.yaml:10:11: should not have an empty replaces entry"}},
		{"case11_empty_key", []rlsconfig.File{file("empty_key.yaml", "domain: d\ndescriptors:\n  - key: \"\"\n    rate_limit: {unit: day, requests_per_unit: 1}\n")},
			false, []string{"empty_key.yaml:3:5: descriptor has empty key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, tc.files, rlsconfig.Options{MergeDomains: tc.merge})
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// Case 6, merge on: one domain from two files.
func TestConformanceCase6DomainMerge(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{MergeDomains: true},
		file("merge_domain_key1.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"),
		file("merge_domain_key2.yaml", "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n"))
	if d := c.Domains(); len(d) != 1 || d[0] != "test-domain" {
		t.Fatalf("domains %v", d)
	}
	expectRule(t, c, "test-domain", entries("key1", "value1"), 10, rlsconfig.Minute, "test-domain.key1_value1")
	expectRule(t, c, "test-domain", entries("key2", "value2"), 20, rlsconfig.Minute, "test-domain.key2_value2")
}

func expectRule(t *testing.T, c *rlsconfig.Config, domain string, es []*ratelimitv3.RateLimitDescriptor_Entry, rpu uint32, u rlsconfig.Unit, stats string) rlsconfig.Rule {
	t.Helper()
	i, _, found := c.Match(domain, es, nil)
	if !found {
		t.Fatalf("%s %v: domain not found", domain, es)
	}
	if i < 0 {
		t.Fatalf("%s %v: no rule, want %d/%s", domain, es, rpu, u)
	}
	r := c.Rules()[i]
	if r.RequestsPerUnit != rpu || r.Unit != u || r.StatsKey != stats {
		t.Errorf("%s %v: %d/%s %q, want %d/%s %q", domain, es, r.RequestsPerUnit, r.Unit, r.StatsKey, rpu, u, stats)
	}
	return r
}

func expectNone(t *testing.T, c *rlsconfig.Config, domain string, es []*ratelimitv3.RateLimitDescriptor_Entry) {
	t.Helper()
	key := []byte("prefix")
	i, out, found := c.Match(domain, es, key)
	if !found {
		t.Fatalf("%s %v: domain not found", domain, es)
	}
	if i >= 0 {
		r := c.Rules()[i]
		t.Errorf("%s %v: rule %q (%d/%s), want none", domain, es, r.StatsKey, r.RequestsPerUnit, r.Unit)
	}
	if string(out) != "prefix" {
		t.Errorf("%s %v: key %q after no match, want it unchanged", domain, es, out)
	}
}

func TestConformanceBasicLookup(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "basic_config.yaml")...)
	const d = "test-domain"
	t.Run("case12_key_only_at_level2", func(t *testing.T) {
		expectRule(t, c, d, entries("key1", "value1", "subkey1", "something"), 5, rlsconfig.Second, "test-domain.key1_value1.subkey1")
	})
	t.Run("case13_exact_beats_key_only", func(t *testing.T) {
		expectRule(t, c, d, entries("key1", "value1", "subkey1", "subvalue1"), 10, rlsconfig.Second, "test-domain.key1_value1.subkey1_subvalue1")
	})
	t.Run("case14_level_without_limit", func(t *testing.T) {
		expectNone(t, c, d, entries("key1", "value1"))
		expectNone(t, c, d, entries("key1", "something"))
	})
	t.Run("case15_key_only_exact_whitelist", func(t *testing.T) {
		expectRule(t, c, d, entries("key2", "something"), 20, rlsconfig.Minute, "test-domain.key2")
		expectRule(t, c, d, entries("key2", "value2"), 30, rlsconfig.Minute, "test-domain.key2_value2")
		expectNone(t, c, d, entries("key2", "value3"))
	})
	t.Run("case16_depth_must_match_no_backtracking", func(t *testing.T) {
		expectNone(t, c, d, entries("key2", "value2", "subkey", "subvalue"))
		expectNone(t, c, d, entries("key5", "value5", "subkey5", "subvalue"))
		expectRule(t, c, d, entries("key5", "value5"), 15, rlsconfig.Day, "test-domain.key5_value5")
		expectRule(t, c, d, entries("key5", "value5", "subkey5", "subvalue5"), 25, rlsconfig.Day, "test-domain.key5_value5.subkey5_subvalue5")
	})
	t.Run("case17_name", func(t *testing.T) {
		if r := expectRule(t, c, d, entries("key4", "foo"), 1, rlsconfig.Day, "test-domain.key4"); r.Name != "key4_rate_limit" {
			t.Errorf("name %q", r.Name)
		}
		if r := expectRule(t, c, d, entries("key3", "foo"), 1, rlsconfig.Hour, "test-domain.key3"); r.Name != "" {
			t.Errorf("name %q", r.Name)
		}
	})
	t.Run("case18_unlimited", func(t *testing.T) {
		i, _, _ := c.Match(d, entries("key6", "foo"), nil)
		if i < 0 || !c.Rules()[i].Unlimited {
			t.Fatalf("key6: rule %d, want the unlimited rule", i)
		}
		if _, ok := c.Rules()[i].Limit(); ok {
			t.Error("an unlimited rule has a counter limit")
		}
	})
	// Upstream's detailed_metric stats key is built from the request's
	// values ("test-domain.key7_unspecified_value"); here stats keys come
	// from the configuration only, so that no request value reaches a
	// metric label: the limit matches, the stats key is the rule's.
	t.Run("case19_detailed_metric_limit", func(t *testing.T) {
		expectRule(t, c, d, entries("key7", "unspecified_value"), 70, rlsconfig.Minute, "test-domain.key7")
	})
	t.Run("case20_unknown_domain_and_zero_entries", func(t *testing.T) {
		if i, out, found := c.Match("foo_domain", nil, []byte("k")); found || i != -1 || string(out) != "k" {
			t.Errorf("foo_domain: %d %q %v, want -1, unchanged key, not found", i, out, found)
		}
		if i, out, found := c.Match(d, nil, []byte("k")); !found || i != -1 || string(out) != "k" {
			t.Errorf("zero entries: %d %q %v, want -1, unchanged key, found", i, out, found)
		}
	})
	t.Run("case_matching_is_case_sensitive", func(t *testing.T) {
		expectNone(t, c, d, entries("KEY2", "value2"))
		expectRule(t, c, d, entries("key2", "VALUE2"), 20, rlsconfig.Minute, "test-domain.key2")
	})
}

func TestConformanceWildcards(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "wildcard.yaml")...)
	const d = "test-domain"
	t.Run("case21_trailing_wildcard", func(t *testing.T) {
		r1, k1, _ := c.Match(d, entries("wild", "foo1"), nil)
		r2, k2, _ := c.Match(d, entries("wild", "foo2"), nil)
		if r1 < 0 || r1 != r2 {
			t.Fatalf("foo1 → %d, foo2 → %d: want one rule", r1, r2)
		}
		if s := c.Rules()[r1].StatsKey; s != "test-domain.wild_foo*" {
			t.Errorf("stats key %q", s)
		}
		if string(k1) == string(k2) {
			t.Errorf("foo1 and foo2 share counter key %q without share_threshold", k1)
		}
		expectNone(t, c, d, entries("wild", "bar"))
		expectNone(t, c, d, entries("noWild", "foo1"))
		expectRule(t, c, d, entries("noVal", "anything"), 20, rlsconfig.Minute, "test-domain.noVal")
	})
	t.Run("case22_nested_wildcard", func(t *testing.T) {
		expectRule(t, c, d, entries("nestedWild", "val1", "wild", "goo2"), 20, rlsconfig.Minute, "test-domain.nestedWild_val1.wild_goo*")
		expectNone(t, c, d, entries("nestedWild", "val1", "wild", "foo2"))
	})
	t.Run("case23_mid_and_multi_wildcards", func(t *testing.T) {
		for _, v := range []string{"barab", "bar123b", "barb"} {
			expectRule(t, c, d, entries("midWild", v), 20, rlsconfig.Minute, "test-domain.midWild_bar*b")
		}
		for _, v := range []string{"bara", "xbarb", "bar"} {
			expectNone(t, c, d, entries("midWild", v))
		}
		for _, v := range []string{"foo123bar456baz", "foobarbaz"} {
			expectRule(t, c, d, entries("multiWild", v), 20, rlsconfig.Minute, "test-domain.multiWild_foo*bar*baz")
		}
		for _, v := range []string{"foo123baz", "bar456baz", "foobazbar"} {
			expectNone(t, c, d, entries("multiWild", v))
		}
	})
	t.Run("case_star_matches_empty", func(t *testing.T) {
		c := mustParse(t, rlsconfig.Options{}, file("star.yaml", "domain: s\ndescriptors:\n  - key: k\n    value: \"*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
		expectRule(t, c, "s", entries("k", ""), 1, rlsconfig.Second, "s.k_*")
		expectRule(t, c, "s", entries("k", "x"), 1, rlsconfig.Second, "s.k_*")
	})
	t.Run("case_wildcard_precedence_file_order", func(t *testing.T) {
		c := mustParse(t, rlsconfig.Options{}, file("order.yaml", "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: k\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: k\n    value: ab*\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: k\n    value: abc\n    rate_limit: {unit: second, requests_per_unit: 9}\n"))
		expectRule(t, c, "s", entries("k", "abc"), 9, rlsconfig.Second, "s.k_abc") // exact first
		expectRule(t, c, "s", entries("k", "abd"), 2, rlsconfig.Second, "s.k_a*")  // first wildcard in file order
		expectRule(t, c, "s", entries("k", "zzz"), 3, rlsconfig.Second, "s.k")     // then key only
	})
}

func TestConformanceCase24ShareThreshold(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "share_threshold.yaml")...)
	const d = "share-threshold"
	ra, ka, _ := c.Match(d, entries("files", "files/a.pdf"), nil)
	rb, kb, _ := c.Match(d, entries("files", "files/b.csv"), nil)
	if ra < 0 || ra != rb || string(ka) != string(kb) {
		t.Errorf("share_threshold: %d %q and %d %q, want one rule and one counter key", ra, ka, rb, kb)
	}
	r := c.Rules()[ra]
	if l, ok := r.Limit(); !ok || l.Limit != 10 || l.ScaleMS != 3_600_000 {
		t.Errorf("limit %+v %v, want 10 per hour", l, ok)
	}
	na, kna, _ := c.Match(d, entries("files_no_share", "files_no_share/x"), nil)
	nb, knb, _ := c.Match(d, entries("files_no_share", "files_no_share/y"), nil)
	if na < 0 || na != nb || string(kna) == string(knb) {
		t.Errorf("no share_threshold: %d %q and %d %q, want one rule, two counter keys", na, kna, nb, knb)
	}
	// share_threshold needs a wildcard value.
	got := problemsOf(t, []rlsconfig.File{file("s.yaml", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n")}, rlsconfig.Options{})
	if want := "s.yaml:5:5: share_threshold can only be used with wildcard values (containing '*'), but found key 'k_v'"; len(got) != 1 || got[0] != want {
		t.Errorf("problems %q, want %q", got, want)
	}
}

// Cases 25-26: detailed_metric is accepted and validated; the stats key
// is the configuration's (nested.key-1 …), never request values.
func TestConformanceCases25and26DetailedMetric(t *testing.T) {
	for _, detailed := range []string{"true", "false"} {
		c := mustParse(t, rlsconfig.Options{}, file("nested.yaml", "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: "+detailed+"\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    descriptors:\n      - key: key-2\n        detailed_metric: "+detailed+"\n        rate_limit: {unit: minute, requests_per_unit: 5}\n"))
		expectRule(t, c, "nested", entries("key-1", "value-1"), 100, rlsconfig.Minute, "nested.key-1")
		expectRule(t, c, "nested", entries("key-1", "value-1", "key-2", "value-2"), 5, rlsconfig.Minute, "nested.key-1.key-2")
	}
	got := problemsOf(t, []rlsconfig.File{file("n.yaml", "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: maybe\n")}, rlsconfig.Options{})
	if want := "n.yaml:4:22: error loading config file: cannot unmarshal \"maybe\" into bool"; len(got) != 1 || got[0] != want {
		t.Errorf("problems %q, want %q", got, want)
	}
}

// Case 27: a descriptor-supplied limit counts in its domain's bucket for
// the unit, keyed by the entries; it needs the domain configured.
func TestConformanceCase27LimitOverride(t *testing.T) {
	c := mustParse(t, rlsconfig.Options{}, testdata(t, "basic_config.yaml")...)
	es := entries("key1", "value1", "subkey1", "something")
	day, ok := c.LimitBucket("test-domain", rlsconfig.Day)
	if !ok {
		t.Fatal("no DAY limit bucket for test-domain")
	}
	hour, _ := c.LimitBucket("test-domain", rlsconfig.Hour)
	if day == hour {
		t.Error("DAY and HOUR share a bucket")
	}
	lb := c.LimitBuckets()[day]
	if lb.Domain != "test-domain" || lb.Unit != rlsconfig.Day || lb.Bucket != "rls-limit/test-domain/DAY" {
		t.Errorf("bucket %+v", lb)
	}
	k1 := rlsconfig.AppendKey(es, nil)
	k2 := rlsconfig.AppendKey(es, nil)
	if string(k1) != string(k2) {
		t.Error("AppendKey is not deterministic")
	}
	if string(rlsconfig.AppendKey(entries("key1", "value1", "subkey1", "somethin"), nil)) == string(k1) {
		t.Error("different entries, one key")
	}
	if _, ok := c.LimitBucket("foo_domain", rlsconfig.Day); ok {
		t.Error("a limit bucket for an unconfigured domain")
	}
	if _, ok := c.LimitBucket("test-domain", 0); ok {
		t.Error("a limit bucket for unit UNKNOWN")
	}
	if _, ok := c.LimitBucket("test-domain", 8); ok {
		t.Error("a limit bucket for unit 8")
	}
}

func TestUnitsAndBounds(t *testing.T) {
	for _, tc := range []struct {
		unit string
		u    rlsconfig.Unit
		s    int64
	}{{"second", rlsconfig.Second, 1}, {"MINUTE", rlsconfig.Minute, 60}, {"Hour", rlsconfig.Hour, 3600}, {"day", rlsconfig.Day, 86400}, {"week", rlsconfig.Week, 604800}} {
		c := mustParse(t, rlsconfig.Options{DefaultAlgorithm: counter.Sliding}, file("u.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+tc.unit+", requests_per_unit: 7}\n"))
		r := c.Rules()[0]
		l, ok := r.Limit()
		if r.Unit != tc.u || r.Unit.Seconds() != tc.s || !ok || l.ScaleMS != tc.s*1000 || l.Limit != 7 || l.Algorithm != counter.Sliding {
			t.Errorf("%s: %v %d %+v", tc.unit, r.Unit, r.Unit.Seconds(), l)
		}
	}
	if rlsconfig.Month.Seconds() != 2592000 || rlsconfig.Year.Seconds() != 31536000 || rlsconfig.Unit(0).Seconds() != 0 || rlsconfig.Unit(0).String() != "Unit(0)" {
		t.Error("unit table")
	}
	// Windows and limits past what the counter keeps are problems naming the bound.
	for _, u := range []rlsconfig.Unit{rlsconfig.Month, rlsconfig.Year} {
		if u.Seconds()*1000 <= counter.MaxScaleMS {
			continue // the counter keeps this window
		}
		got := problemsOf(t, []rlsconfig.File{file("m.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+strings.ToLower(u.String())+", requests_per_unit: 7}\n")}, rlsconfig.Options{})
		if len(got) != 1 || !strings.Contains(got[0], "counter.MaxScaleMS") || !strings.HasPrefix(got[0], "m.yaml:4:18: unit "+u.String()) {
			t.Errorf("%s: %q", u, got)
		}
	}
	got := problemsOf(t, []rlsconfig.File{file("l.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967295}\n")}, rlsconfig.Options{})
	if len(got) != 1 || !strings.Contains(got[0], "counter.MaxLimit") {
		t.Errorf("limit above MaxLimit: %q", got)
	}
	for _, bad := range []string{"-1", "4294967296", "1.5", "abc", "[1]"} {
		got := problemsOf(t, []rlsconfig.File{file("l.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: "+bad+"}\n")}, rlsconfig.Options{})
		if len(got) != 1 || !strings.HasPrefix(got[0], "l.yaml:4:51: ") {
			t.Errorf("requests_per_unit %s: %q", bad, got)
		}
	}
	// 0 is legal: everything is over the limit; no counter limit.
	c := mustParse(t, rlsconfig.Options{}, file("z.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0}\n"))
	if _, ok := c.Rules()[0].Limit(); ok || c.Rules()[0].RequestsPerUnit != 0 {
		t.Error("requests_per_unit 0")
	}
}
