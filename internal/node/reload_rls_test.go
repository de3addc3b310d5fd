package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// rlsText is an RLS configuration of domain d: kept at perMinute a
// minute, changed at 3 per unit.
func rlsText(perMinute int, unit string) string {
	return fmt.Sprintf(`domain: d
descriptors:
  - key: kept
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: changed
    rate_limit: {unit: %s, requests_per_unit: 3}
`, perMinute, unit)
}

func rlsReloadRules(t *testing.T, perMinute int, unit string) *rlsconfig.Config {
	t.Helper()
	c, err := rlsconfig.Parse([]rlsconfig.File{{Name: "d.yaml", Data: []byte(rlsText(perMinute, unit))}}, rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func rlsCode(t *testing.T, svc *rls.Service, key string) rlsv3.RateLimitResponse_Code {
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
		if rlsCode(t, svc, key) == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// The RLS rules are one more part of a generation, read from their own
// directory at start and at every ReloadFiles: their counts are kept while
// a rule's bucket, unit and algorithm hold, reset when its unit changes; a
// reload of the ext_authz rules alone keeps the RLS rules in force, a
// broken RLS file is refused like a broken ext_authz one, and the ids of
// both formats never meet.
func TestReloadRLSRules(t *testing.T) {
	layout := rlsLayout(t, map[string]string{"d.yaml": rlsText(5, "hour")})
	file := filepath.Join(layout.Root, layout.Subdirectory, "config", "d.yaml")
	cfg := local(reloadRules(t, 10, 10, "1h"))
	cfg.RLS = &RLS{Layout: layout}
	cfg.RulesFile = rulesFile(t, "rules.yaml", reloadText(11, 10, "1h"))
	n := start(t, cfg)
	svc := rlsService(t, n.Node)
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
	// ReloadFiles re-reads the unchanged directory: still nothing reset.
	if err := n.ReloadFiles(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	if got := rlsAllowed(t, svc, "changed", 1); got != 0 {
		t.Fatal("an ext_authz reload reset an RLS rule")
	}
	// Both: kept's limit rises (counts stay), changed counts per minute now
	// (a new bucket: from zero).
	if err := os.WriteFile(file, []byte(rlsText(6, "minute")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.ReloadFiles(context.Background(), "test"); err != nil {
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
	bs := replicationBuckets(g)
	for _, b := range bs {
		if other, dup := seen[uint32(b.ID)]; dup {
			t.Fatalf("id %d given to %s and %s", b.ID, other, b.Name)
		}
		seen[uint32(b.ID)] = b.Name
	}
	// Peers may report an RLS rule in its own window only.
	kept := slices.IndexFunc(bs, func(b replicate.Bucket) bool { return b.Name == g.RLS.Rules()[0].Bucket })
	if kept < 0 {
		t.Fatal("kept is not replicated")
	}
	if mx, ok := bs[kept].Bounds[60_000]; !ok || mx != snapshot.BoundFor(6) {
		t.Errorf("kept's bound per minute: %d %v", mx, ok)
	}
	if _, ok := bs[kept].Bounds[3_600_000]; ok {
		t.Error("kept accepts hour windows from peers")
	}
	// A broken RLS file: refused with its place, nothing changes.
	if err := os.WriteFile(file, []byte(rlsText(6, "fortnight")), 0o644); err != nil {
		t.Fatal(err)
	}
	err := n.ReloadFiles(context.Background(), "test")
	if ps, ok := problem.As(err); !ok || !strings.Contains(ps[0].String(), "d.yaml:") {
		t.Fatalf("a broken RLS file: %v, want its located problems", err)
	}
	if got := rlsAllowed(t, svc, "kept", 1); got != 0 {
		t.Fatal("a refused RLS reload changed kept's count")
	}
	// A node without a ShouldRateLimit service refuses RLS rules.
	bare := start(t, local(reloadRules(t, 10, 10, "1h")))
	if err := bare.ReloadSources(context.Background(), Sources{Rules: reloadRules(t, 10, 10, "1h"), RLS: rlsReloadRules(t, 1, "hour")}); err == nil {
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

// A reload that one component refuses after the others accepted it
// changes nothing: the Check keeps its limits and counts, the snapshot
// served and the counter's keys stay, and the refusal is counted.
func TestReloadRefusedByOneComponentChangesNothing(t *testing.T) {
	cfg := local(reloadRules(t, 3, 3, "1h"))
	cfg.RLS = &RLS{Layout: rlsLayout(t, map[string]string{"d.yaml": rlsText(5, "hour")})}
	n := start(t, cfg)
	c, _ := dial(t, n.GRPCAddr())
	if got := spendN(t, c, "/spend", "acme", 3); got != 3 {
		t.Fatalf("%d of the first 3 allowed", got)
	}
	svc := rlsService(t, n.Node)
	if got := rlsAllowed(t, svc, "changed", 1); got != 1 {
		t.Fatal("RLS rule changed refused its first hit")
	}
	cur, keys := n.cur, n.store.Len()
	// spend's window and limit change (a new id: its counts would go), and
	// no RLS rules come with it: the Check, failure counting and RLQS
	// accept it, ShouldRateLimit refuses it.
	err := n.ReloadSources(context.Background(), Sources{Rules: reloadRules(t, 10, 3, "1m")})
	if err == nil || !strings.Contains(err.Error(), "ShouldRateLimit") {
		t.Fatalf("a generation without RLS rules: %v, want ShouldRateLimit's refusal", err)
	}
	if n.cur != cur || n.store.Len() != keys {
		t.Fatalf("the refused reload changed the snapshot or dropped keys (%d → %d)", keys, n.store.Len())
	}
	if checkPath(t, c, "/spend", "acme") {
		t.Fatal("spend admitted a 4th check: the refused reload swapped the Check's limits or dropped its counts")
	}
	if got := rlsAllowed(t, svc, "changed", 3); got != 2 {
		t.Fatalf("RLS rule changed admitted %d of 3 more, want 2 (3 per hour, 1 counted)", got)
	}
	if v := gathered(t, n, `ratelimit_authz_config_reloads_total{result="failure"}`); v != 1 {
		t.Errorf("reloads_total{failure} = %v, want 1", v)
	}
}
