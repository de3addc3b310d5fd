package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

const (
	activitiesPath = "/api/activities"
	activityLimit  = 100 // activity_create per second per tenant in config/ratelimit.yaml
	burstWorkers   = 4
)

// burst is one window's worth of requests to /api/activities.
type burst struct {
	start, end time.Time   // bracket every Check of the burst
	admitted   []*response // the first activityLimit requests of tenant
	over       *response   // request activityLimit+1 of tenant
	other      *response   // one request of another tenant, same window
	upstream   int         // requests that reached the app
}

// sameWindow reports whether every request of the burst fell into one
// wall-clock second, i.e. one fixed window of the server.
func (b *burst) sameWindow() bool {
	return b.start.Truncate(time.Second).Equal(b.end.Truncate(time.Second))
}

// activityBurst waits until just after a second boundary, sends the limit's
// worth of requests for tenant (concurrently), then one more, then one for
// otherTenant.
func (s *stack) activityBurst(tenant, otherTenant string, skipWindows int) *burst {
	s.t.Helper()
	s.up.reset()
	// Align to the wall clock, not a wait for a condition: start 10 ms into
	// a fresh second, skipWindows whole windows later.
	next := time.Now().Truncate(time.Second).Add(time.Duration(1+skipWindows)*time.Second + 10*time.Millisecond)
	time.Sleep(time.Until(next))

	b := &burst{start: time.Now(), admitted: make([]*response, activityLimit)}
	hdr := map[string]string{"x-tenant-id": tenant}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	work := make(chan int)
	for range burstWorkers {
		wg.Go(func() {
			for i := range work {
				r, err := s.post(activitiesPath, hdr)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				}
				b.admitted[i] = r
			}
		})
	}
	for i := range activityLimit {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		s.t.Fatalf("%d of %d requests failed, first: %v", len(errs), activityLimit, errs[0])
	}
	b.over = s.mustPost(activitiesPath, hdr)
	b.other = s.mustPost(activitiesPath, map[string]string{"x-tenant-id": otherTenant})
	b.end = time.Now()
	b.upstream = s.up.count(activitiesPath)
	return b
}

// TestActivityLimitThroughEnvoy: 100 activity creations per second per
// tenant pass with a RateLimit header, the 101st gets 429 with Retry-After,
// the RateLimit fields and a JSON body without reaching the app, and
// another tenant is unaffected.
func TestActivityLimitThroughEnvoy(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := newStack(t)
	s.startServer(serverBin, config)

	before := s.envoyStats("ext_authz")
	b := s.activityBurst("acme", "globex", 0)
	if !b.sameWindow() {
		// A slow machine crossed a second boundary, so the window split the
		// burst. Retry once, leaving a whole window empty so that neither a
		// fixed nor a sliding window carries counts over.
		t.Logf("burst took %v and crossed a second boundary; retrying once", b.end.Sub(b.start))
		before = s.envoyStats("ext_authz")
		b = s.activityBurst("acme", "globex", 1)
		if !b.sameWindow() {
			t.Fatalf("burst took %v and crossed a second boundary twice; machine too slow", b.end.Sub(b.start))
		}
	}
	after := s.envoyStats("ext_authz")
	t.Logf("burst of %d requests took %v", activityLimit+2, b.end.Sub(b.start))

	for i, r := range b.admitted {
		if r.status != http.StatusOK {
			t.Fatalf("request %d of tenant acme: status %d, want 200; body %q", i+1, r.status, r.body)
		}
		if r.header.Get("ratelimit") == "" {
			t.Errorf("request %d of tenant acme: no RateLimit header; headers %v", i+1, r.header)
		}
	}
	t.Logf("an admitted response: ratelimit: %s", b.admitted[0].header.Get("ratelimit"))

	checkDenied(t, b.over)

	if b.other.status != http.StatusOK {
		t.Errorf("tenant globex in the same window: status %d, want 200; body %q", b.other.status, b.other.body)
	}
	if b.other.header.Get("ratelimit") == "" {
		t.Errorf("tenant globex: no RateLimit header; headers %v", b.other.header)
	}
	// 100 of acme and 1 of globex; the denied one never reached the app.
	if want := activityLimit + 1; b.upstream != want {
		t.Errorf("app saw %d requests to %s, want %d (the admitted ones)", b.upstream, activitiesPath, want)
	}

	// Envoy's view: exactly one denial, every request checked.
	const prefix = "http.ingress.ext_authz."
	if d := after[prefix+"denied"] - before[prefix+"denied"]; d != 1 {
		t.Errorf("%sdenied grew by %d, want 1; stats:%s", prefix, d, formatStats(after))
	}
	if d := after[prefix+"ok"] - before[prefix+"ok"]; d != int64(activityLimit+1) {
		t.Errorf("%sok grew by %d, want %d; stats:%s", prefix, d, activityLimit+1, formatStats(after))
	}
	t.Logf("envoy stats after the burst:%s", formatStats(after))

	// Retry-After tells the truth: once the window is over acme is admitted.
	ra, _ := strconv.Atoi(b.over.header.Get("retry-after"))
	poll.Until(t, time.Duration(ra+2)*time.Second, 50*time.Millisecond, func() error {
		r := s.mustPost(activitiesPath, map[string]string{"x-tenant-id": "acme"})
		if r.status != http.StatusOK {
			return fmt.Errorf("tenant acme after Retry-After: status %d", r.status)
		}
		return nil
	})
}

// checkDenied asserts the shape of a rate-limit denial as the client sees it.
func checkDenied(t *testing.T, r *response) {
	t.Helper()
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("request %d of tenant acme: status %d, want 429; headers %v body %q",
			activityLimit+1, r.status, r.header, r.body)
	}
	ra := r.header.Get("retry-after")
	if n, err := strconv.Atoi(ra); err != nil || n < 1 {
		t.Errorf("retry-after %q, want an integer ≥ 1", ra)
	}
	for _, h := range []string{"ratelimit-policy", "ratelimit"} {
		if r.header.Get(h) == "" {
			t.Errorf("429 without %s header; headers %v", h, r.header)
		}
	}
	if !json.Valid(r.body) {
		t.Errorf("429 body is not JSON: %q", r.body)
	}
	// The denial's headers replace Envoy's own, not add to them.
	if ct := r.header.Values("content-type"); len(ct) != 1 {
		t.Errorf("429 content-type %q, want exactly one value", ct)
	}
	t.Logf("429 headers %v, body %s", r.header, r.body)
}

// TestAuthzDownFailsClosed documents the fail-closed choice of
// envoy/ratelimit-authz.yaml: while the server is unreachable, Envoy answers
// 503 (status_on_error) and nothing reaches the app; routes without the
// filter are unaffected.
func TestAuthzDownFailsClosed(t *testing.T) {
	serverBin := serverBinary(t)
	config := serverConfigPath(t)
	s := newStack(t)
	acme := map[string]string{"x-tenant-id": "acme"}

	expect := func(path string, want int) {
		t.Helper()
		r := s.mustPost(path, acme)
		if r.status != want {
			t.Errorf("POST %s: status %d, want %d; headers %v body %q", path, r.status, want, r.header, r.body)
		}
	}

	// Not started: nothing listens on the ext_authz cluster's port (ratelimit_authz_check).
	expect(activitiesPath, http.StatusServiceUnavailable)
	expect("/admin/login", http.StatusServiceUnavailable)
	expect("/api/inbound/ch-1", http.StatusServiceUnavailable)
	expect("/not/an/api/route", http.StatusNotFound) // filter disabled, no check
	if n := s.up.count(activitiesPath); n != 0 {
		t.Errorf("app saw %d requests while the server was down, want 0", n)
	}
	stats := s.envoyStats("ext_authz")
	if stats["http.ingress.ext_authz.error"] < 3 {
		t.Errorf("http.ingress.ext_authz.error = %d, want ≥ 3; stats:%s",
			stats["http.ingress.ext_authz.error"], formatStats(stats))
	}
	t.Logf("envoy stats with the server down:%s", formatStats(stats))

	// Started: requests pass.
	server := s.startServer(serverBin, config)
	poll.Until(t, 10*time.Second, 100*time.Millisecond, func() error {
		if r := s.mustPost(activitiesPath, acme); r.status != http.StatusOK {
			return fmt.Errorf("with the server up: status %d, body %q", r.status, r.body)
		}
		return nil
	})

	// Stopped (SIGTERM, graceful): closed again.
	server.stop(t)
	// The process has exited, so no Check can succeed: exact, no polling.
	seen := s.up.count(activitiesPath)
	expect(activitiesPath, http.StatusServiceUnavailable)
	expect(activitiesPath, http.StatusServiceUnavailable)
	if n := s.up.count(activitiesPath); n != seen {
		t.Errorf("app saw %d more requests after the server stopped, want 0", n-seen)
	}
}
