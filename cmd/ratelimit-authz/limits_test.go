package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// runLine runs one command line against the database and returns its exit
// code and output.
func runLine(t *testing.T, dbURL string, line ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	vars := map[string]string{"RATELIMIT_AUTHZ_CONFIG": "../../config/ratelimit.yaml"}
	if dbURL != "" {
		vars["DATABASE_URL"] = dbURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, line, env(vars), &out, &errOut)
	stderr = errOut.String()
	var ee exitError
	if errors.As(err, &ee) && ee.msg != "" {
		stderr += ee.msg + "\n"
	}
	return exitCode(err), out.String(), stderr
}

// migrated starts Postgres and applies the schema with the CLI.
func migrated(t *testing.T) (*testpg.Server, *pgx.Conn) {
	t.Helper()
	pg := testpg.Start(t)
	if code, out, errOut := runLine(t, pg.URL(), "migrate"); code != 0 || !strings.Contains(out, "applied 0001_tenant_limits") {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	return pg, testpg.Connect(t, pg.URL())
}

func sqlExec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func sqlCount(t *testing.T, conn *pgx.Conn, sql string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func TestMigrateCommand(t *testing.T) {
	pg, _ := migrated(t) // once
	code, out, errOut := runLine(t, pg.URL(), "migrate")
	if code != 0 || out != "schema up to date (version 3)\n" {
		t.Errorf("second migrate: exit %d %q %q", code, out, errOut)
	}
	if code, out, _ := runLine(t, "", "migrate", "--help"); code != 0 || !contains(out, "-database-url", "DATABASE_URL", "-timeout") {
		t.Errorf("migrate --help: %d\n%s", code, out)
	}
	if code, _, errOut := runLine(t, "", "migrate"); code != 2 || !strings.Contains(errOut, "no database: set DATABASE_URL, DATABASE_URL_FILE (--database-url-file) or --database-url") {
		t.Errorf("migrate without a database: %d %q", code, errOut)
	}
	// Unreachable database: exit 1, within the timeout, no password shown.
	url := fmt.Sprintf("postgres://u:s3cret@127.0.0.1:%d/x?connect_timeout=2", freeport.TestPort(t))
	start := time.Now()
	code, _, errOut = runLine(t, url, "migrate", "--timeout", "3s")
	if code != 1 || !strings.Contains(errOut, "connect to the database") || strings.Contains(errOut, "s3cret") || time.Since(start) > 10*time.Second {
		t.Errorf("unreachable: exit %d after %v: %q", code, time.Since(start), errOut)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func TestLimitsCommands(t *testing.T) {
	pg, conn := migrated(t)
	db := pg.URL()
	ok := func(line ...string) string {
		t.Helper()
		code, out, errOut := runLine(t, db, line...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", line, code, out, errOut)
		}
		return out
	}

	out := ok("limits", "set", "acme", "activity_create", "200/1s", "--actor", "alice")
	if out != "acme activity_create: 200/1s (was the configured 100/1s)\n" {
		t.Errorf("set: %q", out)
	}
	// Flags may come first, too; the window may be spelt out.
	out = ok("limits", "set", "--actor=bob", "acme", "upload", "600/minute")
	if out != "acme upload: 600/1m (was the configured 10/1s)\n" {
		t.Errorf("set upload: %q", out)
	}
	out = ok("limits", "set", "acme", "activity_create", "300/1s", "--actor", "carol")
	if out != "acme activity_create: 300/1s (was 200/1s)\n" {
		t.Errorf("change: %q", out)
	}
	ok("limits", "set", "globex", "token_generate", "50/1m", "--actor", "alice")

	out = ok("limits", "get", "acme")
	if !contains(out, "BUCKET", "activity_create  300/1s    100/1s", "upload           600/1m    10/1s", "updated 20") {
		t.Errorf("get:\n%s", out)
	}
	if out := ok("limits", "get", "nobody"); out != "nobody: no overrides; the configured limits apply\n" {
		t.Errorf("get nobody: %q", out)
	}
	out = ok("limits", "list")
	if !contains(out, "acme    activity_create  300/1s", "acme    upload           600/1m", "globex  token_generate   50/1m", "3 override(s)") {
		t.Errorf("list:\n%s", out)
	}

	out = ok("limits", "delete", "acme", "upload", "--actor", "dave")
	if out != "acme upload: override 600/1m deleted; the configured 10/1s applies\n" {
		t.Errorf("delete bucket: %q", out)
	}
	if code, _, errOut := runLine(t, db, "limits", "delete", "acme", "upload", "--actor", "dave"); code != 1 || !strings.Contains(errOut, `tenant "acme" has no override for bucket "upload"`) {
		t.Errorf("delete again: exit %d %q", code, errOut)
	}
	ok("limits", "delete", "acme", "--actor", "dave")
	if out := ok("limits", "get", "acme"); !strings.Contains(out, "no overrides") {
		t.Errorf("after delete: %q", out)
	}

	out = ok("limits", "audit", "acme")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{
		"alice  postgres  activity_create  -       200/1s",
		"bob    postgres  upload           -       600/1m",
		"carol  postgres  activity_create  200/1s  300/1s",
		"dave   postgres  upload           600/1m  -",
		"dave   postgres  activity_create  300/1s  -",
	}
	if len(lines) != len(want)+1 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("audit:\n%s", out)
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i+1], w) {
			t.Errorf("audit line %d: %q, want …%q", i+1, lines[i+1], w)
		}
	}
	// A plain SQL edit shows up in the audit log as the database user.
	sqlExec(t, conn, `INSERT INTO tenant_limits VALUES ('acme', '{"inbound": {"limit": 900, "scale_ms": 1000}}')`)
	if out := ok("limits", "audit", "acme", "--limit", "1"); !contains(out, "sql:postgres", "inbound", "900/1s") || strings.Count(out, "\n") != 2 {
		t.Errorf("audit of a SQL edit:\n%s", out)
	}
}

// TestLimitsInvalidInput: every validation error exits 2 with a message
// and writes nothing.
func TestLimitsInvalidInput(t *testing.T) {
	pg, conn := migrated(t)
	db := pg.URL()
	allowed := "activity_create, inbound, token_generate, upload"
	for _, tc := range []struct {
		line []string
		want string
	}{
		{[]string{"limits", "set", "acme", "login_ip", "100/1m", "--actor", "a"}, `bucket "login_ip" does not accept tenant overrides; buckets that do: ` + allowed},
		{[]string{"limits", "set", "acme", "activty_create", "100/1s", "--actor", "a"}, `unknown bucket "activty_create"; buckets that accept tenant overrides: ` + allowed},
		{[]string{"limits", "set", "acme", "activity_create", "0/1s", "--actor", "a"}, "limit \"0\" must be a whole number from 1 to 2147483647"},
		{[]string{"limits", "set", "acme", "activity_create", "100/10s", "--actor", "a"}, `window "10s" must be one of 1s, 1m, 1h, 1d`},
		{[]string{"limits", "set", "acme", "activity_create", "lots", "--actor", "a"}, "is not LIMIT/WINDOW"},
		{[]string{"limits", "set", "acme", "activity_create", "100/1s"}, "an actor is required (--actor NAME)"},
		{[]string{"limits", "set", "", "activity_create", "100/1s", "--actor", "a"}, "the tenant is empty"},
		{[]string{"limits", "set", "acme", "activity_create", "--actor", "a"}, "missing arguments"},
		{[]string{"limits", "set", "acme", "activity_create", "1/1s", "extra", "--actor", "a"}, `unexpected argument "extra"`},
		{[]string{"limits", "set", "acme", "activity_create", "1/1s", "--actor"}, "flag needs an argument"},
		{[]string{"limits", "delete", "acme"}, "an actor is required"},
		{[]string{"limits", "audit", "acme", "--limit", "0"}, "--limit must be at least 1"},
		{[]string{"limits", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"limits"}, "Usage: ratelimit-authz limits COMMAND"},
	} {
		code, out, errOut := runLine(t, db, tc.line...)
		if code != 2 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s\nwant exit 2 and %q", tc.line, code, out, errOut, tc.want)
		}
	}
	if code, _, errOut := runLine(t, "", "limits", "list"); code != 2 || !strings.Contains(errOut, "no database") {
		t.Errorf("no database: exit %d %q", code, errOut)
	}
	if n := sqlCount(t, conn, "SELECT count(*) FROM tenant_limits") + sqlCount(t, conn, "SELECT count(*) FROM tenant_limits_audit"); n != 0 {
		t.Errorf("invalid input wrote %d rows", n)
	}
	// Help for each command, on stdout, exit 0.
	for _, sub := range []string{"set", "get", "list", "delete", "audit"} {
		code, out, _ := runLine(t, "", "limits", sub, "--help")
		if code != 0 || !contains(out, "Usage: ratelimit-authz limits "+sub, "-database-url", "DATABASE_URL", "-config", "-timeout") {
			t.Errorf("limits %s --help: exit %d\n%s", sub, code, out)
		}
	}
	if code, out, _ := runLine(t, "", "help", "limits"); code != 0 || !contains(out, "set TENANT BUCKET LIMIT/WINDOW --actor NAME", "audit TENANT") {
		t.Errorf("help limits: exit %d\n%s", code, out)
	}
	if code, out, _ := runLine(t, "", "limits", "set", "--help"); code != 0 || !contains(out, "-actor", "1s, 1m, 1h or 1d") {
		t.Errorf("limits set --help: exit %d\n%s", code, out)
	}
}

// policy returns the quota the node applied, from the RateLimit-Policy
// header of an allowed or denied answer ("activity_create";q=200;w=1).
func policy(resp *authv3.CheckResponse) string {
	hs := resp.GetOkResponse().GetResponseHeadersToAdd()
	if resp.GetDeniedResponse() != nil {
		hs = resp.GetDeniedResponse().GetHeaders()
	}
	for _, h := range hs {
		if h.GetHeader().GetKey() == "ratelimit-policy" {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// TestServeTenantOverrides is the "done when": a node with
// --database-url admits 200 activity_create per second for a tenant right
// after `limits set … 200/1s`, 100 again after `limits delete`, and the
// same after plain SQL edits, each within a second.
func TestServeTenantOverrides(t *testing.T) {
	pg, conn := migrated(t)
	db := pg.URL()
	grpcAddr, httpAddr, logs, _ := startServe(t, map[string]string{"DATABASE_URL": db})
	gc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	client := authv3.NewAuthorizationClient(gc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	check := func(tenant string) *authv3.CheckResponse {
		t.Helper()
		resp, err := client.Check(ctx, activity(tenant))
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		return resp
	}
	const tenant = "acme"

	// propagated waits until the node applies quota q to the tenant and
	// returns how long that took after the change returned.
	var times []time.Duration
	propagated := func(what string, changed time.Time, q int) {
		t.Helper()
		want := `"activity_create";q=` + strconv.Itoa(q) + ";w=1"
		poll.Until(t, time.Second, time.Millisecond, func() error {
			if got := policy(check(tenant)); got != want {
				return fmt.Errorf("%s: policy %q, want %q", what, got, want)
			}
			return nil
		})
		d := time.Since(changed)
		times = append(times, d)
		t.Logf("%s: the node applied q=%d %v after the change committed", what, q, d)
	}
	// admitted sends limit+1 checks within one wall-clock second (starting
	// just after a boundary; a burst that straddles one is retried) and
	// wants exactly limit admitted, the last one denied with 429.
	admitted := func(what string, limit int) {
		t.Helper()
		for attempt := 0; attempt < 5; attempt++ {
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
			start := time.Now()
			allowed := 0
			var last *authv3.CheckResponse
			for range limit + 1 {
				last = check(tenant)
				if last.GetStatus().GetCode() == int32(codes.OK) {
					allowed++
				}
			}
			if time.Now().Truncate(time.Second) != start.Truncate(time.Second) {
				continue // crossed a window edge
			}
			if allowed != limit || last.GetDeniedResponse() == nil {
				t.Fatalf("%s: %d of %d admitted in one second, want %d", what, allowed, limit+1, limit)
			}
			return
		}
		t.Fatalf("%s: could not fit %d checks in one second in 5 attempts", what, limit+1)
	}

	admitted("configured", 100)

	if code, out, errOut := runLine(t, db, "limits", "set", tenant, "activity_create", "200/1s", "--actor", "alice"); code != 0 {
		t.Fatalf("limits set: %d %s%s", code, out, errOut)
	}
	propagated("limits set", time.Now(), 200)
	admitted("after limits set", 200)

	if code, out, errOut := runLine(t, db, "limits", "delete", tenant, "--actor", "alice"); code != 0 {
		t.Fatalf("limits delete: %d %s%s", code, out, errOut)
	}
	propagated("limits delete", time.Now(), 100)
	admitted("after limits delete", 100)

	sqlExec(t, conn, `INSERT INTO tenant_limits (tenant, limits) VALUES ($1, '{"activity_create": {"limit": 200, "scale_ms": 1000}}')`, tenant)
	propagated("SQL INSERT", time.Now(), 200)
	admitted("after SQL INSERT", 200)

	sqlExec(t, conn, `UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 150, "scale_ms": 1000}}' WHERE tenant = $1`, tenant)
	propagated("SQL UPDATE", time.Now(), 150)
	admitted("after SQL UPDATE", 150)

	sqlExec(t, conn, `DELETE FROM tenant_limits WHERE tenant = $1`, tenant)
	propagated("SQL DELETE", time.Now(), 100)
	admitted("after SQL DELETE", 100)

	worst := time.Duration(0)
	for _, d := range times {
		worst = max(worst, d)
	}
	t.Logf("propagation to the node's decisions: %v (worst %v)", times, worst)

	_, metrics := scrape.Page(t, "http://"+httpAddr+"/metrics")
	for _, want := range []string{
		"ratelimit_authz_overrides_degraded 0",
		"ratelimit_authz_overrides_loaded 0",
		"ratelimit_authz_overrides_invalid_rows 0",
		`ratelimit_authz_overrides_reloads_total{kind="full"} 1`,
		`ratelimit_authz_overrides_reloads_total{kind="incremental"} `,
		"ratelimit_authz_overrides_reload_errors_total 0",
		"ratelimit_authz_overrides_snapshot_age_seconds ",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(metrics, tenant) {
		t.Error("a tenant leaked into a metric label")
	}
	if !strings.Contains(logs.String(), "tenant overrides loaded") {
		t.Errorf("no load line:\n%s", logs)
	}
}

// TestServeWithPostgresDown: a node whose database is unreachable starts
// anyway, on the configured limits, and says it is degraded.
func TestServeWithPostgresDown(t *testing.T) {
	url := fmt.Sprintf("postgres://u:s3cret@127.0.0.1:%d/x?connect_timeout=1", freeport.TestPort(t))
	grpcAddr, httpAddr, logs, stop := startServe(t, map[string]string{"DATABASE_URL": url})
	gc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := authv3.NewAuthorizationClient(gc).Check(ctx, activity("acme"))
	if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) || policy(resp) != `"activity_create";q=100;w=1` {
		t.Fatalf("check while degraded: %v %v", resp, err)
	}
	_, metrics := scrape.Page(t, "http://"+httpAddr+"/metrics")
	if !strings.Contains(metrics, "ratelimit_authz_overrides_degraded 1") {
		t.Error("not degraded in metrics")
	}
	if !contains(logs.String(), "tenant overrides degraded", "component=overrides") || strings.Contains(logs.String(), "s3cret") {
		t.Errorf("log:\n%s", logs)
	}
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}

func TestServeRefusesBadDatabaseURL(t *testing.T) {
	err := run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--database-url", "postgres://u:s3cret@host:notaport/db"}, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "database URL cannot be parsed") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL: %v", err)
	}
}

// TestServeSurvivesPostgresRestart: Postgres stops under a running node;
// checks go on with the last snapshot, metrics and log say degraded, and
// after the restart the node follows the table again.
func TestServeSurvivesPostgresRestart(t *testing.T) {
	pg, _ := migrated(t)
	db := pg.URL()
	if code, out, errOut := runLine(t, db, "limits", "set", "acme", "activity_create", "200/1s", "--actor", "alice"); code != 0 {
		t.Fatalf("limits set: %d %s%s", code, out, errOut)
	}
	grpcAddr, httpAddr, logs, _ := startServe(t, map[string]string{"DATABASE_URL": db})
	gc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	client := authv3.NewAuthorizationClient(gc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quota := func() string {
		t.Helper()
		resp, err := client.Check(ctx, activity("acme"))
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		return policy(resp)
	}
	metricLine := func(want string) func() error {
		return func() error {
			if _, m := scrape.Page(t, "http://"+httpAddr+"/metrics"); !strings.Contains(m, want) {
				return fmt.Errorf("metrics lack %q", want)
			}
			return nil
		}
	}
	if q := quota(); q != `"activity_create";q=200;w=1` {
		t.Fatalf("at start: %q", q)
	}

	pg.Stop(t)
	poll.Until(t, 10*time.Second, 20*time.Millisecond, metricLine("ratelimit_authz_overrides_degraded 1"))
	if q := quota(); q != `"activity_create";q=200;w=1` {
		t.Errorf("during the outage: %q, want the last snapshot's 200", q)
	}
	if !strings.Contains(logs.String(), "tenant overrides degraded") {
		t.Errorf("outage not logged:\n%s", logs)
	}

	pg.Start(t)
	poll.Until(t, 20*time.Second, 20*time.Millisecond, metricLine("ratelimit_authz_overrides_degraded 0"))
	conn := testpg.Connect(t, db)
	sqlExec(t, conn, `UPDATE tenant_limits SET limits = '{"activity_create": {"limit": 150, "scale_ms": 1000}}' WHERE tenant = 'acme'`)
	changed := time.Now()
	poll.Until(t, time.Second, time.Millisecond, func() error {
		if q := quota(); q != `"activity_create";q=150;w=1` {
			return fmt.Errorf("after the restart: %q", q)
		}
		return nil
	})
	t.Logf("after the restart, a SQL edit reached the node's decisions in %v", time.Since(changed))
}

// cliWith runs one command line with exactly these environment variables
// (plus the test configuration).
func cliWith(t *testing.T, vars map[string]string, line ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	all := map[string]string{"RATELIMIT_AUTHZ_CONFIG": "../../config/ratelimit.yaml"}
	for k, v := range vars {
		all[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, line, env(all), &out, &errOut)
	stderr = errOut.String()
	var ee exitError
	if errors.As(err, &ee) && ee.msg != "" {
		stderr += ee.msg + "\n"
	}
	return exitCode(err), out.String(), stderr
}

func TestOwnerCommands(t *testing.T) {
	pg, conn := migrated(t)
	db := pg.URL()
	ok := func(line ...string) string {
		t.Helper()
		code, out, errOut := runLine(t, db, line...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", line, code, out, errOut)
		}
		return out
	}
	if out := ok("limits", "owner", "set", "channel", "ch-123", "bigco", "--actor", "alice"); out != "channel ch-123: owned by bigco (was no owner)\n" {
		t.Errorf("owner set: %q", out)
	}
	if out := ok("limits", "owner", "set", "channel", "ch-123", "globex", "--actor", "bob"); out != "channel ch-123: owned by globex (was bigco)\n" {
		t.Errorf("owner change: %q", out)
	}
	ok("limits", "owner", "set", "channel", "ch-9", "bigco", "--actor", "alice")
	if out := ok("limits", "set", "bigco", "inbound", "5000/1s", "--actor", "alice"); !strings.Contains(out, "inbound is keyed by channel: this applies to the keys bigco owns ('limits owner set channel KEY bigco')") {
		t.Errorf("set on a channel-keyed bucket: %q", out)
	}
	out := ok("limits", "owner", "list")
	if !contains(out, "KEY_NAME", "channel   ch-123  globex", "channel   ch-9    bigco", "2 owner(s)") {
		t.Errorf("owner list:\n%s", out)
	}
	if out := ok("limits", "owner", "list", "--tenant", "bigco"); !contains(out, "ch-9", "1 owner(s)") || strings.Contains(out, "ch-123") {
		t.Errorf("owner list --tenant:\n%s", out)
	}
	if out := ok("limits", "owner", "delete", "channel", "ch-123", "--actor", "carol"); out != "channel ch-123: owner globex removed; the configured limits apply\n" {
		t.Errorf("owner delete: %q", out)
	}
	if code, _, errOut := runLine(t, db, "limits", "owner", "delete", "channel", "ch-123", "--actor", "carol"); code != 1 || !strings.Contains(errOut, "has no owner; nothing deleted") {
		t.Errorf("owner delete again: %d %q", code, errOut)
	}
	out = ok("limits", "owner", "audit", "channel", "ch-123")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"alice  postgres  -          bigco", "bob    postgres  bigco      globex", "carol  postgres  globex     -"}
	if len(lines) != 4 || !strings.Contains(lines[0], "DB USER") {
		t.Fatalf("owner audit:\n%s", out)
	}
	for i, w := range want {
		if !strings.HasSuffix(lines[i+1], w) {
			t.Errorf("owner audit line %d %q, want …%q", i+1, lines[i+1], w)
		}
	}
	// Invalid input: exit 2, nothing written.
	before := sqlCount(t, conn, "SELECT count(*) FROM tenant_key_owners_audit")
	for _, tc := range []struct {
		line []string
		want string
	}{
		{[]string{"set", "tenant", "x", "bigco", "--actor", "a"}, `no overridable bucket is keyed by "tenant"; key names that take owners: channel`},
		{[]string{"set", "ip", "x", "bigco", "--actor", "a"}, `no overridable bucket is keyed by "ip"`},
		{[]string{"set", "channel", "a\x1b[2Jb", "bigco", "--actor", "a"}, "control characters"},
		{[]string{"set", "channel", "c", "bigco"}, "an actor is required"},
		{[]string{"set", "channel", "c"}, "missing arguments"},
		{[]string{"frob"}, `unknown command "frob"`},
	} {
		code, _, errOut := runLine(t, db, append([]string{"limits", "owner"}, tc.line...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("owner %v: exit %d %q, want 2 and %q", tc.line, code, errOut, tc.want)
		}
	}
	if n := sqlCount(t, conn, "SELECT count(*) FROM tenant_key_owners_audit"); n != before {
		t.Errorf("invalid input wrote %d audit rows", n-before)
	}
	if code, out, _ := runLine(t, "", "limits", "owner", "--help"); code != 0 || !contains(out, "set KEY_NAME KEY TENANT", "raw path segment") {
		t.Errorf("owner --help: %d\n%s", code, out)
	}
}

// TestAuditEscapesControlCharacters: values written with plain SQL cannot
// forge lines or send escape sequences to the operator's terminal.
func TestAuditEscapesControlCharacters(t *testing.T) {
	pg, conn := migrated(t)
	forged := "mallory\n2026-01-01T00:00:00Z  alice  postgres  activity_create  -  9999/1s\x1b[2K\u202e"
	sqlExec(t, conn, "BEGIN")
	sqlExec(t, conn, "SELECT set_config('ratelimit_authz.actor', $1, true)", forged)
	sqlExec(t, conn, `INSERT INTO tenant_limits VALUES ('acme', '{"upload": {"limit": 20, "scale_ms": 1000}}')`)
	sqlExec(t, conn, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', 'ch-1', 'acme')`)
	sqlExec(t, conn, "COMMIT")
	for _, line := range [][]string{{"limits", "audit", "acme"}, {"limits", "owner", "audit", "channel", "ch-1"}} {
		code, out, errOut := runLine(t, pg.URL(), line...)
		if code != 0 {
			t.Fatalf("%v: %d %s", line, code, errOut)
		}
		if strings.Count(out, "\n") != 2 || strings.ContainsAny(out, "\x1b\u202e") {
			t.Errorf("%v: a stored actor reached the terminal raw:\n%q", line, out)
		}
		if !strings.Contains(out, `mallory\n2026-01-01T00:00:00Z  alice`) || !strings.Contains(out, `\x1b[2K\u202e`) {
			t.Errorf("%v: the actor is not shown escaped:\n%q", line, out)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"plain name", "plain name"},
		{"tab\there", `tab\there`},
		{`back\slash` + "\x07", `back\\slash\a`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"é 中文", "é 中文"},
	} {
		if got := printable(tc.in); got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestDatabaseURLFromFileOrEnvironment: every database command takes the
// URL from DATABASE_URL or a file; a password never reaches an error.
func TestDatabaseURLFromFileOrEnvironment(t *testing.T) {
	pg, _ := migrated(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "db-url")
	if err := os.WriteFile(file, []byte(pg.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, vars := range []map[string]string{{"DATABASE_URL_FILE": file}, {"DATABASE_URL": pg.URL()}} {
		if code, out, errOut := cliWith(t, vars, "limits", "list"); code != 0 || !strings.Contains(out, "0 override(s)") {
			t.Errorf("%v: exit %d %s%s", vars, code, out, errOut)
		}
	}
	if code, out, errOut := cliWith(t, nil, "migrate", "--database-url-file", file); code != 0 || !strings.Contains(out, "schema up to date") {
		t.Errorf("migrate --database-url-file: exit %d %s%s", code, out, errOut)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte(" \n"), 0o600)
	huge := filepath.Join(dir, "huge")
	os.WriteFile(huge, bytes.Repeat([]byte("x"), 70_000), 0o600)
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte("postgres://u:s3cret@127.0.0.1:notaport/db"), 0o600)
	for _, tc := range []struct {
		vars map[string]string
		code int
		want string
	}{
		{map[string]string{"DATABASE_URL_FILE": filepath.Join(dir, "missing")}, 2, "database URL file: open"},
		{map[string]string{"DATABASE_URL_FILE": empty}, 2, "is empty"},
		{map[string]string{"DATABASE_URL_FILE": huge}, 2, "more than 65536 bytes"},
		{map[string]string{"DATABASE_URL_FILE": file, "DATABASE_URL": pg.URL()}, 2, "give one"},
		// Unparseable, with a password: the message never repeats it.
		{map[string]string{"DATABASE_URL_FILE": secretFile}, 1, "the database URL cannot be parsed"},
		{map[string]string{"DATABASE_URL": "postgres://u:s3cret@127.0.0.1:notaport/db"}, 1, "the database URL cannot be parsed"},
		{map[string]string{"DATABASE_URL": "host=127.0.0.1 password=s3cret port=bad"}, 1, "the database URL cannot be parsed"},
		// pgx's own redaction shows what follows a raw @ in a password.
		{map[string]string{"DATABASE_URL": "postgres://u:x@s3cret@h:1:2/db"}, 1, "the database URL cannot be parsed"},
		// Wrong password against a real server (trust auth accepts it, so
		// a missing database instead): connection errors hold no password.
		{map[string]string{"DATABASE_URL": strings.Replace(pg.DatabaseURL("nosuchdb"), "postgres@", "postgres:s3cret@", 1)}, 1, "connect to the database"},
	} {
		code, out, errOut := cliWith(t, tc.vars, "limits", "list")
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Contains(out+errOut, "s3cret") {
			t.Errorf("%v: exit %d %q, want %d and %q without the password", tc.vars, code, errOut, tc.code, tc.want)
		}
	}
}
