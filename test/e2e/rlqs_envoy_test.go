package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
)

// These tests pin what Envoy 1.40.0's rate_limit_quota filter does, against
// a stub RLQS server (rlqs_stub_test.go); docs/envoy.md, section
// "rate_limit_quota filter (RLQS)", states each finding. The product's
// server is designed to them, so a new Envoy that behaves otherwise fails
// here first.

// quotaStack starts a stub RLQS server and an Envoy on the shipped quota
// bootstrap, its buckets replaced by bs unless bs is empty.
func quotaStack(t *testing.T, bs ...envoyconf.QuotaBucket) (*stack, *quotaStub) {
	t.Helper()
	s := prepareStack(t, 1)
	q := startQuotaStub(t, s.addrs.Authz[0])
	src, err := os.ReadFile(filepath.Join(root(t), envoyconf.QuotaPath))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyconf.Render(src, s.addrs)
	if err == nil && len(bs) > 0 {
		cfg, err = envoyconf.WithQuotaBuckets(cfg, "stub", bs...)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.envoy = s.startEnvoyConfig(t, "envoy", s.addrs.Admin, cfg)
	return s, q
}

// caseBucket is a bucket for requests with x-case: name, its id
// {case: name} plus parts.
func caseBucket(name string, b envoyconf.QuotaBucket, parts ...envoyconf.QuotaIDPart) envoyconf.QuotaBucket {
	b.Header, b.Exact = "x-case", name
	b.ID = append([]envoyconf.QuotaIDPart{{Key: "case", Value: name}}, parts...)
	return b
}

// burst sends n requests of case c one after the other and returns their
// statuses.
func (s *stack) burst(c string, n int, hdr map[string]string) string {
	s.t.Helper()
	rs := make([]*response, n)
	for i := range rs {
		h := map[string]string{"x-case": c}
		for k, v := range hdr {
			h[k] = v
		}
		rs[i] = s.mustGet(s.addrs.Listener, "/api/activities", h)
	}
	return statuses(rs)
}

func TestQuotaFilterBehaviour(t *testing.T) {
	deny := envoyconf.QuotaBucket{DenyStatus: 429, DenyBody: `{"error":"rate_limited"}`,
		DenyHeaders: map[string]string{"retry-after": "1", "content-type": "application/json"}}
	denyAll := &envoyconf.QuotaStrategy{Blanket: "DENY_ALL"}
	s, q := quotaStack(t,
		caseBucket("tenant", envoyconf.QuotaBucket{}, envoyconf.QuotaIDPart{Key: "tenant", Header: "x-tenant-id"}),
		caseBucket("deny", deny),
		caseBucket("token", envoyconf.QuotaBucket{}),
		caseBucket("per_unit", envoyconf.QuotaBucket{}),
		caseBucket("sub_second", envoyconf.QuotaBucket{}),
		caseBucket("no_assignment", envoyconf.QuotaBucket{NoAssignment: denyAll}),
		caseBucket("expire", envoyconf.QuotaBucket{Expired: denyAll, ExpiredTimeout: time.Minute}),
		caseBucket("expire_no_timeout", envoyconf.QuotaBucket{Expired: denyAll}),
		caseBucket("reuse", envoyconf.QuotaBucket{ReuseLast: true, ExpiredTimeout: time.Minute}),
		caseBucket("ttl0", envoyconf.QuotaBucket{}),
		caseBucket("abandon", envoyconf.QuotaBucket{}),
		caseBucket("replace", envoyconf.QuotaBucket{}),
	)
	ttl := time.Minute
	q.setAnswer(func(id map[string]string, first bool) *rlqsv3.RateLimitQuotaResponse_BucketAction {
		switch id["case"] {
		case "tenant", "abandon":
			return assign(id, ttl, blanket(typev3.RateLimitStrategy_ALLOW_ALL))
		case "deny":
			return assign(id, ttl, blanket(typev3.RateLimitStrategy_DENY_ALL))
		case "token": // the same assignment at every report
			return assign(id, ttl, tokenBucket(3, 1, time.Hour))
		case "per_unit":
			return assign(id, ttl, perSecond(2))
		case "sub_second": // 1 token every 0.5 s, were it honoured
			return assign(id, ttl, tokenBucket(2, 1, 500*time.Millisecond))
		case "expire", "expire_no_timeout":
			if first {
				return assign(id, time.Second, blanket(typev3.RateLimitStrategy_ALLOW_ALL))
			}
		case "reuse":
			if first {
				return assign(id, time.Second, blanket(typev3.RateLimitStrategy_DENY_ALL))
			}
		case "ttl0":
			return assign(id, 0, blanket(typev3.RateLimitStrategy_DENY_ALL))
		case "replace":
			if first {
				return assign(id, ttl, tokenBucket(10, 1, time.Hour))
			}
		}
		return nil
	})
	cases := []string{"tenant", "deny", "token", "per_unit", "sub_second", "no_assignment", "expire", "expire_no_timeout", "reuse", "ttl0", "abandon", "replace"}

	time.Sleep(500 * time.Millisecond)
	if n := len(q.snapshot()); n != 0 {
		t.Errorf("an idle Envoy opened %d RLQS streams, want none before the first request", n)
	}

	// The first request of each bucket: reported at once, alone.
	var firstReport time.Time
	for _, c := range cases {
		st := s.burst(c, 1, map[string]string{"x-tenant-id": "t1"})
		want := "200"
		if c == "no_assignment" {
			want = "429"
		}
		if st != want {
			t.Errorf("%s: first request %s, want %s (no_assignment_behavior)", c, st, want)
		}
		if !q.waitFor(5*time.Second, func() bool { return len(q.reportsOf(map[string]string{"case": c})) > 0 }) {
			t.Fatalf("%s: no report of the new bucket within 5 s", c)
		}
		u := q.reportsOf(map[string]string{"case": c})[0]
		if firstReport.IsZero() {
			firstReport = u.at
		}
		allowed, denied := uint64(1), uint64(0)
		if c == "no_assignment" {
			allowed, denied = 0, 1
		}
		if u.allowed != allowed || u.denied != denied || u.elapsed != 0 {
			t.Errorf("%s: first report allowed %d denied %d elapsed %v, want %d, %d, 0s", c, u.allowed, u.denied, u.elapsed, allowed, denied)
		}
	}
	streams := q.snapshot()
	if len(streams) != 1 {
		t.Fatalf("%d streams after the first requests, want 1", len(streams))
	}
	for _, r := range streams[0].reports {
		if r.domain != "stub" || len(r.usages) != 1 {
			t.Errorf("an immediate report: domain %q, %d usages; want the filter's domain and one usage", r.domain, len(r.usages))
		}
	}
	if got := q.reportsOf(map[string]string{"case": "tenant"})[0].id; idKey(got) != "case=tenant;tenant=t1;" {
		t.Errorf("bucket id %v, want {case: tenant, tenant: t1} (string_value and the header's custom_value)", got)
	}
	// An absent custom_value header: no bucket, not limited, not reported.
	if st := s.burst("tenant", 1, nil); st != "200" {
		t.Errorf("without x-tenant-id: %s, want 200", st)
	}
	time.Sleep(300 * time.Millisecond) // the assignments arrive
	for _, r := range q.reportsOf(map[string]string{"case": "tenant"}) {
		if r.id["tenant"] == "" {
			t.Errorf("a request without the custom_value header was reported as %v", r.id)
		}
	}

	t.Run("strategies", func(t *testing.T) {
		if st := s.burst("deny", 3, nil); st != "429 429 429" {
			t.Errorf("DENY_ALL: %s, want 429s", st)
		}
		r := s.mustGet(s.addrs.Listener, "/api/activities", map[string]string{"x-case": "deny"})
		if r.status != 429 || r.header.Get("Retry-After") != "1" || r.header.Get("Content-Type") != "application/json" || string(r.body) != `{"error":"rate_limited"}` {
			t.Errorf("deny_response_settings: %d %v %q, want 429, retry-after 1, application/json and the body", r.status, r.header, r.body)
		}
		if st := s.burst("tenant", 5, map[string]string{"x-tenant-id": "t1"}); st != "200 200 200 200 200" {
			t.Errorf("ALLOW_ALL: %s", st)
		}
		// A token bucket starts full: 3 tokens, the first request having
		// passed before the assignment.
		if st := s.burst("token", 5, nil); st != "200 200 200 429 429" {
			t.Errorf("token_bucket max 3: %s, want 3 passing, then 429 (default deny status)", st)
		}
		if st := s.burst("per_unit", 6, nil); st != "200 200 200 200 200 200" {
			t.Errorf("requests_per_time_unit 2/s: %s; Envoy 1.40.0 ignores it (all pass)", st)
		}
		if st := s.burst("sub_second", 6, nil); st != "200 200 200 200 200 200" {
			t.Errorf("token_bucket with a 0.5 s fill interval: %s; Envoy 1.40.0 never denies it (all pass)", st)
		}
		if st := s.burst("no_assignment", 2, nil); st != "429 429" {
			t.Errorf("no assignment, DENY_ALL: %s", st)
		}
		if st := s.burst("ttl0", 3, nil); st != "200 200 200" {
			t.Errorf("DENY_ALL with TTL 0: %s; it expires at once (all pass)", st)
		}
	})

	t.Run("token bucket replaced", func(t *testing.T) {
		id := map[string]string{"case": "replace"}
		send := func(as ...*rlqsv3.RateLimitQuotaResponse_BucketAction) {
			q.push(t, &rlqsv3.RateLimitQuotaResponse{BucketAction: as})
			time.Sleep(200 * time.Millisecond)
		}
		if st := s.burst("replace", 3, nil); st != "200 200 200" {
			t.Fatalf("10 tokens: %s", st)
		}
		send(assign(id, ttl, tokenBucket(10, 2, time.Hour)))
		if st := s.burst("replace", 9, nil); st != "200 200 200 200 200 200 200 429 429" {
			t.Errorf("another token bucket of 10 with 7 left: %s; Envoy keeps the 7 (7 pass)", st)
		}
		send(assign(id, ttl, tokenBucket(20, 1, time.Hour)))
		if st := s.burst("replace", 2, nil); st != "429 429" {
			t.Errorf("an empty bucket given max 20: %s; still empty", st)
		}
		send(assign(id, ttl, blanket(typev3.RateLimitStrategy_ALLOW_ALL)), assign(id, ttl, tokenBucket(5, 1, time.Hour)))
		if st := s.burst("replace", 7, nil); st != "200 200 200 200 200 429 429" {
			t.Errorf("a blanket rule and a token bucket of 5 in one message: %s; the bucket starts full (5 pass)", st)
		}
		// A larger bucket replacing a half-spent one keeps the ratio of
		// tokens left, not their number: 5 of 10 left become 10 of 20, so
		// what was spent and what is left add up to at most the new size.
		send(assign(id, ttl, blanket(typev3.RateLimitStrategy_ALLOW_ALL)), assign(id, ttl, tokenBucket(10, 1, time.Hour)))
		if st := s.burst("replace", 5, nil); st != "200 200 200 200 200" {
			t.Errorf("a fresh bucket of 10: %s", st)
		}
		send(assign(id, ttl, tokenBucket(20, 1, time.Hour)))
		if st := s.burst("replace", 12, nil); st != strings.TrimSpace(strings.Repeat("200 ", 10)+"429 429") {
			t.Errorf("a bucket of 20 replacing one of 10 with 5 left: %s; Envoy scales the tokens left (10 pass)", st)
		}
	})

	t.Run("expiry", func(t *testing.T) {
		time.Sleep(time.Until(firstReport.Add(1500 * time.Millisecond))) // TTLs of 1 s ended
		if st := s.burst("expire", 2, nil); st != "429 429" {
			t.Errorf("expired, fallback DENY_ALL for 1 min: %s, want 429s", st)
		}
		if st := s.burst("expire_no_timeout", 2, nil); st != "200 200" {
			t.Errorf("expired, fallback without timeout: %s; it lasts 0 s (all pass)", st)
		}
		if st := s.burst("reuse", 2, nil); st != "200 200" {
			t.Errorf("expired DENY_ALL with reuse_last_assignment: %s; not implemented (all pass)", st)
		}
	})

	t.Run("periodic report", func(t *testing.T) {
		var periodic stubReport
		ok := q.waitFor(8*time.Second, func() bool {
			for _, r := range q.snapshot()[0].reports {
				if len(r.usages) > 1 {
					periodic = r
					return true
				}
			}
			return false
		})
		if !ok {
			t.Fatal("no periodic report within 8 s of the first")
		}
		gap := periodic.at.Sub(firstReport)
		t.Logf("first periodic report %v after the first report (reporting_interval 1 s)", gap)
		if gap < 3500*time.Millisecond {
			t.Errorf("periodic report %v after the first; Envoy 1.40.0 reports every 5 s", gap)
		}
		if len(periodic.usages) != len(cases) {
			t.Errorf("periodic report has %d buckets, want every bucket (%d)", len(periodic.usages), len(cases))
		}
		for _, u := range periodic.usages {
			if u.elapsed%time.Second != 0 || u.elapsed < 3*time.Second {
				t.Errorf("%v: time_elapsed %v, want whole seconds since its first report", u.id, u.elapsed)
			}
			if u.id["case"] == "token" && (u.allowed != 3 || u.denied != 2) {
				t.Errorf("token: reported %d allowed, %d denied since the first report, want 3 and 2", u.allowed, u.denied)
			}
		}
		time.Sleep(200 * time.Millisecond) // the re-sent assignments arrive
		if st := s.burst("token", 2, nil); st != "429 429" {
			t.Errorf("token bucket after the same assignment was sent again: %s; it keeps its tokens (429s)", st)
		}
	})

	t.Run("abandon", func(t *testing.T) {
		before := len(q.reportsOf(map[string]string{"case": "abandon"}))
		q.push(t, &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
			abandon(map[string]string{"case": "abandon", "extra": "x"})}})
		time.Sleep(200 * time.Millisecond)
		s.burst("abandon", 1, nil)
		time.Sleep(200 * time.Millisecond)
		if n := len(q.reportsOf(map[string]string{"case": "abandon"})); n != before {
			t.Errorf("abandon of an id with an extra key dropped the bucket (%d new reports)", n-before)
		}
		q.push(t, &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
			abandon(map[string]string{"case": "abandon"})}})
		time.Sleep(200 * time.Millisecond)
		s.burst("abandon", 1, nil)
		if !q.waitFor(2*time.Second, func() bool { return len(q.reportsOf(map[string]string{"case": "abandon"})) > before }) {
			t.Fatal("after abandon_action, the next request was not reported at once")
		}
		u := q.reportsOf(map[string]string{"case": "abandon"})[before]
		if u.allowed != 1 || u.elapsed != 0 {
			t.Errorf("the report after abandon: allowed %d elapsed %v, want a new bucket's (1, 0s)", u.allowed, u.elapsed)
		}
	})

	t.Run("stream ends", func(t *testing.T) {
		q.endStreams(errStubEnd)
		ended := time.Now()
		time.Sleep(100 * time.Millisecond)
		if st := s.burst("deny", 2, nil); st != "429 429" {
			t.Errorf("DENY_ALL right after the stream ended: %s; the assignment holds until its TTL", st)
		}
		if !q.waitFor(8*time.Second, func() bool { return len(q.snapshot()) > 1 }) {
			t.Fatal("Envoy opened no new stream within 8 s of the old one ending")
		}
		next := q.snapshot()[1]
		t.Logf("new stream %v after the old one ended", next.opened.Sub(ended))
		if !q.waitFor(2*time.Second, func() bool { return len(q.snapshot()[1].reports) > 0 }) {
			t.Fatal("no report on the new stream")
		}
		if r := q.snapshot()[1].reports[0]; len(r.usages) < len(cases)-1 {
			t.Errorf("the new stream's first message has %d buckets, want the periodic report of all", len(r.usages))
		}
	})
}

// TestQuotaShippedBuckets sends the example API's requests through the
// shipped bootstrap as it is and checks the bucket ids Envoy reports: the
// ones config/ratelimit.yaml's quota section maps.
func TestQuotaShippedBuckets(t *testing.T) {
	s, q := quotaStack(t)
	post := func(path string, hdr map[string]string) int {
		t.Helper()
		r, err := s.post(path, hdr)
		if err != nil {
			t.Fatal(err)
		}
		return r.status
	}
	for _, c := range []struct {
		path string
		hdr  map[string]string
		want string // idKey of the reported bucket id
	}{
		{"/api/activities", map[string]string{"x-tenant-id": "acme"}, "name=activity_create;tenant=acme;"},
		{"/api/converger/activities?x=1", map[string]string{"x-tenant-id": "beta"}, "name=activity_create;tenant=beta;"},
		{"/api/activities", nil, "name=activity_create;tenant=;"},
		{"/api/converger/uploads", map[string]string{"x-tenant-id": "acme"}, "name=upload;tenant=acme;"},
		{"/api/inbound/ch1", nil, "channel=ch1;name=inbound;"},
		// The client's own x-ratelimit-channel is replaced by the path's.
		{"/api/inbound/ch2/status?q", map[string]string{"x-ratelimit-channel": "other"}, "channel=ch2;name=inbound;"},
		{"/api/converger/channels/ch3/token/refresh", nil, "channel=ch3;name=token_generate;"},
		// The matchers read the path as normalised (normalize_path,
		// merge_slashes), so a spelling that routes to the app lands in
		// the same bucket.
		{"//api/./activities", map[string]string{"x-tenant-id": "acme2"}, "name=activity_create;tenant=acme2;"},
		{"/api/inbound/x/../ch4", nil, "channel=ch4;name=inbound;"},
	} {
		before := q.reportsOf(nil)
		if st := post(c.path, c.hdr); st != 200 {
			t.Errorf("POST %s: %d, want 200 (the app)", c.path, st)
		}
		if !q.waitFor(3*time.Second, func() bool { return len(q.reportsOf(nil)) > len(before) }) {
			t.Errorf("POST %s %v: no report", c.path, c.hdr)
			continue
		}
		if got := idKey(q.reportsOf(nil)[len(before)].id); got != c.want {
			t.Errorf("POST %s %v: bucket id %s, want %s", c.path, c.hdr, got, c.want)
		}
	}
	// The shipped deny response, and the tenant-less bucket id limited
	// like any other once the server denies it.
	q.push(t, &rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{
		assign(map[string]string{"name": "activity_create", "tenant": ""}, time.Minute, blanket(typev3.RateLimitStrategy_DENY_ALL))}})
	time.Sleep(200 * time.Millisecond)
	r, err := s.post("/api/activities", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 429 || r.header.Get("Retry-After") != "1" || r.header.Get("Content-Type") != "application/json" || string(r.body) != `{"error":"rate_limited"}` {
		t.Errorf("without x-tenant-id, denied: %d %v %q; want the shipped 429 with retry-after 1 and the JSON body", r.status, r.header, r.body)
	}
	// Each new key's first request passes before its assignment can arrive
	// (no_assignment_behavior: allow): a client that can choose its key
	// gets one request per key it invents.
	fresh := 0
	for i := range 20 {
		if post(activitiesPath, map[string]string{"x-tenant-id": fmt.Sprintf("new-%d", i)}) == 200 {
			fresh++
		}
	}
	if fresh != 20 {
		t.Errorf("%d of 20 new tenants' first requests passed, want 20 (no assignment yet)", fresh)
	}
	if !q.waitFor(3*time.Second, func() bool { return len(q.reportsOf(map[string]string{"tenant": "new-19"})) > 0 }) {
		t.Error("the new tenants' bucket ids were not reported")
	}
	for _, r := range q.snapshot()[0].reports {
		if r.domain != "example-api" {
			t.Errorf("domain %q, want example-api (config/ratelimit.yaml quota.domains)", r.domain)
		}
	}
	// Not part of the API, or another method: no bucket, no report.
	n := len(q.reportsOf(nil))
	if r := s.mustGet(s.addrs.Listener, "/api/activities", map[string]string{"x-tenant-id": "acme"}); r.status != 200 {
		t.Errorf("GET /api/activities: %d", r.status)
	}
	if r := s.mustGet(s.addrs.Listener, "/elsewhere", nil); r.status != 404 {
		t.Errorf("GET /elsewhere: %d, want 404", r.status)
	}
	time.Sleep(200 * time.Millisecond)
	if got := len(q.reportsOf(nil)); got != n {
		var ids []string
		for _, u := range q.reportsOf(nil)[n:] {
			ids = append(ids, idKey(u.id))
		}
		t.Errorf("requests outside the limited routes were reported: %s", strings.Join(ids, " "))
	}
}
