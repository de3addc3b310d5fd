package rls_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

// inflightYAML limits each tenant to 2 requests in flight, the request
// id being the descriptor's last entry, as Envoy sends it from
// x-request-id; and a shadow rule of 1.
const inflightYAML = `inflight.yaml:
domain: inflight
descriptors:
  - key: tenant
    descriptors:
      - key: request_id
        rate_limit: {count: concurrency, requests_per_unit: 2, lease_ttl: 10s, name: per_tenant}
  - key: shadow
    descriptors:
      - key: request_id
        shadow_mode: true
        rate_limit: {count: concurrency, requests_per_unit: 1}
`

// acquire is the request-phase descriptor of a request of tenant; release
// its stream-done twin, as Envoy sends it (hits_addend 1, is_negative_hits).
func acquire(tenant, id string) *ratelimitv3.RateLimitDescriptor {
	return desc("tenant", tenant, "request_id", id)
}

func release(tenant, id string) *ratelimitv3.RateLimitDescriptor {
	return negative(withHits(acquire(tenant, id), 1))
}

// A concurrency rule: a request-phase descriptor acquires a lease keyed
// by its request id, OVER_LIMIT once the tenant has its limit in flight;
// a negative-hits descriptor frees the lease it names, and only a lease
// this service granted: a release of an id never granted, of a denied
// request, of another tenant's key, or one already freed frees nothing.
// A lost release expires after lease_ttl. Both ports (the harness calls
// both) answer alike.
func TestConcurrencyRule(t *testing.T) {
	h := newHarness(t, rls.Settings{}, inflightYAML)
	const ok1, ok0, over = "OK | OK 2/UNKNOWN(per_tenant) 1 1s", "OK | OK 2/UNKNOWN(per_tenant) 0 1s", "OVER_LIMIT | OVER_LIMIT 2/UNKNOWN(per_tenant) 0 1s"
	const released = "OK | OK - 0 -"
	h.run([]step{
		{name: "r1 acquires", domain: "inflight", descs: ds(acquire("acme", "r1")), want: ok1},
		{name: "r1's id again, while it holds a slot", domain: "inflight", descs: ds(acquire("acme", "r1")), want: over},
		{name: "r2 acquires", domain: "inflight", descs: ds(acquire("acme", "r2")), want: ok0},
		{name: "r3: two in flight", domain: "inflight", descs: ds(acquire("acme", "r3")), want: over},
		{name: "another tenant has its own slots", domain: "inflight", descs: ds(acquire("other", "o1")), want: ok1},
		// Envoy releases a denied request too: nothing to free.
		{name: "r3's release", domain: "inflight", descs: ds(release("acme", "r3")), want: released},
		{name: "an id never granted", domain: "inflight", descs: ds(release("acme", "forged")), want: released},
		{name: "r1's id under another tenant", domain: "inflight", descs: ds(release("other", "r1")), want: released},
		{name: "still two in flight", domain: "inflight", descs: ds(acquire("acme", "r4")), want: over},
		{name: "r1 done", domain: "inflight", descs: ds(release("acme", "r1")), want: released},
		{name: "r1 released twice", domain: "inflight", descs: ds(release("acme", "r1")), want: released},
		{name: "a slot is free", domain: "inflight", descs: ds(acquire("acme", "r5")), want: ok0},
		{name: "and only one", domain: "inflight", descs: ds(acquire("acme", "r6")), want: over, after: 10 * time.Second},
		// r2's and r5's releases were lost: their leases expire.
		{name: "after lease_ttl", domain: "inflight", descs: ds(acquire("acme", "r7")), want: ok1},
		{name: "a lease expired is not released", domain: "inflight", descs: ds(release("acme", "r2")), want: released},
		{name: "r7 done", domain: "inflight", descs: ds(release("acme", "r7")), want: released},
	})
	b := h.bucket("inflight", acquire("acme", "x"))
	for dec, want := range map[string]float64{"allowed": 5, "denied": 4, "released": 2, "negative": 5} {
		if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", dec); got != want {
			t.Errorf("%s: %v, want %v", dec, got, want)
		}
	}
	// The sweep Sync.Run makes (an acquisition at the limit sweeps only
	// its key's shard): o1 expired too.
	h.leases.Table().Sweep(h.clock.Now())
	h.leanLeases.Table().Sweep(h.clock.Now())
	if got := h.metric("ratelimit_authz_inflight_requests", "bucket", b); got != 0 {
		t.Errorf("%v requests in flight, want 0", got)
	}
	if got := h.metric("ratelimit_authz_inflight_acquisitions_denied_total", "reason", "request_id"); got != 1 {
		t.Errorf("%v acquisitions denied for a repeated id, want 1", got)
	}
	if got := h.metric("ratelimit_authz_inflight_leases_expired_total"); got != 3 {
		t.Errorf("%v leases expired, want 3 (r2, r5, o1)", got)
	}
}

// A shadow rule answers OK where it would be over and holds nothing for
// the request it would have refused.
func TestConcurrencyRuleShadow(t *testing.T) {
	h := newHarness(t, rls.Settings{}, inflightYAML)
	d := func(id string) *ratelimitv3.RateLimitDescriptor { return desc("shadow", "s", "request_id", id) }
	h.run([]step{
		{name: "s1", domain: "inflight", descs: ds(d("s1")), want: "OK | OK 1/UNKNOWN 0 1s"},
		{name: "s2 over, shadow", domain: "inflight", descs: ds(d("s2")), want: "OK | OK 1/UNKNOWN 0 1s"},
		{name: "s1 done", domain: "inflight", descs: ds(negative(d("s1"))), want: "OK | OK - 0 -"},
		{name: "s3", domain: "inflight", descs: ds(d("s3")), want: "OK | OK 1/UNKNOWN 0 1s"},
	})
	b := h.bucket("inflight", d("x"))
	for dec, want := range map[string]float64{"allowed": 2, "shadow_denied": 1, "released": 1} {
		if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", dec); got != want {
			t.Errorf("%s: %v, want %v", dec, got, want)
		}
	}
}

// A request whose rate rule and concurrency rule both apply: each
// descriptor decides on its own, and a full lease table fails closed.
func TestConcurrencyRuleBesideRates(t *testing.T) {
	h := newHarness(t, rls.Settings{}, inflightYAML, `rate.yaml:
domain: inflight2
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: request_id
        rate_limit: {count: concurrency, requests_per_unit: 5}
`)
	h.run([]step{
		{name: "both fit", domain: "inflight2", descs: ds(desc("tenant", "a"), acquire("a", "q1")), want: "OK | OK 1/SECOND 0 1s; OK 5/UNKNOWN 4 1s"},
		{name: "the rate is spent, the slot taken", domain: "inflight2", descs: ds(desc("tenant", "a"), acquire("a", "q2")), want: "OVER_LIMIT | OVER_LIMIT 1/SECOND 0 1s; OK 5/UNKNOWN 3 1s"},
		{name: "a refill of the rate rule is refused", domain: "inflight2", descs: ds(negative(desc("tenant", "a")), release("a", "q2")), want: "OK | OK - 0 -; OK - 0 -"},
	})
}

// A configuration with a concurrency rule needs a lease table.
func TestConcurrencyRuleNeedsLeases(t *testing.T) {
	c, err := rlsconfig.Parse(files(t, inflightYAML), rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := counter.New(counter.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = rls.New(config(t, c, rls.Settings{}), store, nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), rls.Options{})
	if err == nil || !strings.Contains(err.Error(), "no lease table") {
		t.Fatalf("New without leases: %v", err)
	}
}

// A call whose answer Envoy does not take holds no slot: on the gRPC
// port one cancelled while it was decided is answered with the context's
// error, on the lean path the transport gives back the answer's Hold;
// both release the leases the call acquired, and count them cancelled.
func TestCancelledCallReleasesItsLeases(t *testing.T) {
	h := newHarness(t, rls.Settings{}, inflightYAML)
	h.gRPCOnly()
	call := func(id string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "inflight", Descriptors: ds(acquire("acme", id))}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.svc.ShouldRateLimit(ctx, call("r1")); status.Code(err) != codes.Canceled {
		t.Fatalf("ShouldRateLimit with its call cancelled: %v, want Canceled", err)
	}
	lean := func(id string) (rlsv3.RateLimitResponse_Code, checkwire.Hold) {
		t.Helper()
		in, err := proto.Marshal(call(id))
		if err != nil {
			t.Fatal(err)
		}
		var lr checkwire.RateLimitRequest
		if err := h.svc.RateLimitDecoder().Decode(in, &lr); err != nil {
			t.Fatal(err)
		}
		out, hold, err := h.svc.AppendShouldRateLimit(context.Background(), &lr, nil)
		if err != nil {
			t.Fatal(err)
		}
		var resp rlsv3.RateLimitResponse
		if err := proto.Unmarshal(out[5:], &resp); err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode(), hold
	}
	code, hold := lean("r2")
	if code != rlsv3.RateLimitResponse_OK || hold == nil {
		t.Fatalf("r2: %v, hold %v", code, hold)
	}
	hold.Cancel() // its stream was reset before Envoy read the answer
	for _, id := range []string{"r3", "r4"} {
		if code, hold := lean(id); code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v; the cancelled calls still hold their slots", id, code)
		} else {
			hold.Keep()
		}
	}
	if code, _ := lean("r5"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("r5, a third in flight: %v", code)
	}
	b := h.bucket("inflight", acquire("acme", "x"))
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", "cancelled"); got != 2 {
		t.Errorf("cancelled: %v, want 2", got)
	}
}
