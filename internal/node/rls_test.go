package node

import (
	"context"
	"errors"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// rlsLayout writes envoyproxy/ratelimit configuration files in upstream's
// default layout (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/NAME) under a
// fresh directory and returns it.
func rlsLayout(t *testing.T, files map[string]string) rlsconfig.Layout {
	t.Helper()
	l := rlsconfig.Layout{Root: filepath.Join(t.TempDir(), "current"), Subdirectory: "ratelimit", WatchRoot: true}
	dir := filepath.Join(l.Root, l.Subdirectory, "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

const rlsRules = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 5
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 3
      name: rls_tenant
      overridable: true
`

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return r
}

// One node serves Check and ShouldRateLimit on one loopback port, one
// connection: each with its own configuration, counts apart.
func TestRLSBesideCheck(t *testing.T) {
	cfg := local(shipped(t))
	cfg.RLS = &RLS{Layout: rlsLayout(t, map[string]string{"edge.yaml": rlsRules}), Settings: rls.Settings{ResponseHeaders: true}}
	n := start(t, cfg)
	check, conn := dial(t, n.GRPCAddr())
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	client := rlsv3.NewRateLimitServiceClient(conn)

	for i := 1; i <= 6; i++ {
		r := shouldRateLimit(t, client, "remote_address", "203.0.113.7")
		want := rlsv3.RateLimitResponse_OK
		if i > 5 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if r.GetOverallCode() != want || r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 5 {
			t.Fatalf("call %d: %v, want %v of 5/MINUTE", i, r, want)
		}
		if i == 1 && len(r.GetResponseHeadersToAdd()) != 3 {
			t.Errorf("response headers %v, want three", r.GetResponseHeadersToAdd())
		}
	}
	// Check is served beside it, with the shipped configuration's limits.
	for i := range 3 {
		if !allowed(t, check, "acme") {
			t.Fatalf("check %d denied", i)
		}
	}
	hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of the RLS service: %v, %v", hc, err)
	}
	if got := scrape.Must(t, n.Gatherer(), "ratelimit_authz_rls_requests_total", "domain", "edge", "code", "over_limit"); got != 1 {
		t.Errorf("over-limit RLS requests: %v, want 1", got)
	}
	if got := scrape.Must(t, n.Gatherer(), "ratelimit_authz_checks_total", "bucket", "activity_create", "decision", "allowed"); got != 3 {
		t.Errorf("allowed checks: %v, want 3", got)
	}
}

func TestRLSConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		files map[string]string
		want  string
	}{
		"a problem in a file": {map[string]string{"bad.yaml": "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"},
			"bad.yaml:4:18: invalid rate limit unit 'fortnight'"},
		"an overridable rule named like an ext_authz bucket": {map[string]string{"o.yaml": strings.ReplaceAll(rlsRules, "rls_tenant", "upload")},
			"has the name of an ext_authz bucket"},
	} {
		cfg := local(shipped(t))
		cfg.RLS = &RLS{Layout: rlsLayout(t, tc.files)}
		n, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil {
			n.Close()
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// Three nodes over a real NATS server: the hits of an RLS rule on two of
// them hold on the third, as ext_authz counts do.
func TestRLSCountsReplicate(t *testing.T) {
	srv := testnats.Run(t)
	layout := rlsLayout(t, map[string]string{"edge.yaml": rlsRules})
	var clients []rlsv3.RateLimitServiceClient
	for _, id := range []string{"a", "b", "c"} {
		cfg := local(shipped(t))
		cfg.Cluster = &Cluster{URL: srv.ClientURL(), NodeID: id, SyncInterval: 50 * time.Millisecond}
		cfg.RLS = &RLS{Layout: layout}
		n := start(t, cfg)
		poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
			if code, _ := scrape.Page(t, "http://"+n.HTTPAddr().String()+"/readyz"); code != 200 {
				return errors.New("not ready")
			}
			return nil
		})
		_, conn := dial(t, n.GRPCAddr())
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	// 2 hits on a, 2 on b: c, once it has heard, has 1 of 5 left.
	for i, c := range clients[:2] {
		for range 2 {
			if !poll.Soon(2*time.Second, 2*time.Millisecond, func() bool {
				return shouldRateLimit(t, c, "remote_address", "198.51.100.1").GetOverallCode() == rlsv3.RateLimitResponse_OK
			}) {
				t.Fatalf("node %d: a hit within the cluster's limit denied", i)
			}
		}
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		// A check without hits: it reads the count and counts nothing.
		d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.1"}}}
		d.HitsAddend = wrapperspb.UInt64(0)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := clients[2].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			return err
		}
		if got := r.GetStatuses()[0].GetLimitRemaining(); got != 1 {
			return fmt.Errorf("c sees %d remaining, want 1", got)
		}
		return nil
	})
	// The next hit on c is the last one the cluster admits.
	if r := shouldRateLimit(t, clients[2], "remote_address", "198.51.100.1"); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Fatalf("c's hit: %v", r)
	}
	if r := shouldRateLimit(t, clients[2], "remote_address", "198.51.100.1"); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("over the cluster's limit on c: %v", r)
	}
}

// A tenant override stored in Postgres for an overridable RLS rule, under
// the rule's name, applies to the descriptors whose first value is that
// tenant, and to no other.
func TestRLSTenantOverride(t *testing.T) {
	r := shipped(t)
	rlsCfg := &RLS{Layout: rlsLayout(t, map[string]string{"edge.yaml": rlsRules})}
	rc, err := loadRLS(rlsCfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	dbURL := overridesDB(t, Sources{Rules: r, RLS: rc}, "big", limits.Override{Bucket: "rls_tenant", Limit: 100, ScaleMS: 3_600_000})

	cfg := local(r)
	cfg.RLS = rlsCfg
	cfg.Overrides = Overrides{DatabaseURL: dbURL}
	n := start(t, cfg)
	_, c := dial(t, n.GRPCAddr())
	client := rlsv3.NewRateLimitServiceClient(c)
	for _, tc := range []struct {
		tenant string
		rpu    uint32
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
	}{{"big", 100, rlsv3.RateLimitResponse_RateLimit_HOUR}, {"acme", 3, rlsv3.RateLimitResponse_RateLimit_MINUTE}} {
		l := shouldRateLimit(t, client, "tenant", tc.tenant).GetStatuses()[0].GetCurrentLimit()
		if l.GetRequestsPerUnit() != tc.rpu || l.GetUnit() != tc.unit || l.GetName() != "rls_tenant" {
			t.Errorf("%s: current limit %v, want %d/%v", tc.tenant, l, tc.rpu, tc.unit)
		}
	}
}

// rlsService is the ShouldRateLimit service n serves.
func rlsService(t *testing.T, n *Node) *rls.Service {
	t.Helper()
	for _, f := range n.fronts {
		if svc, ok := f.svc.(*rls.Service); ok {
			return svc
		}
	}
	t.Fatal("the node serves no ShouldRateLimit")
	return nil
}
