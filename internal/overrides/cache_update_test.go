package overrides_test

import (
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Update re-resolves the overrides held against a new configuration by
// bucket name, under the new ids, without waiting on Postgres: a bucket
// gone or no longer overridable stops applying (its tenant counts as an
// invalid row), key owners follow their key name, and the next refresh
// re-reads the table so overrides of a bucket the reload added apply.
func TestCacheUpdate(t *testing.T) {
	e := setup(t)
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}, "upload": {"limit": 20, "scale_ms": 1000}, "inbound": {"limit": 900, "scale_ms": 1000}}')`)
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('beta', '{"fresh": {"limit": 7, "scale_ms": 60000}}')`)
	e.Exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', 'ch-1', 'acme')`)
	c := startCache(t, e, overrides.Config{})
	if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 1 {
		t.Fatalf("invalid rows %v before the update, want 1 (beta names a bucket not configured)", got)
	}
	next, err := configfile.Parse([]byte(`keys:
  tenant_header: x-tenant-id
buckets:
  fresh: {limit: 1, per: 1m, key: tenant, overridable: true}
  inbound: {limit: 500, per: 1s, key: path:channel, overridable: true}
  activity_create: {limit: 100, per: 1s, key: tenant, overridable: true, algorithm: sliding}
  upload: {limit: 10, per: 1s, key: tenant}
routes:
  - {method: POST, path: /a, buckets: [activity_create, upload, fresh]}
  - {method: POST, path: "/in/{channel}", buckets: [inbound]}
`), "next.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Ids as the node's allocator would give them: new ones, far from the
	// indices, so that a lookup by index would miss.
	ids := []counter.Bucket{40, 41, 42, 43}
	if err := reload(c.Cache, withIDs(t, next, ids...)); err != nil {
		t.Fatal(err)
	}
	if got, ok := c.Override("acme", 42); !ok || got != (counter.Limit{Limit: 200, ScaleMS: 1000, Algorithm: counter.Sliding}) {
		t.Errorf("activity_create under its new id: %+v %v, want 200/1s with the bucket's new algorithm", got, ok)
	}
	if got, ok := c.OverrideFor(41, "ch-1"); !ok || got.Limit != 900 {
		t.Errorf("inbound through ch-1's owner: %+v %v", got, ok)
	}
	if _, ok := c.Override("acme", 43); ok {
		t.Error("upload is no longer overridable and still has an override")
	}
	for _, old := range []counter.Bucket{0, 1, 2} {
		if _, ok := c.Override("acme", old); ok {
			t.Errorf("an override answers under the old id %d", old)
		}
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_loaded"); got != 2 {
		t.Errorf("loaded %v after the update, want 2", got)
	}
	// The full refresh that follows picks up beta's override of fresh.
	e.Exec(t, `UPDATE tenant_limits SET limits = limits WHERE tenant = 'nobody'`)
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('gamma', '{}')`) // a NOTIFY: refresh now
	expectOverride(t, c, "beta", 40, counter.Limit{Limit: 7, ScaleMS: 60_000})
	if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 1 {
		t.Errorf("invalid rows %v after the full refresh, want 1 (acme's upload)", got)
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_reloads_total", "kind", "full"); got != 2 {
		t.Errorf("%v full refreshes, want 2 (the first, and the one after the reload)", got)
	}
	if err := reload(c.Cache, nil); err == nil {
		t.Error("a reload without a configuration accepted")
	}
	if got, ok := c.Override("acme", 42); !ok || got.Limit != 200 {
		t.Errorf("a refused reload changed the overrides: %+v %v", got, ok)
	}
}

// An Update (a reload) does not wait for a refresh whose query is stuck:
// the refresh reads without the cache's lock. The rows it read against the
// old configuration are discarded and the table read again under the new
// one, so an override of a bucket only the new configuration has applies.
func TestCacheUpdateDuringBlockedRefresh(t *testing.T) {
	e := setup(t)
	c := startCache(t, e, overrides.Config{QueryTimeout: 20 * time.Second})
	// Hold the table so that the next refresh's read blocks on it.
	locker := e.Connect(t)
	tx, err := locker.Begin(e.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(e.Ctx)
	if _, err := tx.Exec(e.Ctx, `LOCK TABLE tenant_limits IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.Ctx, `INSERT INTO tenant_limits VALUES ('acme', '{"fresh": {"limit": 7, "scale_ms": 60000}}')`); err != nil {
		t.Fatal(err)
	}
	e.Exec(t, `SELECT pg_notify($1, '')`, overridedb.Channel)
	blocked := func() bool {
		return e.Count(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FROM tenant_limits%'`) == 1
	}
	poll.UntilTrue(t, 10*time.Second, 10*time.Millisecond, blocked)

	next, err := configfile.Parse([]byte(`keys:
  tenant_header: x-tenant-id
buckets:
  fresh: {limit: 1, per: 1m, key: tenant, overridable: true}
routes:
  - {method: POST, path: /a, buckets: [fresh]}
`), "next.yaml")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- reload(c.Cache, withIDs(t, next, 30)) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Update waited for the refresh blocked on the table")
	}
	if !blocked() {
		t.Fatal("the refresh is no longer blocked: the test did not show that Update ran while it was")
	}
	if err := tx.Commit(e.Ctx); err != nil {
		t.Fatal(err)
	}
	expectOverride(t, c, "acme", 30, counter.Limit{Limit: 7, ScaleMS: 60_000})
	if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 0 {
		t.Errorf("invalid rows %v, want 0: the read against the old configuration was published", got)
	}
}

// withIDs is the snapshot of r with the counter ids ids, by position.
func withIDs(t testing.TB, r *configfile.Rules, ids ...counter.Bucket) *snapshot.Snapshot {
	t.Helper()
	next := 0
	snap, err := snapshot.CompileWith(snapshot.Sources{Rules: r}, func(snapshot.Key) counter.Bucket { next++; return ids[next-1] })
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// reload makes snap the cache's configuration as a node's reload does:
// Prepare, then the swap.
func reload(c *overrides.Cache, snap *snapshot.Snapshot) error {
	swap, err := c.Prepare(snap)
	if err != nil {
		return err
	}
	swap()
	return nil
}
