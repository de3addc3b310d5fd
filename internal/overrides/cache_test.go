package overrides_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// expectOverride waits (up to a second: the promise) until the cache
// answers want (a zero want: no override) and returns how long it took.
func expectOverride(t *testing.T, c *running, tenant string, bucket counter.Bucket, want counter.Limit) time.Duration {
	t.Helper()
	start := time.Now()
	poll.Until(t, time.Second, time.Millisecond, func() error {
		got, ok := c.Override(tenant, bucket)
		if ok != (want != counter.Limit{}) || got != want {
			return fmt.Errorf("Override(%q, %d) = %+v, %v; want %+v", tenant, bucket, got, ok, want)
		}
		return nil
	})
	return time.Since(start)
}

func lim(l, ms int64) counter.Limit { return counter.Limit{Limit: l, ScaleMS: ms} }

// TestCacheFollowsSQL: plain SQL edits reach a running cache within a
// second, through NOTIFY and incremental refreshes.
func TestCacheFollowsSQL(t *testing.T) {
	e := setup(t)
	act, upl := counter.Bucket(e.rules.BucketIndex("activity_create")), counter.Bucket(e.rules.BucketIndex("upload"))
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('before', '{"upload": {"limit": 11, "scale_ms": 1000}}')`)
	goroutines := runtime.NumGoroutine()
	c := startCache(t, e, overrides.Config{})
	if got, ok := c.Override("before", upl); !ok || got != lim(11, 1000) {
		t.Fatalf("loaded before Run: %+v %v", got, ok)
	}
	if d := metric(t, c.reg, "ratelimit_authz_overrides_degraded"); d != 0 {
		t.Errorf("degraded %v after a load", d)
	}

	var worst time.Duration
	for _, step := range []struct {
		what, sql string
		tenant    string
		bucket    counter.Bucket
		want      counter.Limit
	}{
		{"insert", `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}}')`, "acme", act, lim(200, 1000)},
		{"update", `UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 250, "scale_ms": 60000}}' WHERE tenant = 'acme'`, "acme", act, lim(250, 60_000)},
		{"jsonb_set", `UPDATE tenant_limits SET limits = jsonb_set(limits, '{activity_create,limit}', '300') WHERE tenant = 'acme'`, "acme", act, lim(300, 60_000)},
		{"delete", `DELETE FROM tenant_limits WHERE tenant = 'acme'`, "acme", act, counter.Limit{}},
		{"re-insert", `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 50, "scale_ms": 1000}}')`, "acme", act, lim(50, 1000)},
		{"other tenant kept", `DELETE FROM tenant_limits WHERE tenant = 'nobody'`, "before", upl, lim(11, 1000)},
	} {
		e.Exec(t, step.sql)
		d := expectOverride(t, c, step.tenant, step.bucket, step.want)
		worst = max(worst, d)
		t.Logf("%s: visible after %v", step.what, d)
	}
	t.Logf("worst propagation of a SQL edit: %v", worst)
	if got := metric(t, c.reg, "ratelimit_authz_overrides_loaded"); got != 2 {
		t.Errorf("loaded %v, want 2", got)
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_reloads_total", "kind", "full"); got != 1 {
		t.Errorf("%v full reloads, want only the first", got)
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_reloads_total", "kind", "incremental"); got < 5 {
		t.Errorf("%v incremental reloads", got)
	}
	if age := metric(t, c.reg, "ratelimit_authz_overrides_snapshot_age_seconds"); age < 0 || age > 5 {
		t.Errorf("snapshot age %v", age)
	}

	// Stopping Run closes its connection and leaves no goroutine behind;
	// the snapshot keeps answering.
	backends := func() int {
		return e.Count(t, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", overrides.ApplicationName)
	}
	if n := backends(); n != 1 {
		t.Errorf("%d cache connections while running, want 1", n)
	}
	c.stop()
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := backends(); n != 0 {
			return fmt.Errorf("%d cache connections after Run returned", n)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			return fmt.Errorf("%d goroutines, %d before the cache", n, goroutines)
		}
		return nil
	})
	if got, ok := c.Override("before", upl); !ok || got != lim(11, 1000) {
		t.Errorf("after Run returned: %+v %v", got, ok)
	}
}

// TestCacheLateCommit: a transaction that started before a refresh and
// commits after it is not missed (the refresh resumes from the oldest
// transaction still running, not from the newest change it saw).
func TestCacheLateCommit(t *testing.T) {
	e := setup(t)
	act := counter.Bucket(e.rules.BucketIndex("activity_create"))
	c := startCache(t, e, overrides.Config{})

	slow, err := e.Connect(t).Begin(e.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slow.Exec(e.Ctx, `INSERT INTO tenant_limits VALUES ('slow', '{"activity_create": {"limit": 7, "scale_ms": 1000}}')`); err != nil {
		t.Fatal(err)
	}
	// A later transaction commits first; the cache refreshes and sees it.
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('fast', '{"activity_create": {"limit": 8, "scale_ms": 1000}}')`)
	expectOverride(t, c, "fast", act, lim(8, 1000))
	if _, ok := c.Override("slow", act); ok {
		t.Fatal("uncommitted row visible")
	}
	if err := slow.Commit(e.Ctx); err != nil {
		t.Fatal(err)
	}
	expectOverride(t, c, "slow", act, lim(7, 1000))
}

// TestCacheBrokenRow: rows that fail validation (written with the
// database checks bypassed, or for a bucket this node does not let tenants
// override) are skipped, logged and counted; the others apply.
func TestCacheBrokenRow(t *testing.T) {
	e := setup(t)
	act, upl := counter.Bucket(e.rules.BucketIndex("activity_create")), counter.Bucket(e.rules.BucketIndex("upload"))
	e.Exec(t, "ALTER TABLE tenant_limits DISABLE TRIGGER tenant_limits_before")
	e.Exec(t, "ALTER TABLE tenant_limits DROP CONSTRAINT tenant_limits_limits_shape")
	e.Exec(t, `INSERT INTO tenant_limits VALUES
		('good1', '{"activity_create": {"limit": 200, "scale_ms": 1000}}'),
		('broken', '{"activity_create": {"limit": "lots", "scale_ms": 1000}}'),
		('array', '[1, 2, 3]'),
		('half', '{"activity_create": {"limit": -5, "scale_ms": 1000}, "upload": {"limit": 30, "scale_ms": 1000}}'),
		('good2', '{"upload": {"limit": 40, "scale_ms": 60000}}')`)
	c := startCache(t, e, overrides.Config{})
	for _, tc := range []struct {
		tenant string
		bucket counter.Bucket
		want   counter.Limit
	}{
		{"good1", act, lim(200, 1000)},
		{"good2", upl, lim(40, 60_000)},
		{"half", upl, lim(30, 1000)},
		{"half", act, counter.Limit{}},
		{"broken", act, counter.Limit{}},
		{"array", act, counter.Limit{}},
	} {
		expectOverride(t, c, tc.tenant, tc.bucket, tc.want)
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 3 {
		t.Errorf("invalid rows %v, want 3", got)
	}
	if got := metric(t, c.reg, "ratelimit_authz_overrides_loaded"); got != 3 {
		t.Errorf("loaded %v, want 3", got)
	}
	if !contains(c.logs.String(), "tenant override skipped", "tenant=broken", "tenant=array", "tenant=half", "must be a whole number") {
		t.Errorf("skipped rows not logged:\n%s", c.logs)
	}

	// A bucket SQL accepts but this configuration does not let tenants
	// override, arriving incrementally; then the broken row is fixed.
	e.Exec(t, "ALTER TABLE tenant_limits ENABLE TRIGGER tenant_limits_before")
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('login', '{"login_ip": {"limit": 500, "scale_ms": 60000}, "activity_create": {"limit": 3, "scale_ms": 1000}}')`)
	expectOverride(t, c, "login", act, lim(3, 1000))
	if _, ok := c.Override("login", counter.Bucket(e.rules.BucketIndex("login_ip"))); ok {
		t.Error("override of a bucket that is not overridable")
	}
	e.Exec(t, `UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 9, "scale_ms": 1000}}' WHERE tenant = 'broken'`)
	expectOverride(t, c, "broken", act, lim(9, 1000))
	poll.Until(t, time.Second, 5*time.Millisecond, func() error {
		if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 3 { // array, half, login
			return fmt.Errorf("invalid rows %v, want 3", got)
		}
		return nil
	})
	if !strings.Contains(c.logs.String(), `bucket=login_ip`) {
		t.Errorf("non-overridable bucket not logged:\n%s", c.logs)
	}
}

// TestCacheOutage: Postgres stops under a running cache; the last snapshot
// keeps serving, the cache says it is degraded, and it recovers by itself.
func TestCacheOutage(t *testing.T) {
	e := setup(t)
	act := counter.Bucket(e.rules.BucketIndex("activity_create"))
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}}')`)
	c := startCache(t, e, overrides.Config{})
	expectOverride(t, c, "acme", act, lim(200, 1000))

	e.Server.Stop(t)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if metric(t, c.reg, "ratelimit_authz_overrides_degraded") != 1 {
			return fmt.Errorf("not degraded")
		}
		return nil
	})
	// Several failed attempts, each backed off; the snapshot still serves.
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := metric(t, c.reg, "ratelimit_authz_overrides_reload_errors_total"); n < 3 {
			return fmt.Errorf("%v reload errors", n)
		}
		return nil
	})
	if got, ok := c.Override("acme", act); !ok || got != lim(200, 1000) {
		t.Fatalf("during the outage: %+v %v", got, ok)
	}
	if !c.Degraded() || !contains(c.logs.String(), "tenant overrides degraded", "serving=\"the last snapshot\"", "retry_in=") {
		t.Errorf("outage not logged:\n%s", c.logs)
	}

	e.Server.Start(t)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if metric(t, c.reg, "ratelimit_authz_overrides_degraded") != 0 {
			return fmt.Errorf("still degraded")
		}
		return nil
	})
	if !strings.Contains(c.logs.String(), "tenant overrides recovered") {
		t.Errorf("recovery not logged:\n%s", c.logs)
	}
	// Listening again: a change now arrives within a second.
	conn := e.Connect(t)
	if _, err := conn.Exec(e.Ctx, `UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 400, "scale_ms": 1000}}'`); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the restart, a SQL edit was visible after %v", expectOverride(t, c, "acme", act, lim(400, 1000)))
}

// TestCacheStartsWithPostgresDown: the node starts on the configured
// limits and picks the overrides up once Postgres is there.
func TestCacheStartsWithPostgresDown(t *testing.T) {
	e := setup(t)
	act := counter.Bucket(e.rules.BucketIndex("activity_create"))
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}}')`)
	e.Server.Stop(t)
	c := startCache(t, e, overrides.Config{})
	if _, ok := c.Override("acme", act); ok {
		t.Fatal("override without a database")
	}
	if !c.Degraded() || metric(t, c.reg, "ratelimit_authz_overrides_degraded") != 1 {
		t.Error("not degraded")
	}
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(c.logs.String(), `serving="the configured limits (no snapshot yet)"`) {
			return fmt.Errorf("log: %s", c.logs)
		}
		return nil
	})
	e.Server.Start(t)
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if _, ok := c.Override("acme", act); !ok {
			return fmt.Errorf("no override yet")
		}
		return nil
	})
	if c.Degraded() || !strings.Contains(c.logs.String(), "tenant overrides loaded") {
		t.Errorf("degraded %v; log:\n%s", c.Degraded(), c.logs)
	}
}

// TestCachePeriodicRefresh: with NOTIFY and change tracking bypassed
// (session_replication_role = replica turns triggers off), the periodic
// refreshes still bring changes in: new rows incrementally, changed rows
// with the next full reload.
func TestCachePeriodicRefresh(t *testing.T) {
	e := setup(t)
	act := counter.Bucket(e.rules.BucketIndex("activity_create"))
	e.Exec(t, `INSERT INTO tenant_limits VALUES ('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}}')`)
	c := startCache(t, e, overrides.Config{RefreshInterval: 100 * time.Millisecond, FullRefreshInterval: 400 * time.Millisecond})
	quiet := e.Connect(t)
	exec := func(sql string) {
		t.Helper()
		err := pgx.BeginFunc(e.Ctx, quiet, func(tx pgx.Tx) error {
			if _, err := tx.Exec(e.Ctx, "SET LOCAL session_replication_role = replica"); err != nil {
				return err
			}
			_, err := tx.Exec(e.Ctx, sql)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	exec(`INSERT INTO tenant_limits VALUES ('quiet', '{"activity_create": {"limit": 5, "scale_ms": 1000}}')`)
	expectOverride(t, c, "quiet", act, lim(5, 1000))
	exec(`UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 6, "scale_ms": 1000}}' WHERE tenant = 'acme'`)
	expectOverride(t, c, "acme", act, lim(6, 1000))
	if n := metric(t, c.reg, "ratelimit_authz_overrides_reloads_total", "kind", "full"); n < 2 {
		t.Errorf("%v full reloads", n)
	}
}

func TestNewCacheRefusesBadConfig(t *testing.T) {
	r := shippedRules(t)
	for _, cfg := range []overrides.Config{
		{},
		{URL: "postgres://%zz"},
		{URL: "postgres://127.0.0.1/x", FullRefreshInterval: 24 * time.Hour},
		{URL: "postgres://127.0.0.1/x", MinBackoff: time.Second, MaxBackoff: time.Millisecond},
	} {
		if _, err := overrides.NewCache(cfg, snapshottest.ByIndex(t, r), newRegistry(), discardLog()); err == nil {
			t.Errorf("NewCache(%+v) accepted", cfg)
		}
	}
	// The URL's password never appears in an error.
	_, err := overrides.NewCache(overrides.Config{URL: "postgres://u:s3cret@host:notaport/db"}, snapshottest.ByIndex(t, r), newRegistry(), discardLog())
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL error: %v", err)
	}
}
