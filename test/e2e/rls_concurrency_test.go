package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// Requests in flight through Envoy's ratelimit filter, as shipped: route
// inflight of envoy/ratelimit-rls.yaml with config/rls/config/inflight.yaml
// (5 of a tenant at once; a request-phase descriptor acquires a lease
// keyed by x-request-id, the stream-done one, is_negative_hits, releases
// it).

const (
	rlsInflightPath   = "/v1/reports"
	rlsInflightBucket = "rls/inflight/tenant/request_id"
	rlsInflightLimit  = 5
)

// rlsInflightSeries is a series of the shipped concurrency rule's bucket.
func rlsInflightSeries(name, decision string) string {
	if decision == "" {
		return fmt.Sprintf(`%s{bucket=%q}`, name, rlsInflightBucket)
	}
	return fmt.Sprintf(`%s{bucket=%q,decision=%q}`, name, rlsInflightBucket, decision)
}

// TestRLSConcurrencyThroughEnvoy, on both ports: a tenant limited to 5
// requests in flight sends 20 at once to an upstream that holds every request it
// gets: exactly 5 reach it, the 15 others are answered 429 with
// Retry-After 1 while those 5 are held, and the releases Envoy sends for
// the 15 denied ones free nothing. Forged releases sent to the server
// meanwhile (an id never granted, a held request's id under another
// tenant's key) free nothing either. Once the 5 end, their releases free
// their slots and 5 new ones are held again. Then 20 clients send 400
// more to an upstream holding each 20 ms: the upstream never holds more
// than 5 at once, every admitted request's lease is released (none
// expires), and nothing is left in flight. Envoy's x-ratelimit-* of a
// concurrency status carry the limit without a window.
func TestRLSConcurrencyThroughEnvoy(t *testing.T) { bothPorts(t, testRLSConcurrency) }

func testRLSConcurrency(t *testing.T, lean bool) {
	up := startGatedUpstream(t)
	s := startRLSExamples(t, lean, up.addr)
	metric := func(name, decision string) float64 { return s.serverMetric(rlsInflightSeries(name, decision)) }
	inFlight := func() float64 { return metric("ratelimit_authz_inflight_requests", "") }
	get := func(tenant string) (*response, error) {
		return s.get(s.addrs.Listener, rlsInflightPath, map[string]string{"x-tenant-id": tenant})
	}
	concurrent := func(n int, tenant string) <-chan int {
		out := make(chan int, n)
		for range n {
			go func() {
				r, err := get(tenant)
				if err != nil {
					t.Error(err)
					out <- 0
					return
				}
				if r.status == http.StatusTooManyRequests && r.header.Get("retry-after") != "1" {
					t.Errorf("429 with retry-after %q, want 1", r.header.Get("retry-after"))
				}
				out <- r.status
			}()
		}
		return out
	}

	up.close()
	statuses := concurrent(20, "acme")
	for denied := 0; denied < 15; denied++ {
		select {
		case st := <-statuses:
			if st != http.StatusTooManyRequests {
				t.Fatalf("status %d while the upstream holds every admitted request: only 429s can finish", st)
			}
		case <-time.After(processLifetime(t)):
			t.Fatalf("%d 429s, want 15", denied)
		}
	}
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held, _ := up.holding(); held != rlsInflightLimit {
			return fmt.Errorf("the upstream holds %d, want %d", held, rlsInflightLimit)
		}
		return nil
	})
	// Envoy releases the 15 denied requests too: they name no lease.
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := metric("ratelimit_authz_rls_descriptors_total", "negative"); n != 15 {
			return fmt.Errorf("%v releases of denied requests read, want 15", n)
		}
		return nil
	})
	// Forged releases on the server's gRPC port: an id never granted, and
	// a held request's id under another tenant's key.
	ids := up.heldIDs()
	forge(t, s.addrs.Authz[0], releaseDesc("acme", "forged-id"), releaseDesc("other-tenant", ids[0]))
	if v := inFlight(); v != rlsInflightLimit {
		t.Fatalf("%v in flight after the denied requests' and the forged releases, want %d", v, rlsInflightLimit)
	}
	if r, err := get("acme"); err != nil || r.status != http.StatusTooManyRequests {
		t.Fatalf("after the forged releases: %v %v, want 429", r, err)
	}
	up.open()
	for range rlsInflightLimit {
		if st := <-statuses; st != http.StatusOK {
			t.Fatalf("an admitted request ended with %d", st)
		}
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := inFlight(); v != 0 {
			return fmt.Errorf("%v in flight after every request ended", v)
		}
		return nil
	})
	// A replayed release of a finished request frees nothing of the next.
	forge(t, s.addrs.Authz[0], releaseDesc("acme", ids[0]))
	up.close()
	statuses = concurrent(rlsInflightLimit, "acme")
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held, _ := up.holding(); held != rlsInflightLimit {
			return fmt.Errorf("the upstream holds %d, want %d: the slots did not come back", held, rlsInflightLimit)
		}
		return nil
	})
	if v := inFlight(); v != rlsInflightLimit {
		t.Fatalf("%v in flight, want %d", v, rlsInflightLimit)
	}
	up.open()
	for range rlsInflightLimit {
		if st := <-statuses; st != http.StatusOK {
			t.Fatalf("status %d after the slots came back", st)
		}
	}

	// 400 more from 20 clients, each held 20 ms.
	up.hold = 20 * time.Millisecond
	ok, limited := concurrentLoad(t, 20, 20, func(int) (*response, error) { return get("acme") })
	// What Envoy makes of a concurrency status (a limit without a unit).
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := inFlight(); v != 0 {
			return fmt.Errorf("%v in flight after the load", v)
		}
		return nil
	})
	r, err := get("acme")
	if err != nil || r.status != http.StatusOK {
		t.Fatalf("a request alone: %v %v", r, err)
	}
	// No window: no ";w=" policy (unit UNKNOWN); the slots left; 1 s.
	if l, rem, reset := r.header.Get("x-ratelimit-limit"), r.header.Get("x-ratelimit-remaining"), r.header.Get("x-ratelimit-reset"); l != "5" || rem != "4" || reset != "1" {
		t.Errorf("x-ratelimit-limit %q, x-ratelimit-remaining %q, x-ratelimit-reset %q; want 5, 4, 1", l, rem, reset)
	}
	// Every request's release arrives: the admitted ones free their
	// leases, the denied ones and the 3 forged ones nothing.
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		allowed, denied := metric("ratelimit_authz_rls_descriptors_total", "allowed"), metric("ratelimit_authz_rls_descriptors_total", "denied")
		released, negative := metric("ratelimit_authz_rls_descriptors_total", "released"), metric("ratelimit_authz_rls_descriptors_total", "negative")
		if released != allowed || negative != denied+3 {
			return fmt.Errorf("%v released of %v allowed, %v negative of %v denied + 3 forged", released, allowed, negative, denied)
		}
		return nil
	})
	if v, l := inFlight(), s.serverMetric("ratelimit_authz_inflight_leases"); v != 0 || l != 0 {
		t.Errorf("%v in flight, %v leases after every request ended", v, l)
	}
	if exp := s.serverMetric("ratelimit_authz_inflight_leases_expired_total"); exp != 0 {
		t.Errorf("%v leases expired: releases were lost", exp)
	}
	_, maxHeld := up.holding()
	if maxHeld > rlsInflightLimit {
		t.Errorf("the upstream held %d at once, limit %d", maxHeld, rlsInflightLimit)
	}
	t.Logf("400 requests from 20 clients: %d passed, %d limited; the upstream held at most %d at once; %v acquisitions, %v releases",
		ok, limited, maxHeld, metric("ratelimit_authz_rls_descriptors_total", "allowed"), metric("ratelimit_authz_rls_descriptors_total", "released"))
}

// releaseDesc is the stream-done descriptor of route inflight, as Envoy
// sends it.
func releaseDesc(tenant, id string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{
		Entries:        []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}, {Key: "request_id", Value: id}},
		HitsAddend:     wrapperspb.UInt64(1),
		IsNegativeHits: true,
	}
}

// forge sends releases to the ShouldRateLimit of the server at addr (its
// gRPC port), one call each, as any client reaching the port can.
func forge(t *testing.T, addr string, ds ...*ratelimitv3.RateLimitDescriptor) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	for _, d := range ds {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "inflight", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		cancel()
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("a forged release: %v, %v", resp, err)
		}
	}
}
