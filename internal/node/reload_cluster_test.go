package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// clusterReloadRules: shared is the same on both nodes; win and alg differ
// by window and algorithm when a node's variant differs; extraX exists on
// one node only.
func clusterReloadRules(t *testing.T, winPer, alg, extra string) *configfile.Rules {
	t.Helper()
	return parseRules(t, fmt.Sprintf(`keys:
  tenant_header: x-tenant-id
buckets:
  shared: {limit: 10, per: 1h, key: tenant}
  win: {limit: 10, per: %s, key: tenant}
  alg: {limit: 10, per: 1h, key: tenant, algorithm: %s}
  %s: {limit: 10, per: 1h, key: tenant}
routes:
  - {method: POST, path: /shared, buckets: [shared]}
  - {method: POST, path: /win, buckets: [win]}
  - {method: POST, path: /alg, buckets: [alg]}
  - {method: POST, path: /extra, buckets: [%s]}
`, winPer, alg, extra, extra))
}

// Nodes of a cluster reload at different moments. While their
// configurations differ they keep replicating the buckets they share;
// entries of a bucket one does not have, or counted in another window or
// algorithm, are dropped and counted by reason; once they agree again,
// those buckets replicate too. Over a real nats-server process.
func TestClusterNodesWithDifferentConfigurations(t *testing.T) {
	nats := testnats.StartProcess(t)
	cluster := func(id string, r *configfile.Rules) Config {
		cfg := local(r)
		// Without budget shares every count is sent when it changes,
		// which is what this test follows.
		cfg.Cluster = &Cluster{URL: nats.URL(), NodeID: id, SyncInterval: 20 * time.Millisecond, WarmStartTimeout: 200 * time.Millisecond, NoShares: true}
		return cfg
	}
	a := start(t, cluster("a", clusterReloadRules(t, "1h", "fixed", "extra_a")))
	b := start(t, cluster("b", clusterReloadRules(t, "1h", "fixed", "extra_b")))
	ac, _ := dial(t, a.GRPCAddr())
	bc, _ := dial(t, b.GRPCAddr())
	for _, n := range []*running{a, b} {
		poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
			if code, _ := scrape.Page(t, "http://"+n.HTTPAddr().String()+"/readyz"); code != 200 {
				return errors.New("not ready")
			}
			return nil
		})
	}
	// b's win counts per minute, its alg slides: a's counts of them are
	// not b's to merge.
	if err := b.Reload(t.Context(), clusterReloadRules(t, "1m", "sliding", "extra_b")); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/shared", "/win", "/alg", "/extra"} {
		if got := spendN(t, ac, path, "acme", 4); got != 4 {
			t.Fatalf("a: %s admitted %d of 4", path, got)
		}
	}
	dropped := func(reason string) float64 {
		return gathered(t, b, fmt.Sprintf(`ratelimit_authz_replicate_entries_dropped_total{reason="%s"}`, reason))
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, reason := range []string{"unknown_bucket", "scale", "algorithm"} {
			if dropped(reason) < 1 {
				return fmt.Errorf("b dropped no entry for reason %s yet", reason)
			}
		}
		return nil
	})
	// shared replicated: b admits 6 of its 10.
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v := gathered(t, b, "ratelimit_authz_replicate_entries_merged_total"); v < 1 {
			return errors.New("b merged nothing of a's")
		}
		return nil
	})
	if got := spendN(t, bc, "/shared", "acme", 8); got != 6 {
		t.Fatalf("b: shared admitted %d of 8 with a's 4 of 10 replicated, want 6", got)
	}
	// win and alg did not mix: b admits its full 10 of each.
	for _, path := range []string{"/win", "/alg"} {
		if got := spendN(t, bc, path, "acme", 11); got != 10 {
			t.Fatalf("b: %s admitted %d of 11, want its own 10 (a's counts are in another window or algorithm)", path, got)
		}
	}
	// b's extra bucket is a's unknown one, and the reverse.
	if got := spendN(t, bc, "/extra", "acme", 1); got != 1 {
		t.Fatal("b: extra_b denied its first")
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := gathered(t, a, `ratelimit_authz_replicate_entries_dropped_total{reason="unknown_bucket"}`); v < 1 {
			return errors.New("a dropped none of b's extra_b entries")
		}
		return nil
	})
	// b reloads a's configuration: extra_a replicates from the count a
	// sends next (a count is sent when it changes).
	if err := b.Reload(t.Context(), clusterReloadRules(t, "1h", "fixed", "extra_a")); err != nil {
		t.Fatal(err)
	}
	merged := gathered(t, b, "ratelimit_authz_replicate_entries_merged_total")
	if got := spendN(t, ac, "/extra", "acme", 1); got != 1 {
		t.Fatal("a: extra_a denied its 5th")
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := gathered(t, b, "ratelimit_authz_replicate_entries_merged_total"); v <= merged {
			return errors.New("b merged nothing more of a's")
		}
		return nil
	})
	if got := spendN(t, bc, "/extra", "acme", 10); got != 5 {
		t.Fatalf("b: extra_a admitted %d of 10 with a's 5 replicated after the reload, want 5", got)
	}
}
