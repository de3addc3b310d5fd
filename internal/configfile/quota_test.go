package configfile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
)

const quotaBase = `
keys: {account_header: x-acct}
buckets:
  per_tenant: {limit: 100, per: 1s, key: tenant}
  per_channel: {limit: 10, per: 1m, key: "path:channel", algorithm: sliding}
  per_ip: {limit: 5, per: 1s, key: ip}
  per_account: {limit: 5, per: 1s, key: account}
  logins: {limit: 5, per: 1m, key: tenant, count: failures}
  unlimited: {key: tenant}
routes:
  - {method: POST, path: "/x/{channel}", buckets: [per_tenant, per_channel]}
`

func TestQuotaSection(t *testing.T) {
	r, err := configfile.Parse([]byte(quotaBase+`
quota:
  domains: [api, other]
  assignment_ttl: 7s
  abandon_after: 30s
  unmatched: deny
  max_streams: 3
  max_bucket_ids: 9
  buckets:
    - {match: {name: t}, bucket: per_tenant, key: tenant}
    - {match: {name: c, env: prod}, bucket: per_channel, key: channel}
    - {bucket: per_tenant, key: org, cost: 25}
`), "q.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := r.Quota
	if q == nil {
		t.Fatal("no quota section")
	}
	if strings.Join(q.Domains, ",") != "api,other" || q.AssignmentTTL != 7*time.Second || q.AbandonAfter != 30*time.Second ||
		q.Unmatched != configfile.Deny || q.MaxStreams != 3 || q.MaxBucketIDs != 9 {
		t.Errorf("quota: %+v", q)
	}
	if len(q.Buckets) != 3 {
		t.Fatalf("entries: %+v", q.Buckets)
	}
	e := q.Buckets[1]
	if int(e.Bucket) != r.BucketIndex("per_channel") || e.Key != "channel" || len(e.Match) != 2 || e.Match["env"] != "prod" || e.Cost != 1 || e.Line == 0 {
		t.Errorf("entry 1: %+v", e)
	}
	if len(q.Buckets[2].Match) != 0 || q.Buckets[2].Key != "org" || q.Buckets[2].Cost != 25 {
		t.Errorf("entry 2: %+v", q.Buckets[2])
	}
}

func TestQuotaDefaults(t *testing.T) {
	r, err := configfile.Parse([]byte(quotaBase+`
quota:
  domains: [api]
  buckets: [{match: {name: t}, bucket: per_tenant, key: tenant}]
`), "q.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := r.Quota
	if q.AssignmentTTL != configfile.DefaultQuotaAssignmentTTL || q.AbandonAfter != configfile.DefaultQuotaAbandonAfter ||
		q.Unmatched != configfile.Allow || q.MaxStreams != configfile.DefaultQuotaMaxStreams || q.MaxBucketIDs != configfile.DefaultQuotaMaxBucketIDs {
		t.Errorf("defaults: %+v", q)
	}
	// No section: no RLQS.
	r, err = configfile.Parse([]byte(quotaBase), "q.yaml")
	if err != nil || r.Quota != nil {
		t.Fatalf("no quota section: %+v, %v", r.Quota, err)
	}
}

func TestShippedQuota(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	q := r.Quota
	if q == nil || len(q.Domains) != 1 || q.Domains[0] != "example-api" {
		t.Fatalf("shipped quota: %+v", q)
	}
	want := map[string]string{"activity_create": "tenant", "upload": "tenant", "inbound": "channel", "token_generate": "channel"}
	if len(q.Buckets) != len(want) {
		t.Fatalf("entries: %+v", q.Buckets)
	}
	for _, e := range q.Buckets {
		name := r.Buckets[e.Bucket].Name
		if want[name] != e.Key || e.Match["name"] != name || len(e.Match) != 1 {
			t.Errorf("entry for %s: %+v", name, e)
		}
	}
}

func TestQuotaProblems(t *testing.T) {
	for _, tc := range []struct{ name, quota, want string }{
		{"no domains", `{buckets: [{bucket: per_tenant, key: t}]}`, "q.yaml:12:8: quota: no domains"},
		{"no buckets", `{domains: [a]}`, "quota: no buckets"},
		{"empty buckets", `{domains: [a], buckets: []}`, "quota.buckets must be a non-empty list"},
		{"empty domains", `{domains: [], buckets: [{bucket: per_tenant, key: t}]}`, "quota.domains must be a non-empty list"},
		{"domain twice", `{domains: [a, a], buckets: [{bucket: per_tenant, key: t}]}`, `quota.domains: "a" given twice`},
		{"domain space", `{domains: ["a b"], buckets: [{bucket: per_tenant, key: t}]}`, `"a b" must be 1 to 128 printable`},
		{"unknown field", `{domains: [a], buckets: [{bucket: per_tenant, key: t}], ttl: 5s}`, `quota: unknown field "ttl"`},
		{"unknown entry field", `{domains: [a], buckets: [{bucket: per_tenant, key: t, value: x}]}`, `quota.buckets[0]: unknown field "value"`},
		{"unknown bucket", `{domains: [a], buckets: [{bucket: nope, key: t}]}`, `quota.buckets[0].bucket: unknown bucket "nope"`},
		{"no key", `{domains: [a], buckets: [{bucket: per_tenant}]}`, `quota.buckets[0]: no key`},
		{"no bucket", `{domains: [a], buckets: [{key: t}]}`, `quota.buckets[0]: no bucket`},
		{"bad key name", `{domains: [a], buckets: [{bucket: per_tenant, key: "a b"}]}`, `entry name "a b" must be`},
		{"bad match name", `{domains: [a], buckets: [{bucket: per_tenant, key: t, match: {"x/y": v}}]}`, `entry name "x/y" must be`},
		{"empty match value", `{domains: [a], buckets: [{bucket: per_tenant, key: t, match: {n: ""}}]}`, `quota.buckets[0].match.n: the value must be 1 to 256 bytes`},
		{"long match value", `{domains: [a], buckets: [{bucket: per_tenant, key: t, match: {n: ` + strings.Repeat("v", 257) + `}}]}`, `the value must be 1 to 256 bytes`},
		{"key matched", `{domains: [a], buckets: [{bucket: per_tenant, key: n, match: {n: v}}]}`, `entry "n" is both matched and the key`},
		{"same shape", `{domains: [a], buckets: [{bucket: per_tenant, key: t, match: {n: v}}, {bucket: per_channel, key: t, match: {n: v}}]}`, `quota.buckets[1]: matches the same bucket ids as the entry at line 12`},
		{"failures bucket", `{domains: [a], buckets: [{bucket: logins, key: t}]}`, `bucket "logins" counts failures`},
		{"ip bucket", `{domains: [a], buckets: [{bucket: per_ip, key: t}]}`, `bucket "per_ip" is keyed by ip`},
		{"account bucket", `{domains: [a], buckets: [{bucket: per_account, key: t}]}`, `bucket "per_account" is keyed by account`},
		{"no limit", `{domains: [a], buckets: [{bucket: unlimited, key: t}]}`, `bucket "unlimited" has no limit`},
		{"ttl too short", `{domains: [a], assignment_ttl: 10ms, buckets: [{bucket: per_tenant, key: t}]}`, `quota.assignment_ttl must be a duration between 1s and 24h0m0s`},
		{"ttl not whole seconds", `{domains: [a], assignment_ttl: 1500ms, buckets: [{bucket: per_tenant, key: t}]}`, `quota.assignment_ttl 1.5s must be whole seconds`},
		{"abandon not a duration", `{domains: [a], abandon_after: soon, buckets: [{bucket: per_tenant, key: t}]}`, `quota.abandon_after must be a duration`},
		{"unmatched", `{domains: [a], unmatched: maybe, buckets: [{bucket: per_tenant, key: t}]}`, `quota.unmatched must be one of allow, deny`},
		{"max streams", `{domains: [a], max_streams: 0, buckets: [{bucket: per_tenant, key: t}]}`, `quota.max_streams must be between 1 and`},
		{"max bucket ids", `{domains: [a], max_bucket_ids: -1, buckets: [{bucket: per_tenant, key: t}]}`, `quota.max_bucket_ids must be between 1 and`},
		{"not a mapping", `[a]`, `quota must be a mapping`},
		{"cost 0", `{domains: [a], buckets: [{bucket: per_tenant, key: t, cost: 0}]}`, `quota.buckets[0].cost must be between 1 and 2147483647`},
		{"cost negative", `{domains: [a], buckets: [{bucket: per_tenant, key: t, cost: -5}]}`, `quota.buckets[0].cost must be between 1 and 2147483647`},
		{"cost huge", `{domains: [a], buckets: [{bucket: per_tenant, key: t, cost: 2147483648}]}`, `quota.buckets[0].cost must be between 1 and 2147483647`},
		{"cost text", `{domains: [a], buckets: [{bucket: per_tenant, key: t, cost: many}]}`, `quota.buckets[0].cost`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := configfile.Parse([]byte(quotaBase+"quota: "+tc.quota+"\n"), "q.yaml")
			if err == nil {
				t.Fatalf("parsed: %+v", r.Quota)
			}
			if r != nil {
				t.Fatal("rules returned with problems")
			}
			if _, ok := problem.As(err); !ok || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant %q", err, tc.want)
			}
		})
	}
}
