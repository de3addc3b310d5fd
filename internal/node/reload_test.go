package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// reloadRules is a configuration with two tenant buckets on their own
// routes; spend and other are the limits, window the spend bucket's.
func reloadRules(t *testing.T, spend, other int, window string) *configfile.Rules {
	t.Helper()
	return parseRules(t, reloadText(spend, other, window))
}

// rulesFile writes text to a file named name and returns it as the rules
// file of a node.
func rulesFile(t *testing.T, name, text string) *configfile.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return &configfile.File{Path: path, Explicit: true}
}

func reloadText(spend, other int, window string) string {
	return fmt.Sprintf(`keys:
  tenant_header: x-tenant-id
buckets:
  spend: {limit: %d, per: %s, key: tenant}
  other: {limit: %d, per: 1h, key: tenant}
routes:
  - {method: POST, path: /spend, buckets: [spend]}
  - {method: POST, path: /other, buckets: [other]}
`, spend, window, other)
}

// checkPath reports whether a check of POST path for tenant is allowed.
func checkPath(t *testing.T, c authv3.AuthorizationClient, path, tenant string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, request("POST", path, map[string]string{"x-tenant-id": tenant}))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return resp.GetStatus().GetCode() == int32(codes.OK)
}

func spendN(t *testing.T, c authv3.AuthorizationClient, path, tenant string, n int) (allowed int) {
	t.Helper()
	for range n {
		if checkPath(t, c, path, tenant) {
			allowed++
		}
	}
	return allowed
}

// gathered is the value of series, name{label="value"} or name.
func gathered(t *testing.T, n *running, series string) float64 {
	t.Helper()
	name, labels := series, []string(nil)
	if i := strings.IndexByte(series, '{'); i >= 0 {
		name = series[:i]
		for _, kv := range strings.Split(strings.Trim(series[i:], "{}"), ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels = append(labels, k, strings.Trim(v, `"`))
		}
	}
	v, ok, err := scrape.Gathered(n.Gatherer(), name, labels...)
	if err != nil || !ok {
		t.Fatalf("%s: %v (present %v)", series, err, ok)
	}
	return v
}

// Counts of a bucket whose name, window and algorithm hold survive a
// reload that edits another bucket, and a new limit applies to them from
// the next check.
func TestReloadKeepsCountsOfUnchangedBuckets(t *testing.T) {
	n := start(t, local(reloadRules(t, 10, 5, "1h")))
	c, _ := dial(t, n.GRPCAddr())
	if got := spendN(t, c, "/spend", "acme", 7); got != 7 {
		t.Fatalf("%d of the first 7 allowed", got)
	}
	if err := n.Reload(context.Background(), reloadRules(t, 10, 6, "1h")); err != nil {
		t.Fatal(err)
	}
	if got := spendN(t, c, "/spend", "acme", 3); got != 3 {
		t.Fatalf("%d of the 8th to 10th allowed after an unrelated edit", got)
	}
	if checkPath(t, c, "/spend", "acme") {
		t.Fatal("the 11th allowed: the reload reset the count")
	}
	// other's limit changed (5 → 6): the new limit applies.
	if got := spendN(t, c, "/other", "acme", 8); got != 6 {
		t.Fatalf("other admitted %d of 8 under its new limit 6", got)
	}
	// A higher limit for spend applies to the count it has: 10 taken of 12.
	if err := n.Reload(context.Background(), reloadRules(t, 12, 6, "1h")); err != nil {
		t.Fatal(err)
	}
	if got := spendN(t, c, "/spend", "acme", 4); got != 2 {
		t.Fatalf("spend admitted %d of 4 after its limit rose from 10 to 12 with 10 counted, want 2", got)
	}
	if v := gathered(t, n, `ratelimit_authz_config_reloads_total{result="success"}`); v != 2 {
		t.Errorf("reloads_total{success} = %v, want 2", v)
	}
	if v := gathered(t, n, "ratelimit_authz_config_last_reload_successful"); v != 1 {
		t.Errorf("last_reload_successful = %v, want 1", v)
	}
}

// A bucket whose window changed starts from zero; a removed bucket's keys
// are dropped at once.
func TestReloadResetsChangedAndDropsRemovedBuckets(t *testing.T) {
	n := start(t, local(reloadRules(t, 3, 3, "1h")))
	c, _ := dial(t, n.GRPCAddr())
	for _, tenant := range []string{"a", "b", "c", "d"} {
		spendN(t, c, "/spend", tenant, 3)
		spendN(t, c, "/other", tenant, 1)
	}
	if checkPath(t, c, "/spend", "a") {
		t.Fatal("spend not at its limit")
	}
	if v := gathered(t, n, "ratelimit_authz_counter_live_keys"); v != 8 {
		t.Fatalf("live_keys %v, want 8", v)
	}
	// spend counts per minute now: a new bucket for the counter.
	if err := n.Reload(context.Background(), reloadRules(t, 3, 3, "1m")); err != nil {
		t.Fatal(err)
	}
	if v := gathered(t, n, "ratelimit_authz_counter_live_keys"); v != 4 {
		t.Fatalf("live_keys %v after spend's window changed, want 4 (other's)", v)
	}
	if got := spendN(t, c, "/spend", "a", 4); got != 3 {
		t.Fatalf("spend admitted %d of 4 in its new window, want 3", got)
	}
	// Remove other: its keys go.
	if err := n.Reload(context.Background(), parseRules(t, `keys:
  tenant_header: x-tenant-id
buckets:
  spend: {limit: 3, per: 1m, key: tenant}
routes:
  - {method: POST, path: /spend, buckets: [spend]}
`)); err != nil {
		t.Fatal(err)
	}
	if v := gathered(t, n, "ratelimit_authz_counter_live_keys"); v != 1 {
		t.Fatalf("live_keys %v after other was removed, want 1", v)
	}
	// Its series go with it; spend's stay.
	if _, ok, err := scrape.Gathered(n.Gatherer(), "ratelimit_authz_checks_total", "bucket", "other"); ok || err != nil {
		t.Errorf("checks_total{bucket=\"other\"} still exported after other was removed (err %v)", err)
	}
	if _, ok, err := scrape.Gathered(n.Gatherer(), "ratelimit_authz_checks_total", "bucket", "spend"); !ok || err != nil {
		t.Errorf("checks_total{bucket=\"spend\"} gone (err %v)", err)
	}
	if !checkPath(t, c, "/other", "a") {
		t.Fatal("a route the reload removed still limited")
	}
	if checkPath(t, c, "/spend", "a") {
		t.Fatal("spend's count lost by removing another bucket")
	}
	// other comes back: from zero.
	if err := n.Reload(context.Background(), reloadRules(t, 3, 1, "1m")); err != nil {
		t.Fatal(err)
	}
	if got := spendN(t, c, "/other", "a", 2); got != 1 {
		t.Fatalf("other admitted %d of 2 when it came back with limit 1", got)
	}
}

// A configuration that does not load or cannot be served is refused,
// counted, and the previous one keeps serving.
func TestReloadRefused(t *testing.T) {
	n := start(t, local(reloadRules(t, 2, 2, "1h")))
	c, _ := dial(t, n.GRPCAddr())
	spendN(t, c, "/spend", "acme", 1)
	n.cfg.RulesFile = rulesFile(t, "broken.yaml", "buckets:\n  spend: {limit: -1, per: 1s, key: tenant}\n")
	err := n.ReloadFiles(context.Background(), "test")
	if ps, ok := problem.As(err); !ok || !strings.Contains(ps[0].String(), "broken.yaml:2:") {
		t.Fatalf("a broken file: %v, want its located problems", err)
	}
	bigger := reloadRules(t, 2, 2, "1h")
	bigger.Counter.MaxKeys, bigger.Counter.Shards = 5, 2
	err = n.Reload(context.Background(), bigger)
	if err == nil || !strings.Contains(err.Error(), "counter.max_keys, counter.shards only change with a restart") {
		t.Fatalf("a changed key bound: %v", err)
	}
	if err := n.Reload(context.Background(), nil); err == nil {
		t.Fatal("nil rules accepted")
	}
	for series, want := range map[string]float64{
		`ratelimit_authz_config_reloads_total{result="failure"}`: 3,
		`ratelimit_authz_config_reloads_total{result="success"}`: 0,
		"ratelimit_authz_config_last_reload_successful":          0,
	} {
		if v := gathered(t, n, series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	if got := spendN(t, c, "/spend", "acme", 2); got != 1 {
		t.Fatalf("after refused reloads spend admitted %d of 2, want 1 (the old limit 2, 1 counted)", got)
	}
	before := gathered(t, n, "ratelimit_authz_config_last_reload_success_timestamp_seconds")
	if err := n.Reload(context.Background(), reloadRules(t, 3, 2, "1h")); err != nil {
		t.Fatal(err)
	}
	if v := gathered(t, n, "ratelimit_authz_config_last_reload_successful"); v != 1 {
		t.Errorf("last_reload_successful = %v after a good reload", v)
	}
	if v := gathered(t, n, "ratelimit_authz_config_last_reload_success_timestamp_seconds"); v < before {
		t.Errorf("last success %v went back from %v", v, before)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := n.Reload(ctx, reloadRules(t, 9, 9, "1h")); !errors.Is(err, context.Canceled) {
		t.Errorf("a reload with an ended context: %v", err)
	}
}

// Checks racing reloads: no check fails, and a bucket every generation
// keeps unchanged loses no update — its count is exactly the checks it
// admitted — while another bucket's window flips on every reload.
func TestReloadRacingChecks(t *testing.T) {
	const limit = 1_000_000
	n := start(t, local(reloadRules(t, 5, limit, "1h")))
	c, _ := dial(t, n.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/other"
			if w%2 == 1 {
				path = "/spend"
			}
			for ctx.Err() == nil {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := c.Check(cctx, request("POST", path, map[string]string{"x-tenant-id": "acme"}))
				ccancel()
				if err != nil {
					errs <- err
					return
				}
				if path == "/other" && resp.GetStatus().GetCode() == int32(codes.OK) {
					admitted.Add(1)
				}
			}
		}()
	}
	reloads := 0
	for ctx.Err() == nil {
		window := []string{"1m", "1h"}[reloads%2]
		if err := n.Reload(context.Background(), reloadRules(t, 5, limit, window)); err != nil {
			t.Fatal(err)
		}
		reloads++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a check failed while reloading: %v", err)
	}
	if reloads < 10 || admitted.Load() < 10 {
		t.Fatalf("only %d reloads and %d checks in a second", reloads, admitted.Load())
	}
	// other never changed: every admitted check is counted, none lost.
	resp, err := c.Check(context.Background(), request("POST", "/other", map[string]string{"x-tenant-id": "acme"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := ratelimitRemaining(t, resp); got != limit-admitted.Load()-1 {
		t.Fatalf("other: remaining %d after %d admitted checks and %d reloads, want %d", got, admitted.Load(), reloads, limit-admitted.Load()-1)
	}
	t.Logf("%d reloads and %d checks of the unchanged bucket in a second", reloads, admitted.Load())
}

// ratelimitRemaining reads r= of the RateLimit header of an allowed
// response.
func ratelimitRemaining(t *testing.T, resp *authv3.CheckResponse) int64 {
	t.Helper()
	for _, h := range resp.GetOkResponse().GetResponseHeadersToAdd() {
		if h.GetHeader().GetKey() == "ratelimit" {
			var name string
			var r, tt int64
			if _, err := fmt.Sscanf(strings.ReplaceAll(h.GetHeader().GetValue(), ";", " "), "%s r=%d t=%d", &name, &r, &tt); err != nil {
				t.Fatalf("RateLimit %q: %v", h.GetHeader().GetValue(), err)
			}
			return r
		}
	}
	t.Fatalf("no RateLimit header: %v", resp)
	return 0
}
