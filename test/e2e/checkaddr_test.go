package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// The clusters of the shipped bootstrap as Envoy's stats name them.
const (
	checkClusterStats = "cluster." + envoyconf.ShippedCheckCluster + "."
	grpcClusterStats  = "cluster." + envoyconf.ShippedAuthzCluster + "."
)

// TestLeanCheckListenerThroughEnvoy: the shipped bootstrap as shipped. Its
// ext_authz cluster, gRPC health check included, reaches the server's
// lean Check listener (--check-addr) and its access-log cluster the gRPC
// port: both health checks pass, a tenant's activities pass up to the
// limit, the next gets 429 with Retry-After, and the checks went to the
// lean listener.
func TestLeanCheckListenerThroughEnvoy(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := prepareStack(t, 1)
	if len(s.check) != 1 || s.check[0] == s.addrs.Authz[0] {
		t.Fatalf("stack: lean Check listener %v beside gRPC port %v, want one of its own", s.check, s.addrs.Authz)
	}
	s.startEnvoy()
	s.startServer(serverBin, config)

	// Envoy's gRPC health checks pass on both: the lean listener and the
	// gRPC port each answer grpc.health.v1.
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		st := s.envoyStats(`cluster\.ratelimit_authz(_check)?\.(health_check\.success|membership_healthy)$`)
		for _, c := range []string{checkClusterStats, grpcClusterStats} {
			if st[c+"health_check.success"] < 1 || st[c+"membership_healthy"] != 1 {
				return fmt.Errorf("health checks not passing yet: %s", formatStats(st))
			}
		}
		return nil
	})
	if h := s.checkHealth(t)[s.check[0]]; h != "healthy" {
		t.Fatalf("ext_authz cluster endpoint %s: health %q, want healthy (endpoints %v)", s.check[0], h, s.checkHealth(t))
	}

	burstThrough(t, s, "lean")
	st := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_rq_total$`)
	if got := st[checkClusterStats+"upstream_rq_total"]; got < activityLimit+2 {
		t.Fatalf("Envoy sent %d checks to the lean listener, want at least %d", got, activityLimit+2)
	}
	if got := s.serverMetric(`ratelimit_authz_server_connections_open{listener="check"}`); got < 1 {
		t.Errorf("the server's lean Check listener has %v connections open, want Envoy's", got)
	}
}

// TestCheckOnGRPCPortThroughEnvoy: a server without --check-addr serves
// Check on its gRPC port. The shipped bootstrap rendered with the gRPC
// port as the ext_authz cluster's endpoint (no Check addresses) limits as
// well through the real Envoy.
func TestCheckOnGRPCPortThroughEnvoy(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := prepareStack(t, 1)
	s.check = nil // no lean listener: Envoy checks on the gRPC port
	s.startEnvoy()
	s.startServer(serverBin, config)

	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		if h := s.checkHealth(t)[s.addrs.Authz[0]]; h != "healthy" {
			return fmt.Errorf("ext_authz cluster endpoint %s (the gRPC port): health %q; endpoints %v", s.addrs.Authz[0], h, s.checkHealth(t))
		}
		return nil
	})

	burstThrough(t, s, "grpcport")
	st := s.envoyStats(`cluster\.ratelimit_authz_check\.upstream_rq_total$`)
	if got := st[checkClusterStats+"upstream_rq_total"]; got < activityLimit+2 {
		t.Fatalf("Envoy sent %d checks to the gRPC port, want at least %d", got, activityLimit+2)
	}
	if got := s.serverMetric(`ratelimit_authz_server_connections_open{listener="check"}`); got != 0 {
		t.Errorf("a lean Check listener has %v connections open, want none opened", got)
	}
}

// burstThrough sends a tenant's activity burst through Envoy: the limit's
// worth pass, the next is denied with 429, another tenant passes, and the
// app sees exactly the admitted ones.
func burstThrough(t *testing.T, s *stack, prefix string) {
	t.Helper()
	b := s.activityBurst(prefix+"-acme", prefix+"-globex", 0)
	if !b.sameWindow() {
		t.Logf("burst took %v and crossed a second boundary; retrying once", b.end.Sub(b.start))
		b = s.activityBurst(prefix+"-acme2", prefix+"-globex2", 1)
		if !b.sameWindow() {
			t.Fatalf("burst took %v and crossed a second boundary twice; machine too slow", b.end.Sub(b.start))
		}
	}
	for i, r := range b.admitted {
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200; body %q", i+1, r.status, r.body)
		}
	}
	checkDenied(t, b.over)
	if b.other.status != http.StatusOK {
		t.Fatalf("another tenant: status %d, want 200", b.other.status)
	}
	if b.upstream != activityLimit+1 { // the admitted and the other tenant's
		t.Fatalf("the app saw %d activities, want %d", b.upstream, activityLimit+1)
	}
}
