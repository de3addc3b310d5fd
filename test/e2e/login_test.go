package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// loginFrom posts a login through Envoy from a loopback source address, so
// Envoy sees (and reports in x-envoy-external-address) a distinct client.
func (s *stack) loginFrom(srcIP, path, account, password string) *response {
	s.t.Helper()
	body := fmt.Sprintf(`{"email":%q,"password":%q}`, account, password)
	return s.send(srcIP, path, "application/json", body, nil)
}

// awayFromMinuteEdge waits past the next minute boundary when fewer than
// 20 s remain in this one: the login windows are one minute long.
func awayFromMinuteEdge() {
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 20*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
}

// TestLoginLockoutThroughEnvoy: the application answers 401, Envoy's access
// log reports it, and after five failures the right password gets 429 until
// the minute ends — per client IP across accounts and per account across
// IPs.
func TestLoginLockoutThroughEnvoy(t *testing.T) {
	s := newStack(t)
	s.startServer(serverBinary(t), serverConfigPath(t))
	awayFromMinuteEdge()

	// Five failures from one IP on five accounts.
	for i := range 5 {
		if r := s.loginFrom("127.0.0.2", "/admin/login", fmt.Sprintf("user%d@example.com", i), "wrong"); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d: status %d %s", i+1, r.status, r.body)
		}
	}
	// The access log is asynchronous: poll with the right password of yet
	// another account until the lock shows (a pass meanwhile is allowed).
	var locked *response
	poll.Until(t, 5*time.Second, 50*time.Millisecond, func() error {
		r := s.loginFrom("127.0.0.2", "/portal/login", "fresh@example.com", "right")
		if r.status != http.StatusTooManyRequests {
			return fmt.Errorf("status %d, want 429", r.status)
		}
		locked = r
		return nil
	})
	retry, err := strconv.Atoi(locked.header.Get("Retry-After"))
	endOfMinute := int(time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)).Seconds()) + 1
	if err != nil || retry < 1 || retry > endOfMinute {
		t.Errorf("retry-after %q, want 1..%d (the end of the minute)", locked.header.Get("Retry-After"), endOfMinute)
	}
	if !strings.Contains(locked.header.Get("Ratelimit-Policy"), `"login_ip";q=5;w=60`) {
		t.Errorf("ratelimit-policy %q", locked.header.Get("Ratelimit-Policy"))
	}
	// Another client IP is not locked.
	if r := s.loginFrom("127.0.0.3", "/admin/login", "fresh@example.com", "right"); r.status != http.StatusOK {
		t.Errorf("other IP: status %d", r.status)
	}

	// Five failures on one account from five IPs lock the account.
	for i := range 5 {
		s.loginFrom(fmt.Sprintf("127.0.1.%d", 10+i), "/portal/login", "Bob@Example.com", "wrong")
	}
	poll.Until(t, 5*time.Second, 50*time.Millisecond, func() error {
		if r := s.loginFrom("127.0.1.99", "/admin/login", " bob@example.com", "right"); r.status != http.StatusTooManyRequests {
			return fmt.Errorf("locked account, right password: status %d, want 429", r.status)
		}
		return nil
	})
	// Envoy shipped only failures: successes were not sent.
	stats := s.envoyStats("ext_authz")
	if stats["http.ingress.ext_authz.denied"] < 2 {
		t.Errorf("ext_authz stats: %s", formatStats(stats))
	}
}
