package accesslog_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

const leaseRules = `
buckets:
  db_pool: {count: concurrency, limit: 2, key: tenant}
  rate: {limit: 100, per: 1s, key: tenant}
  login_ip: {limit: 5, per: 1m, key: ip, count: failures}
routes:
  - {path: /reports, buckets: [db_pool]}
  - {path: /login, buckets: [login_ip]}
`

type leaseHarness struct {
	svc    *authz.Service
	rec    *accesslog.Recorder
	leases *inflight.Table
}

func newLeaseHarness(t *testing.T) *leaseHarness {
	t.Helper()
	r, err := configfile.Parse([]byte(leaseRules), "leases.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := match.New(r.Descriptors())
	if err != nil {
		t.Fatal(err)
	}
	store, err := counter.New(r.Counter)
	if err != nil {
		t.Fatal(err)
	}
	h := &leaseHarness{}
	if h.leases, err = inflight.New(inflight.Config{}); err != nil {
		t.Fatal(err)
	}
	reg, log := prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil))
	lim := snapshot.NewResolver(snapshottest.ByIndex(t, r), nil)
	now := func() time.Time { return t0 }
	snap := snapshottest.ByIndex(t, r)
	if h.svc, err = authz.New(authz.ConfigFrom(snap), m, store, lim, reg, log, authz.Options{Now: now, Leases: h.leases}); err != nil {
		t.Fatal(err)
	}
	if h.rec, err = accesslog.New(accesslog.ConfigFrom(snap), store, lim, reg, log, accesslog.Options{Now: now, Leases: h.leases}); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *leaseHarness) check(t *testing.T, tenantID, requestID string) *authv3.CheckResponse {
	t.Helper()
	headers := map[string]string{":method": "GET", ":path": "/reports", "x-tenant-id": tenantID, "x-request-id": requestID}
	resp, err := h.svc.Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1"},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/reports", Headers: headers}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func withRequestID(e *accesslogv3.HTTPAccessLogEntry, id string) *accesslogv3.HTTPAccessLogEntry {
	e.Request = &accesslogv3.HTTPRequestProperties{RequestId: id}
	return e
}

// TestAccessLogReleasesLeases: the access-log entry of a request that
// holds a lease releases it, whatever the response code; a forged entry
// (another request id, another tenant's key, a replay) frees nothing.
func TestAccessLogReleasesLeases(t *testing.T) {
	h := newLeaseHarness(t)
	a1, a2 := h.check(t, "acme", "a1"), h.check(t, "acme", "a2")
	b1 := h.check(t, "beta", "b1")
	if !allowed(a1) || !allowed(a2) || !allowed(b1) || allowed(h.check(t, "acme", "a3")) {
		t.Fatal("want two of acme's and one of beta's in flight, the third of acme's denied")
	}
	inFlight := func(tenantID string) int64 { l, _ := h.leases.InFlight(dbPool, tenantID); return l }

	// Forgeries: a2's metadata under another id; beta's request id with
	// acme's metadata; a lease of a bucket that is not a concurrency one.
	for name, e := range map[string]*accesslogv3.HTTPAccessLogEntry{
		"another id":       withRequestID(entry(a2, 200), "a9"),
		"another tenant's": withRequestID(entry(a2, 200), "b1"),
	} {
		if got := h.rec.Entry(e); got != "released" {
			t.Errorf("%s: entry %s", name, got)
		}
	}
	if inFlight("acme") != 2 || inFlight("beta") != 1 {
		t.Fatalf("forged releases freed slots: acme %d, beta %d", inFlight("acme"), inFlight("beta"))
	}
	// The real entry, a 500 from the upstream: released.
	if got := h.rec.Entry(withRequestID(entry(a1, 500), "a1")); got != "released" {
		t.Fatalf("entry %s", got)
	}
	if inFlight("acme") != 1 {
		t.Fatalf("acme %d in flight after a1's entry, want 1", inFlight("acme"))
	}
	// Replayed: nothing more.
	h.rec.Entry(withRequestID(entry(a1, 500), "a1"))
	if inFlight("acme") != 1 {
		t.Fatalf("acme %d in flight after a replay, want 1", inFlight("acme"))
	}
	if !allowed(h.check(t, "acme", "a3")) {
		t.Fatal("a slot freed by the access log was not given")
	}
}

func TestMalformedLeaseEntries(t *testing.T) {
	h := newLeaseHarness(t)
	held := h.check(t, "acme", "a1")
	md := func(leases *structpb.Value) *authv3.CheckResponse {
		return &authv3.CheckResponse{DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{accesslog.MetaLeases: leases}}}
	}
	for name, e := range map[string]*accesslogv3.HTTPAccessLogEntry{
		"no request id":  entry(held, 200),
		"not a struct":   withRequestID(entry(md(structpb.NewStringValue("x")), 200), "a1"),
		"unknown bucket": withRequestID(entry(md(structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"nope": structpb.NewStringValue("acme")}})), 200), "a1"),
		"rate bucket":    withRequestID(entry(md(structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"rate": structpb.NewStringValue("acme")}})), 200), "a1"),
		"non-string key": withRequestID(entry(md(structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"db_pool": structpb.NewNumberValue(1)}})), 200), "a1"),
	} {
		if got := h.rec.Entry(e); got != "malformed" {
			t.Errorf("%s: entry %s, want malformed", name, got)
		}
	}
	if l, _ := h.leases.InFlight(dbPool, "acme"); l != 1 {
		t.Fatalf("%d in flight, want 1", l)
	}
}

// dbPool is db_pool's id: snapshottest.ByIndex gives bucket i id i.
const dbPool = counter.Bucket(0)
