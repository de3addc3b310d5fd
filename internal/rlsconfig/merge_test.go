package rlsconfig_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// rulesText renders a Config's rules in file order, one a line, as
// "stats key: requests_per_unit/UNIT name=… shadow" (unlimited: "unlimited").
func rulesText(c *rlsconfig.Config) string {
	var lines []string
	for _, r := range c.Rules() {
		l := r.StatsKey + ": unlimited"
		if !r.Unlimited {
			l = fmt.Sprintf("%s: %d/%s", r.StatsKey, r.RequestsPerUnit, strings.ToUpper(r.Unit.String()))
		}
		if r.Name != "" {
			l += " name=" + r.Name
		}
		if len(r.Replaces) > 0 {
			l += " replaces=" + strings.Join(r.Replaces, ",")
		}
		if r.Shadow {
			l += " shadow"
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "\n")
}

// YAML merge keys and aliases are read as gopkg.in/yaml.v2 v2.4.0,
// envoyproxy/ratelimit's decoder, reads them: each case's rules are what
// upstream's loader makes of the same file (its Dump, in file order). The
// pairs of a merge apply where the << is written, so a key after it
// overrides a merged one and a merge after a key overrides that key; of a
// list of mappings the earlier wins; a rate_limit given by a merge and
// again explicitly combines its fields (upstream decodes both into one
// struct), and a null one drops them.
func TestMergeKeys(t *testing.T) {
	const rl5 = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: second, requests_per_unit: 5, name: five}\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"the issue's file", rl5 + "  - key: b\n    rate_limit: {<<: *rl, requests_per_unit: 9}\n",
			"d.a: 5/SECOND name=five\nd.b: 9/SECOND name=five"},
		{"a merge after a key overrides it", rl5 + "  - key: b\n    rate_limit: {requests_per_unit: 9, <<: *rl}\n",
			"d.a: 5/SECOND name=five\nd.b: 5/SECOND name=five"},
		{"of a list the earlier wins", rl5 + "  - key: b\n    rate_limit: &m {unit: minute, requests_per_unit: 7}\n  - key: c\n    rate_limit: {<<: [*rl, *m]}\n  - key: e\n    rate_limit: {<<: [*m, *rl]}\n",
			"d.a: 5/SECOND name=five\nd.b: 7/MINUTE\nd.c: 5/SECOND name=five\nd.e: 7/MINUTE name=five"},
		{"two merge keys: the later wins", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {<<: {unit: second, requests_per_unit: 1}, <<: {unit: minute}}\n",
			"d.a: 1/MINUTE"},
		{"a merged rate_limit and an explicit one combine", "domain: d\ndescriptors:\n  - &base\n    key: a\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 5, name: n}\n  - <<: *base\n    key: b\n    rate_limit: {requests_per_unit: 9}\n",
			"d.a: 5/SECOND name=n shadow\nd.b: 9/SECOND name=n shadow"},
		{"a null rate_limit drops the merged one", "domain: d\ndescriptors:\n  - &b {key: a, rate_limit: {unit: second, requests_per_unit: 5}}\n  - <<: *b\n    key: b\n    rate_limit: ~\n",
			"d.a: 5/SECOND"},
		{"a merged null drops the one before", "domain: d\ndescriptors:\n  - &b {key: a, rate_limit: ~}\n  - rate_limit: {unit: second, requests_per_unit: 5}\n    <<: *b\n    key: b\n",
			""},
		{"merges of merges", rl5 + "  - key: b\n    rate_limit: &r2 {<<: *rl, requests_per_unit: 2}\n  - key: c\n    rate_limit: {<<: *r2, unit: minute}\n",
			"d.a: 5/SECOND name=five\nd.b: 2/SECOND name=five\nd.c: 2/MINUTE name=five"},
		{"the same mapping twice", rl5 + "  - key: b\n    rate_limit: {<<: [*rl, *rl]}\n",
			"d.a: 5/SECOND name=five\nd.b: 5/SECOND name=five"},
		{"a key merged and written", "domain: d\ndescriptors:\n  - <<: {key: z}\n    key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			"d.a: 1/SECOND"},
		{"children by merge", "domain: d\ndescriptors:\n  - key: a\n    descriptors: &kids\n      - key: x\n        rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    <<: {descriptors: *kids}\n",
			"d.a.x: 1/SECOND\nd.b.x: 1/SECOND"},
		{"at the top level", "descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n<<: {domain: x}\n", "x.a: 1/SECOND"},
		{"in a replaces entry", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{<<: {name: m}}]}\n",
			"d.a: 1/SECOND name=n replaces=m"},
		{"in metadata, with scalar keys", "domain: d\ndescriptors:\n  - key: a\n    metadata: &m {team: x, 7: y}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    metadata: {<<: *m, team: z, deep: {<<: *m}}\n",
			"d.a: 1/SECOND"},
		{"an empty list merges nothing", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {<<: [], unit: second, requests_per_unit: 3}\n",
			"d.a: 3/SECOND"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, rlsconfig.Options{}, file("m.yaml", tc.yaml))
			if got := rulesText(c); got != tc.want {
				t.Errorf("rules:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// Merges upstream refuses are refused, with upstream's text and how to
// fix it, and so is a merge of the mapping it is in.
func TestMergeKeyProblems(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"a scalar", "rate_limit: {<<: 5, unit: second}", "x.yaml:4:22: error loading config file: yaml: map merge requires map or sequence of maps as the value, not \"5\": merge a mapping (<<: *anchor) or a list of them"},
		{"a null", "rate_limit: {<<: ~, unit: second}", "x.yaml:4:22: error loading config file: yaml: map merge requires map or sequence of maps as the value, not \"~\": merge a mapping (<<: *anchor) or a list of them"},
		{"a list of scalars", "rate_limit: {<<: [5], unit: second}", "x.yaml:4:23: error loading config file: yaml: map merge requires map or sequence of maps as the value, not \"5\": merge a mapping (<<: *anchor) or a list of them"},
		{"itself", "<<: &a {<<: *a}", "x.yaml:4:9: error loading config file: a merge (<<) includes the mapping it is in: merge another mapping"},
		{"a quoted << is a key", "rate_limit: {\"<<\": {unit: second}}", "x.yaml:4:18: config error, unknown key '<<'"},
		{"an unknown key in a merged mapping", "rate_limit: {<<: {bogus: 1}, unit: second, requests_per_unit: 1}", "x.yaml:4:23: config error, unknown key 'bogus'"},
		{"a key twice in a merged mapping", "rate_limit: {<<: {unit: second, unit: minute}, requests_per_unit: 1}", "x.yaml:4:37: config error, key 'unit' given twice in rate_limit (first at x.yaml:4:23): remove one (envoyproxy/ratelimit uses the last)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := problemsOf(t, []rlsconfig.File{file("x.yaml", "domain: d\ndescriptors:\n  - key: k\n    "+tc.yaml+"\n")}, rlsconfig.Options{})
			if len(got) == 0 || got[0] != tc.want {
				t.Errorf("problems %q\nwant first %q", got, tc.want)
			}
		})
	}
}
