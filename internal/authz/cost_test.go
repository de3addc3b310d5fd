package authz_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

const costYAML = `
buckets:
  declared: {limit: 100, per: 1m, key: tenant, cost: {request_header: x-cost, max: 60}}
  lenient: {limit: 100, per: 1m, key: tenant, cost: {request_header: x-cost, max: 60, missing: 5}}
  bytes_in: {limit: 1000, per: 1m, key: tenant, cost: content_length}
  tokens: {limit: 10000, per: 1m, key: tenant, cost: {response_header: x-usage-total-tokens, max: 4000}}
  bytes_out: {limit: 1000, per: 1m, key: tenant, cost: response_bytes}
  weighted: {limit: 100, per: 1m, key: tenant}
  per_request: {limit: 3, per: 1m, key: tenant}
  guesses: {limit: 5, per: 1m, key: ip, count: failures}
routes:
  - {path: /declared, buckets: [declared]}
  - {path: /lenient, buckets: [lenient]}
  - {path: /upload, buckets: [bytes_in]}
  - {path: /llm, buckets: [per_request, tokens]}
  - {path: /download, buckets: [bytes_out, guesses]}
  - {path: /heavy, buckets: [weighted], costs: {weighted: 30}}
  - {path: /light, buckets: [weighted]}
  - {path: /both, buckets: [weighted, declared]}
`

func costHeaders(tenantID string, kv ...string) map[string]string {
	h := tenant(tenantID)
	for i := 0; i+1 < len(kv); i += 2 {
		h[kv[i]] = kv[i+1]
	}
	return h
}

// A request-time cost is taken whole: all of it fits or the request is
// denied and counts nothing, with Retry-After from the window.
func TestRequestHeaderCostIsTakenWhole(t *testing.T) {
	h := newHarness(t, costYAML)
	r := func(cost string) req { return req{path: "/declared", headers: costHeaders("t", "x-cost", cost)} }
	h.expectRun(1, true, r("60"))
	h.expectRun(1, true, r("40"))
	resp := h.check(r("1"))
	if allowed(resp) {
		t.Fatal("a request over the spent budget was allowed")
	}
	hd := responseHeaders(resp)
	if hd["retry-after"] != "60" {
		t.Errorf("retry-after %q, want 60", hd["retry-after"])
	}
	// A header cost has no unit the draft names: no RateLimit fields.
	if _, ok := hd["ratelimit-policy"]; ok {
		t.Errorf("a token budget answered RateLimit-Policy %q", hd["ratelimit-policy"])
	}
	h.expectRun(1, false, r("0")) // costs nothing, but the budget is spent
	h.clock.Set(t0.Add(time.Minute))
	h.expectRun(1, true, r("0"))
	h.expectRun(1, true, r("60"))
	h.expectRun(1, false, r("41")) // 41 of the 40 left: none of it taken
	h.expectRun(1, true, r("40"))
	if got := h.metric("ratelimit_authz_cost_admitted_total", "bucket", "declared"); got != 200 {
		t.Errorf("cost admitted %v, want 200", got)
	}
	if got := h.metric("ratelimit_authz_cost_denied_total", "bucket", "declared"); got != 42 {
		t.Errorf("cost denied %v, want 42 (1 + 0 + 41)", got)
	}
}

// Each hostile request value has one outcome: refused with 400 and the
// problem named, or the configured missing cost.
func TestHostileRequestCosts(t *testing.T) {
	h := newHarness(t, costYAML)
	for _, tc := range []struct {
		path, value string
		present     bool
		problem     string // "" = allowed
	}{
		{"/declared", "", false, "missing"},
		{"/declared", "", true, "missing"},
		{"/declared", "-1", true, "invalid"},
		{"/declared", "1.5", true, "invalid"},
		{"/declared", "ten", true, "invalid"},
		{"/declared", "+3", true, "invalid"},
		{"/declared", "61", true, "over_max"},
		{"/declared", "99999999999999999999999999", true, "over_max"},
		{"/declared", "1,1", true, "repeated"},
		{"/lenient", "", false, ""}, // missing: 5
		{"/lenient", "-1", true, "invalid"},
	} {
		hd := tenant("h")
		if tc.present {
			hd["x-cost"] = tc.value
		}
		resp := h.check(req{path: tc.path, headers: hd})
		if tc.problem == "" {
			if !allowed(resp) {
				t.Errorf("%s %q: denied", tc.path, tc.value)
			}
			continue
		}
		d := resp.GetDeniedResponse()
		if d.GetStatus().GetCode() != 400 || !strings.Contains(d.GetBody(), `"problem":"`+tc.problem+`"`) {
			t.Errorf("%s %q: %v %q, want 400 naming %s", tc.path, tc.value, d.GetStatus().GetCode(), d.GetBody(), tc.problem)
		}
	}
	if got := h.store.Peek(h.id("lenient"), "h", counter.Limit{Limit: 100, ScaleMS: 60000}, h.clock.Now()).Count; got != 5 {
		t.Errorf("lenient took %d for a missing header, want 5", got)
	}
	if got := h.store.Peek(h.id("declared"), "h", counter.Limit{Limit: 100, ScaleMS: 60000}, h.clock.Now()).Count; got != 0 {
		t.Errorf("refused requests took %d", got)
	}
	if got := h.metric("ratelimit_authz_cost_refused_total", "bucket", "declared", "problem", "invalid"); got != 4 {
		t.Errorf("refused invalid %v, want 4", got)
	}
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "declared", "decision", "invalid_cost"); got != 9 {
		t.Errorf("invalid_cost decisions %v, want 9", got)
	}
}

// content_length is a budget in bytes, advertised as content-bytes.
func TestContentLengthBudget(t *testing.T) {
	h := newHarness(t, costYAML)
	up := func(n string) req { return req{path: "/upload", headers: costHeaders("t", "content-length", n)} }
	resp := h.check(up("600"))
	if got := responseHeaders(resp)["ratelimit-policy"]; got != `"bytes_in";q=1000;w=60;qu="content-bytes"` {
		t.Errorf("policy %q", got)
	}
	if got := responseHeaders(resp)["ratelimit"]; got != `"bytes_in";r=400;t=60` {
		t.Errorf("ratelimit %q", got)
	}
	h.expectRun(1, false, up("401"))
	resp = h.check(up("401"))
	if got := responseHeaders(resp)["ratelimit-policy"]; got != `"bytes_in";q=1000;w=60;qu="content-bytes"` {
		t.Errorf("denied policy %q", got)
	}
	h.expectRun(1, true, up("400"))
	// A request without content-length (chunked) is refused: no missing.
	if d := h.check(req{path: "/upload", headers: tenant("u")}).GetDeniedResponse(); d.GetStatus().GetCode() != 400 {
		t.Errorf("no content-length: %v", d)
	}
}

// A route's constant cost is taken like any other; routes without one
// cost 1; a later bucket's denial gives the whole cost back.
func TestRouteCostsAndGiveBack(t *testing.T) {
	h := newHarness(t, costYAML)
	heavy := req{path: "/heavy", headers: tenant("t")}
	h.expectRun(3, true, heavy)
	h.expectRun(1, false, heavy)
	h.expectRun(10, true, req{path: "/light", headers: tenant("t")})
	h.expectRun(1, false, req{path: "/light", headers: tenant("t")})
	// weighted (1 on /both) then declared, which refuses 61: weighted
	// gives its hit back.
	h2 := newHarness(t, costYAML)
	h2.expectRun(1, true, req{path: "/both", headers: costHeaders("t", "x-cost", "60")})
	h2.expectRun(3, false, req{path: "/both", headers: costHeaders("t", "x-cost", "41")})
	h2.expectRun(3, false, req{path: "/both", headers: costHeaders("t", "x-cost", "x")})
	lim := counter.Limit{Limit: 100, ScaleMS: 60000}
	if got := h2.store.Peek(h2.id("weighted"), "t", lim, h2.clock.Now()).Count; got != 1 {
		t.Errorf("weighted kept %d after the denials, want 1", got)
	}
	if got := h2.metric("ratelimit_authz_cost_admitted_total", "bucket", "weighted"); got != 1 {
		t.Errorf("weighted admitted %v, want 1: a cost given back was not admitted", got)
	}
	if got := h.metric("ratelimit_authz_cost_admitted_total", "bucket", "weighted"); got != 100 {
		t.Errorf("weighted admitted %v, want 3×30 + 10", got)
	}
}

// A response-time cost: the check peeks (counts nothing itself), names the
// bucket's key under "charges" for the access log, and denies once the
// charges have spent the budget; a denied request lists no charges.
func TestResponseCostPeeksAndRecordsKeys(t *testing.T) {
	h := newHarness(t, costYAML)
	llm := req{path: "/llm", headers: tenant("acme")}
	resp := h.check(llm)
	if !allowed(resp) {
		t.Fatal("denied")
	}
	md := resp.GetDynamicMetadata().GetFields()
	if got := md[accesslog.MetaCharges].GetStructValue().GetFields()["tokens"].GetStringValue(); got != "acme" {
		t.Errorf("charges metadata %v", md)
	}
	if _, ok := md[accesslog.MetaFailures]; ok {
		t.Error("a route without failure buckets has failures metadata")
	}
	lim := counter.Limit{Limit: 10000, ScaleMS: 60000}
	if got := h.store.Peek(h.id("tokens"), "acme", lim, h.clock.Now()).Count; got != 0 {
		t.Errorf("the check charged %d", got)
	}
	h.store.Incr(h.id("tokens"), "acme", lim, 9999, h.clock.Now())
	h.expectRun(1, true, req{path: "/llm", headers: tenant("acme")})
	h.store.Incr(h.id("tokens"), "acme", lim, 1, h.clock.Now())
	h.clock.Set(t0.Add(15 * time.Second))
	resp = h.check(req{path: "/llm", headers: tenant("acme")})
	if allowed(resp) {
		t.Fatal("a spent budget allowed a request")
	}
	if got := responseHeaders(resp)["retry-after"]; got != "45" {
		t.Errorf("retry-after %q, want 45", got)
	}
	if _, ok := resp.GetDynamicMetadata().GetFields()[accesslog.MetaCharges]; ok {
		t.Error("a denied request lists charges")
	}
	// response_bytes with a failure bucket on one route: both fields.
	resp = h.check(req{path: "/download", headers: tenant("acme")})
	md = resp.GetDynamicMetadata().GetFields()
	if md[accesslog.MetaCharges].GetStructValue().GetFields()["bytes_out"].GetStringValue() != "acme" ||
		md[accesslog.MetaFailures].GetStructValue().GetFields()["guesses"].GetStringValue() != "192.0.2.10" {
		t.Errorf("download metadata %v", md)
	}
	if got := responseHeaders(resp)["ratelimit-policy"]; got != `"bytes_out";q=1000;w=60;qu="content-bytes", "guesses";q=5;w=60` {
		t.Errorf("download policy %q", got)
	}
}

func TestCostCheckAllocations(t *testing.T) {
	h := newHarness(t, costYAML)
	for _, tc := range []struct {
		name string
		r    req
		max  float64
	}{
		{"request header", req{path: "/declared", headers: costHeaders("t", "x-cost", "0")}, 2},
		{"route constant", req{path: "/light", headers: tenant("t")}, 2},
		// The charges metadata: as a login's.
		{"response cost", req{path: "/llm", headers: tenant("t")}, 9},
	} {
		wire := marshalRequest(t, checkRequest(tc.r))
		got := allocsPerCheck(t, h, wire)
		t.Logf("%s: %.1f allocs per check", tc.name, got)
		if got > tc.max {
			t.Errorf("%s: %.1f allocs per check, budget %.0f", tc.name, got, tc.max)
		}
	}
}

// A shadow cost bucket counts and reports but never denies, nor refuses.
func TestShadowCostNeverDenies(t *testing.T) {
	h := newHarness(t, `
buckets:
  b: {limit: 10, per: 1m, key: tenant, mode: shadow, cost: {request_header: x-cost, max: 8}}
routes: [{path: /x, buckets: [b]}]`)
	r := req{path: "/x", headers: costHeaders("t", "x-cost", "8")}
	h.expectRun(4, true, r)
	if got := h.metric("ratelimit_authz_cost_admitted_total", "bucket", "b"); got != 8 {
		t.Errorf("admitted %v, want 8", got)
	}
	if got := h.metric("ratelimit_authz_cost_denied_total", "bucket", "b"); got != 24 {
		t.Errorf("denied %v, want 24 (3 × 8, shadow)", got)
	}
	// A cost that cannot be read is reported, not refused: shadow mode
	// turns a new budget on without refusing what it would refuse.
	if d := h.check(req{path: "/x", headers: costHeaders("t", "x-cost", "x")}); !allowed(d) {
		t.Errorf("unreadable cost in shadow mode: %v", d)
	}
	if got := h.metric("ratelimit_authz_cost_refused_total", "bucket", "b", "problem", "invalid"); got != 1 {
		t.Errorf("shadow refusals reported %v, want 1", got)
	}
}

// A shadow budget charged from the response reports the requests it would
// deny (its cost is unknown at the check: cost_denied_total has no
// series for it) and lets them through.
func TestShadowChargedBudgetReportsDenials(t *testing.T) {
	h := newHarness(t, `
buckets:
  tokens: {limit: 100, per: 1m, key: tenant, mode: shadow, cost: {response_header: x-tokens}}
routes: [{path: /x, buckets: [tokens]}]`)
	r := req{path: "/x", headers: tenant("t")}
	h.expectRun(1, true, r)
	h.store.Incr(h.id("tokens"), "t", counter.Limit{Limit: 100, ScaleMS: 60000}, 150, h.clock.Now()) // charged past the budget
	h.expectRun(3, true, r)
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "tokens", "decision", "shadow_denied"); got != 3 {
		t.Errorf("shadow_denied %v, want 3", got)
	}
	if got := h.metric("ratelimit_authz_exceeded_total", "bucket", "tokens"); got != 3 {
		t.Errorf("exceeded %v, want 3", got)
	}
	if _, ok, err := scrape.Gathered(h.reg, "ratelimit_authz_cost_denied_total", "bucket", "tokens"); err != nil || ok {
		t.Errorf("cost_denied_total has a series for a cost charged from the response (%v)", err)
	}
}

// A reload that makes a bucket's cost come from a request header makes
// the decoders keep that header, on both paths.
func TestReloadReadsTheNewCostHeader(t *testing.T) {
	h := newHarness(t, `
buckets:
  b: {limit: 10, per: 1m, key: tenant}
routes: [{path: /x, buckets: [b]}]`)
	r := req{path: "/x", headers: costHeaders("t", "x-cost", "10")}
	h.expectRun(2, true, r)
	h.reload(`
buckets:
  b: {limit: 10, per: 1m, key: tenant, cost: {request_header: x-cost}}
routes: [{path: /x, buckets: [b]}]`)
	// The harness's store is shared and ids are indices here, so the
	// 2 counted before the reload remain: 8 left, 10 does not fit.
	h.expectRun(2, false, r)
	h.expectRun(2, true, req{path: "/x", headers: costHeaders("t", "x-cost", "4")})
}
