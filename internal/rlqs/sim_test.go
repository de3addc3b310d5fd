package rlqs

import (
	"log/slog"
	"slices"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// simEnvoy models one Envoy 1.40 quota filter with one bucket id, as
// docs/envoy.md records it: the first request passes (no assignment:
// ALLOW_ALL) and is reported at once; then a report every 5 s; a token
// bucket refills at tokens_per_fill per whole second of fill_interval; it
// starts full when it is the first assignment or follows a blanket rule,
// and a different token bucket replacing one keeps its tokens (up to the
// new max_tokens); an equal one changes nothing.
type simEnvoy struct {
	str                *stream
	id                 map[string]string
	started            bool
	nextReport         time.Time
	allowed, denied    uint64
	strat              strategy
	max, perFill, fill int64 // the token bucket
	tokens             float64
	last               time.Time
}

func (e *simEnvoy) apply(resp *rlqspb.RateLimitQuotaResponse, now time.Time) {
	for _, a := range resp.GetBucketAction() {
		rs := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		if tb := rs.GetTokenBucket(); tb != nil {
			m, p, f := int64(tb.GetMaxTokens()), int64(tb.GetTokensPerFill().GetValue()), int64(tb.GetFillInterval().AsDuration()/time.Second)
			switch {
			case e.strat != stratTokenBucket:
				e.strat, e.max, e.perFill, e.fill, e.tokens, e.last = stratTokenBucket, m, p, f, float64(m), now
			case m != e.max || p != e.perFill || f != e.fill:
				e.refill(now)
				e.max, e.perFill, e.fill, e.tokens = m, p, f, min(e.tokens, float64(m))
			}
			continue
		}
		if rs.GetBlanketRule() == 1 {
			e.strat = stratDenyAll
		} else {
			e.strat = stratAllowAll
		}
	}
}

func (e *simEnvoy) report(now time.Time) {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: e.id}, NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied},
	}}
	e.allowed, e.denied = 0, 0
	resp, err := e.str.report(m, now)
	if err != nil {
		panic(err)
	}
	e.apply(resp, now)
}

func (e *simEnvoy) refill(now time.Time) {
	if e.fill > 0 {
		e.tokens = min(float64(e.max), e.tokens+now.Sub(e.last).Seconds()*float64(e.perFill)/float64(e.fill))
	}
	e.last = now
}

// request decides one request at now.
func (e *simEnvoy) request(now time.Time) bool {
	ok := true
	switch {
	case !e.started:
		e.started, e.nextReport = true, now.Add(5*time.Second)
		e.allowed++
		e.report(now)
		return true
	case e.strat == stratDenyAll:
		ok = false
	case e.strat == stratTokenBucket:
		e.refill(now)
		if ok = e.tokens >= 1; ok {
			e.tokens--
		}
	}
	if ok {
		e.allowed++
	} else {
		e.denied++
	}
	return ok
}

// steady is a rate that does not change.
func steady(perSecond int) func(sec int) int { return func(int) int { return perSecond } }

// simulate offers rates (requests per second in second sec of the run, one
// Envoy each, all on this node) to one bucket id of tenant_rate (10 per
// second) for secs seconds and returns what was admitted in each whole
// window.
func simulate(t *testing.T, secs int, rates ...func(sec int) int) []int {
	t.Helper()
	cfg := fuzzConfig(t)
	cfg.Buckets = slices.Clone(cfg.Buckets)
	for i := range cfg.Buckets {
		cfg.Buckets[i].Participants = nil
	}
	clock := new(testclock.Clock)
	start := time.Unix(1764547200, 0).Add(337 * time.Millisecond) // ticks 37 ms into each window
	clock.Set(start)
	store, err := counter.New(counter.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(cfg, store, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"name": "t", "tenant": "sim"}
	var envoys []*simEnvoy
	for i := range rates {
		envoys = append(envoys, &simEnvoy{str: &stream{s: svc, id: uint64(i + 1), ids: map[string]*tracked{}}, id: id})
	}
	perWindow := make([]int, secs+1)
	next := make([]time.Duration, len(rates))
	for ms := 0; ms < secs*1000; ms++ {
		now := start.Add(time.Duration(ms) * time.Millisecond)
		clock.Set(now)
		for i, e := range envoys {
			if ms%100 == 0 {
				e.apply(e.str.tick(now), now)
			}
			if e.started && !now.Before(e.nextReport) {
				e.nextReport = e.nextReport.Add(5 * time.Second)
				e.report(now)
			}
			for time.Duration(ms)*time.Millisecond >= next[i] {
				next[i] += time.Second / time.Duration(rates[i](ms/1000))
				if e.request(now) {
					perWindow[(now.UnixMilli()-start.UnixMilli()+337)/1000]++
				}
			}
		}
	}
	return perWindow[1:secs] // whole windows only
}

// The documented accuracy of a 10/s budget (tenant_rate) against Envoy's
// filter as modelled: per whole window, at most the limit (one Envoy) or
// the limit plus one per Envoy (shares rounded), and at least 80% of it,
// at 2× and 10× the limit offered. The figures are logged for docs/rlqs.md.
func TestSimulatedEnvoyAccuracy(t *testing.T) {
	const limit = 10
	for _, tc := range []struct {
		name  string
		rates []func(int) int
	}{
		{"one Envoy at 2x", []func(int) int{steady(2 * limit)}},
		{"one Envoy at 10x", []func(int) int{steady(10 * limit)}},
		{"two Envoys at 1x each", []func(int) int{steady(limit), steady(limit)}},
		{"two Envoys at 5x each", []func(int) int{steady(5 * limit), steady(5 * limit)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := simulate(t, 21, tc.rates...)
			t.Logf("%s: admitted per window %v", tc.name, ws)
			for i, n := range ws {
				if n > limit {
					t.Errorf("window %d admitted %d, over the limit %d", i+1, n, limit)
				}
				if n < limit*8/10 {
					t.Errorf("window %d admitted %d, under 80%% of %d", i+1, n, limit)
				}
			}
		})
	}
}

// A participant under its share (half of it) is refilled its share once a
// window, and its bucket is not restarted each window; when it floods
// (3×), the window it floods in admits what its bucket held and one
// share of refill, and the windows after it one share each until its
// next report (every 5 s) shows it spending its share: one window up to
// twice the limit is the price of keeping it admitted should the server
// go away. The figures are logged for docs/rlqs.md.
func TestSimulatedCalmThenFlood(t *testing.T) {
	const limit, calm = 10, 11 // seconds 1–10 at half the limit, then 3×
	ws := simulate(t, 21, func(sec int) int {
		if sec < calm {
			return limit / 2
		}
		return 3 * limit
	})
	t.Logf("half the limit until %d s, then 3×: admitted per window %v", calm, ws)
	over := 0
	for i, n := range ws {
		switch w := i + 1; {
		case w < calm:
			if n != limit/2 {
				t.Errorf("window %d (calm) admitted %d, want all %d offered", w, n, limit/2)
			}
		case n > 2*limit:
			t.Errorf("window %d admitted %d, more than twice the limit %d", w, n, limit)
		case n > limit:
			over++
		}
	}
	if over > 1 {
		t.Errorf("%d windows over the limit after the flood began, want at most the first", over)
	}
}
