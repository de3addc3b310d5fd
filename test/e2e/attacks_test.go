package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/exampleapp"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// The attacks of a client that does not play by the rules, through the
// real Envoy with the shipped bootstrap: decoy account headers, bodies the
// server cannot read, many addresses of one IPv6 network, and a key table
// filled up. Each test states the attack and what it must not achieve.

// send posts body to path through Envoy from the loopback address srcIP
// (Envoy sees a distinct client) with the given headers (a header given
// twice is sent twice).
func (s *stack) send(srcIP, path, contentType, body string, header [][2]string) *response {
	s.t.Helper()
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.ParseIP(srcIP)},
			Timeout:   2 * time.Second,
		}).DialContext},
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+s.addrs.Listener+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for _, kv := range header {
		req.Header.Add(kv[0], kv[1])
	}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatalf("POST %s from %s: %v", path, srcIP, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &response{status: resp.StatusCode, header: resp.Header, body: b}
}

// serverConfigWith writes the shipped server config with each old → new
// replacement made exactly once, and returns its path.
func serverConfigWith(t *testing.T, replace ...string) string {
	t.Helper()
	b, err := os.ReadFile(serverConfigPath(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for i := 0; i+1 < len(replace); i += 2 {
		if n := strings.Count(cfg, replace[i]); n != 1 {
			t.Fatalf("shipped config: %q occurs %d times", replace[i], n)
		}
		cfg = strings.Replace(cfg, replace[i], replace[i+1], 1)
	}
	p := filepath.Join(t.TempDir(), "ratelimit.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// loginJSON is a JSON login body for account.
func loginJSON(account, password string) string {
	return fmt.Sprintf(`{"email":%q,"password":%q}`, account, password)
}

// waitLocked retries attempt until it is answered 429 (failures reach the
// server over Envoy's asynchronous access log), and reports the last
// answer as an error, without stopping the test, if it never is: each
// attack's outcome is reported.
func waitLocked(t *testing.T, what string, attempt func() *response) {
	t.Helper()
	err := poll.Wait(5*time.Second, 50*time.Millisecond, func() error {
		if r := attempt(); r.status != http.StatusTooManyRequests {
			return fmt.Errorf("status %d %s, want 429", r.status, r.body)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// failFive sends five wrong-password logins, each from its own address
// 127.0.<net>.<10+i> (so no per-IP limit is reached), requiring 401.
func failFive(t *testing.T, s *stack, net int, send func(src string, i int) *response) {
	t.Helper()
	for i := range 5 {
		src := fmt.Sprintf("127.0.%d.%d", net, 10+i)
		if r := send(src, i); r.status != http.StatusUnauthorized {
			t.Fatalf("failure %d from %s: status %d %s, want 401", i+1, src, r.status, r.body)
		}
	}
}

// TestLoginAttacksThroughEnvoy: a guesser cannot escape the per-account
// limit by making the server read another account than the application
// (decoy x-login-account headers), or none at all (a body over Envoy's
// 8 KiB buffer, the field given twice, a forged partial-body flag).
func TestLoginAttacksThroughEnvoy(t *testing.T) {
	s := newStack(t)
	s.startServer(serverBinary(t), serverConfigPath(t))
	awayFromMinuteEdge()
	const js = "application/json"

	t.Run("decoy account headers", func(t *testing.T) {
		// Five wrong passwords for one account (in the body), each with
		// another decoy x-login-account and from another IP …
		failFive(t, s, 2, func(src string, i int) *response {
			return s.send(src, "/admin/login", js, loginJSON("victim@example.com", "wrong"),
				[][2]string{{"x-login-account", fmt.Sprintf("decoy%d@example.com", i)}})
		})
		// … then the right password, with yet another decoy, from yet
		// another IP: locked.
		waitLocked(t, "right password after decoyed failures", func() *response {
			return s.send("127.0.2.99", "/portal/login", js, loginJSON("victim@example.com", exampleapp.Password),
				[][2]string{{"x-login-account", "decoy-final@example.com"}})
		})
		// Without any header too.
		if r := s.send("127.0.2.98", "/admin/login", js, loginJSON("victim@example.com", exampleapp.Password), nil); r.status != http.StatusTooManyRequests {
			t.Errorf("right password, no header: status %d, want 429", r.status)
		}
		// The header given twice is one request presenting two copies:
		// counted under the shared key, and the body account still counts.
		if r := s.send("127.0.2.97", "/admin/login", js, loginJSON("victim@example.com", exampleapp.Password),
			[][2]string{{"x-login-account", "a@example.com"}, {"x-login-account", "b@example.com"}}); r.status != http.StatusTooManyRequests {
			t.Errorf("right password, header twice: status %d, want 429", r.status)
		}
	})

	// Unreadable logins share one strict key: five failures among them
	// lock them all, whatever account the application read.
	t.Run("unreadable bodies", func(t *testing.T) {
		pad := strings.Repeat("x", 9000) // over the 8 KiB Envoy buffers for the check
		oversized := func(account, password string) string {
			return fmt.Sprintf(`{"email":%q,"password":%q,"pad":%q}`, account, password, pad)
		}
		failFive(t, s, 3, func(src string, i int) *response {
			switch i {
			case 0, 1: // over the buffer: the server sees a cut body
				return s.send(src, "/admin/login", js, oversized(fmt.Sprintf("big%d@example.com", i), "wrong"), nil)
			case 2: // over the buffer, and a forged "complete" flag
				return s.send(src, "/admin/login", js, oversized("big2@example.com", "wrong"),
					[][2]string{{"x-envoy-auth-partial-body", "false"}})
			default: // the field twice: which copy the application reads is its business
				return s.send(src, "/portal/login", js, fmt.Sprintf(`{"email":"dup%d@example.com","email":"other@example.com","password":"wrong"}`, i), nil)
			}
		})
		waitLocked(t, "oversized body, right password", func() *response {
			return s.send("127.0.3.99", "/admin/login", js, oversized("big9@example.com", exampleapp.Password), nil)
		})
		for name, body := range map[string]string{
			"duplicated field": `{"email":"fresh@example.com","email":"other2@example.com","password":"` + exampleapp.Password + `"}`,
			"malformed":        `{"email":"fresh@example.com","password":"` + exampleapp.Password + `"`,
		} {
			if r := s.send("127.0.3.98", "/admin/login", js, body, nil); r.status != http.StatusTooManyRequests {
				t.Errorf("%s, right password: status %d, want 429", name, r.status)
			}
		}
		if r := s.send("127.0.3.97", "/admin/login", "text/plain", "email=fresh@example.com&password="+exampleapp.Password, nil); r.status != http.StatusTooManyRequests {
			t.Errorf("wrong content type, right password: status %d, want 429", r.status)
		}
		// A readable login of another account is not affected.
		if r := s.send("127.0.3.96", "/admin/login", js, loginJSON("fresh@example.com", exampleapp.Password), nil); r.status != http.StatusOK {
			t.Errorf("readable login of a fresh account: status %d, want 200", r.status)
		}
	})
	stats := s.envoyStats("ext_authz")
	if stats["http.ingress.ext_authz.error"] != 0 {
		t.Errorf("ext_authz errors: %s", formatStats(stats))
	}
}

// TestIPv6NetworkThroughEnvoy: one IPv6 /64 is one client. Clients are
// presented as x-forwarded-for entries of one trusted proxy (Envoy and the
// server both trust one hop): 15 legacy token requests (10 per minute per
// IP) from 15 addresses of one /64 admit 10, and an IPv4 client written as
// IPv4-mapped IPv6 shares its IPv4 budget.
func TestIPv6NetworkThroughEnvoy(t *testing.T) {
	s := prepareStack(t, 1)
	s.envoyEdit = func(b []byte) ([]byte, error) { return envoyconf.WithTrustedHops(b, 1) }
	s.startEnvoy()
	s.startServer(serverBinary(t), serverConfigWith(t, "trusted_hops: 0", "trusted_hops: 1"))
	awayFromMinuteEdge()

	tokens := func(xff string) int {
		return s.mustPost("/api/v1/tokens", map[string]string{"x-forwarded-for": xff}).status
	}
	admitted := 0
	for i := range 15 {
		switch st := tokens(fmt.Sprintf("2001:db8:77:1:%x::%x", i*4099, i+1)); st {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("request %d: status %d", i+1, st)
		}
	}
	if admitted != 10 {
		t.Errorf("15 addresses of one /64: %d admitted, want 10", admitted)
	}
	if st := tokens("2001:db8:77:2::1"); st != http.StatusOK {
		t.Errorf("the next /64: status %d, want 200", st)
	}
	for i := range 10 {
		if st := tokens("203.0.113.77"); st != http.StatusOK {
			t.Fatalf("IPv4 request %d: status %d", i+1, st)
		}
	}
	if st := tokens("::ffff:203.0.113.77"); st != http.StatusTooManyRequests {
		t.Errorf("the same IPv4 client as IPv4-mapped IPv6: status %d, want 429", st)
	}

	// Failed logins from one /64 lock the whole /64.
	for i := range 5 {
		r := s.send("127.0.0.1", "/admin/login", "application/json", loginJSON(fmt.Sprintf("u%d@example.com", i), "wrong"),
			[][2]string{{"x-forwarded-for", fmt.Sprintf("2001:db8:88:1::%x", i+1)}})
		if r.status != http.StatusUnauthorized {
			t.Fatalf("login failure %d: status %d", i+1, r.status)
		}
	}
	waitLocked(t, "another address of the /64", func() *response {
		return s.send("127.0.0.1", "/admin/login", "application/json", loginJSON("new@example.com", exampleapp.Password),
			[][2]string{{"x-forwarded-for", "2001:db8:88:1:ffff::1"}})
	})
}

// TestFullKeyTableThroughEnvoy: a flood of distinct keys (here legacy token
// requests from 40 addresses, on a node with room for 40 keys of which 10
// are reserved for the login buckets) neither switches the lockout off nor
// locks everyone out: five failures still lock the account, counted in the
// reserve. Once failures fill the reserve too, logins fail closed.
func TestFullKeyTableThroughEnvoy(t *testing.T) {
	s := newStack(t)
	s.startServer(serverBinary(t), serverConfigWith(t, "max_keys: 1000000", "max_keys: 40\n  shards: 1\n  reserved_keys: 10"))
	awayFromMinuteEdge()

	// A flood of distinct keys in a request bucket fills the table up to
	// the reserve only: the login buckets keep room of their own.
	for i := range 40 {
		if r := s.send(fmt.Sprintf("127.0.9.%d", i+1), "/api/v1/tokens", "application/json", "{}", nil); r.status != http.StatusOK {
			t.Fatalf("token request %d: status %d", i+1, r.status)
		}
	}
	if got := s.serverMetric("ratelimit_authz_counter_live_keys"); got != 30 {
		t.Fatalf("live keys after the flood %v, want 30 (max_keys − reserved_keys)", got)
	}
	codes := map[int]int{}
	for i := range 5 {
		r := s.send(fmt.Sprintf("127.0.10.%d", i+1), "/admin/login", "application/json", loginJSON("victim@example.com", "wrong"), nil)
		codes[r.status]++
	}
	if codes[http.StatusUnauthorized] != 5 {
		t.Fatalf("five wrong passwords after the flood: %v, want 5 × 401", codes)
	}
	// Envoy reports failures asynchronously: wait for all five to be counted.
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		if got := s.serverMetric("ratelimit_authz_counter_live_keys"); got != 36 {
			return fmt.Errorf("live keys %v, want 36", got)
		}
		return nil
	})
	r := s.send("127.0.10.99", "/admin/login", "application/json", loginJSON("victim@example.com", exampleapp.Password), nil)
	if r.status != http.StatusTooManyRequests {
		t.Errorf("right password after five failures with the table full of other keys: status %d, want 429", r.status)
	}
	if got := s.serverMetric(`ratelimit_authz_checks_total{bucket="login_ip",decision="overflow"}`); got != 0 {
		t.Errorf("login_ip overflow decisions %v while the reserve had room, want 0", got)
	}

	// Failures that fill the reserve itself close the login: a login the
	// table cannot count is refused, never admitted uncounted.
	for i := range 2 {
		r := s.send(fmt.Sprintf("127.0.11.%d", i+1), "/admin/login", "application/json", loginJSON(fmt.Sprintf("filler%d@example.com", i), "wrong"), nil)
		if r.status != http.StatusUnauthorized {
			t.Fatalf("filler login %d: status %d, want 401", i, r.status)
		}
	}
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		if got := s.serverMetric("ratelimit_authz_counter_live_keys"); got != 40 {
			return fmt.Errorf("live keys %v, want 40", got)
		}
		return nil
	})
	r = s.send("127.0.12.1", "/admin/login", "application/json", loginJSON("someone@example.com", exampleapp.Password), nil)
	if r.status != http.StatusTooManyRequests {
		t.Errorf("login with the reserve full: status %d, want 429 (fail closed)", r.status)
	}
	if got := s.serverMetric(`ratelimit_authz_checks_total{bucket="login_ip",decision="overflow"}`); got < 1 {
		t.Errorf("login_ip overflow decisions %v, want ≥ 1", got)
	}
}

// serverMetric reads one sample from the server's /metrics: name with its
// labels exactly as exposed, or a bare name; 0 when absent.
func (s *stack) serverMetric(sample string) float64 {
	s.t.Helper()
	return metricOf(s.t, s.client, s.httpAddr, sample)
}

// metricOf reads one series, written as exposed, from the /metrics page
// of the server at httpAddr; 0 when absent. A page that does not parse
// fails the test.
func metricOf(t *testing.T, c *http.Client, httpAddr, series string) float64 {
	t.Helper()
	page, err := scrape.Get(c, "http://"+httpAddr+"/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", httpAddr, err)
	}
	v, _ := page.Get(series)
	return v
}

// TestHeaderStripThroughEnvoy: with a header_mutation filter ahead of
// ext_authz removing x-tenant-id (what check-config --envoy looks for), a
// client's copy never reaches the check: 150 activities claiming a tenant
// are not counted under it (they are requests without a tenant, the
// missing-key policy's), while they would be without the filter.
func TestHeaderStripThroughEnvoy(t *testing.T) {
	s := prepareStack(t, 1)
	s.envoyEdit = func(b []byte) ([]byte, error) { return envoyconf.WithHeaderStrip(b, "x-tenant-id") }
	s.startEnvoy()
	s.startServer(serverBinary(t), serverConfigPath(t))
	for i := range 150 {
		r := s.mustPost("/api/activities", map[string]string{"x-tenant-id": "victim"})
		if r.status != http.StatusOK {
			t.Fatalf("activity %d: status %d %s", i+1, r.status, r.body)
		}
	}
	if got := s.serverMetric(`ratelimit_authz_checks_total{bucket="activity_create",decision="missing_key"}`); got != 150 {
		t.Errorf("checks without a tenant: %v, want 150 (the client's x-tenant-id removed)", got)
	}
	if got := s.serverMetric(`ratelimit_authz_checks_total{bucket="activity_create",decision="allowed"}`); got != 0 {
		t.Errorf("checks counted under a tenant: %v, want 0", got)
	}
	// Nor does it reach the application: the layer after the strip (here
	// none) is the only source of the header.
	s.up.mu.Lock()
	defer s.up.mu.Unlock()
	for _, h := range s.up.hits {
		if h.tenant != "" {
			t.Fatalf("the application saw x-tenant-id %q", h.tenant)
		}
	}
}
