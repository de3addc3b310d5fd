package kubernetes_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// run runs a command with a timeout and returns its combined output.
func run(t *testing.T, timeout time.Duration, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestEnvoyBootstrapValidates: the Kubernetes/compose bootstrap is a whole
// Envoy configuration the pinned Envoy accepts.
func TestEnvoyBootstrapValidates(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	abs, err := filepath.Abs("envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, 2*time.Minute, nil, envoy, "--mode", "validate", "-c", abs, "--log-level", "warn")
	if err != nil || !strings.Contains(out, "OK") {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// TestEnvoyBootstrapMatchesShipped: deploy/kubernetes/envoy/envoy.yaml is
// envoy/ratelimit-authz.yaml with only its addresses and discovery
// changed, so the filter settings (fail closed, retries, health checks,
// access log) cannot drift apart.
func TestEnvoyBootstrapMatchesShipped(t *testing.T) {
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	load := func(p string) map[string]any {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return m
	}
	shipped := load(filepath.Join(root, "envoy", "ratelimit-authz.yaml"))
	deployed := load("envoy/envoy.yaml")

	// The differences a DNS-discovered deployment needs, applied to the
	// shipped bootstrap.
	sr := shipped["static_resources"].(map[string]any)
	listener := sr["listeners"].([]any)[0].(map[string]any)
	listener["address"].(map[string]any)["socket_address"].(map[string]any)["address"] = "0.0.0.0"
	for _, c := range sr["clusters"].([]any) {
		c := c.(map[string]any)
		c["type"] = "STRICT_DNS"
		c["dns_lookup_family"] = "V4_ONLY"
		// Both ratelimit-authz clusters, the lean Check listener's and the
		// gRPC port's, reach the same pods.
		host := map[string]string{"ratelimit_authz_check": "ratelimit-authz", "ratelimit_authz": "ratelimit-authz", "app": "app"}[c["name"].(string)]
		if host == "" {
			t.Fatalf("shipped cluster %v: not one this test knows", c["name"])
		}
		if host == "ratelimit-authz" {
			c["dns_refresh_rate"] = "2s"
			c["respect_dns_ttl"] = false
		}
		ep := c["load_assignment"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)["lb_endpoints"].([]any)[0].(map[string]any)
		ep["endpoint"].(map[string]any)["address"].(map[string]any)["socket_address"].(map[string]any)["address"] = host
	}
	if !reflect.DeepEqual(shipped, deployed) {
		a, _ := yaml.Marshal(shipped)
		b, _ := yaml.Marshal(deployed)
		t.Errorf("envoy/envoy.yaml differs from envoy/ratelimit-authz.yaml beyond addresses and discovery:\n--- shipped (adjusted)\n%s\n--- deploy\n%s", a, b)
	}
}

// TestNATSConfigValidates: the NATS StatefulSet's configuration (the
// shipped permissions included, plus the cluster) is accepted by the
// pinned nats-server with the variables the StatefulSet sets, and refused
// without the nodes' password.
func TestNATSConfigValidates(t *testing.T) {
	bin := testnats.Binary(t)
	dir := t.TempDir()
	for _, f := range []string{"nats.conf", "ratelimit-authz.conf"} {
		b, err := os.ReadFile(filepath.Join("nats", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "nats.conf")
	env := []string{"POD_NAME=nats-0", "RATELIMIT_NODE_NATS_PASSWORD=node-secret", "APP_NATS_PASSWORD=app-secret"}
	if out, err := run(t, time.Minute, env, bin, "-t", "-c", conf); err != nil {
		t.Fatalf("nats-server -t: %v\n%s", err, out)
	}
	if out, err := run(t, time.Minute, env[:1], bin, "-t", "-c", conf); err == nil {
		t.Errorf("nats-server -t accepted the configuration without the passwords:\n%s", out)
	}
}

// pgTool finds a PostgreSQL client program (psql, pg_dump, pg_restore).
func pgTool(t *testing.T, name string) string {
	t.Helper()
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1]
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found (Debian package postgresql-client)", name)
	}
	t.Skipf("%s not found", name)
	return ""
}

func psql(t *testing.T) string { return pgTool(t, "psql") }

// migrated returns a new database on pg with the overrides schema, made
// by the real binary.
func migrated(t *testing.T, pg *testpg.Server, name string) string {
	t.Helper()
	url := pg.CreateDatabase(t, name)
	if out, err := run(t, 2*time.Minute, []string{"DATABASE_URL=" + url}, serverBin, "migrate"); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	return url
}

// TestOverridesBackupRestore runs the backup and restore commands of
// docs/operations.md against a real Postgres: every override and key owner
// comes back, and the CLI lists them.
func TestOverridesBackupRestore(t *testing.T) {
	dump, restore := pgTool(t, "pg_dump"), pgTool(t, "pg_restore")
	pg := testpg.Start(t)
	src, dst := migrated(t, pg, "backup_src"), migrated(t, pg, "backup_dst")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srcConn, dstConn := testpg.Connect(t, src), testpg.Connect(t, dst)
	if _, err := srcConn.Exec(ctx, `INSERT INTO tenant_limits (tenant, limits) VALUES
		('acme', '{"activity_create": {"limit": 200, "scale_ms": 1000}}'),
		('globex', '{"upload": {"limit": 20, "scale_ms": 1000}}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := srcConn.Exec(ctx, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', 'ch-1', 'acme')`); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "overrides.dump")
	if out, err := run(t, time.Minute, nil, dump, src, "--data-only", "--format=custom",
		"-t", "tenant_limits", "-t", "tenant_key_owners", "-t", "tenant_limits_audit", "-t", "tenant_key_owners_audit", "-f", file); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}
	if out, err := run(t, time.Minute, nil, restore, "--data-only", "-t", "tenant_limits", "-t", "tenant_key_owners", "-d", dst, file); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	read := func(url, sql string) []string {
		t.Helper()
		out, err := run(t, time.Minute, nil, psql(t), url, "--no-psqlrc", "-At", "-c", sql)
		if err != nil {
			t.Fatalf("%s: %v\n%s", sql, err, out)
		}
		return strings.Split(strings.TrimSpace(out), "\n")
	}
	for _, sql := range []string{
		`SELECT tenant || ' ' || limits::text FROM tenant_limits ORDER BY tenant`,
		`SELECT key_name || ' ' || key_value || ' ' || tenant FROM tenant_key_owners ORDER BY 1`,
	} {
		if a, b := read(src, sql), read(dst, sql); !reflect.DeepEqual(a, b) || len(a) == 0 || a[0] == "" {
			t.Errorf("%s: restored %q, backed up %q", sql, b, a)
		}
	}
	// Restored with the triggers on: audited as plain SQL.
	var audited int
	if err := dstConn.QueryRow(ctx, `SELECT count(*) FROM tenant_limits_audit WHERE actor LIKE 'sql:%'`).Scan(&audited); err != nil || audited != 2 {
		t.Errorf("restored overrides audited %d times (%v), want 2", audited, err)
	}
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(t, time.Minute, []string{"DATABASE_URL=" + dst, "RATELIMIT_AUTHZ_CONFIG=" + filepath.Join(root, "config", "ratelimit.yaml")}, serverBin, "limits", "list")
	if err != nil || !strings.Contains(out, "acme") || !strings.Contains(out, "globex") {
		t.Errorf("limits list after the restore: %v\n%s", err, out)
	}
}

// TestAuditRetentionSQL runs the CronJob's SQL with psql, exactly as the
// CronJob does, against a real Postgres migrated by the real binary:
// audit rows older than the retention go, younger ones and the overrides
// stay; a too-short or malformed retention, or one trying to inject SQL,
// fails and deletes nothing.
func TestAuditRetentionSQL(t *testing.T) {
	psqlBin := psql(t)
	pg := testpg.Start(t)
	url := migrated(t, pg, "retention")
	conn := testpg.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// Two tenants and two key owners, each change audited by the triggers;
	// then the "old" ones' audit rows are backdated past the retention.
	exec(`INSERT INTO tenant_limits (tenant, limits) VALUES
		('old', '{"activity_create": {"limit": 200, "scale_ms": 1000}}'),
		('new', '{"activity_create": {"limit": 300, "scale_ms": 1000}}')`)
	exec(`INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', 'old-channel', 'old'), ('channel', 'new-channel', 'new')`)
	exec(`UPDATE tenant_limits_audit SET at = now() - interval '500 days' WHERE tenant = 'old'`)
	exec(`UPDATE tenant_key_owners_audit SET at = now() - interval '500 days' WHERE key_value = 'old-channel'`)

	count := func(sql string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	state := func() [4]int {
		return [4]int{
			count(`SELECT count(*) FROM tenant_limits_audit`),
			count(`SELECT count(*) FROM tenant_key_owners_audit`),
			count(`SELECT count(*) FROM tenant_limits`),
			count(`SELECT count(*) FROM tenant_key_owners`),
		}
	}
	sqlFile, err := filepath.Abs("components/overrides/audit-retention.sql")
	if err != nil {
		t.Fatal(err)
	}
	retention := func(value string) (string, error) {
		return run(t, time.Minute, nil, psqlBin, url, "--no-psqlrc", "-v", "ON_ERROR_STOP=1", "-v", "retention="+value, "-f", sqlFile)
	}
	before := state()
	if before != [4]int{2, 2, 2, 2} {
		t.Fatalf("before: audit rows, owner audit rows, overrides, owners = %v, want 2 each", before)
	}
	for _, bad := range []string{"1 day", "29 days", "abc", "", "400 days'; DROP TABLE tenant_limits; --", "-400 days"} {
		if out, err := retention(bad); err == nil {
			t.Errorf("retention %q: psql succeeded:\n%s", bad, out)
		}
		if got := state(); got != before {
			t.Fatalf("retention %q changed the tables: %v, was %v", bad, got, before)
		}
	}
	out, err := retention("400 days")
	if err != nil {
		t.Fatalf("retention 400 days: %v\n%s", err, out)
	}
	if !strings.Contains(out, "deleted 1 tenant_limits_audit and 1 tenant_key_owners_audit rows") {
		t.Errorf("psql output does not report the deletions:\n%s", out)
	}
	if got := state(); got != [4]int{1, 1, 2, 2} {
		t.Errorf("after: %v, want the old audit rows gone and every override kept: [1 1 2 2]", got)
	}
	if n := count(`SELECT count(*) FROM tenant_limits_audit WHERE tenant = 'new'`); n != 1 {
		t.Errorf("the young audit row is gone")
	}
	// Running it again deletes nothing more.
	if out, err := retention("400 days"); err != nil || !strings.Contains(out, "deleted 0 tenant_limits_audit and 0") {
		t.Errorf("second run: %v\n%s", err, out)
	}
}
