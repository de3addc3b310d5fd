package rls_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Example 7 of upstream's README (§1.5): the matched rule another matched
// rule replaces is neither counted nor reported; unlimited rules replace
// too.
func TestReplaces(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "replaces.yaml")
	first, second := desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")
	var steps []step
	for i := 1; i <= 11; i++ {
		want := fmt.Sprintf("OK | OK - 0 -; OK 10/SECOND %d 1s", 10-i)
		if i == 11 {
			want = "OVER_LIMIT | OK - 0 -; OVER_LIMIT 10/SECOND 0 1s"
		}
		steps = append(steps, step{name: fmt.Sprintf("call %d", i), domain: "replaces", descs: ds(first, second), want: want})
	}
	steps = append(steps,
		// the replaced rule's counter was never touched
		step{name: "alone", domain: "replaces", descs: ds(first), want: "OK | OK 5/SECOND(specific_limit) 4 1s"},
		step{name: "by an unlimited rule", domain: "replaces", descs: ds(first, desc("key_3", "x")), want: "OK | OK - 0 -; OK - 4294967295 -"},
	)
	h.run(steps)
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("replaces", first), "decision", "replaced"); got != 12 {
		t.Errorf("replaced descriptors: %v, want 12", got)
	}
}

// A descriptor-supplied limit applies whenever the domain is configured,
// rule or not (§2.4), in one bucket per (domain, unit) keyed by the
// entries; a unit the counter cannot hold is ignored.
func TestDescriptorSuppliedLimit(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	const (
		unknown = 0
		second  = 1
		hour    = 3
		day     = 4
		month   = 5
		week    = 7
	)
	hw := func(rpu uint32, unit int32) *ratelimitv3.RateLimitDescriptor {
		return withLimit(desc("hello", "world"), rpu, unit)
	}
	h.run([]step{
		{name: "10/DAY instead of the rule's 10/MINUTE", domain: "service", descs: ds(hw(10, day)), want: "OK | OK 10/DAY 9 24h0m0s"},
		{name: "again", domain: "service", descs: ds(hw(10, day)), want: "OK | OK 10/DAY 8 24h0m0s"},
		{name: "another limit, same unit: same counter", domain: "service", descs: ds(hw(42, day)), want: "OK | OK 42/DAY 39 24h0m0s"},
		{name: "another unit: another counter", domain: "service", descs: ds(hw(42, hour)), want: "OK | OK 42/HOUR 41 1h0m0s"},
		{name: "WEEK", domain: "service", descs: ds(hw(2, week)), want: "OK | OK 2/WEEK 1 72h0m0s"},
		{name: "no rule needed", domain: "service", descs: ds(withLimit(desc("nope", "x"), 1, second)), want: "OK | OK 1/SECOND 0 1s"},
		{name: "over", domain: "service", descs: ds(withLimit(desc("nope", "x"), 1, second)), want: "OVER_LIMIT | OVER_LIMIT 1/SECOND 0 1s"},
		{name: "zero: over, not counted", domain: "service", descs: ds(withLimit(desc("nope", "y"), 0, second)), want: "OVER_LIMIT | OVER_LIMIT 0/SECOND 0 1s"},
		{name: "keys count apart", domain: "service", descs: ds(withLimit(desc("nope2", "x"), 1, second)), want: "OK | OK 1/SECOND 0 1s"},
		// the rule applies again: its own counter, untouched so far
		{name: "UNKNOWN unit ignored", domain: "service", descs: ds(hw(1, unknown)), want: "OK | OK 10/MINUTE 9 1m0s"},
		{name: "MONTH: 30-day windows", domain: "service", descs: ds(hw(1, month)), want: "OK | OK 1/MONTH 0 168h0m0s"},
		{name: "out of range ignored", domain: "service", descs: ds(hw(1, 99)), want: "OK | OK 10/MINUTE 8 1m0s"},
		{name: "ignored, no rule", domain: "service", descs: ds(withLimit(desc("nope", "z"), 1, -1)), want: "OK | OK - 0 -"},
	})
	// Thursday 00:00 UTC starts a week (the epoch was a Thursday); t0 is
	// a Monday: 3 days to go.
	if got := h.metric("ratelimit_authz_rls_limit_overrides_ignored_total"); got != 3 {
		t.Errorf("ignored descriptor limits: %v, want 3", got)
	}
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", "rls-limit/service/DAY", "decision", "allowed"); got != 3 {
		t.Errorf("allowed in the DAY bucket: %v, want 3", got)
	}
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", "rls-limit/service/SECOND", "decision", "denied"); got != 2 {
		t.Errorf("denied in the SECOND bucket: %v, want 2", got)
	}
}

// Case 24 through the service: share_threshold counts every matching
// value in one counter; without it each value has its own.
func TestShareThreshold(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "share_threshold.yaml")
	var steps []step
	for i := range 10 {
		steps = append(steps,
			step{name: "shared", domain: "share-threshold", descs: ds(desc("files", "files/a.pdf")), want: fmt.Sprintf("OK | OK 10/HOUR %d 1h0m0s", 9-i)},
			step{name: "not shared", domain: "share-threshold", descs: ds(desc("files_no_share", fmt.Sprintf("files_no_share/%d", i))), want: "OK | OK 10/HOUR 9 1h0m0s"})
	}
	steps = append(steps, step{name: "another file, same counter", domain: "share-threshold", descs: ds(desc("files", "files/b.csv")), want: "OVER_LIMIT | OVER_LIMIT 10/HOUR 0 1h0m0s"})
	h.run(steps)
}

// An overridable rule takes a tenant's override, the tenant being the
// value of the descriptor's first entry and nothing else.
func TestOverridableRule(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	i, _, _ := h.cfg.Match("service", desc("tenant", "x", "route", "y").GetEntries(), nil)
	h.over[h.config.Snapshot.RLSRules[i].ID] = map[string]counter.Limit{
		"big":  {Limit: 100, ScaleMS: 3_600_000},
		"tiny": {Limit: 1, ScaleMS: 60_000},
	}
	h.run([]step{
		{name: "no override", domain: "service", descs: ds(desc("tenant", "acme", "route", "big")), want: "OK | OK 5/MINUTE(rls_tenant) 4 1m0s"},
		{name: "raised", domain: "service", descs: ds(desc("tenant", "big", "route", "r")), want: "OK | OK 100/HOUR(rls_tenant) 99 1h0m0s"},
		{name: "lowered", domain: "service", descs: ds(desc("tenant", "tiny", "route", "r")), want: "OK | OK 1/MINUTE(rls_tenant) 0 1m0s"},
		{name: "lowered: over", domain: "service", descs: ds(desc("tenant", "tiny", "route", "r")), want: "OVER_LIMIT | OVER_LIMIT 1/MINUTE(rls_tenant) 0 1m0s"},
	})
}

func TestRequestsPerUnitZero(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.clock.Add(15 * time.Second)
	h.run([]step{
		{name: "any hit is over", domain: "service", descs: ds(desc("blocked", "a")), want: "OVER_LIMIT | OVER_LIMIT 0/MINUTE 0 45s"},
		// One more hit would be refused: a check without counting is over.
		{name: "a check without hits is over", domain: "service", descs: ds(withHits(desc("blocked", "b"), 0)), want: "OVER_LIMIT | OVER_LIMIT 0/MINUTE 0 45s"},
		{name: "a descriptor-supplied 0 is over", domain: "service", descs: ds(withLimit(desc("hello", "world"), 0, 2)), want: "OVER_LIMIT | OVER_LIMIT 0/MINUTE 0 45s"},
		{name: "and so is a check against it", domain: "service", descs: ds(withHits(withLimit(desc("nope", "x"), 0, 2), 0)), want: "OVER_LIMIT | OVER_LIMIT 0/MINUTE 0 45s"},
		{name: "a zero addend is over in shadow mode too", domain: "service", descs: ds(withHits(desc("blocked_shadow", "a"), 0)), want: "OK | OK 0/MINUTE 0 45s"},
	})
	if n := h.store.Len(); n != 0 {
		t.Errorf("the counter holds %d keys: requests_per_unit 0 must count nothing", n)
	}
	if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", desc("blocked_shadow", "a")), "decision", "shadow_denied"); got != 1 {
		t.Errorf("shadow_denied of a limit of 0: %v, want 1", got)
	}
}

// README Example 3's block list: a client whose address has a limit of 0
// is over however it asks, before any hit was refused and after, with or
// without counting; the other addresses keep their 10/s.
func TestBlockList(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "../../../config/rls/config/example3.yaml")
	h.clock.Add(500 * time.Millisecond)
	const domain = "edge_proxy_per_ip"
	blocked, other := desc("remote_address", "50.0.0.5"), desc("remote_address", "10.0.0.1")
	check := func(d *ratelimitv3.RateLimitDescriptor) *ratelimitv3.RateLimitDescriptor {
		return withHits(desc(d.Entries[0].Key, d.Entries[0].Value), 0)
	}
	steps := []step{
		{name: "blocked, checked before any hit", domain: domain, descs: ds(check(blocked)), want: "OVER_LIMIT | OVER_LIMIT 0/SECOND 0 1s"},
		{name: "blocked, a hit", domain: domain, descs: ds(blocked), want: "OVER_LIMIT | OVER_LIMIT 0/SECOND 0 1s"},
		{name: "blocked, checked after", domain: domain, descs: ds(check(blocked)), want: "OVER_LIMIT | OVER_LIMIT 0/SECOND 0 1s"},
		{name: "another address, checked", domain: domain, descs: ds(check(other)), want: "OK | OK 10/SECOND 10 1s"},
	}
	for i := range 10 {
		steps = append(steps, step{name: fmt.Sprintf("another address, hit %d", i+1), domain: domain, descs: ds(other), want: fmt.Sprintf("OK | OK 10/SECOND %d 1s", 9-i)})
	}
	steps = append(steps,
		step{name: "another address, at its limit, checked", domain: domain, descs: ds(check(other)), want: "OVER_LIMIT | OVER_LIMIT 10/SECOND 0 1s", after: time.Second},
		step{name: "blocked in the next window, checked", domain: domain, descs: ds(check(blocked)), want: "OVER_LIMIT | OVER_LIMIT 0/SECOND 0 1s"},
		step{name: "another address in the next window", domain: domain, descs: ds(check(other)), want: "OK | OK 10/SECOND 10 1s"},
	)
	h.run(steps)
}

// A sliding window reports, when over, when one hit would be admitted
// (a Retry-After), and when allowed the end of the current window.
func TestSlidingReset(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	d := desc("sliding_minute", "s")
	h.clock.Add(30 * time.Second)
	h.run([]step{
		{name: "10 at once", domain: "service", descs: ds(withHits(desc("sliding_minute", "s"), 10)), want: "OK | OK 10/MINUTE 0 30s", after: 36 * time.Second},
		// 6 s into the next window: 10×54/60 = 9 of the previous, 1 fits.
		{name: "one fits", domain: "service", descs: ds(d), want: "OK | OK 10/MINUTE 0 54s"},
		// 10×(60−e)/60 + 2 ≤ 10 from e = 12 s: 6 s from now.
		{name: "over: when one fits", domain: "service", descs: ds(d), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 6s"},
	})
}

func TestOverflow(t *testing.T) {
	for _, tt := range []struct {
		set  rls.Settings
		want string
	}{
		{rls.Settings{}, "OK | OK 10/SECOND 0 1s"},
		{rls.Settings{DenyOverflow: true}, "OVER_LIMIT | OVER_LIMIT 10/SECOND 0 1s"},
	} {
		h := newHarnessStore(t, tt.set, counter.Config{MaxKeys: 1, Shards: 1}, "service.yaml")
		h.run([]step{
			{name: "the one key", domain: "service", descs: ds(desc("hello", "world")), want: "OK | OK 10/MINUTE 9 1m0s"},
			{name: "no room", domain: "service", descs: ds(desc("second", "x")), want: tt.want},
			{name: "no room, check only: no count", domain: "service", descs: ds(withHits(desc("shadow", "x"), 0)), want: "OK | OK 10/MINUTE 10 1m0s"},
		})
		if got := h.metric("ratelimit_authz_rls_descriptors_total", "bucket", h.bucket("service", desc("second", "x")), "decision", "overflow"); got != 1 {
			t.Errorf("%+v: overflow decisions: %v, want 1", tt.set, got)
		}
	}
}

// The bounds on one request, each at its worst value: refused whole
// (InvalidArgument) before anything is counted, at the bound accepted.
func TestRequestBounds(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	counted := desc("hello", "world")
	many := func(n int) []*ratelimitv3.RateLimitDescriptor {
		out := []*ratelimitv3.RateLimitDescriptor{counted}
		for len(out) < n {
			out = append(out, desc("nope", "x"))
		}
		return out
	}
	wide := func(n int) *ratelimitv3.RateLimitDescriptor {
		d := desc("hello", "world")
		for len(d.Entries) < n {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
		}
		return d
	}
	for _, tt := range []struct {
		name  string
		descs []*ratelimitv3.RateLimitDescriptor
		want  string // "" accepted
	}{
		{"descriptors at the bound", many(rls.DefaultMaxDescriptors), ""},
		{"one descriptor more", many(rls.DefaultMaxDescriptors + 1), "more than 64 descriptors"},
		{"a flood of descriptors", many(200_000), "more than 64 descriptors"},
		{"entries at the bound", ds(counted, wide(rls.DefaultMaxEntries)), ""},
		{"one entry more", ds(counted, wide(rls.DefaultMaxEntries+1)), "descriptor 1 has more than 32 entries"},
		{"key at the bound", ds(counted, desc(strings.Repeat("k", rls.DefaultMaxKeyBytes), "v")), ""},
		{"key one byte longer", ds(counted, desc(strings.Repeat("k", rls.DefaultMaxKeyBytes+1), "v")), "descriptor 1 entry 0: key of 1025 bytes: at most 1024"},
		{"value at the bound", ds(counted, desc("k", strings.Repeat("v", rls.DefaultMaxValueBytes))), ""},
		{"value one byte longer", ds(counted, desc("k", "v", "k2", strings.Repeat("v", rls.DefaultMaxValueBytes+1))), "descriptor 1 entry 1: value of 65537 bytes: at most 65536"},
		{"a value of 8 MiB", ds(counted, desc("hello", strings.Repeat("v", 8<<20))), "descriptor 1 entry 0: value of 8388608 bytes"},
	} {
		before := h.store.Len()
		_, err := h.should(&rlsv3.RateLimitRequest{Domain: "service", Descriptors: tt.descs})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.want != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want)):
			t.Errorf("%s: %v, want InvalidArgument %q", tt.name, err, tt.want)
		case tt.want != "" && h.store.Len() != before:
			t.Errorf("%s: refused, but the counter went from %d to %d keys", tt.name, before, h.store.Len())
		}
	}
	// Every accepted request above counted hello=world once.
	if got := statuses(h.call("service", 0, counted)); got != "OK | OK 10/MINUTE 5 1m0s" {
		t.Errorf("after the accepted requests: %s", got)
	}
}

// Addends beyond any limit are over and count nothing.
func TestHugeAddends(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	d := desc("hello", "world")
	h.run([]step{
		{name: "descriptor addend 2^64-1", domain: "service", descs: ds(withHits(desc("hello", "world"), math.MaxUint64)), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 1m0s"},
		{name: "request addend 2^32-1", domain: "service", hits: math.MaxUint32, descs: ds(d), want: "OVER_LIMIT | OVER_LIMIT 10/MINUTE 0 1m0s"},
		{name: "nothing counted", domain: "service", descs: ds(d), want: "OK | OK 10/MINUTE 9 1m0s"},
		{name: "negative hits are neither a refill nor a charge", domain: "service", descs: ds(&ratelimitv3.RateLimitDescriptor{Entries: d.Entries, IsNegativeHits: true}), want: "OK | OK - 0 -"},
		{name: "still nothing counted", domain: "service", descs: ds(d), want: "OK | OK 10/MINUTE 8 1m0s"},
	})
}

// The counter keys are built in a buffer the next call reuses: the
// counter must keep copies. Alternating values would read each other's
// counts (or corrupt the counter's map) if it kept the views.
func TestKeyBufferReuse(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	for i := 1; i <= 5; i++ {
		for _, v := range []string{"aaaa", "bbbb"} {
			want := fmt.Sprintf("OK | OK 10/MINUTE %d 1m0s", 10-i)
			if got := statuses(h.call("service", 0, desc("hello", "world"), desc("second", v))); !strings.HasPrefix(got, "OK | OK 10/MINUTE") {
				t.Fatalf("%s", got)
			}
			if got := statuses(h.call("service", 0, desc("shadow", v))); got != want {
				t.Errorf("round %d, %s: %s, want %s", i, v, got, want)
			}
		}
	}
}

// Malformed but decodable requests: nil descriptors and entries, empty
// keys and values.
func TestOddDescriptors(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	r := h.call("service", 0, nil, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{nil}}, desc("", ""), desc("hello", ""))
	if got := statuses(r); got != "OK | OK - 0 -; OK - 0 -; OK - 0 -; OK - 0 -" {
		t.Errorf("%s", got)
	}
}

func TestUpdate(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml", "basic.yaml")
	h.fill("service", desc("hello", "world"), 3)
	old := h.bucket("basic", desc("key1", "x"))
	h.call("basic", 0, desc("key1", "x"))

	// A new configuration: hello=world keeps its bucket (and id, and so
	// its counts); basic is gone, and so are its series.
	c, err := rlsconfig.Parse(files(t, "service.yaml", "another.yaml"), rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	next := config(t, c, rls.Settings{})
	if err := h.update(next.Snapshot); err != nil {
		t.Fatal(err)
	}
	h.cfg = c
	h.run([]step{
		{name: "counts kept", domain: "service", descs: ds(desc("hello", "world")), want: "OK | OK 10/MINUTE 6 1m0s"},
		{name: "new domain", domain: "another", descs: ds(desc("key3", "y")), want: "OK | OK 10/HOUR 9 1h0m0s"},
		{name: "old domain gone", domain: "basic", descs: ds(desc("key1", "x")), want: "OK | OK - 0 -"},
	})
	if _, ok, _ := scrape.Gathered(h.reg, "ratelimit_authz_rls_descriptors_total", "bucket", old); ok {
		t.Errorf("the series of removed bucket %s remain", old)
	}
	if _, ok, _ := scrape.Gathered(h.reg, "ratelimit_authz_rls_requests_total", "domain", "basic"); ok {
		t.Error("the series of removed domain basic remain")
	}

	if err := h.update(&snapshot.Snapshot{}); err == nil {
		t.Error("an update without RLS rules succeeded")
	}
	h.run([]step{{name: "after a failed update", domain: "another", descs: ds(desc("key3", "y")), want: "OK | OK 10/HOUR 8 1h0m0s"}})
}

// Calls racing with updates finish on one configuration or the other,
// never a mix (run under -race).
func TestUpdateConcurrent(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.gRPCOnly()
	a := h.config.Snapshot
	c, err := rlsconfig.Parse(files(t, "service.yaml", "another.yaml"), rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := config(t, c, rls.Settings{}).Snapshot
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := h.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("unlimited", "u"), desc("hour", "h"))})
				if err != nil || len(r.Statuses) != 2 {
					t.Error(r, err)
					return
				}
			}
		})
	}
	for i := range 200 {
		cfg := a
		if i%2 == 1 {
			cfg = b
		}
		if err := h.update(cfg); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestNewErrors(t *testing.T) {
	c, err := rlsconfig.Parse(files(t, "service.yaml"), rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store, _ := counter.New(counter.Config{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := config(t, c, rls.Settings{})
	if _, err := rls.New(cfg, nil, nil, prometheus.NewRegistry(), log, rls.Options{}); err == nil {
		t.Error("New without a limiter succeeded")
	}
	if _, err := rls.New(cfg, store, nil, prometheus.NewRegistry(), log, rls.Options{MaxEntries: -1}); err == nil {
		t.Error("New with a negative bound succeeded")
	}
	for _, set := range []rls.Settings{{LimitHeader: "bad header"}, {LimitHeader: "X-A", ResetHeader: "x-a"}} {
		if _, err := rls.New(config(t, c, set), store, nil, prometheus.NewRegistry(), log, rls.Options{}); err == nil {
			t.Errorf("New with settings %+v succeeded", set)
		}
	}
	reg := prometheus.NewRegistry()
	if _, err := rls.New(cfg, store, nil, reg, log, rls.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rls.New(cfg, store, nil, reg, log, rls.Options{}); err == nil {
		t.Error("a second Service on one registry succeeded")
	}
}

func TestAllocations(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	h.gRPCOnly()
	req := &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("hour", "h"))}
	req3 := &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("hour", "h"), desc("second", "s"), desc("twenty", "t"))}
	ctx := context.Background()
	for _, tt := range []struct {
		req  *rlsv3.RateLimitRequest
		most float64
	}{{req, 1}, {req3, 1}} {
		h.svc.ShouldRateLimit(ctx, tt.req)
		if a := testing.AllocsPerRun(200, func() { h.svc.ShouldRateLimit(ctx, tt.req) }); a > tt.most {
			t.Errorf("%d descriptors: %v allocations per call, want at most %v", len(tt.req.Descriptors), a, tt.most)
		}
	}
}

// On the lean path a call allocates nothing in steady state: allowed or
// denied, with the response headers, more descriptors than a reply holds
// inline, a descriptor-supplied limit.
func TestLeanAllocations(t *testing.T) {
	if testing.CoverMode() != "" || raceBuild {
		t.Skip("coverage instrumentation and the race detector allocate")
	}
	h := newHarness(t, rls.Settings{ResponseHeaders: true}, "service.yaml")
	h.gRPCOnly()
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"allowed", &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("hour", "h"))}},
		{"denied", &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("blocked", "b"))}},
		{"five descriptors", &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(desc("hour", "h"), desc("second", "s"), desc("twenty", "t"), desc("unlimited", "u"), desc("nope", "x"))}},
		{"own limit", &rlsv3.RateLimitRequest{Domain: "service", Descriptors: ds(withLimit(desc("k", "v"), 5, 1))}},
	} {
		in, err := proto.Marshal(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		var r checkwire.RateLimitRequest
		buf := make([]byte, 0, 4096)
		call := func() {
			if err := h.svc.RateLimitDecoder().Decode(in, &r); err != nil {
				t.Fatal(err)
			}
			if _, _, err := h.svc.AppendShouldRateLimit(ctx, &r, buf[:0]); err != nil {
				t.Fatal(err)
			}
			r.Reset()
		}
		call()
		if a := testing.AllocsPerRun(200, call); a != 0 {
			t.Errorf("%s: %v allocations per call, want 0", tt.name, a)
		}
	}
}

// Whatever a client sends, the series are the configuration's: unknown
// domains share one label value, descriptors are labelled by the rule
// they matched, never by their values.
func TestHostileCardinality(t *testing.T) {
	h := newHarness(t, rls.Settings{}, "service.yaml")
	series := func() int {
		mfs, err := h.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			n += len(mf.GetMetric())
		}
		return n
	}
	h.call("service", 0, desc("hello", "world"), desc("nope", "x"))
	h.call("nowhere", 0, desc("hello", "world"))
	before := series()
	for i := range 2000 {
		v := fmt.Sprintf("v%d", i)
		h.call("domain-"+v, 0, desc("hello", v))
		h.call("service", 0, desc("hello", v), desc("k"+v, v), withLimit(desc("nope", v), 5, 1))
	}
	if after := series(); after != before {
		t.Errorf("%d series after 2000 distinct domains, keys and values, %d before", after, before)
	}
}
