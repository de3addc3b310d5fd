package node

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rls"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rlsconfig"
)

func rlsRules(t *testing.T, perMinute int, unit string) *rlsconfig.Config {
	t.Helper()
	c, err := rlsconfig.Parse([]rlsconfig.File{{Name: "d.yaml", Data: []byte(fmt.Sprintf(`domain: d
descriptors:
  - key: kept
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: changed
    rate_limit: {unit: %s, requests_per_unit: 3}
`, perMinute, unit))}}, rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// withRLS gives a node a ShouldRateLimit service over the RLS part of its
// generation, as the node's RLS wiring does.
func withRLS(t *testing.T, n *running, c *rlsconfig.Config) *rls.Service {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	g, err := planGeneration(Sources{Rules: n.cur.rules, RLS: c}, n.ids)
	if err != nil {
		t.Fatal(err)
	}
	g.build(n.over)
	svc, err := rls.New(g.rlsConfig(rls.Settings{}), n.store, rlsLimits{n.over}, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), rls.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ids.Commit(g.ids); err != nil {
		t.Fatal(err)
	}
	n.cur, n.rlsSvc = g, svc
	return svc
}

func shouldRateLimit(t *testing.T, svc *rls.Service, key string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetOverallCode()
}

func rlsAllowed(t *testing.T, svc *rls.Service, key string, n int) (ok int) {
	t.Helper()
	for range n {
		if shouldRateLimit(t, svc, key) == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// The RLS rules are one more part of a generation: reloaded with the
// ext_authz rules, their counts kept while a rule's bucket, unit and
// algorithm hold, reset when its unit changes; a reload of the ext_authz
// rules alone keeps the RLS rules in force, and their ids never meet.
func TestReloadRLSRules(t *testing.T) {
	n := start(t, local(reloadRules(t, 10, 10, "1h")))
	svc := withRLS(t, n, rlsRules(t, 5, "hour"))
	if got := rlsAllowed(t, svc, "kept", 3); got != 3 {
		t.Fatalf("kept: %d of 3", got)
	}
	if got := rlsAllowed(t, svc, "changed", 4); got != 3 {
		t.Fatalf("changed: %d of 4 under 3/hour", got)
	}
	// ext_authz alone: the RLS rules stay, counts and all.
	if err := n.Reload(context.Background(), reloadRules(t, 11, 10, "1h")); err != nil {
		t.Fatal(err)
	}
	if got := rlsAllowed(t, svc, "changed", 1); got != 0 {
		t.Fatal("an ext_authz reload reset an RLS rule")
	}
	// Both: kept's limit rises (counts stay), changed counts per minute now
	// (a new bucket: from zero).
	if err := n.ReloadSources(context.Background(), Sources{Rules: reloadRules(t, 11, 10, "1h"), RLS: rlsRules(t, 6, "minute")}); err != nil {
		t.Fatal(err)
	}
	if got := rlsAllowed(t, svc, "kept", 5); got != 3 {
		t.Fatalf("kept: %d of 5 after its limit rose from 5 to 6 with 3 counted, want 3", got)
	}
	if got := rlsAllowed(t, svc, "changed", 4); got != 3 {
		t.Fatalf("changed: %d of 4 in its new window, want 3", got)
	}
	seen := map[uint32]string{}
	g := n.cur
	for i, id := range g.ids.IDs {
		if other, dup := seen[uint32(id)]; dup {
			t.Fatalf("id %d given to %s and %s", id, other, g.table.Buckets[i])
		}
		seen[uint32(id)] = g.table.Buckets[i]
	}
	bounds, _ := g.table.Bounds.(replicate.BucketWindows)
	if len(g.table.Buckets) != len(g.ids.IDs) || len(g.table.Algorithms) != len(g.ids.IDs) || len(bounds) != len(g.ids.IDs) {
		t.Fatalf("replication table of %d names, %d algorithms and %d bounds for %d ids", len(g.table.Buckets), len(g.table.Algorithms), len(bounds), len(g.ids.IDs))
	}
	// Peers may report an RLS rule in its own window only.
	kept := slices.Index(g.table.Buckets, g.rls.Rules()[0].Bucket)
	if mx, ok := bounds.PeerBound(counter.Bucket(kept), 60_000); !ok || mx != replicate.BoundFor(6) {
		t.Errorf("kept's bound per minute: %d %v", mx, ok)
	}
	if _, ok := bounds.PeerBound(counter.Bucket(kept), 3_600_000); ok {
		t.Error("kept accepts hour windows from peers")
	}
	// A node without a ShouldRateLimit service refuses RLS rules.
	bare := start(t, local(reloadRules(t, 10, 10, "1h")))
	if err := bare.ReloadSources(context.Background(), Sources{Rules: reloadRules(t, 10, 10, "1h"), RLS: rlsRules(t, 1, "hour")}); err == nil {
		t.Fatal("RLS rules accepted by a node that does not serve them")
	}
	// A node serving them refuses a generation without them.
	if err := n.ReloadSources(context.Background(), Sources{Rules: reloadRules(t, 10, 10, "1h")}); err == nil {
		t.Fatal("a generation without RLS rules accepted by a node serving ShouldRateLimit")
	}
	if got := rlsAllowed(t, svc, "kept", 1); got != 0 {
		t.Fatal("a refused reload changed the RLS rules")
	}
}
