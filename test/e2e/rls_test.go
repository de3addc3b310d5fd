package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// rlsHourly is a descriptor file beside the README examples: the
// 3-an-hour limit of the x-ratelimit header sample of
// docs/envoyproxy-ratelimit.md §6 case 47, and a 10-a-second one for
// hostile descriptor values.
const rlsHourly = `domain: rls_e2e
descriptors:
  - key: generic_key
    value: hourly
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 10
`

// rlsReplacesExample is envoyproxy/ratelimit's
// examples/ratelimit/config/example.yaml, the configuration its
// integration-test/scripts/replaces.sh runs against, without the two
// quota_mode rules (quota mode is refused here, and the script does not
// use them).
const rlsReplacesExample = `domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces:
        - name: bkthomps
        - name: fake_name
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit:
          replaces:
            - name: bkthomps
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: mock
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: destination_cluster
        value: override
        rate_limit:
          replaces:
            - name: banned_limit
          unit: minute
          requests_per_unit: 2
      - key: destination_cluster
        value: fake
        rate_limit:
          name: fake_name
          unit: minute
          requests_per_unit: 2
  - key: foo
    rate_limit:
      unit: minute
      requests_per_unit: 2
    descriptors:
      - key: bar
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: bar
        value: bkthomps
        rate_limit:
          name: bkthomps
          unit: minute
          requests_per_unit: 1
      - key: bar
        value: banned
        rate_limit:
          name: banned_limit
          unit: minute
          requests_per_unit: 0
      - key: baz
        rate_limit:
          unit: second
          requests_per_unit: 1
      - key: baz
        value: not-so-shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
      - key: baz
        value: shady
        rate_limit:
          unit: minute
          requests_per_unit: 3
        shadow_mode: true
      - key: bay
        rate_limit:
          unlimited: true
  - key: unspec
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: qux
    rate_limit:
      unlimited: true
`

// rlsHeaders is a descriptor of request_headers actions, each header
// giving the entry of the same name (examples/envoy/proxy.yaml's style).
func rlsHeaders(names ...string) envoyconf.RateLimit {
	var rl envoyconf.RateLimit
	for _, n := range names {
		rl.Actions = append(rl.Actions, envoyconf.RequestHeader(n, n))
	}
	return rl
}

// rlsRoutes are the routes the tests add to envoy/ratelimit-rls.yaml for
// rlsHourly and, as envoyproxy/ratelimit's examples/envoy/proxy.yaml
// writes them, for rlsReplacesExample.
var rlsRoutes = []envoyconf.RateLimitRoute{
	{Name: "hourly", Prefix: "/hourly", Domain: "rls_e2e",
		RateLimits: []envoyconf.RateLimit{{Actions: []envoyconf.Action{envoyconf.GenericKey("", "hourly")}}}},
	{Name: "client", Prefix: "/client", Domain: "rls_e2e",
		RateLimits: []envoyconf.RateLimit{{Actions: []envoyconf.Action{envoyconf.RequestHeader("x-client", "client")}}}},
	{Name: "twoheader", Prefix: "/twoheader", Domain: "rl",
		RateLimits: []envoyconf.RateLimit{rlsHeaders("foo", "bar"), rlsHeaders("foo", "baz")}},
	{Name: "fourheader", Prefix: "/fourheader", Domain: "rl",
		RateLimits: []envoyconf.RateLimit{rlsHeaders("foo", "bar"), rlsHeaders("source_cluster", "destination_cluster")}},
	{Name: "fiveheader", Prefix: "/fiveheader", Domain: "rl",
		RateLimits: []envoyconf.RateLimit{rlsHeaders("foo", "bar"), rlsHeaders("source_cluster", "destination_cluster"), rlsHeaders("category")}},
}

// TestRLSThroughEnvoy runs envoyproxy/ratelimit's README examples through
// the real Envoy's rate limit filter (envoy/ratelimit-rls.yaml, as
// shipped but for its addresses, one trusted proxy hop so that the test
// presents client addresses in x-forwarded-for, and the test routes of
// rlsRoutes) against one ratelimit-authz serving config/rls/config as
// envoyproxy/ratelimit would: the 200/429 sequences of
// docs/envoyproxy-ratelimit.md §6 cases 43–47 (46: upstream's replaces.sh,
// call by call), Envoy's x-ratelimit-* headers (§5.3), Retry-After and
// x-envoy-ratelimited; hostile descriptor values and x-forwarded-for
// through a second Envoy as shipped (no trusted hop); then, with the
// server stopped, both failure modes (case 48).
func TestRLSThroughEnvoy(t *testing.T) { bothPorts(t, testRLSThroughEnvoy) }

func testRLSThroughEnvoy(t *testing.T, lean bool) {
	serverBin := serverBinary(t)
	s := prepareRLSStack(t, 1, lean)
	files := rlsExamples(t)
	files["rls_e2e.yaml"] = rlsHourly
	files["rl.yaml"] = rlsReplacesExample
	runtimeRoot := writeRLSRuntime(t, files)

	trust1 := func(b []byte) ([]byte, error) { return envoyconf.WithTrustedHops(b, 1) }
	routes := func(b []byte) ([]byte, error) { return envoyconf.WithRateLimitRoutes(b, rlsRoutes...) }
	a := s.rlsAddrs(s.addrs, 0, 1)
	s.envoy = s.startEnvoyConfig(t, "envoy", s.addrs.Admin, renderRLS(t, a, trust1, routes))
	// A second Envoy as shipped (no trusted proxy hop: remote_address is
	// the TCP peer) but failing closed (failure_mode_deny).
	more := freeport.TestAddrs(t, 2)
	denyAddrs := s.rlsAddrs(envoyconf.Addrs{Admin: more[0], Listener: more[1], App: s.addrs.App, Authz: s.addrs.Authz}, 0, 1)
	deny := func(b []byte) ([]byte, error) {
		return envoyconf.WithRateLimitFilter(b, envoyconf.RateLimitFilter{Domain: "edge_proxy_per_ip", Cluster: envoyconf.ShippedRLSCluster,
			Timeout: 250 * time.Millisecond, FailureModeDeny: true, XRateLimitHeaders: true, RetryAfter: true})
	}
	s.startEnvoyConfig(t, "envoy-deny", denyAddrs.Admin, renderRLS(t, denyAddrs, routes, deny))
	s.startRLSServer(serverBin, runtimeRoot)
	// Envoy's health checks see the node before the first request.
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		return rlsClusterHealthy(s, s.addrs.Admin, rlsEndpoint(a))
	})
	// Envoy reaches the node on the port under test only.
	if got := s.serverMetric(`ratelimit_authz_server_connections_open{listener="check"}`); (got >= 1) != lean {
		t.Fatalf("the server's lean listener has %v connections open; Envoy calls it: %v", got, lean)
	}
	listener := s.addrs.Listener
	from := func(ip string, hdr map[string]string) map[string]string {
		h := map[string]string{"x-forwarded-for": ip}
		for k, v := range hdr {
			h[k] = v
		}
		return h
	}

	t.Run("43_example3_remote_address", func(t *testing.T) {
		// The blocked address: its first request is over (0 a second).
		r := s.mustGet(listener, "/example3", from("50.0.0.5", nil))
		checkRLSDenied(t, r, "0, 0;w=1", 1)
		if n := s.up.count("/example3"); n != 0 {
			t.Errorf("the app saw %d requests from the blocked address", n)
		}
		// Any other address: 10 a second, the 11th is 429.
		for _, ip := range []string{"50.0.0.1", "2001:db8::7"} {
			rs, ok := inOneSecond(t, 11, func(int) *response { return s.mustGet(listener, "/example3", from(ip, nil)) })
			if !ok {
				t.Fatal("11 requests did not fit in one second twice; machine too slow")
			}
			for i, r := range rs[:10] {
				checkRLSAllowed(t, r, "10, 10;w=1", 9-i, 1)
			}
			checkRLSDenied(t, rs[10], "10, 10;w=1", 1)
			t.Logf("%s: %s; first answer's headers: x-ratelimit-limit %q remaining %q reset %q", ip, statuses(rs),
				rs[0].header.Get("x-ratelimit-limit"), rs[0].header.Get("x-ratelimit-remaining"), rs[0].header.Get("x-ratelimit-reset"))
		}
	})

	t.Run("44_example2_nested_header_value_match", func(t *testing.T) {
		day := time.Now().UTC().Truncate(24 * time.Hour)
		number := fmt.Sprintf("206%07d", time.Now().UnixNano()%10_000_000)
		marketing := from("50.0.1.1", map[string]string{"x-message-type": "marketing", "x-to-number": number})
		var rs []*response
		for range 6 {
			rs = append(rs, s.mustGet(listener, "/example2", marketing))
		}
		if time.Now().UTC().Truncate(24*time.Hour) != day {
			t.Skip("the UTC day (the examples' window) ended during the test")
		}
		// Both descriptors are sent; the marketing one (5 a day) has the
		// least remaining, so its limit leads the header.
		untilDay := func() int { return int(day.Add(24*time.Hour).Sub(time.Now()) / time.Second) }
		for i, r := range rs[:5] {
			checkRLSAllowed(t, r, "5, 5;w=86400, 100;w=86400", 4-i, untilDay())
		}
		checkRLSDenied(t, rs[5], "5, 5;w=86400, 100;w=86400", untilDay())
		t.Logf("marketing messages to %s: %s", number, statuses(rs))
		// Not marketing (header_value_match does not match: no such
		// descriptor): only the 100 a day per number, which counted all
		// six above.
		other := s.mustGet(listener, "/example2", from("50.0.1.1", map[string]string{"x-message-type": "alert", "x-to-number": number}))
		checkRLSAllowed(t, other, "100, 100;w=86400", 100-7, untilDay())
		// Without x-to-number neither descriptor is sent: no call, no
		// headers.
		none := s.mustGet(listener, "/example2", from("50.0.1.1", map[string]string{"x-message-type": "marketing"}))
		if none.status != http.StatusOK || none.header.Get("x-ratelimit-limit") != "" {
			t.Errorf("no x-to-number: status %d, x-ratelimit-limit %q; want 200 and no limit", none.status, none.header.Get("x-ratelimit-limit"))
		}
	})

	t.Run("45_example7_replaces_generic_key", func(t *testing.T) {
		bkthomps := from("50.0.2.1", map[string]string{"x-user": "bkthomps"})
		rs, ok := inOneSecond(t, 11, func(int) *response { return s.mustGet(listener, "/example7", bkthomps) })
		if !ok {
			t.Fatal("11 requests did not fit in one second twice; machine too slow")
		}
		// Only the 10/s rule applies: the 5/s one is replaced, so its
		// status has no limit and Envoy leaves it out of the header.
		for i, r := range rs[:10] {
			checkRLSAllowed(t, r, "10, 10;w=1", 9-i, 1)
		}
		checkRLSDenied(t, rs[10], "10, 10;w=1", 1)
		t.Logf("bkthomps: %s", statuses(rs))
		// The replaced rule counted nothing: no series of it with an
		// allowed or denied decision, 11+ replaced.
		page := rlsDescriptorMetrics(t, s.httpAddr)
		var replaced, counted float64
		for series, v := range page {
			if !strings.Contains(series, "key_1") {
				continue
			}
			switch {
			case strings.Contains(series, `decision="replaced"`):
				replaced += v
			case strings.Contains(series, `decision="allowed"`), strings.Contains(series, `decision="denied"`):
				counted += v
			}
		}
		if replaced < 11 || counted != 0 {
			t.Errorf("the replaced rule (key_1): %v replaced, %v allowed or denied; want ≥ 11 and 0\n%v", replaced, counted, page)
		}
		// Another user matches no rule: OK without any limit.
		r := s.mustGet(listener, "/example7", from("50.0.2.1", map[string]string{"x-user": "someone"}))
		if r.status != http.StatusOK || r.header.Get("x-ratelimit-limit") != "" {
			t.Errorf("user someone: status %d, x-ratelimit-limit %q; want 200, no limit", r.status, r.header.Get("x-ratelimit-limit"))
		}
	})

	t.Run("46_replaces_sh", func(t *testing.T) {
		// envoyproxy/ratelimit's integration-test/scripts/replaces.sh, call
		// by call: curl -f, so "limited" is any status ≥ 400. Every limit is
		// per minute: the calls must fall into one.
		if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 5*time.Second {
			time.Sleep(left + 10*time.Millisecond)
		}
		minute := time.Now().Truncate(time.Minute)
		h := func(kv ...string) map[string]string {
			m := map[string]string{"x-forwarded-for": "50.0.7.1"}
			for i := 0; i < len(kv); i += 2 {
				m[kv[i]] = kv[i+1]
			}
			return m
		}
		const ok, limited = true, false
		steps := []struct {
			path string
			hdr  map[string]string
			ok   bool
		}{
			// replaces increases the limit
			{"/twoheader", h("foo", "bkthomps", "bar", "banned"), limited},
			{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "mock"), limited},
			{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "override"), ok},
			{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "override"), ok},
			{"/fourheader", h("foo", "bkthomps", "bar", "banned", "source_cluster", "proxy", "destination_cluster", "override"), limited},
			// replaces does not affect the original limit
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), ok},
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), ok},
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), limited},
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "not_bkthomps"), ok},
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "not_bkthomps"), limited},
			{"/fourheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "bkthomps"), limited},
			// replaces can replace several descriptors
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), ok},
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), ok},
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), ok},
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), ok},
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), limited},
			{"/twoheader", h("foo", "foo_2", "bar", "bkthomps"), ok},
			{"/twoheader", h("foo", "foo_2", "bar", "bkthomps"), limited},
			{"/fourheader", h("foo", "foo_3", "bar", "bar_3", "source_cluster", "proxy", "destination_cluster", "fake"), ok},
			{"/fourheader", h("foo", "foo_3", "bar", "bar_3", "source_cluster", "proxy", "destination_cluster", "fake"), ok},
			{"/fourheader", h("foo", "foo_3", "bar", "bar_3", "source_cluster", "proxy", "destination_cluster", "fake"), limited},
			{"/fiveheader", h("foo", "my_foo", "bar", "bkthomps", "source_cluster", "proxy", "destination_cluster", "fake", "category", "account"), limited},
		}
		var got, want []string
		word := map[bool]string{true: "ok", false: "limited"}
		for _, st := range steps {
			r := s.mustGet(listener, st.path, st.hdr)
			got = append(got, word[r.status < 400])
			want = append(want, word[st.ok])
		}
		if time.Now().Truncate(time.Minute) != minute {
			t.Fatal("the sequence crossed a minute boundary")
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("replaces.sh:\n got  %s\n want %s", strings.Join(got, " "), strings.Join(want, " "))
		}
		t.Logf("replaces.sh, %d calls: %s", len(got), strings.Join(got, " "))
	})

	t.Run("example1_generic_key", func(t *testing.T) {
		r := s.mustGet(listener, "/example1", from("50.0.3.1", nil))
		checkRLSAllowed(t, r, "500, 500;w=1", -1, 1)
	})

	t.Run("47_headers_3_per_hour", func(t *testing.T) {
		hour := time.Now().Truncate(time.Hour)
		untilHour := func() int { return int(hour.Add(time.Hour).Sub(time.Now()) / time.Second) }
		var rs []*response
		for range 4 {
			rs = append(rs, s.mustGet(listener, "/hourly", from("50.0.4.1", nil)))
		}
		if time.Now().Truncate(time.Hour) != hour {
			t.Skip("the hour ended during the test")
		}
		checkRLSAllowed(t, rs[0], "3, 3;w=3600", 2, untilHour())
		checkRLSAllowed(t, rs[1], "3, 3;w=3600", 1, untilHour())
		checkRLSAllowed(t, rs[2], "3, 3;w=3600", 0, untilHour())
		checkRLSDenied(t, rs[3], "3, 3;w=3600", untilHour())
		t.Logf("after two calls: x-ratelimit-limit %q, x-ratelimit-remaining %q, x-ratelimit-reset %q; the 4th: %d, retry-after %q",
			rs[1].header.Get("x-ratelimit-limit"), rs[1].header.Get("x-ratelimit-remaining"), rs[1].header.Get("x-ratelimit-reset"),
			rs[3].status, rs[3].header.Get("retry-after"))
	})

	t.Run("hostile_descriptor_values", func(t *testing.T) {
		// A client chooses request_headers values. Values that would
		// collide if keys were joined with a separator count apart; a
		// long one counts like any other; none is a failure.
		for _, pair := range [][2]string{{"a_b", "a"}, {"a|b", "a:b"}, {strings.Repeat("x", 16<<10), strings.Repeat("x", 16<<10-1)}} {
			for i := range 2 {
				for _, v := range pair {
					r := s.mustGet(listener, "/client", from("50.0.5.1", map[string]string{"x-client": v}))
					if r.status != http.StatusOK || r.header.Get("x-ratelimit-remaining") != strconv.Itoa(9-i) {
						t.Errorf("x-client of %d bytes, call %d: status %d, remaining %q; want 200 and %d (its own count)",
							len(v), i+1, r.status, r.header.Get("x-ratelimit-remaining"), 9-i)
					}
				}
			}
		}
		// Spoofing the address Envoy trusts: with one trusted hop the
		// client's own x-forwarded-for entries before the last are not
		// used, so prepending the blocked address changes nothing.
		r := s.mustGet(listener, "/example3", map[string]string{"x-forwarded-for": "50.0.0.5, 50.0.5.2"})
		if r.status != http.StatusOK {
			t.Errorf("x-forwarded-for 50.0.0.5, 50.0.5.2: status %d, want 200 (the client is 50.0.5.2)", r.status)
		}
		// As shipped (no trusted hop) x-forwarded-for is the client's to
		// write and Envoy does not use it: a client that writes a new
		// address on every request, or the blocked one, still spends the
		// 10 a second of its TCP address.
		rs, ok := inOneSecond(t, 11, func(i int) *response {
			return s.mustGet(denyAddrs.Listener, "/example3", map[string]string{"x-forwarded-for": fmt.Sprintf("50.0.0.%d", 5+i)})
		})
		if !ok {
			t.Fatal("11 requests did not fit in one second twice; machine too slow")
		}
		for i, r := range rs[:10] {
			checkRLSAllowed(t, r, "10, 10;w=1", 9-i, 1)
		}
		checkRLSDenied(t, rs[10], "10, 10;w=1", 1)
		t.Logf("as shipped, x-forwarded-for 50.0.0.5, 50.0.0.6, … from one client: %s", statuses(rs))
	})

	t.Run("48_failure_modes", func(t *testing.T) {
		// Both Envoys answer from the service while it is up.
		for _, l := range []string{listener, denyAddrs.Listener} {
			if r := s.mustGet(l, "/example1", from("50.0.6.1", nil)); r.status != http.StatusOK || r.header.Get("x-ratelimit-limit") != "500, 500;w=1" {
				t.Fatalf("%s with the service up: status %d, x-ratelimit-limit %q", l, r.status, r.header.Get("x-ratelimit-limit"))
			}
		}
		s.server.stop(t)
		allowedBefore := s.statsOf(t, `ratelimit\.failure_mode_allowed`)
		// failure_mode_deny: false → the request passes, without limits.
		poll.Until(t, 5*time.Second, 20*time.Millisecond, func() error {
			r, err := s.get(listener, "/example3", from("50.0.0.5", nil))
			if err != nil {
				return err
			}
			if r.status != http.StatusOK || r.header.Get("x-ratelimit-limit") != "" {
				return fmt.Errorf("failure_mode_deny false, service down: status %d, x-ratelimit-limit %q; want 200 without limits",
					r.status, r.header.Get("x-ratelimit-limit"))
			}
			return nil
		})
		// failure_mode_deny: true → status_on_error, 500.
		r := s.mustGet(denyAddrs.Listener, "/example1", nil)
		if r.status != http.StatusInternalServerError {
			t.Errorf("failure_mode_deny true, service down: status %d, want 500; body %q", r.status, r.body)
		}
		after := s.statsOf(t, `ratelimit\.failure_mode_allowed`)
		t.Logf("Envoy (failure_mode_deny false) ratelimit.failure_mode_allowed: before %s, after %s", formatStats(allowedBefore), formatStats(after))
		var grew bool
		for k, v := range after {
			grew = grew || v > allowedBefore[k]
		}
		if !grew {
			t.Errorf("ratelimit.failure_mode_allowed did not grow:%s", formatStats(after))
		}
	})
}

// rlsClusterHealthy reports whether the Envoy at admin sees endpoint
// healthy in its rate limit cluster.
func rlsClusterHealthy(s *stack, admin, endpoint string) error {
	resp, err := s.client.Get("http://" + admin + "/clusters")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	want := envoyconf.ShippedRLSCluster + "::" + endpoint + "::health_flags::healthy"
	if !strings.Contains(string(b), want) {
		return fmt.Errorf("envoy %s: no %q in /clusters", admin, want)
	}
	return nil
}

// rlsDescriptorMetrics returns the samples of
// ratelimit_authz_rls_descriptors_total on the server at httpAddr, by
// series as exposed.
func rlsDescriptorMetrics(t *testing.T, httpAddr string) map[string]float64 {
	t.Helper()
	page, err := scrape.Get(&http.Client{Timeout: 5 * time.Second}, "http://"+httpAddr+"/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", httpAddr, err)
	}
	out := map[string]float64{}
	for _, smp := range page {
		if smp.Name == "ratelimit_authz_rls_descriptors_total" {
			out[smp.Series] = smp.Value
		}
	}
	return out
}

// checkRLSAllowed checks an answer Envoy let through with the filter's
// x-ratelimit headers: the limit header exactly, the remaining count
// (unless remaining < 0) and the reset within a second of reset.
func checkRLSAllowed(t *testing.T, r *response, limit string, remaining, reset int) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Errorf("status %d, want 200; headers %v body %q", r.status, r.header, r.body)
		return
	}
	checkRLSHeaders(t, r, limit, remaining, reset)
	if v := r.header.Get("x-envoy-ratelimited"); v != "" {
		t.Errorf("an admitted answer with x-envoy-ratelimited %q", v)
	}
}

// checkRLSDenied checks a 429 of Envoy's rate limit filter: the
// x-ratelimit headers with nothing remaining, x-envoy-ratelimited, and
// Retry-After within a second of retryAfter.
func checkRLSDenied(t *testing.T, r *response, limit string, retryAfter int) {
	t.Helper()
	if r.status != http.StatusTooManyRequests {
		t.Errorf("status %d, want 429; headers %v body %q", r.status, r.header, r.body)
		return
	}
	checkRLSHeaders(t, r, limit, 0, retryAfter)
	if v := r.header.Get("x-envoy-ratelimited"); v != "true" {
		t.Errorf("429 with x-envoy-ratelimited %q, want true", v)
	}
	ra, err := strconv.Atoi(r.header.Get("retry-after"))
	if err != nil || ra < 1 || ra < retryAfter-1 || ra > retryAfter+1 {
		t.Errorf("429 with retry-after %q, want %d (±1, at least 1)", r.header.Get("retry-after"), retryAfter)
	}
}

func checkRLSHeaders(t *testing.T, r *response, limit string, remaining, reset int) {
	t.Helper()
	if got := r.header.Get("x-ratelimit-limit"); got != limit {
		t.Errorf("x-ratelimit-limit %q, want %q", got, limit)
	}
	if remaining >= 0 {
		if got := r.header.Get("x-ratelimit-remaining"); got != strconv.Itoa(remaining) {
			t.Errorf("x-ratelimit-remaining %q, want %d", got, remaining)
		}
	}
	got, err := strconv.Atoi(r.header.Get("x-ratelimit-reset"))
	if err != nil || got < 1 || got < reset-1 || got > reset+1 {
		t.Errorf("x-ratelimit-reset %q, want %d (±1, at least 1)", r.header.Get("x-ratelimit-reset"), reset)
	}
}

// TestRLSExamplesCheckConfig: the shipped descriptor files pass the
// built binary's check-config, and a broken copy is reported at its
// file, line and column with envoyproxy/ratelimit's message.
func TestRLSExamplesCheckConfig(t *testing.T) {
	bin := serverBinary(t)
	run := func(dir string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "check-config", "--rls-config-dir", dir).CombinedOutput()
		return string(out), err
	}
	out, err := run(filepath.Join(root(t), "config", "rls", "config"))
	if err != nil || !strings.Contains(out, "9 domains") {
		t.Fatalf("check-config of config/rls/config: %v\n%s", err, out)
	}
	t.Logf("check-config --rls-config-dir config/rls/config: %s", strings.TrimSpace(out))
	files := rlsExamples(t)
	files["example3.yaml"] = strings.Replace(files["example3.yaml"], "unit: second\n      requests_per_unit: 10", "unit: fortnight\n      requests_per_unit: 10", 1)
	dir := filepath.Join(writeRLSRuntime(t, files), rlsSubdirectory, "config")
	out, err = run(dir)
	want := filepath.Join(dir, "example3.yaml") + ":6:7: invalid rate limit unit 'fortnight'"
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("check-config of a broken copy: %v\n%s\nwant %q", err, out, want)
	}
}
