package rls_test

import (
	"math"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
)

// negative marks a descriptor is_negative_hits.
func negative(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
	d.IsNegativeHits = true
	return d
}

// A charged rule counts every charge, whether or not it fits (Envoy
// charges what a response reported, when the stream is done, and ignores
// the answer); a check (hits_addend 0) is over once the budget is spent.
// Both ports (the harness calls both) answer alike.
func TestChargedRule(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	tok := func() *ratelimitv3.RateLimitDescriptor { return desc("tokens", "acme") }
	h.run([]step{
		{name: "check, nothing spent", domain: "service", descs: ds(withHits(tok(), 0)), want: "OK | OK 1000/MINUTE 1000 1m0s"},
		{name: "charge 600", domain: "service", descs: ds(withHits(tok(), 600)), want: "OK | OK 1000/MINUTE 400 1m0s"},
		{name: "check, 400 left", domain: "service", descs: ds(withHits(tok(), 0)), want: "OK | OK 1000/MINUTE 400 1m0s"},
		// TakeN would refuse 600 of 400 and count none: a charge counts.
		{name: "charge 600 more: counted past the budget", domain: "service", descs: ds(withHits(tok(), 600)), want: "OVER_LIMIT | OVER_LIMIT 1000/MINUTE 0 1m0s"},
		{name: "check, spent", domain: "service", descs: ds(withHits(tok(), 0)), want: "OVER_LIMIT | OVER_LIMIT 1000/MINUTE 0 1m0s"},
		{name: "a refill is refused", domain: "service", descs: ds(negative(withHits(tok(), 1000))), want: "OK | OK - 0 -"},
		{name: "check, still spent", domain: "service", descs: ds(withHits(tok(), 0)), want: "OVER_LIMIT | OVER_LIMIT 1000/MINUTE 0 1m0s", after: time.Minute},
		{name: "the next window: check", domain: "service", descs: ds(withHits(tok(), 0)), want: "OK | OK 1000/MINUTE 1000 1m0s"},
		// Without a hits_addend of its own a descriptor takes the
		// request's, at least 1, as everywhere: a charge of 1.
		{name: "no addend: a charge of 1", domain: "service", descs: ds(tok()), want: "OK | OK 1000/MINUTE 999 1m0s"},
		{name: "request addend 7", domain: "service", hits: 7, descs: ds(tok()), want: "OK | OK 1000/MINUTE 992 1m0s"},
		{name: "a charge to the limit fits", domain: "service", descs: ds(withHits(tok(), 992)), want: "OK | OK 1000/MINUTE 0 1m0s"},
		{name: "check at the limit: over", domain: "service", descs: ds(withHits(tok(), 0)), want: "OVER_LIMIT | OVER_LIMIT 1000/MINUTE 0 1m0s"},
	})
	b := h.bucket("service", tok())
	for dec, want := range map[string]float64{"charged": 4, "charged_over": 1, "negative": 1, "allowed": 3, "denied": 3} {
		if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", b, "decision", dec); got != want {
			t.Errorf("%s: %v, want %v", dec, got, want)
		}
	}
}

// A charge of any size spends at most the whole window and never
// overflows or wraps: the window after starts from nothing.
func TestChargedRuleHugeAddends(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	// A sliding window's estimate carries the spent window into the next
	// one: one hit is admitted again two windows from now.
	for key, retry := range map[string]string{"tokens": "1m0s", "tokens_sliding": "2m0s"} {
		d := func() *ratelimitv3.RateLimitDescriptor { return desc(key, "acme") }
		over := "OVER_LIMIT | OVER_LIMIT 1000/MINUTE 0 " + retry
		h.run([]step{
			{name: key + ": charge 2^64-1", domain: "service", descs: ds(withHits(d(), math.MaxUint64)), want: over},
			{name: key + ": charge 2^64-1 again", domain: "service", descs: ds(withHits(d(), math.MaxUint64)), want: over},
			{name: key + ": request addend 2^32-1", domain: "service", hits: math.MaxUint32, descs: ds(d()), want: over},
			{name: key + ": check", domain: "service", descs: ds(withHits(d(), 0)), want: over},
		})
	}
	h.clock.Add(2 * time.Minute) // past the sliding rule's previous window too
	h.run([]step{
		{name: "fixed, two windows later", domain: "service", descs: ds(withHits(desc("tokens", "acme"), 0)), want: "OK | OK 1000/MINUTE 1000 1m0s"},
		{name: "sliding, two windows later", domain: "service", descs: ds(withHits(desc("tokens_sliding", "acme"), 0)), want: "OK | OK 1000/MINUTE 1000 1m0s"},
	})
}

// A charged rule in shadow mode counts and answers OK.
func TestChargedRuleShadow(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	d := func() *ratelimitv3.RateLimitDescriptor { return desc("tokens_shadow", "acme") }
	h.run([]step{
		{name: "charge past the budget", domain: "service", descs: ds(withHits(d(), 1500)), want: "OK | OK 1000/MINUTE 0 1m0s"},
		{name: "check", domain: "service", descs: ds(withHits(d(), 0)), want: "OK | OK 1000/MINUTE 0 1m0s"},
	})
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", d()), "decision", "charged_over"); got != 1 {
		t.Errorf("charged_over: %v, want 1", got)
	}
}

// is_negative_hits is neither a refill nor a charge, on every kind of
// descriptor: answered OK, nothing counted.
func TestNegativeHitsRefused(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.fill("service", desc("hello", "world"), 10)
	h.run([]step{
		{name: "rule at its limit", domain: "service", descs: ds(negative(withHits(desc("hello", "world"), 5))), want: "OK | OK - 0 -"},
		{name: "still at its limit", domain: "service", descs: ds(desc("hello", "world")), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 1m0s"},
		{name: "request addend", domain: "service", hits: 3, descs: ds(negative(desc("second", "s"))), want: "OK | OK - 0 -"},
		{name: "nothing counted", domain: "service", descs: ds(desc("second", "s")), want: "OK | OK 10/SECOND 9 1s"},
		{name: "descriptor-supplied limit", domain: "service", descs: ds(negative(withLimit(desc("own", "x"), 1, 2))), want: "OK | OK - 0 -"},
		{name: "its budget untouched", domain: "service", descs: ds(withLimit(desc("own", "x"), 1, 2)), want: "OK | OK 1/MINUTE 0 1m0s"},
	})
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", desc("hello", "world")), "decision", "negative"); got != 1 {
		t.Errorf("negative: %v, want 1", got)
	}
}
