package authz_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

const concurrencyRules = `
buckets:
  db_pool: {count: concurrency, limit: 3, lease_ttl: 10s, key: tenant}
  rate: {limit: 100, per: 1s, key: "header:x-user"}
  shadow_pool: {count: concurrency, limit: 1, key: tenant, mode: shadow}
routes:
  - {path: /reports, buckets: [db_pool]}
  - {path: /both, buckets: [db_pool, rate]}
  - {path: /shadow, buckets: [shadow_pool]}
`

func withID(tenantID, requestID string) map[string]string {
	return map[string]string{"x-tenant-id": tenantID, "x-request-id": requestID}
}

// leases returns the leases a response's dynamic metadata records.
func leases(resp *authv3.CheckResponse) map[string]string {
	out := map[string]string{}
	for name, v := range resp.GetDynamicMetadata().GetFields()[accesslog.MetaLeases].GetStructValue().GetFields() {
		out[name] = v.GetStringValue()
	}
	return out
}

// TestConcurrencyLeases: a concurrency bucket admits its limit of
// requests in flight per key, each holding a lease by its request id
// that the dynamic metadata records; the next is denied with 429 at once,
// Retry-After 1 and the policy in concurrent requests; a release lets
// one more in.
func TestConcurrencyLeases(t *testing.T) {
	h := newHarness(t, concurrencyRules)
	for i := range 3 {
		resp := h.check(req{path: "/reports", headers: withID("acme", fmt.Sprint("r", i))})
		hd := responseHeaders(resp)
		if !allowed(resp) || hd["ratelimit-policy"] != `"db_pool";q=3;qu="concurrent-requests"` || hd["ratelimit"] != fmt.Sprintf(`"db_pool";r=%d;t=1`, 2-i) {
			t.Fatalf("request %d: allowed %v, headers %v", i, allowed(resp), hd)
		}
		if got := leases(resp); len(got) != 1 || got["db_pool"] != "acme" {
			t.Fatalf("request %d: leases in metadata %v", i, got)
		}
	}
	resp := h.check(req{path: "/reports", headers: withID("acme", "r3")})
	hd := responseHeaders(resp)
	if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != 429 || hd["retry-after"] != "1" ||
		hd["ratelimit-policy"] != `"db_pool";q=3;qu="concurrent-requests"` ||
		!strings.Contains(resp.GetDeniedResponse().GetBody(), `"error":"concurrency_limited"`) {
		t.Fatalf("fourth in flight: %v %v %q", allowed(resp), hd, resp.GetDeniedResponse().GetBody())
	}
	// Another tenant has its own slots.
	h.expectRun(1, true, req{path: "/reports", headers: withID("other", "o1")})
	if !h.leases.Release(0, "acme", "r1") {
		t.Fatal("the lease of r1 was not held")
	}
	h.expectRun(1, true, req{path: "/reports", headers: withID("acme", "r4")})
	h.expectRun(1, false, req{path: "/reports", headers: withID("acme", "r5")})
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "db_pool", "decision", "denied"); got != 2 {
		t.Errorf("denied %v, want 2", got)
	}
}

// TestConcurrencyWithoutRequestID: a request without a usable request id
// is refused with 400 and holds nothing; in a shadow bucket it is let
// through.
func TestConcurrencyWithoutRequestID(t *testing.T) {
	h := newHarness(t, concurrencyRules)
	for name, hdrs := range map[string]map[string]string{
		"none":     {"x-tenant-id": "acme"},
		"too long": withID("acme", strings.Repeat("x", 129)),
	} {
		resp := h.check(req{path: "/reports", headers: hdrs})
		if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != 400 ||
			!strings.Contains(resp.GetDeniedResponse().GetBody(), "missing_request_id") {
			t.Errorf("%s: %v", name, resp)
		}
	}
	// One id cannot hold two slots.
	h.expectRun(1, true, req{path: "/reports", headers: withID("acme", "same")})
	h.expectRun(1, false, req{path: "/reports", headers: withID("acme", "same")})
	if l, _ := h.leases.InFlight(0, "acme"); l != 1 {
		t.Errorf("%d in flight, want 1", l)
	}
	h.expectRun(3, true, req{path: "/shadow", headers: map[string]string{"x-tenant-id": "acme"}})
	h.expectRun(3, true, req{path: "/shadow", headers: withID("acme", "s1")})
}

// TestConcurrencyLeaseGivenBackOnLaterDenial: a request that a later
// bucket denies holds no lease.
func TestConcurrencyLeaseGivenBackOnLaterDenial(t *testing.T) {
	h := newHarness(t, strings.Replace(concurrencyRules, "limit: 100, per: 1s", "limit: 1, per: 1m", 1))
	h.expectRun(1, true, req{path: "/both", headers: map[string]string{"x-tenant-id": "acme", "x-request-id": "a", "x-user": "u"}})
	for i := range 5 {
		h.expectRun(1, false, req{path: "/both", headers: map[string]string{"x-tenant-id": "acme", "x-request-id": fmt.Sprint("d", i), "x-user": "u"}})
	}
	if l, _ := h.leases.InFlight(0, "acme"); l != 1 {
		t.Fatalf("%d in flight after 5 denials by the rate bucket, want 1", l)
	}
}

// TestConcurrencyManyLeases: a request holding leases of several
// buckets records each in the metadata.
func TestConcurrencyManyLeases(t *testing.T) {
	h := newHarness(t, `
buckets:
  a: {count: concurrency, limit: 3, key: tenant}
  b: {count: concurrency, limit: 3, key: tenant}
  c: {count: concurrency, limit: 3, key: "header:x-user"}
routes:
  - {path: /x, buckets: [a, b, c]}
`)
	resp := h.check(req{path: "/x", headers: map[string]string{"x-tenant-id": "acme", "x-user": "u", "x-request-id": "r"}})
	if got := leases(resp); !allowed(resp) || len(got) != 3 || got["a"] != "acme" || got["b"] != "acme" || got["c"] != "u" {
		t.Fatalf("allowed %v, leases %v", allowed(resp), got)
	}
}

// BenchmarkCheckConcurrency: a check of a concurrency bucket, its lease
// released after it (as the access log does), through the lean decoder.
func BenchmarkCheckConcurrency(b *testing.B) {
	h := newHarness(b, concurrencyRules)
	const n = 1 << 12
	wires, ids := make([][]byte, n), make([]string, n)
	for i := range wires {
		ids[i] = fmt.Sprintf("0f8fad5b-d9cb-469f-a165-%012d", i)
		wires[i] = marshalRequest(b, checkRequest(req{path: "/reports", headers: withID("acme", ids[i])}))
	}
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	var r checkwire.Request
	for b.Loop() {
		if err := r.Decode(h.svc.Decoder(), wires[i%n]); err != nil {
			b.Fatal(err)
		}
		resp, _ := h.svc.CheckWire(ctx, &r)
		if hold := resp.Hold(); hold != nil {
			hold.Keep() // the answer was read, as the lean listener learns
		}
		h.leases.Release(0, "acme", ids[i%n])
		i++
	}
}

// TestConcurrencyTenantOverride: a tenant override of an overridable
// concurrency bucket sets its limit in flight; its window is ignored.
func TestConcurrencyTenantOverride(t *testing.T) {
	h := newHarnessWith(t, `
buckets:
  db_pool: {count: concurrency, limit: 3, key: tenant, overridable: true}
routes:
  - {path: /reports, buckets: [db_pool]}
`, overrides{"big": {0: {Limit: 5, ScaleMS: 60_000}}})
	for i := range 5 {
		h.expectRun(1, true, req{path: "/reports", headers: withID("big", fmt.Sprint("b", i))})
	}
	resp := h.check(req{path: "/reports", headers: withID("big", "b5")})
	if allowed(resp) || responseHeaders(resp)["ratelimit-policy"] != `"db_pool";q=5;qu="concurrent-requests"` {
		t.Fatalf("the sixth of big's: allowed %v, %v", allowed(resp), responseHeaders(resp))
	}
	for i := range 3 {
		h.expectRun(1, true, req{path: "/reports", headers: withID("small", fmt.Sprint("s", i))})
	}
	h.expectRun(1, false, req{path: "/reports", headers: withID("small", "s3")})
}
