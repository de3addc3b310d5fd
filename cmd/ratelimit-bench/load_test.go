package main

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

func TestIntendedTimeDealsTheScheduleToWorkers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const rate, c = 1000.0, 4 // one request per ms over 4 workers
	var all []time.Duration
	for w := range c {
		for k := range int64(25) {
			all = append(all, intendedTime(t0, rate, c, w, k).Sub(t0))
		}
	}
	slices.Sort(all)
	for i, d := range all {
		if want := time.Duration(i) * time.Millisecond; d != want {
			t.Fatalf("request %d due at %v, want %v", i, d, want)
		}
	}
	if got := intendedTime(t0, rate, c, 1, 2).Sub(t0); got != 9*time.Millisecond {
		t.Errorf("worker 1, request 2: %v, want 9ms", got)
	}
}

// fakeCaller answers at once: every third request denied, every seventh
// an error.
type fakeCaller struct{ calls atomic.Int64 }

func (f *fakeCaller) prepare(r request, id uint64) (any, error) { return r, nil }

func (f *fakeCaller) call(ctx context.Context, seq uint64, p any) outcome {
	n := f.calls.Add(1)
	switch {
	case n%7 == 0:
		return outcome{class: classError, code: -1, err: "boom"}
	case n%3 == 0:
		return outcome{class: classDenied, code: 8}
	}
	return outcome{class: classAllowed}
}

func (f *fakeCaller) close() {}

func testConfig(t *testing.T) loadConfig {
	t.Helper()
	m, err := parseMix("api")
	if err != nil {
		t.Fatal(err)
	}
	return loadConfig{
		concurrency: 8, duration: time.Minute, timeout: time.Second, pool: 64, seed: 1, mix: m,
		keys: keySpec{dist: keysZipf, zipfS: 1.1, tenants: 10, channels: 10, ips: 10, accounts: 10},
	}
}

func TestRunLoadStopsAtTheRequestBound(t *testing.T) {
	for _, pool := range []int{0, 64} {
		cfg := testConfig(t)
		cfg.requests, cfg.pool = 700, pool
		f := &fakeCaller{}
		rec, err := runLoad(context.Background(), cfg, f)
		if err != nil {
			t.Fatal(err)
		}
		if f.calls.Load() != 700 || rec.sent != 700 {
			t.Fatalf("pool %d: %d calls, %d sent; want 700", pool, f.calls.Load(), rec.sent)
		}
		res := summarise(rec, cfg)
		if res.Requests != 700 || res.Allowed+res.Denied+res.Errors != 700 {
			t.Errorf("pool %d: %+v", pool, res)
		}
		if res.Errors != 100 || res.ErrorKinds["boom"] != 100 {
			t.Errorf("pool %d: errors %d (%v), want 100", pool, res.Errors, res.ErrorKinds)
		}
		if res.Denied != 700/3-700/21 {
			t.Errorf("pool %d: denied %d, want %d", pool, res.Denied, 700/3-700/21)
		}
		if res.Latency.Count != 700 || res.RPS <= 0 || len(res.CDF) != len(cdfQuantiles) {
			t.Errorf("pool %d: latency %+v, rps %v, %d CDF points", pool, res.Latency, res.RPS, len(res.CDF))
		}
	}
}

func TestRunLoadStopsWhenCancelled(t *testing.T) {
	cfg := testConfig(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec, err := runLoad(ctx, cfg, &fakeCaller{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.sent != 0 {
		t.Errorf("sent %d after cancel", rec.sent)
	}
}

func TestRunLoadRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*loadConfig)
		want string
	}{
		{func(c *loadConfig) { c.concurrency = 0 }, "--concurrency"},
		{func(c *loadConfig) { c.rate = -1 }, "--rate"},
		{func(c *loadConfig) { c.duration = 0 }, "--duration"},
		{func(c *loadConfig) { c.duration = 2 * time.Hour }, "--duration"},
		{func(c *loadConfig) { c.requests = -1 }, "--requests"},
		{func(c *loadConfig) { c.timeout = 0 }, "--timeout"},
		{func(c *loadConfig) { c.keys.dist = "x" }, "--keys"},
	} {
		cfg := testConfig(t)
		tc.mod(&cfg)
		if _, err := runLoad(context.Background(), cfg, &fakeCaller{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one about %s", err, tc.want)
		}
	}
}

// The text summary names Check's codes in numeric order, says the load's
// shape, and counts overdue requests only at a fixed rate.
func TestPrintText(t *testing.T) {
	r := &loadresult.Result{Mode: "check", Codes: map[string]int64{"8": 3, "0": 5, "-1": 1, "10": 2}}
	var b strings.Builder
	printText(&b, r)
	if out := b.String(); !strings.Contains(out, "closed loop") || !strings.Contains(out, "codes     no-answer:1 OK:5 RESOURCE_EXHAUSTED:3 10:2\n") || strings.Contains(out, "schedule") {
		t.Errorf("closed loop:\n%s", out)
	}
	r.Rate, r.Late = 100, 7
	b.Reset()
	printText(&b, r)
	if out := b.String(); !strings.Contains(out, "fixed rate 100/s") || !strings.Contains(out, "schedule  7 requests") {
		t.Errorf("fixed rate:\n%s", out)
	}
}
