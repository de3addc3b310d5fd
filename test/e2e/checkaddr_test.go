package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// TestLeanCheckListenerThroughEnvoy: Envoy's ext_authz cluster, its gRPC
// health check included, pointed at --check-addr (the gRPC port is not in
// Envoy's configuration at all): the health check passes, a tenant's
// activities pass up to the limit, and the next gets 429 with Retry-After.
func TestLeanCheckListenerThroughEnvoy(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := prepareStack(t, 1)
	s.startEnvoy()
	s.server = s.logs.start(t, "ratelimit-authz", serverBin, "serve",
		"--config", config,
		"--grpc-addr", s.spare[0],
		"--check-addr", s.addrs.Authz[0],
		"--http-addr", s.httpAddr,
		"--log-level", "debug",
	)
	waitHTTP200(t, s.server, "http://"+s.httpAddr+"/readyz")

	// Envoy's gRPC health check of the cluster passes on the lean listener.
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		st := s.envoyStats(`cluster\.ratelimit_authz\.(health_check\.(success|failure)|membership_healthy)$`)
		if st["cluster.ratelimit_authz.health_check.success"] < 1 || st["cluster.ratelimit_authz.membership_healthy"] != 1 {
			return fmt.Errorf("health check not passing yet: %s", formatStats(st))
		}
		return nil
	})

	b := s.activityBurst("lean-acme", "lean-globex", 0)
	if !b.sameWindow() {
		t.Logf("burst took %v and crossed a second boundary; retrying once", b.end.Sub(b.start))
		b = s.activityBurst("lean-acme2", "lean-globex2", 1)
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
	st := s.envoyStats(`cluster\.ratelimit_authz\.upstream_rq_total$`)
	if st["cluster.ratelimit_authz.upstream_rq_total"] < activityLimit+2 {
		t.Fatalf("Envoy sent %d checks to the lean listener, want at least %d", st["cluster.ratelimit_authz.upstream_rq_total"], activityLimit+2)
	}
}
