package rlqs_test

import (
	"testing"
	"time"
)

// costRules maps one shape of bucket ids to a budget of 100 units a
// second at 30 units a request (quota.buckets[].cost).
const costRules = `
buckets:
  tenant_units: {limit: 100, per: 1s, key: tenant}
routes:
  - {path: "/x", buckets: [tenant_units]}
quota:
  domains: [api]
  assignment_ttl: 4s
  buckets:
    - {match: {name: heavy}, bucket: tenant_units, key: tenant, cost: 30}
`

// A mapping entry's cost: every request Envoy reports counts cost units
// in the bucket, and what a participant is assigned is the requests its
// share of the units pays for, rounded down.
func TestStreamCostPerRequest(t *testing.T) {
	h := startTicking(t, costRules, 0, time.Hour) // no tick: reports only
	e := h.open()
	heavy := map[string]string{"name": "heavy", "tenant": "acme"}
	h.clock.Add(100 * time.Millisecond)
	e.report("api", usage{id: heavy, allowed: 1})
	if a := e.one(heavy); a != "tokens 2" {
		t.Fatalf("after 1 request (30 of 100 units): %q, want tokens 2 (70 / 30)", a)
	}
	if c := h.count(0, "acme"); c != 30 {
		t.Fatalf("counted %d units, want 30", c)
	}
	// 90 of 100: one more request would cost 30, beyond what is left.
	e.report("api", usage{id: heavy, allowed: 2})
	if a := e.one(heavy); a != "DENY_ALL" {
		t.Fatalf("after 90 of 100 units: %q, want DENY_ALL", a)
	}
	if c := h.count(0, "acme"); c != 90 {
		t.Fatalf("counted %d units, want 90", c)
	}
	// The next window: 100 units pay for 3 requests; a calm participant
	// (nothing reported) is refilled its share, 3 requests a window.
	h.clock.Set(t0.Add(time.Second + 100*time.Millisecond))
	e.report("api", usage{id: heavy})
	if a := e.one(heavy); a != "tokens 3 refill 3/1s" {
		t.Fatalf("new window: %q, want tokens 3 (100 / 30), refilled 3 a second", a)
	}
}
