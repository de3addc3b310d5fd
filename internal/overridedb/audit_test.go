package overridedb_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// asUser connects to e's database as another login role.
func asUser(t *testing.T, e *env, user string) *pgx.Conn {
	t.Helper()
	u, err := url.Parse(e.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return testpg.Connect(t, u.String())
}

// TestAuditRecordsTheDatabaseUser: whatever actor a session claims, the
// audit row says which database user (and role) made the change, and a
// row inserted by hand cannot claim another.
func TestAuditRecordsTheDatabaseUser(t *testing.T) {
	e := setup(t)
	e.Exec(t, "CREATE ROLE mallory LOGIN")
	e.Exec(t, "CREATE ROLE ops NOLOGIN")
	e.Exec(t, "GRANT ops TO mallory")
	// The privileges docs/security.md gives the CLI's role.
	e.Exec(t, "GRANT SELECT, INSERT, UPDATE, DELETE ON tenant_limits, tenant_limits_deletions, tenant_key_owners, tenant_key_owners_deletions TO ops")
	e.Exec(t, "GRANT INSERT ON tenant_limits_audit, tenant_key_owners_audit TO ops")
	m := asUser(t, e, "mallory")
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := m.Exec(e.Ctx, sql, args...); err != nil {
			t.Fatalf("as mallory: %s: %v", sql, err)
		}
	}
	exec("SET ROLE ops")
	exec("SELECT set_config('ratelimit_authz.actor', 'alice', false)")
	exec("BEGIN")
	exec("SELECT set_config('ratelimit_authz.actor', 'alice', true)")
	exec(`INSERT INTO tenant_limits VALUES ('acme', '{"upload": {"limit": 20, "scale_ms": 1000}}')`)
	exec(`INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', 'ch-1', 'acme')`)
	exec("COMMIT")
	// Forged by hand: the stamp wins.
	exec(`INSERT INTO tenant_limits_audit (tenant, actor, db_user, db_role) VALUES ('acme', 'alice', 'alice', 'alice')`)
	exec(`DELETE FROM tenant_limits WHERE tenant = 'acme'`)
	exec(`DELETE FROM tenant_key_owners WHERE key_value = 'ch-1'`)
	for _, sql := range []string{
		`UPDATE tenant_limits_audit SET db_user = 'alice'`,
		`DELETE FROM tenant_limits_audit`,
		`TRUNCATE tenant_limits_audit`,
		`ALTER TABLE tenant_limits DISABLE TRIGGER USER`,
		`SET session_replication_role = replica`,
	} {
		if _, err := m.Exec(e.Ctx, sql); err == nil {
			t.Errorf("as mallory: %s: allowed", sql)
		}
	}

	for _, table := range []string{"tenant_limits_audit", "tenant_key_owners_audit"} {
		rows, err := e.Conn.Query(e.Ctx, "SELECT actor, db_user, db_role FROM "+table+" ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			var a, u, ro string
			err := r.Scan(&a, &u, &ro)
			return a + " " + u + " " + ro, err
		})
		if err != nil || len(got) == 0 {
			t.Fatalf("%s: %v %v", table, got, err)
		}
		for _, g := range got {
			if g != "alice mallory ops" {
				t.Errorf("%s row %q, want actor alice made by mallory as ops", table, g)
			}
		}
	}
}

// TestTriggersPinSearchPath: a session's temporary table named like an
// audit or tracking table (pg_temp comes first for tables by default)
// does not capture the triggers' writes.
func TestTriggersPinSearchPath(t *testing.T) {
	e := setup(t)
	attack := func(conn *pgx.Conn, tenant string) {
		t.Helper()
		for _, sql := range []string{
			"CREATE TEMP TABLE IF NOT EXISTS tenant_limits_audit (LIKE public.tenant_limits_audit INCLUDING ALL)",
			"CREATE TEMP TABLE IF NOT EXISTS tenant_limits_deletions (LIKE public.tenant_limits_deletions INCLUDING ALL)",
			"CREATE TEMP TABLE IF NOT EXISTS tenant_key_owners_audit (LIKE public.tenant_key_owners_audit INCLUDING ALL)",
			`INSERT INTO public.tenant_limits VALUES ('` + tenant + `', '{"upload": {"limit": 20, "scale_ms": 1000}}')`,
			`DELETE FROM public.tenant_limits WHERE tenant = '` + tenant + `'`,
			`INSERT INTO public.tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', '` + tenant + `', 'x')`,
		} {
			if _, err := conn.Exec(e.Ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
	}
	audited := func(tenant string) int {
		return e.Count(t, "SELECT count(*) FROM public.tenant_limits_audit WHERE tenant = $1", tenant) +
			e.Count(t, "SELECT count(*) FROM public.tenant_limits_deletions WHERE tenant = $1", tenant) +
			e.Count(t, "SELECT count(*) FROM public.tenant_key_owners_audit WHERE key_value = $1", tenant)
	}

	attack(e.Connect(t), "pinned")
	if n := audited("pinned"); n != 4 { // insert + delete audited, deletion tracked, owner audited
		t.Errorf("with the search_path pinned: %d rows in the real tables, want 4", n)
	}

	// The same attack against unpinned functions captures every row: what
	// the pinning prevents.
	for _, f := range []string{"tenant_limits_after_row()", "tenant_key_owners_after_row()"} {
		e.Exec(t, "ALTER FUNCTION "+f+" RESET search_path")
	}
	attack(e.Connect(t), "unpinned")
	if n := audited("unpinned"); n != 0 {
		t.Errorf("unpinned: %d rows in the real tables, want 0 (the attack did not work: the test proves nothing)", n)
	}
}

// TestEveryFunctionPinsSearchPath: no trigger or check function of the
// schema is left to the caller's search_path.
func TestEveryFunctionPinsSearchPath(t *testing.T) {
	e := setup(t)
	rows, err := e.Conn.Query(e.Ctx, `SELECT p.proname, coalesce(array_to_string(p.proconfig, ' '), '')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = current_schema() AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var name, cfg string
	_, err = pgx.ForEachRow(rows, []any{&name, &cfg}, func() error {
		n++
		if !strings.Contains(cfg, "search_path=pg_catalog, public, pg_temp") {
			t.Errorf("function %s: config %q lacks the pinned search_path", name, cfg)
		}
		return nil
	})
	if err != nil || n < 10 {
		t.Errorf("%d functions checked: %v", n, err)
	}
}
