package configfile_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

const concurrencyConfig = `
buckets:
  db_pool:
    count: concurrency
    limit: 5
    lease_ttl: 30s
    key: tenant
    overridable: true
  jobs:
    count: concurrency
    limit: 2
    key: path:queue
routes:
  - path: /api/reports
    buckets: [db_pool]
  - path: /api/jobs/{queue}
    buckets: [jobs]
`

func TestParseConcurrencyBuckets(t *testing.T) {
	r, err := configfile.Parse([]byte(concurrencyConfig), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	db, jobs := r.Buckets[0], r.Buckets[1]
	if db.Count != configfile.CountConcurrency || db.Limit.Limit != 5 || db.LeaseTTL != 30*time.Second || !db.HasLimit || !db.Overridable {
		t.Errorf("db_pool: %+v", db)
	}
	if jobs.LeaseTTL != limits.DefaultLeaseTTL || jobs.Limit.ScaleMS != limits.ConcurrencyScaleMS || jobs.OnOverflow != configfile.Deny {
		t.Errorf("jobs: %+v", jobs)
	}
}

func TestParseConcurrencyProblems(t *testing.T) {
	for name, c := range map[string]struct{ bucket, want string }{
		"no limit":           {"count: concurrency\n    key: tenant", "needs a limit"},
		"a window":           {"count: concurrency\n    limit: 3\n    per: 1s\n    key: tenant", "no per or algorithm"},
		"an algorithm":       {"count: concurrency\n    limit: 3\n    algorithm: sliding\n    key: tenant", "no per or algorithm"},
		"on_overflow":        {"count: concurrency\n    limit: 3\n    on_overflow: allow\n    key: tenant", "always denies"},
		"ttl without leases": {"limit: 3\n    per: 1s\n    lease_ttl: 5s\n    key: tenant", "only a bucket with count: concurrency"},
		"ttl too short":      {"count: concurrency\n    limit: 3\n    lease_ttl: 10ms\n    key: tenant", "between 1s and 24h"},
		"ttl not a duration": {"count: concurrency\n    limit: 3\n    lease_ttl: soon\n    key: tenant", "duration"},
	} {
		cfg := "buckets:\n  b:\n    " + c.bucket + "\nroutes:\n  - path: /x\n    buckets: [b]\n"
		_, err := configfile.Parse([]byte(cfg), "c.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want a problem with %q", name, err, c.want)
		}
	}
	// A concurrency bucket cannot take a route default, nor be an RLQS
	// quota's bucket.
	cfg := "buckets:\n  b:\n    count: concurrency\n    limit: 3\n    key: tenant\nroutes:\n  - path: /x\n    buckets: [b]\n    defaults:\n      b: {limit: 5, per: 1s}\n"
	if _, err := configfile.Parse([]byte(cfg), "c.yaml"); err == nil || !strings.Contains(err.Error(), "never used") {
		t.Errorf("route default: %v", err)
	}
	cfg = "buckets:\n  b:\n    count: concurrency\n    limit: 3\n    key: tenant\nroutes:\n  - path: /x\n    buckets: [b]\n    costs: {b: 2}\n"
	if _, err := configfile.Parse([]byte(cfg), "c.yaml"); err == nil || !strings.Contains(err.Error(), "no cost") {
		t.Errorf("route cost: %v", err)
	}
	cfg = "buckets:\n  b:\n    count: concurrency\n    limit: 3\n    key: tenant\n    cost: content_length\nroutes:\n  - path: /x\n    buckets: [b]\n"
	if _, err := configfile.Parse([]byte(cfg), "c.yaml"); err == nil || !strings.Contains(err.Error(), "a cost is for a bucket counting requests") {
		t.Errorf("bucket cost: %v", err)
	}
	cfg = "buckets:\n  b:\n    count: concurrency\n    limit: 3\n    key: tenant\nroutes:\n  - path: /x\n    buckets: [b]\nquota:\n  domains: [d]\n  buckets:\n    - match: {a: b}\n      bucket: b\n      key: t\n"
	if _, err := configfile.Parse([]byte(cfg), "c.yaml"); err == nil || !strings.Contains(err.Error(), "requests in flight") {
		t.Errorf("quota: %v", err)
	}
}
