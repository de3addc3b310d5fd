package rls_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// The service cases of docs/envoyproxy-ratelimit.md §6 (28-41), against a
// real counter.Store and a test clock; each test name carries its case
// number. Case 39 (quota_mode) does not apply: rlsconfig refuses
// quota_mode.

// step is one call: the descriptors of a request of domain with the
// request-level hits_addend, and its answer as statuses renders it.
type step struct {
	name   string
	domain string
	hits   uint32
	descs  []*ratelimitv3.RateLimitDescriptor
	want   string
	after  time.Duration // clock moves by this after the call
}

func (h *harness) run(steps []step) {
	h.t.Helper()
	for _, st := range steps {
		got := statuses(h.call(st.domain, st.hits, st.descs...))
		if got != st.want {
			h.t.Errorf("%s:\n got %s\nwant %s", st.name, got, st.want)
		}
		h.clock.Add(st.after)
	}
}

func TestCase28UnknownDomain(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "basic.yaml", "another.yaml")
	h.run([]step{
		{name: "unknown domain", domain: "foo", descs: ds(desc("hello", "world")), want: "OK | OK - 0 -"},
		// a descriptor-supplied limit needs a configured domain
		{name: "unknown domain, own limit", domain: "foo", descs: ds(withLimit(desc("hello", "world"), 1, 1)), want: "OK | OK - 0 -"},
		{name: "no rule", domain: "basic", descs: ds(desc("nope", "x"), desc()), want: "OK | OK - 0 -; OK - 0 -"},
	})
	if got := h.metric("ratelimit_authz_rls_descriptors_unmatched_total", "domain", ""); got != 2 {
		t.Errorf("unmatched descriptors of unknown domains: %v, want 2", got)
	}
	if got := h.metric("ratelimit_authz_rls_descriptors_unmatched_total", "domain", "basic"); got != 2 {
		t.Errorf("unmatched descriptors of basic: %v, want 2", got)
	}
	if got := h.metric("ratelimit_authz_rls_requests_total", "domain", "", "code", "ok"); got != 2 {
		t.Errorf("requests of unknown domains: %v, want 2", got)
	}
}

func TestCase29Basic(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "basic.yaml")
	d := desc("key1", "foo")
	h.run([]step{{name: "first hit", domain: "basic", descs: ds(d), want: "OK | OK 50/SECOND 49 1s"}})
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("basic", d), "decision", "allowed"); got != 1 {
		t.Errorf("allowed descriptors of key1: %v, want 1", got)
	}
}

func TestCase30OverTheLimit(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "another.yaml")
	d := desc("key2", "r1")
	var steps []step
	for i := 1; i <= 25; i++ {
		want := fmt.Sprintf("OK | OK 20/MINUTE %d 1m0s", 20-i)
		if i > 20 {
			want = "OVER_LIMIT | OVER_LIMIT 20/MINUTE 0 1m0s"
		}
		steps = append(steps, step{name: fmt.Sprintf("call %d", i), domain: "another", descs: ds(d), want: want})
	}
	h.run(steps)
	b := h.bucket("another", d)
	if a, o := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", "allowed"),
		h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", "denied"); a != 20 || o != 5 {
		t.Errorf("allowed %v, denied %v: want 20 and 5", a, o)
	}
	if got := h.metric("ratelimit_authz_rls_requests_total", "domain", "another", "code", "over_limit"); got != 5 {
		t.Errorf("over-limit requests: %v, want 5", got)
	}
}

func TestCase31EveryDescriptorCounts(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "another.yaml")
	var steps []step
	for i := 1; i <= 15; i++ {
		want := fmt.Sprintf("OK | OK 20/MINUTE %d 1m0s; OK 10/HOUR %d 1h0m0s", 20-i, 10-i)
		if i > 10 {
			// key2 keeps counting while key3 is over
			want = fmt.Sprintf("OVER_LIMIT | OK 20/MINUTE %d 1m0s; OVER_LIMIT 10/HOUR 0 1h0m0s", 20-i)
		}
		steps = append(steps, step{name: fmt.Sprintf("call %d", i), domain: "another", descs: ds(desc("key2", "r2"), desc("key3", "r2")), want: want})
	}
	h.run(steps)
}

func TestCase32ResetShrinks(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "another.yaml")
	h.clock.Add(10 * time.Hour)
	h.run([]step{
		{name: "first", domain: "another", descs: ds(desc("key4", "x")), want: "OK | OK 20/DAY 19 14h0m0s", after: 2 * time.Second},
		{name: "2 s later", domain: "another", descs: ds(desc("key4", "x")), want: "OK | OK 20/DAY 18 13h59m58s"},
	})
}

// fill takes n hits of d in domain, outside the steps under test.
func (h *harness) fill(domain string, d *ratelimitv3.RateLimitDescriptor, n int) {
	h.t.Helper()
	for range n {
		h.call(domain, 1, d)
	}
}

func TestCase33OverallOverLimit(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.fill("service", desc("hello", "world"), 10)
	h.run([]step{{name: "one over, one without a limit", domain: "service",
		descs: ds(desc("hello", "world"), desc("nope", "x")), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 1m0s; OK - 0 -"}})

	// A failing update leaves the previous configuration serving.
	if err := h.update(&snapshot.Snapshot{}); err == nil {
		t.Fatal("an update without RLS rules succeeded")
	}
	h.run([]step{{name: "after a failed update", domain: "service", descs: ds(desc("hello", "world")), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 1m0s"}})
}

func TestCase34GlobalShadowMode(t *testing.T) {
	h := newHarness(t, rls.Settings{ShadowMode: true}, "service.yaml")
	h.fill("service", desc("hello", "world"), 10)
	h.run([]step{{name: "global shadow", domain: "service",
		descs: ds(desc("hello", "world"), desc("nope", "x")), want: "OK | OVER_LIMIT 10/MINUTE 0 1m0s; OK - 0 -"}})
	if got := h.metric("ratelimit_authz_rls_requests_total", "domain", "service", "code", "shadow_over_limit"); got != 1 {
		t.Errorf("shadow over-limit requests: %v, want 1", got)
	}
}

func TestCase35MixedRuleShadowMode(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.fill("service", desc("shadow", "s"), 10)
	h.fill("service", desc("hello", "world"), 10)
	h.run([]step{
		{name: "shadow rule over", domain: "service", descs: ds(desc("shadow", "s")), want: "OK | OK 10/MINUTE 0 1m0s"},
		{name: "shadow rule over, other over", domain: "service", descs: ds(desc("shadow", "s"), desc("hello", "world")),
			want: "OVER_LIMIT | OK 10/MINUTE 0 1m0s; OVER_LIMIT 10/MINUTE 0 1m0s"},
	})
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", desc("shadow", "s")), "decision", "shadow_denied"); got != 2 {
		t.Errorf("shadow denials: %v, want 2", got)
	}
}

func headers(r *rlsv3.RateLimitResponse) string {
	var out []string
	for _, h := range r.GetResponseHeadersToAdd() {
		out = append(out, h.GetKey()+": "+h.GetValue())
	}
	return strings.Join(out, ", ")
}

func TestCase36ResponseHeaders(t *testing.T) {
	for _, tt := range []struct {
		name string
		set  rls.Settings
		want string
	}{
		{"default names", rls.Settings{ResponseHeaders: true}, "RateLimit-Limit: 10, RateLimit-Remaining: 0, RateLimit-Reset: 58"},
		{"custom names", rls.Settings{ResponseHeaders: true, LimitHeader: "A-Ratelimit-Limit", RemainingHeader: "A-Ratelimit-Remaining", ResetHeader: "A-Ratelimit-Reset"},
			"A-Ratelimit-Limit: 10, A-Ratelimit-Remaining: 0, A-Ratelimit-Reset: 58"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.set, "service.yaml")
			h.clock.Set(time.Unix(2222, 0)) // upstream's clock: 58 s to the minute's end
			h.fill("service", desc("hello", "world"), 10)
			r := h.call("service", 0, desc("hello", "world"), desc("nope", "x"))
			if got := statuses(r); got != "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 58s; OK - 0 -" {
				t.Errorf("statuses %s", got)
			}
			if got := headers(r); got != tt.want {
				t.Errorf("headers %q, want %q", got, tt.want)
			}
		})
	}

	// Which descriptor the headers describe: the last over the limit, else
	// the limited one with the least remaining (the first of equals); none
	// without any limit.
	h := newHarness(t, rls.Settings{ResponseHeaders: true}, "service.yaml")
	h.fill("service", desc("hour", "a"), 5)
	h.fill("service", desc("hello", "world"), 10)
	h.fill("service", desc("second", "b"), 10)
	for _, tt := range []struct {
		descs []*ratelimitv3.RateLimitDescriptor
		want  string
	}{
		{ds(desc("hour", "x"), desc("hour", "a")), "RateLimit-Limit: 15, RateLimit-Remaining: 9, RateLimit-Reset: 3600"},
		{ds(desc("hour", "y"), desc("hour", "y")), "RateLimit-Limit: 15, RateLimit-Remaining: 13, RateLimit-Reset: 3600"},
		{ds(desc("hello", "world"), desc("hour", "z"), desc("second", "b")), "RateLimit-Limit: 10, RateLimit-Remaining: 0, RateLimit-Reset: 1"},
		{ds(desc("unlimited", "u"), desc("nope", "x")), ""},
	} {
		if got := headers(h.call("service", 0, tt.descs...)); got != tt.want {
			t.Errorf("%v: headers %q, want %q", tt.descs, got, tt.want)
		}
	}
}

func TestCase37Errors(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	for _, tt := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: ds(desc("hello", "world"))}, "rate limit domain must not be empty"},
		{&rlsv3.RateLimitRequest{Domain: "service"}, "rate limit descriptor list must not be empty"},
		{nil, "rate limit domain must not be empty"},
	} {
		resp, err := h.should(tt.req)
		if resp != nil || status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tt.want {
			t.Errorf("%v: %v, %v; want InvalidArgument %q", tt.req, resp, err, tt.want)
		}
	}
	if got := h.metric("ratelimit_authz_rls_requests_total", "domain", "service", "code", "invalid"); got != 1 {
		t.Errorf("invalid requests of service: %v, want 1", got)
	}
}

func TestCase38Unlimited(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.run([]step{{name: "limited, none, unlimited", domain: "service",
		descs: ds(desc("hello", "world"), desc("nope", "x"), desc("unlimited", "u")),
		want:  "OK | OK 10/MINUTE 9 1m0s; OK - 0 -; OK - 4294967295 -"}})
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", desc("unlimited", "u")), "decision", "unlimited"); got != 1 {
		t.Errorf("unlimited descriptors: %v, want 1", got)
	}
}

// Case 40 (upstream's TestRedis). The cache key of upstream's Redis does
// not apply: counts are keyed by rule and values here. Upstream counts the
// hit that goes over (its counter reaches 11 of 10); here it is not
// counted, so a check with an addend of 0 is over once one more hit
// would be refused: at the limit (upstream: OK there, OVER once past it).
func TestCase40Counting(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.clock.Set(time.Unix(1234, 0))
	h.fill("service", desc("second", "v"), 4)
	h.fill("service", desc("hello", "world"), 10)
	h.run([]step{
		{name: "10/SECOND, count becomes 5", domain: "service", descs: ds(desc("second", "v")), want: "OK | OK 10/SECOND 5 1s"},
		{name: "addends 0 and 1, the second over", domain: "service",
			descs: ds(withHits(desc("nope", "x"), 0), withHits(desc("hello", "world"), 1)),
			want:  "OVER_LIMIT | OK - 0 -; OVER_LIMIT 10/MINUTE 0 26s"},
		{name: "addend 0 at the limit: over", domain: "service", descs: ds(withHits(desc("hello", "world"), 0)), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 26s"},
	})
	h.peer("service", desc("hello", "world"), 1) // 11 of 10
	h.run([]step{{name: "addend 0 over the limit", domain: "service", descs: ds(withHits(desc("hello", "world"), 0)), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 26s"}})
	b := h.bucket("service", desc("hello", "world"))
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", "denied"); got != 3 {
		t.Errorf("denied: %v, want 3", got)
	}
}

// Case 41 (upstream's TestNearLimit): the remaining arithmetic with
// addends. Upstream's near_limit statistic has no counterpart here. The
// states upstream reaches by counting hits that went over are set with a
// peer's count (replication).
func TestCase41Addends(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.clock.Set(time.Unix(1000000, 0))
	hour, twenty, eight := desc("hour", "h"), desc("twenty", "t"), desc("eight", "e")
	h.fill("service", hour, 10)
	h.run([]step{
		{name: "15/HOUR at 11", domain: "service", descs: ds(hour), want: "OK | OK 15/HOUR 4 13m20s"},
		{name: "15/HOUR at 13", domain: "service", hits: 2, descs: ds(hour), want: "OK | OK 15/HOUR 2 13m20s"},
		{name: "15/HOUR at 16: over", domain: "service", hits: 3, descs: ds(hour), want: "OVER_LIMIT | OVER_LIMIT 15/HOUR 0 13m20s"},
		// the 3 hits that did not fit were not counted: 2 still fit
		{name: "15/HOUR: 2 more fit", domain: "service", hits: 2, descs: ds(hour), want: "OK | OK 15/HOUR 0 13m20s"},
		{name: "20/SECOND, addend 3 from 2", domain: "service", descs: ds(withHits(desc("twenty", "a"), 2)), want: "OK | OK 20/SECOND 18 1s"},
		{name: "20/SECOND, addend 3 to 5", domain: "service", hits: 3, descs: ds(desc("twenty", "a")), want: "OK | OK 20/SECOND 15 1s"},
	})
	h.fill("service", eight, 5)
	h.fill("service", twenty, 16)
	h.run([]step{
		{name: "8/SECOND, addend 2 to 7", domain: "service", hits: 2, descs: ds(eight), want: "OK | OK 8/SECOND 1 1s"},
		{name: "20/SECOND, addend 3 to 19", domain: "service", hits: 3, descs: ds(twenty), want: "OK | OK 20/SECOND 1 1s"},
		{name: "20/SECOND, addend 3 to 22: over", domain: "service", hits: 3, descs: ds(twenty), want: "OVER_LIMIT | OVER_LIMIT 20/SECOND 0 1s"},
	})
	// 15 + 7 = 22 > 20: over; 27 + 3 of 10: over.
	seven, ten := desc("twenty", "b"), desc("second", "c")
	h.fill("service", seven, 15)
	h.peer("service", ten, 27)
	h.run([]step{
		{name: "20/SECOND, addend 7 from 15", domain: "service", descs: ds(withHits(seven, 7)), want: "OVER_LIMIT | OVER_LIMIT 20/SECOND 0 1s"},
		{name: "10/SECOND, addend 3 from 27", domain: "service", descs: ds(withHits(ten, 3)), want: "OVER_LIMIT | OVER_LIMIT 10/SECOND 0 1s"},
		{name: "10/SECOND, addend 0 at 27", domain: "service", descs: ds(withHits(ten, 0)), want: "OVER_LIMIT | OVER_LIMIT 10/SECOND 0 1s"},
	})
}

func ds(d ...*ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor { return d }
