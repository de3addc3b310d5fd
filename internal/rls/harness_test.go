package rls_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// t0 is the start of a day (so of every window up to a day long): Unix
// seconds 1764547200 (2025-12-01 00:00:00 UTC), a multiple of 86400.
var t0 = time.Unix(1764547200, 0).UTC()

// harness is a Service over a real counter.Store and a test clock, with
// the limits of overridable rules resolved by limits.Resolver.
type harness struct {
	t      testing.TB
	clock  *testclock.Clock
	store  *counter.Store
	reg    *prometheus.Registry
	cfg    *rlsconfig.Config
	config rls.Config
	svc    *rls.Service
	over   overrides
}

// overrides are tenant overrides by (bucket id, tenant).
type overrides map[counter.Bucket]map[string]counter.Limit

func (o overrides) OverrideFor(b counter.Bucket, key string) (counter.Limit, bool) {
	l, ok := o[b][key]
	return l, ok
}

// files reads testdata files into rlsconfig files; "name:yaml" inline
// files are taken as they are.
func files(t testing.TB, specs ...string) []rlsconfig.File {
	t.Helper()
	var fs []rlsconfig.File
	for _, s := range specs {
		if name, data, ok := strings.Cut(s, ":\n"); ok {
			fs = append(fs, rlsconfig.File{Name: name, Data: []byte(data)})
			continue
		}
		b, err := os.ReadFile(filepath.Join("testdata", s))
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, rlsconfig.File{Name: s, Data: b})
	}
	return fs
}

// config is what a node gives the service: dense bucket ids, rules first.
func config(t testing.TB, c *rlsconfig.Config, set rls.Settings) rls.Config {
	t.Helper()
	cfg := rls.Config{Rules: c, Settings: set}
	for i := range c.Rules() {
		cfg.RuleIDs = append(cfg.RuleIDs, counter.Bucket(i))
	}
	for i := range c.LimitBuckets() {
		cfg.LimitIDs = append(cfg.LimitIDs, counter.Bucket(len(c.Rules())+i))
	}
	return cfg
}

// resolver is the limits view of the rules: overridable ones take
// tenant overrides under their name, keyed by tenant.
func resolver(c *rlsconfig.Config, over limits.Overrides) *limits.Resolver {
	var bs limits.Buckets
	for _, r := range c.Rules() {
		l, ok := r.Limit()
		b := limits.Bucket{Name: r.Bucket, Limit: l, HasLimit: ok}
		if r.Overridable {
			b.Name, b.Overridable = r.Name, true
		}
		bs = append(bs, b)
	}
	return limits.NewResolver(bs, over)
}

func newHarness(t testing.TB, set rls.Settings, specs ...string) *harness {
	t.Helper()
	return newHarnessStore(t, set, counter.Config{}, specs...)
}

func newHarnessStore(t testing.TB, set rls.Settings, sc counter.Config, specs ...string) *harness {
	t.Helper()
	c, err := rlsconfig.Parse(files(t, specs...), rlsconfig.Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	store, err := counter.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clock: &testclock.Clock{}, store: store, reg: prometheus.NewRegistry(), cfg: c, over: overrides{}}
	h.clock.Set(t0)
	h.config = config(t, c, set)
	h.svc, err = rls.New(h.config, store, resolver(c, h.over), h.reg, slog.New(slog.NewTextHandler(io.Discard, nil)), rls.Options{Now: h.clock.Now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return h
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withHits sets the descriptor's own hits_addend.
func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// withLimit sets a descriptor-supplied limit.
func withLimit(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit int32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typeUnit(unit)}
	return d
}

func (h *harness) call(domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	h.t.Helper()
	resp, err := h.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		h.t.Fatalf("ShouldRateLimit(%s): %v", domain, err)
	}
	if len(resp.GetStatuses()) != len(ds) {
		h.t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(ds))
	}
	return resp
}

// statuses renders a response as "OVERALL | status; status", a status as
// "CODE limit remaining reset" with "-" for what is unset:
// "OK 50/SECOND 49 1s", "OK - 0 -".
func statuses(r *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for i, s := range r.GetStatuses() {
		if i == 0 {
			b.WriteString(" | ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(statusText(s))
	}
	return b.String()
}

func statusText(s *rlsv3.RateLimitResponse_DescriptorStatus) string {
	lim, reset := "-", "-"
	if l := s.GetCurrentLimit(); l != nil {
		lim = fmt.Sprintf("%d/%s", l.GetRequestsPerUnit(), l.GetUnit())
		if l.GetName() != "" {
			lim += "(" + l.GetName() + ")"
		}
	}
	if d := s.GetDurationUntilReset(); d != nil {
		reset = d.AsDuration().String()
	}
	return fmt.Sprintf("%s %s %d %s", s.GetCode(), lim, s.GetLimitRemaining(), reset)
}

func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	return scrape.Read(h.t, h.reg, name, labels...)
}

// bucket is the bucket name of the rule a descriptor of domain matches.
func (h *harness) bucket(domain string, d *ratelimitv3.RateLimitDescriptor) string {
	h.t.Helper()
	i, _, _ := h.cfg.Match(domain, d.GetEntries(), nil)
	if i < 0 {
		h.t.Fatalf("no rule for %v in %s", d.GetEntries(), domain)
	}
	return h.cfg.Rules()[i].Bucket
}

func typeUnit(u int32) typev3.RateLimitUnit { return typev3.RateLimitUnit(u) }

// peer merges a peer node's running count of the rule a descriptor of
// domain matches, in the current window: what replication does.
func (h *harness) peer(domain string, d *ratelimitv3.RateLimitDescriptor, count int64) {
	h.t.Helper()
	i, key, _ := h.cfg.Match(domain, d.GetEntries(), nil)
	if i < 0 {
		h.t.Fatalf("no rule for %v in %s", d.GetEntries(), domain)
	}
	lim, _ := h.cfg.Rules()[i].Limit()
	now := h.clock.Now()
	st := h.store.Merge(1, counter.WindowCount{
		Bucket: h.config.RuleIDs[i], Key: string(key), ScaleMS: lim.ScaleMS, Algorithm: lim.Algorithm,
		Window: counter.WindowOf(now.UnixMilli(), lim.ScaleMS), Count: count,
	}, now)
	if st != counter.Merged {
		h.t.Fatalf("Merge: %v", st)
	}
}
