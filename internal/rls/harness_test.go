package rls_test

import (
	"bytes"
	"context"
	"encoding/binary"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// t0 is the start of a day (so of every window up to a day long): Unix
// seconds 1764547200 (2025-12-01 00:00:00 UTC), a multiple of 86400.
var t0 = time.Unix(1764547200, 0).UTC()

// harness is a Service over a real counter.Store and a test clock, with
// the limits of overridable rules resolved by snapshot.Resolver.
type harness struct {
	t      testing.TB
	clock  *testclock.Clock
	store  *counter.Store
	reg    *prometheus.Registry
	cfg    *rlsconfig.Config
	config rls.Config
	svc    *rls.Service
	over   overrides

	// leases hold the concurrency rules' leases (a node alone).
	leases *inflight.Sync

	// The lean path's twin: a Service alike over a store and leases of
	// its own, called by should with the request's wire form (checkwire).
	lean       *rls.Service
	leanStore  *counter.Store
	leanLeases *inflight.Sync
	leanReg    *prometheus.Registry
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

// config is what a node gives the service: c compiled into a snapshot.
func config(t testing.TB, c *rlsconfig.Config, set rls.Settings) rls.Config {
	t.Helper()
	return rls.Config{Snapshot: snapshottest.RLS(t, c), Settings: set}
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
	h := &harness{t: t, clock: &testclock.Clock{}, reg: prometheus.NewRegistry(), leanReg: prometheus.NewRegistry(), cfg: c, over: overrides{}}
	h.clock.Set(t0)
	h.config = config(t, c, set)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tw := range []struct {
		store  **counter.Store
		leases **inflight.Sync
		svc    **rls.Service
		reg    *prometheus.Registry
	}{{&h.store, &h.leases, &h.svc, h.reg}, {&h.leanStore, &h.leanLeases, &h.lean, h.leanReg}} {
		if *tw.store, err = counter.New(sc); err != nil {
			t.Fatal(err)
		}
		// One shard: both twins' tables sweep and fill alike.
		tb, err := inflight.New(inflight.Config{Shards: 1})
		if err != nil {
			t.Fatal(err)
		}
		if *tw.leases, err = inflight.NewSync(tb, nil, inflight.SyncConfig{}, tw.reg, log); err != nil {
			t.Fatal(err)
		}
		(*tw.leases).SetBuckets(h.config.Snapshot.Concurrency())
		if *tw.svc, err = rls.New(h.config, *tw.store, h.over, tw.reg, log, rls.Options{Now: h.clock.Now, Leases: *tw.leases}); err != nil {
			t.Fatalf("New: %v", err)
		}
	}
	t.Cleanup(func() {
		if h.lean == nil {
			return
		}
		if g, l := series(t, h.reg), series(t, h.leanReg); g != l {
			t.Errorf("the metrics of the two paths differ:\ngRPC:\n%s\nlean:\n%s", g, l)
		}
	})
	return h
}

// should calls ShouldRateLimit on the gRPC path, and on the lean path of
// the twin (the request's wire form decoded by checkwire, the answer
// encoded by hand), and fails the test unless both answer the same bytes
// or the same status. It returns the gRPC path's answer.
func (h *harness) should(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	h.t.Helper()
	return h.shouldOn(h.t, req)
}

// shouldOn is should failing t.
func (h *harness) shouldOn(t testing.TB, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	ctx := context.Background()
	resp, err := h.svc.ShouldRateLimit(ctx, req)
	if h.lean == nil {
		return resp, err
	}
	in, merr := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if merr != nil {
		t.Fatal(merr)
	}
	var lr checkwire.RateLimitRequest
	if derr := h.lean.RateLimitDecoder().Decode(in, &lr); derr != nil {
		t.Fatalf("the lean decoder refuses what proto.Marshal wrote: %v", derr)
	}
	out, hold, lerr := h.lean.AppendShouldRateLimit(ctx, &lr, []byte("prefix"))
	lr.Reset()
	if hold != nil {
		hold.Keep() // the answer is taken
	}
	if err != nil {
		if status.Code(lerr) != status.Code(err) || status.Convert(lerr).Message() != status.Convert(err).Message() {
			t.Fatalf("gRPC path: %v; lean path: %v", err, lerr)
		}
		return resp, err
	}
	if lerr != nil {
		t.Fatalf("gRPC path: %v; lean path: %v", statuses(resp), lerr)
	}
	want, merr := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if merr != nil {
		t.Fatal(merr)
	}
	if got := out[len("prefix"):]; string(out[:len("prefix")]) != "prefix" || got[0] != 0 || binary.BigEndian.Uint32(got[1:5]) != uint32(len(want)) || !bytes.Equal(got[5:], want) {
		t.Fatalf("gRPC path answers %x (%s); lean path %x", want, statuses(resp), got)
	}
	return resp, err
}

// gRPCOnly drops the twin, for a test calling h.svc itself.
func (h *harness) gRPCOnly() { h.lean = nil }

// update makes snap the configuration of both paths' services alike, as
// a reload does (Prepare, then the swap).
func (h *harness) update(snap *snapshot.Snapshot) error {
	h.t.Helper()
	swap, err := h.svc.Prepare(snap)
	if err == nil {
		swap()
	}
	if h.lean == nil {
		return err
	}
	lswap, lerr := h.lean.Prepare(snap)
	if (lerr == nil) != (err == nil) {
		h.t.Fatalf("Prepare: %v; on the twin: %v", err, lerr)
	}
	if lerr == nil {
		lswap()
	}
	return err
}

// series renders every sample of reg: name, labels, value, histogram
// count.
func series(t testing.TB, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			fmt.Fprintf(&b, "%s", mf.GetName())
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, " %s=%q", l.GetName(), l.GetValue())
			}
			fmt.Fprintf(&b, " %v %v %v\n", m.GetCounter().GetValue(), m.GetGauge().GetValue(), m.GetHistogram().GetSampleCount())
		}
	}
	return b.String()
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
	resp, err := h.should(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
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
	for _, store := range []*counter.Store{h.store, h.leanStore} {
		st := store.Merge(1, counter.WindowCount{
			Bucket: h.config.Snapshot.RLSRules[i].ID, Key: string(key), ScaleMS: lim.ScaleMS, Algorithm: lim.Algorithm,
			Window: counter.WindowOf(now.UnixMilli(), lim.ScaleMS), Count: count,
		}, now)
		if st != counter.Merged {
			h.t.Fatalf("Merge: %v", st)
		}
	}
}
