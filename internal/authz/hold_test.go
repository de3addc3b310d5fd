package authz_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

const holdRules = `
buckets:
  db_pool: {count: concurrency, limit: 1, lease_ttl: 1m, key: tenant}
  tokens: {limit: 100, per: 1m, key: tenant, cost: {request_header: x-cost, max: 100}}
  per_request: {limit: 2, per: 1m, key: tenant}
routes:
  - {path: /llm, buckets: [db_pool, tokens, per_request]}
  - {path: /plain, buckets: [per_request]}
  - {path: /gen, buckets: [db_pool, tokens]}
`

// leanCheck checks r on the lean path and returns whether it was allowed
// and the answer's Hold.
func leanCheck(t *testing.T, h *harness, r req) (bool, checkwire.Hold) {
	t.Helper()
	var in checkwire.Request
	if err := in.Decode(h.svc.Decoder(), marshalRequest(t, checkRequest(r))); err != nil {
		t.Fatal(err)
	}
	resp, err := h.svc.CheckWire(context.Background(), &in)
	if err != nil {
		t.Fatal(err)
	}
	return allowed(resp.CheckResponse()), resp.Hold()
}

// A check whose answer Envoy does not take gives back what it reserved
// for the upstream, its lease and the cost it took, and keeps its count
// of one request (it did arrive); a check that reserves nothing holds
// nothing.
func TestCancelledCheckGivesBackReservations(t *testing.T) {
	h := newHarness(t, holdRules)
	llm := func(id, cost string) req {
		return req{path: "/llm", headers: costHeaders("acme", "x-request-id", id, "x-cost", cost)}
	}
	ok, hold := leanCheck(t, h, llm("r1", "100"))
	if !ok || hold == nil {
		t.Fatalf("first check: allowed %v, hold %v", ok, hold)
	}
	hold.Cancel() // its stream was reset before Envoy read the answer

	// The slot and the 100 tokens are free again.
	ok, hold = leanCheck(t, h, llm("r2", "100"))
	if !ok || hold == nil {
		t.Fatalf("after the cancelled check: allowed %v, hold %v; want its lease and cost given back", ok, hold)
	}
	hold.Keep() // read by Envoy: the request goes on
	if ok, _ := leanCheck(t, h, llm("r3", "0")); ok {
		t.Fatal("a second request in flight was allowed: the kept lease was given back")
	}
	if !h.leases.Release(h.id("db_pool"), "acme", "r2") {
		t.Fatal("r2's lease was not held")
	}
	// per_request counted r1 and r2: the cancelled request's count stays.
	if ok, _ := leanCheck(t, h, llm("r4", "0")); ok {
		t.Fatal("a third request of per_request (limit 2) was allowed: the cancelled check's count was given back")
	}
	for _, b := range []string{"db_pool", "tokens"} {
		if got := h.metric("ratelimit_authz_reservations_cancelled_total", "bucket", b); got != 1 {
			t.Errorf("reservations_cancelled_total{bucket=%q} = %v, want 1", b, got)
		}
	}
	h2 := newHarness(t, holdRules)
	if ok, hold := leanCheck(t, h2, req{path: "/plain", headers: tenant("acme")}); !ok || hold != nil {
		t.Errorf("a check of a rate bucket: allowed %v, hold %v; want allowed and nothing held", ok, hold)
	}
}

// On the gRPC port a check whose call was cancelled (or timed out) while
// it was decided is answered with the context's error and gives back what
// it reserved, on both decoders.
func TestCheckCancelledOnTheGRPCPort(t *testing.T) {
	h := newHarness(t, holdRules)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := checkRequest(req{path: "/gen", headers: costHeaders("acme", "x-request-id", "g1", "x-cost", "100")})
	if _, err := h.svc.Check(ctx, r); status.Code(err) != codes.Canceled {
		t.Fatalf("generic Check with its call cancelled: %v, want Canceled", err)
	}
	wire := marshalRequest(t, r)
	handler := checkgrpc.ServiceDesc().Methods[0].Handler
	_, err := handler(h.svc, ctx, func(m any) error { return m.(*checkwire.Request).Decode(h.svc.Decoder(), wire) }, nil)
	if status.Code(err) != codes.Canceled {
		t.Fatalf("lean Check with its call cancelled: %v, want Canceled", err)
	}
	if ok, hold := leanCheck(t, h, req{path: "/gen", headers: costHeaders("acme", "x-request-id", "g2", "x-cost", "100")}); !ok {
		t.Fatal("the cancelled calls held the slot or the tokens")
	} else {
		hold.Keep()
	}
	if got := h.metric("ratelimit_authz_reservations_cancelled_total", "bucket", "db_pool"); got != 2 {
		t.Errorf("reservations_cancelled_total{db_pool} = %v, want 2", got)
	}
}
