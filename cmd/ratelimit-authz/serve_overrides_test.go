package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// hang stops (SIGSTOP) the postmaster of pg and every process it started
// (its backends and auxiliary processes: each makes itself the leader of a
// process group of its own, so the postmaster's group alone is not
// enough). The server is then hung, not down: the kernel still accepts
// TCP connections, nothing answers them. The returned function (also run
// at cleanup) resumes them.
func hang(t *testing.T, pg *testpg.Server) (resume func()) {
	t.Helper()
	master := postmasterPID(t, pg.Port())
	pids := append([]int{master}, childPIDs(t, master)...)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	// A child forked between the listing and the postmaster's stop.
	for _, pid := range childPIDs(t, master) {
		if !slices.Contains(pids, pid) {
			syscall.Kill(pid, syscall.SIGSTOP)
			pids = append(pids, pid)
		}
	}
	t.Logf("postgres hung: SIGSTOP to the postmaster %d and its %d children", master, len(pids)-1)
	done := false
	resume = func() {
		if done {
			return
		}
		done = true
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// postmasterPID finds the postgres process started with -p port.
func postmasterPID(t *testing.T, port int) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(cmd, "\x00")), "\x00")
		if len(args) == 0 || filepath.Base(args[0]) != "postgres" {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-p" && args[i+1] == strconv.Itoa(port) {
				pid, _ := strconv.Atoi(filepath.Base(d))
				return pid
			}
		}
	}
	t.Fatalf("no postmaster with -p %d", port)
	return 0
}

// childPIDs lists the processes whose parent is ppid.
func childPIDs(t *testing.T, ppid int) []int {
	t.Helper()
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces: split after ')'.
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			pids = append(pids, pid)
		}
	}
	return pids
}

// admittedInOneWindow sends n checks for tenant's activity_create within
// one 1-second window and counts those allowed.
func admittedInOneWindow(t *testing.T, grpcAddr, tenant string, n int) int {
	t.Helper()
	gc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	client := authv3.NewAuthorizationClient(gc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client.Check(ctx, activity("warm-up")) // connect before the window starts
	for attempt := 0; ; attempt++ {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 5*time.Millisecond)))
		start := time.Now()
		ok := 0
		for range n {
			resp, err := client.Check(ctx, activity(tenant))
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if resp.GetStatus().GetCode() == int32(codes.OK) {
				ok++
			}
		}
		if start.Truncate(time.Second) == time.Now().Truncate(time.Second) || attempt == 4 {
			return ok
		}
		// The burst crossed a window edge (a slow machine): again.
	}
}

// TestOverridesSurviveAHungPostgres is the outage the snapshot file is for:
// Postgres hung by SIGSTOP (not down), a node restarted during the hang
// still admits a tenant its 300/s override, as before the hang, during it
// and after Postgres returns. The CLI and migrate give up within their
// timeouts against the hung server.
func TestOverridesSurviveAHungPostgres(t *testing.T) {
	const (
		tenant = "big"
		quota  = 300
		burst  = 400
	)
	pg, _ := migrated(t)
	db := pg.URL()
	if code, out, errOut := runLine(t, db, "limits", "set", tenant, "activity_create", strconv.Itoa(quota)+"/1s", "--actor", "alice"); code != 0 {
		t.Fatalf("limits set: %d %s%s", code, out, errOut)
	}
	vars := map[string]string{"DATABASE_URL": db, "RATELIMIT_AUTHZ_OVERRIDES_SNAPSHOT": filepath.Join(t.TempDir(), "overrides.snapshot")}
	grpcAddr, _, _, stop := startServe(t, vars)
	figures := map[string]int{}
	figures["before the hang"] = admittedInOneWindow(t, grpcAddr, tenant, burst)

	resume := hang(t, pg)
	figures["during the hang"] = admittedInOneWindow(t, grpcAddr, tenant, burst)

	// Every database command is bounded by its timeout.
	for _, line := range [][]string{{"limits", "list", "--timeout", "2s"}, {"limits", "set", tenant, "upload", "5/1s", "--actor", "a", "--timeout", "2s"}, {"migrate", "--timeout", "2s"}} {
		start := time.Now()
		code, _, errOut := runLine(t, db, line...)
		took := time.Since(start)
		t.Logf("%v against the hung Postgres: exit %d after %v", line, code, took.Round(time.Millisecond))
		if code != 1 || took > 8*time.Second {
			t.Errorf("%v: exit %d after %v: %s", line, code, took, errOut)
		}
	}

	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	start := time.Now()
	grpcAddr, httpAddr, logs, _ := startServe(t, vars)
	t.Logf("restart during the hang: serving after %v", time.Since(start).Round(time.Millisecond))
	figures["after a restart during the hang"] = admittedInOneWindow(t, grpcAddr, tenant, burst)
	_, m := scrape.Page(t, "http://"+httpAddr+"/metrics")
	if !contains(m, `ratelimit_authz_overrides_source{source="snapshot"} 1`, "ratelimit_authz_overrides_degraded 1") {
		t.Errorf("metrics do not say the snapshot file is served:\n%s", grep(m, "overrides_"))
	}
	if !contains(logs.String(), "serving the snapshot file until Postgres answers") {
		t.Errorf("log:\n%s", logs)
	}
	if _, body := scrape.Page(t, "http://"+httpAddr+"/readyz"); !contains(body, "ready", "overrides: snapshot file", "Postgres cannot be reached") {
		t.Errorf("/readyz does not say the snapshot file is served: %q", body)
	}

	// Without a snapshot file the same restart serves the configured
	// limits, and says so.
	bare, bareHTTP, bareLogs, stopBare := startServe(t, map[string]string{"DATABASE_URL": db})
	figures["after a restart during the hang, no snapshot file"] = admittedInOneWindow(t, bare, tenant, burst)
	if _, m := scrape.Page(t, "http://"+bareHTTP+"/metrics"); !contains(m, `ratelimit_authz_overrides_source{source="none"} 1`) {
		t.Errorf("metrics of a node without a snapshot file:\n%s", grep(m, "overrides_"))
	}
	if _, body := scrape.Page(t, "http://"+bareHTTP+"/readyz"); !contains(body, "overrides: none") {
		t.Errorf("/readyz of a node without a snapshot file: %q", body)
	}
	if !contains(bareLogs.String(), "no --overrides-snapshot", "no snapshot file is configured") {
		t.Errorf("log of a node without a snapshot file:\n%s", bareLogs)
	}
	stopBare()

	resume()
	poll.Until(t, 60*time.Second, 50*time.Millisecond, func() error {
		if _, m := scrape.Page(t, "http://"+httpAddr+"/metrics"); !contains(m, `ratelimit_authz_overrides_source{source="postgres"} 1`, "ratelimit_authz_overrides_degraded 0") {
			return fmt.Errorf("not back on Postgres:\n%s", grep(m, "overrides_source", "overrides_degraded"))
		}
		return nil
	})
	figures["after Postgres returns"] = admittedInOneWindow(t, grpcAddr, tenant, burst)

	for _, stage := range []string{"before the hang", "during the hang", "after a restart during the hang", "after Postgres returns"} {
		t.Logf("%s: %d of %d admitted (override %d/s)", stage, figures[stage], burst, quota)
		if figures[stage] != quota {
			t.Errorf("%s: %d admitted, want the override's %d", stage, figures[stage], quota)
		}
	}
	const configured = 100 // activity_create in config/ratelimit.yaml
	stage := "after a restart during the hang, no snapshot file"
	t.Logf("%s: %d of %d admitted (configured %d/s)", stage, figures[stage], burst, configured)
	if figures[stage] != configured {
		t.Errorf("%s: %d admitted, want the configured %d", stage, figures[stage], configured)
	}
}

// grep keeps the lines of s that hold any of subs.
func grep(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestServeDatabaseURLFromFile: serve takes the URL from a file; a file it
// cannot use stops it with a message that holds no URL.
func TestServeDatabaseURLFromFile(t *testing.T) {
	pg, _ := migrated(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "db-url")
	if err := os.WriteFile(file, []byte(pg.URL()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, logs, stop := startServe(t, map[string]string{"DATABASE_URL_FILE": file})
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), "tenant overrides loaded") {
			return fmt.Errorf("no load line:\n%s", logs)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "no --overrides-snapshot") {
		t.Errorf("no warning about the missing snapshot file:\n%s", logs)
	}
	stop()

	for _, vars := range []map[string]string{
		{"DATABASE_URL_FILE": filepath.Join(dir, "missing")},
		{"DATABASE_URL_FILE": file, "DATABASE_URL": "postgres://u:s3cret@h/db"},
	} {
		vars["RATELIMIT_AUTHZ_GRPC_ADDR"], vars["RATELIMIT_AUTHZ_HTTP_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
		var out bytes.Buffer
		err := run(context.Background(), []string{"serve", "--config", "../../config/ratelimit.yaml"}, env(vars), &out, &out)
		if err == nil || !strings.Contains(err.Error(), "database URL") || strings.Contains(err.Error()+out.String(), "s3cret") {
			t.Errorf("%v: %v\n%s", vars, err, out.String())
		}
	}
}
