package overridedb_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

func TestMigrateTwice(t *testing.T) {
	e := setup(t) // migrated once
	ms, err := overridedb.Migrations()
	if err != nil || len(ms) == 0 || ms[0].Version != 1 {
		t.Fatalf("embedded migrations: %v %v", ms, err)
	}
	latest := ms[len(ms)-1].Version
	res, err := overridedb.Migrate(e.Ctx, e.Conn)
	if err != nil || len(res.Applied) != 0 || res.Version != latest || res.Newer {
		t.Fatalf("second migrate: %+v %v", res, err)
	}
	if n := e.Count(t, "SELECT count(*) FROM ratelimit_authz_migrations"); n != len(ms) {
		t.Errorf("%d migrations recorded, want %d", n, len(ms))
	}

	// A fresh database migrated from several connections at once: the
	// advisory lock lets one apply, the others find it done.
	url := e.Server.CreateDatabase(t, "concurrent")
	var wg sync.WaitGroup
	results := make([]overridedb.MigrateResult, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Go(func() {
			conn, err := pgx.Connect(e.Ctx, url)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(e.Ctx)
			results[i], errs[i] = overridedb.Migrate(e.Ctx, conn)
		})
	}
	wg.Wait()
	applied := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("concurrent migrate %d: %v", i, errs[i])
		}
		applied += len(results[i].Applied)
	}
	if applied != len(ms) {
		t.Errorf("concurrent migrations applied %d in total, want %d", applied, len(ms))
	}

	// A database migrated by a newer release is left alone.
	e.Exec(t, "INSERT INTO ratelimit_authz_migrations (version, name) VALUES (9999, '9999_future')")
	res, err = overridedb.Migrate(e.Ctx, e.Conn)
	if err != nil || !res.Newer || res.Version != 9999 || len(res.Applied) != 0 {
		t.Errorf("newer schema: %+v %v", res, err)
	}
}

// TestSQLChecks: a direct SQL edit with a bad shape is refused with a
// message that says what is wrong; the constraint holds even with the
// triggers off.
func TestSQLChecks(t *testing.T) {
	e := setup(t)
	good := `{"activity_create": {"limit": 200, "scale_ms": 1000}}`
	e.Exec(t, "INSERT INTO tenant_limits (tenant, limits) VALUES ('ok', $1)", good)
	for _, tc := range []struct {
		sql, want string
	}{
		{`INSERT INTO tenant_limits VALUES ('a', '[]')`, "limits must be a JSON object"},
		{`INSERT INTO tenant_limits VALUES ('a', '{"Activity": {"limit": 1, "scale_ms": 1000}}')`, `"Activity" is not a bucket name`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": 5}')`, `bucket upload: want {"limit": N, "scale_ms": MS}, not 5`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 5}}')`, `bucket upload: "scale_ms" must be 1000 (1s), 60000 (1m), 3600000 (1h) or 86400000 (1d), not missing`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 0, "scale_ms": 1000}}')`, `bucket upload: "limit" must be a whole number from 1 to 2147483647, not 0`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": -1, "scale_ms": 1000}}')`, `"limit" must be a whole number`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 2.5, "scale_ms": 1000}}')`, `"limit" must be a whole number`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": "5", "scale_ms": 1000}}')`, `"limit" must be a whole number`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 99999999999, "scale_ms": 1000}}')`, `"limit" must be a whole number`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 5, "scale_ms": 1500}}')`, `"scale_ms" must be 1000 (1s)`},
		{`INSERT INTO tenant_limits VALUES ('a', '{"upload": {"limit": 5, "scale_ms": 1000, "burst": 2}}')`, `unknown field "burst"`},
		{`UPDATE tenant_limits SET limits = jsonb_set(limits, '{activity_create,limit}', '0')`, `invalid limits for tenant "ok"`},
		{`INSERT INTO tenant_limits VALUES ('', '{}')`, "tenant_limits_tenant_valid"},
		{`UPDATE tenant_limits SET tenant = 'renamed'`, "a row's tenant cannot change"},
		{`TRUNCATE tenant_limits`, "TRUNCATE is refused"},
	} {
		_, err := e.Conn.Exec(e.Ctx, tc.sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || !strings.Contains(pe.Message, tc.want) && !strings.Contains(pe.ConstraintName, tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.sql, err, tc.want)
		}
	}
	// Only the good row, unchanged, and its one audit entry.
	if n := e.Count(t, "SELECT count(*) FROM tenant_limits WHERE limits = $1::jsonb", good); n != 1 {
		t.Errorf("%d good rows", n)
	}
	if n := e.Count(t, "SELECT count(*) FROM tenant_limits_audit"); n != 1 {
		t.Errorf("%d audit rows", n)
	}

	// With the triggers off (session_replication_role = replica), the
	// CHECK constraint still refuses a bad shape.
	e.Exec(t, "SET session_replication_role = replica")
	_, err := e.Conn.Exec(e.Ctx, `INSERT INTO tenant_limits VALUES ('b', '{"upload": {"limit": 0, "scale_ms": 1000}}')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.ConstraintName != "tenant_limits_limits_shape" {
		t.Errorf("constraint without triggers: %v", err)
	}
	e.Exec(t, "SET session_replication_role = origin")

	// A plain SQL change is audited with the database user as the actor.
	e.Exec(t, `UPDATE tenant_limits SET limits = '{"upload": {"limit": 20, "scale_ms": 1000}}' WHERE tenant = 'ok'`)
	var actor string
	if err := e.Conn.QueryRow(e.Ctx, "SELECT actor FROM tenant_limits_audit ORDER BY id DESC LIMIT 1").Scan(&actor); err != nil || actor != "sql:postgres" {
		t.Errorf("actor of a SQL edit: %q %v", actor, err)
	}
}

func TestNoSchema(t *testing.T) {
	e := setup(t)
	url := e.Server.CreateDatabase(t, "empty")
	conn := testpg.Connect(t, url)
	s, _ := overridedb.NewStore(conn, snapshottest.ByIndex(t, e.rules))
	_, _, err := s.Get(e.Ctx, "acme")
	if !errors.Is(err, overridedb.ErrNoSchema) || !strings.Contains(err.Error(), "ratelimit-authz migrate") {
		t.Errorf("get without schema: %v", err)
	}
}
