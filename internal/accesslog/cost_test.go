package accesslog_test

import (
	"testing"
	"time"

	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const costYAML = `
keys: {account_header: x-login-account}
buckets:
  tokens: {limit: 10000, per: 1m, key: "header:x-org", cost: {response_header: x-usage-total-tokens, max: 4000}}
  trailer_tokens: {limit: 10000, per: 1m, key: "header:x-org", cost: {response_trailer: x-tokens, max: 4000, missing: 7}}
  bytes_out: {limit: 1000, per: 1m, key: "header:x-org", cost: response_bytes}
  guesses: {limit: 5, per: 1m, key: ip, count: failures}
routes:
  - {path: /llm, buckets: [tokens, trailer_tokens]}
  - {path: /download, buckets: [bytes_out, guesses]}
`

// call is one checked request of org to path, through the harness's Check.
func (h *harness) call(path, org string) *authv3.CheckResponse {
	h.t.Helper()
	return h.checkHeaders(path, map[string]string{"x-org": org, "x-envoy-external-address": "203.0.113.5"})
}

// answered is the access-log entry of resp answered with code, the given
// response headers and trailers, and bytes of body.
func answered(resp *authv3.CheckResponse, code uint32, headers, trailers map[string]string, bytes uint64) *accesslogv3.HTTPAccessLogEntry {
	e := entry(resp, code)
	e.Response = &accesslogv3.HTTPResponseProperties{
		ResponseCode: wrapperspb.UInt32(code), ResponseHeaders: headers, ResponseTrailers: trailers, ResponseBodyBytes: bytes,
	}
	return e
}

// The access log charges each response's reported cost under the key the
// Check recorded; once the charges spend the budget the Check denies,
// until the window ends.
func TestResponseCostChargedFromTheAccessLog(t *testing.T) {
	h := newHarnessFor(t, "", []byte(costYAML))
	for i := range 3 {
		resp := h.call("/llm", "acme")
		if !allowed(resp) {
			t.Fatalf("request %d denied", i)
		}
		h.send(answered(resp, 200, map[string]string{"x-usage-total-tokens": "3000"}, map[string]string{"x-tokens": "1"}, 0))
	}
	h.waitCounted("counted", 3)
	if got := h.metric("ratelimit_authz_cost_charged_total", "bucket", "tokens"); got != 9000 {
		t.Fatalf("charged %v, want 9000", got)
	}
	// 1000 left: the next request is let in (the check cannot know its
	// cost) and its response overshoots the budget.
	resp := h.call("/llm", "acme")
	if !allowed(resp) {
		t.Fatal("denied with 1000 tokens left")
	}
	h.send(answered(resp, 200, map[string]string{"x-usage-total-tokens": "2500"}, nil, 0))
	h.waitCounted("counted", 4)
	h.clock.Set(t0.Add(10 * time.Second))
	resp = h.call("/llm", "acme")
	if allowed(resp) {
		t.Fatal("a spent budget let a request through")
	}
	if got := headerOf(resp, "retry-after"); got != "50" {
		t.Errorf("retry-after %q, want 50", got)
	}
	if allowed := allowed(h.call("/llm", "other")); !allowed {
		t.Error("another org's budget is spent too")
	}
	h.clock.Set(t0.Add(time.Minute))
	if !allowed(h.call("/llm", "acme")) {
		t.Error("still denied in the next window")
	}
	// The trailer bucket: 1 three times, then missing (7).
	if got := h.metric("ratelimit_authz_cost_charged_total", "bucket", "trailer_tokens"); got != 10 {
		t.Errorf("trailer charged %v, want 10", got)
	}
	if got := h.metric("ratelimit_authz_cost_charge_values_total", "bucket", "trailer_tokens", "outcome", "missing"); got != 1 {
		t.Errorf("trailer missing %v, want 1", got)
	}
}

// Hostile reported values charge by the documented rule, never a refund
// or more than max, each counted by outcome.
func TestHostileResponseCosts(t *testing.T) {
	h := newHarnessFor(t, "", []byte(costYAML))
	values := []struct {
		v       string
		present bool
		charge  float64
		outcome string
	}{
		{"10", true, 10, "ok"},
		{"-500", true, 0, "invalid"},
		{"lots", true, 0, "invalid"},
		{"", false, 0, "missing"},
		{"99999999999999999999999", true, 4000, "over_max"},
		{"5000", true, 4000, "over_max"},
		{"3,20", true, 20, "repeated"},
		{"3,-20", true, 0, "invalid"},
	}
	var want float64
	for i, v := range values {
		resp := h.call("/llm", "acme")
		hd := map[string]string{}
		if v.present {
			hd["x-usage-total-tokens"] = v.v
		}
		h.send(answered(resp, 200, hd, nil, 0))
		h.waitCounted("counted", float64(i+1))
		want += v.charge
		if got := h.metric("ratelimit_authz_cost_charged_total", "bucket", "tokens"); got != want {
			t.Fatalf("after %q: charged %v, want %v", v.v, got, want)
		}
	}
	for outcome, n := range map[string]float64{"ok": 1, "invalid": 3, "missing": 1, "over_max": 2, "repeated": 1} {
		if got := h.metric("ratelimit_authz_cost_charge_values_total", "bucket", "tokens", "outcome", outcome); got != n {
			t.Errorf("outcome %s: %v, want %v", outcome, got, n)
		}
	}
}

// response_bytes charges the body bytes; a failure bucket on the same
// route charges only failures, through the same entry.
func TestResponseBytesAndFailuresOneEntry(t *testing.T) {
	h := newHarnessFor(t, "", []byte(costYAML))
	resp := h.call("/download", "acme")
	h.send(answered(resp, 200, nil, nil, 600))
	h.waitCounted("counted", 1)
	resp = h.call("/download", "acme")
	h.send(answered(resp, 401, nil, nil, 1<<40)) // over max (2^31−1)
	h.waitCounted("counted", 2)
	if got := h.metric("ratelimit_authz_cost_charged_total", "bucket", "bytes_out"); got != 600+2147483647 {
		t.Errorf("bytes charged %v", got)
	}
	if got := h.metric("ratelimit_authz_failures_counted_total", "bucket", "guesses"); got != 1 {
		t.Errorf("failures %v, want 1 (the 401 only)", got)
	}
	if allowed(h.call("/download", "acme")) {
		t.Error("spent byte budget allowed")
	}
}

// A denied request lists no charges; an entry naming a bucket under the
// wrong field, or a bucket the Check peeks at under no field, is
// malformed and charges nothing.
func TestChargesNeedTheirField(t *testing.T) {
	h := newHarnessFor(t, "", []byte(costYAML))
	resp := h.call("/llm", "acme")
	md := resp.GetDynamicMetadata()
	charges := md.GetFields()["charges"]
	md.Fields["failures"] = charges // a cost bucket under failures
	delete(md.Fields, "charges")
	h.send(answered(resp, 401, map[string]string{"x-usage-total-tokens": "100"}, nil, 0))
	h.waitCounted("malformed", 1)
	if got := h.metric("ratelimit_authz_cost_charged_total", "bucket", "tokens"); got != 0 {
		t.Errorf("charged %v through the failures field", got)
	}
}

func headerOf(resp *authv3.CheckResponse, name string) string {
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == name {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}
