package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// rlsDir writes one envoyproxy/ratelimit configuration file into a fresh
// directory and returns the directory.
func rlsDir(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The limits commands accept the overridable rules of an RLS configuration
// under their names, as the server files their overrides, with
// --rls-config-dir; without it they refuse those names, and a name both
// formats use, or a broken file, stops the command before the database.
func TestLimitsRLSRules(t *testing.T) {
	pg, conn := migrated(t)
	db := pg.URL()
	dir := rlsDir(t, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, overridable: true, name: api_tenant}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
`)
	code, out, errOut := runLine(t, db, "limits", "set", "acme", "api_tenant", "50/1m", "--actor", "alice")
	if code != 2 || !strings.Contains(errOut, `unknown bucket "api_tenant"`) {
		t.Fatalf("without --rls-config-dir: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runLine(t, db, "limits", "set", "acme", "api_tenant", "50/1m", "--actor", "alice", "--rls-config-dir", dir)
	if code != 0 || out != "acme api_tenant: 50/1m (was the configured 10/1m)\n" {
		t.Fatalf("with --rls-config-dir: exit %d\n%s%s", code, out, errOut)
	}
	if n := sqlCount(t, conn, `SELECT count(*) FROM tenant_limits WHERE tenant = 'acme' AND limits->'api_tenant'->>'limit' = '50'`); n != 1 {
		t.Fatalf("%d rows hold acme's api_tenant override, want 1", n)
	}
	code, out, errOut = runLine(t, db, "limits", "get", "acme", "--rls-config-dir", dir)
	if code != 0 || !strings.Contains(out, "api_tenant") || strings.Contains(out, "ignored") {
		t.Errorf("get with --rls-config-dir: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runLine(t, db, "limits", "get", "acme")
	if code != 0 || !strings.Contains(out, "ignored: not overridable in this configuration") {
		t.Errorf("get without --rls-config-dir should mark the override as ignored: exit %d\n%s%s", code, out, errOut)
	}

	clash := rlsDir(t, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10, overridable: true, name: upload}
`)
	code, out, errOut = runLine(t, db, "limits", "set", "acme", "upload", "5/1m", "--actor", "alice", "--rls-config-dir", clash)
	if code != 1 || !strings.Contains(errOut, `the RLS rule name "upload" is also a bucket of`) {
		t.Errorf("a name in both formats: exit %d\n%s%s", code, out, errOut)
	}
	broken := rlsDir(t, `domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: fortnight, requests_per_unit: 10}
`)
	code, out, errOut = runLine(t, db, "limits", "set", "acme", "api_tenant", "5/1m", "--actor", "alice", "--rls-config-dir", broken)
	if code != 1 || !strings.Contains(errOut, "config.yaml:4:") || !strings.Contains(errOut, "invalid rate limit unit 'fortnight'") {
		t.Errorf("a broken RLS file: exit %d\n%s%s", code, out, errOut)
	}
	if n := sqlCount(t, conn, `SELECT count(*) FROM tenant_limits WHERE tenant = 'acme' AND limits->'upload' IS NOT NULL`); n != 0 {
		t.Errorf("a refused command wrote %d rows", n)
	}
}
