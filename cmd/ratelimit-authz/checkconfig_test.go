package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// check-config --rls-config-dir validates envoyproxy/ratelimit files:
// a one-line summary on success; every problem with file:line:column and
// exit 1 otherwise.
func TestCheckConfigRLS(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: j\n    rate_limit: {unit: minute, requests_per_unit: 5, overridable: true, name: upload}\n")
	writeFile(t, filepath.Join(dir, "sub", "b.yaml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n")
	writeFile(t, filepath.Join(dir, "..2026_12_02", "a.yaml"), "domain: a\n") // a ConfigMap's copy: skipped
	var out, errOut bytes.Buffer
	if err := run(ctx, []string{"check-config", "--rls-config-dir", dir}, env(nil), &out, &errOut); err != nil {
		t.Fatalf("valid directory: %v\n%s", err, errOut.String())
	}
	if want := dir + ": OK (2 domains, 3 rules)\n"; out.String() != want {
		t.Errorf("stdout %q, want %q", out.String(), want)
	}

	// An overridable rule named like an ext_authz bucket, with --config.
	out.Reset()
	errOut.Reset()
	err := run(ctx, []string{"check-config", "--rls-config-dir", dir, "--config", "../../config/ratelimit.yaml"}, env(nil), &out, &errOut)
	if exitCode(err) != 1 || !strings.Contains(errOut.String(), filepath.Join(dir, "a.yaml")+":5:5: overridable rule upload is also a bucket of ../../config/ratelimit.yaml") {
		t.Errorf("name clash: exit %d, stderr %q", exitCode(err), errOut.String())
	}

	// Problems of several files, each located; the directory from the environment.
	writeFile(t, filepath.Join(dir, "c.yaml"), "domain: a\ndescriptors:\n  - key: \"\"\n  - key: x\n    ratelimit: {}\n")
	writeFile(t, filepath.Join(dir, ".hidden"), "not yaml: [")
	out.Reset()
	errOut.Reset()
	err = run(ctx, []string{"check-config"}, env(map[string]string{"RATELIMIT_AUTHZ_RLS_CONFIG_DIR": dir}), &out, &errOut)
	if exitCode(err) != 1 {
		t.Fatalf("bad directory: exit %d (%v)", exitCode(err), err)
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	loc := regexp.MustCompile(`^` + regexp.QuoteMeta(dir) + `/[^:]+(:\d+:\d+)?: `)
	for _, l := range lines {
		if !loc.MatchString(l) {
			t.Errorf("problem without its file: %q", l)
		}
	}
	for _, want := range []string{
		"/.hidden: error loading config file: yaml: line 1: did not find expected node content",
		"/c.yaml:1:1: duplicate domain 'a' in config file",
	} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if out.Len() != 0 {
		t.Errorf("stdout %q on failure", out.String())
	}

	// --rls-ignore-dotfiles and --rls-merge-domains (MERGE_DOMAIN_CONFIG).
	out.Reset()
	errOut.Reset()
	writeFile(t, filepath.Join(dir, "c.yaml"), "domain: a\ndescriptors:\n  - key: x\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	err = run(ctx, []string{"check-config", "--rls-config-dir", dir, "--rls-ignore-dotfiles"}, env(map[string]string{"MERGE_DOMAIN_CONFIG": "true"}), &out, &errOut)
	if err != nil || out.String() != dir+": OK (2 domains, 4 rules)\n" {
		t.Errorf("merged: %v %q %q", err, out.String(), errOut.String())
	}
	err = run(ctx, []string{"check-config", "--rls-config-dir", dir}, env(map[string]string{"MERGE_DOMAIN_CONFIG": "maybe"}), &out, &errOut)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), `MERGE_DOMAIN_CONFIG="maybe": not a boolean`) {
		t.Errorf("bad env: %v", err)
	}

	// A directory that is not one.
	err = run(ctx, []string{"check-config", "--rls-config-dir", filepath.Join(dir, "a.yaml")}, env(nil), &out, &errOut)
	if exitCode(err) != 1 {
		t.Errorf("a file as the directory: %v", err)
	}
}

// check-config --envoy with --check-addr (or its variable, as serve
// reads it, or serve's default when neither is given): the shipped
// bootstrap, Check on the lean listener and the access log on the gRPC
// port, passes; the same bootstrap with the access log sent to the lean
// listener's cluster is a problem, exit 1, naming the call and the
// cluster. With --check-addr off (servers without the lean listener) it
// passes.
func TestCheckConfigLeanListener(t *testing.T) {
	ctx := context.Background()
	const config = "../../config/ratelimit.yaml"
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const logTo = "grpc_service: { envoy_grpc: { cluster_name: ratelimit_authz } }"
	if strings.Count(string(shipped), logTo) != 1 {
		t.Fatalf("the shipped bootstrap lacks the access log's %q", logTo)
	}
	bad := filepath.Join(t.TempDir(), "log-to-check.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(shipped), logTo, "grpc_service: { envoy_grpc: { cluster_name: ratelimit_authz_check } }", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	check := func(vars map[string]string, args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"check-config", "--config", config}, args...), env(vars), &out, &errOut)
		return errOut.String(), err
	}

	if stderr, err := check(nil, "--envoy", "../../envoy/ratelimit-authz.yaml", "--check-addr", "127.0.0.1:9002"); err != nil {
		t.Errorf("shipped bootstrap with --check-addr: %v\n%s", err, stderr)
	}
	want := bad + ": envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig sends to cluster ratelimit_authz_check on port 9002, the lean Check listener"
	for name, tc := range map[string]struct {
		vars map[string]string
		args []string
	}{
		"flag":     {nil, []string{"--envoy", bad, "--check-addr", "0.0.0.0:9002"}},
		"default":  {nil, []string{"--envoy", bad}}, // serve's own default, 127.0.0.1:9002
		"variable": {map[string]string{"RATELIMIT_AUTHZ_CHECK_ADDR": "0.0.0.0:9002"}, []string{"--envoy", bad}},
	} {
		stderr, err := check(tc.vars, tc.args...)
		if exitCode(err) != 1 || !strings.Contains(stderr, want) {
			t.Errorf("%s: access log on the lean listener: %v, stderr %q; want exit 1 and %q", name, err, stderr, want)
		}
	}
	// Another port, or none (off): nothing says the access log's cluster
	// is the lean listener.
	// A service name is a port, as serve listens on it; without --envoy
	// the address is not looked at (the image sets the variable for serve).
	for _, args := range [][]string{{"--envoy", bad, "--check-addr", "off"}, {"--envoy", bad, "--check-addr", "127.0.0.1:9003"},
		{"--envoy", bad, "--check-addr", "127.0.0.1:http"}, {"--check-addr", "host:x"}} {
		if stderr, err := check(nil, args...); err != nil {
			t.Errorf("%v: %v\n%s", args, err, stderr)
		}
	}
	for _, addr := range []string{"9002", "host:0", "host:65536", "host:x"} {
		if _, err := check(nil, "--envoy", bad, "--check-addr", addr); exitCode(err) != 2 {
			t.Errorf("--check-addr %q: %v, want a usage error (exit 2)", addr, err)
		}
	}
}

// check-config --envoy --check-addr knows the lean listener serves
// ShouldRateLimit on a node serving RLS: the shipped RLS bootstrap, whose
// rate limit filter calls the lean listener, passes with the node's
// --rls-config-dir and is a problem without it (a node without RLS
// answers UNIMPLEMENTED there); the access log stays a problem either way.
func TestCheckConfigLeanListenerRLS(t *testing.T) {
	ctx := context.Background()
	const rlsBootstrap, rlsDir = "../../envoy/ratelimit-rls.yaml", "../../config/rls/config"
	check := func(args ...string) (string, error) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"check-config", "--envoy"}, args...), env(nil), &out, &errOut)
		return errOut.String(), err
	}
	if stderr, err := check(rlsBootstrap, "--check-addr", "127.0.0.1:9002", "--rls-config-dir", rlsDir); err != nil {
		t.Errorf("the RLS bootstrap on a node serving RLS: %v\n%s", err, stderr)
	}
	want := rlsBootstrap + ": envoy.extensions.filters.http.ratelimit.v3.RateLimit sends to cluster ratelimit on port 9002, the lean Check listener (--check-addr), which serves ShouldRateLimit only on a node serving RLS"
	if stderr, err := check(rlsBootstrap, "--check-addr", "127.0.0.1:9002"); exitCode(err) != 1 || !strings.Contains(stderr, want) {
		t.Errorf("the RLS bootstrap on a node without RLS: %v, stderr %q; want exit 1 and %q", err, stderr, want)
	}
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "log-to-check.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(string(shipped), "grpc_service: { envoy_grpc: { cluster_name: ratelimit_authz } }", "grpc_service: { envoy_grpc: { cluster_name: ratelimit_authz_check } }", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if stderr, err := check(bad, "--check-addr", "127.0.0.1:9002", "--rls-config-dir", rlsDir); exitCode(err) != 1 || !strings.Contains(stderr, "HttpGrpcAccessLogConfig sends to cluster ratelimit_authz_check") {
		t.Errorf("the access log on the lean listener of a node serving RLS: %v, stderr %q", err, stderr)
	}
}

// check-config --envoy reports a limited route of the configuration that
// the bootstrap sends where the check never runs: to an upstream with
// ext_authz off (those requests pass unlimited), or to a route Envoy
// answers itself (they never get through). The shipped pair passes.
func TestCheckConfigUncheckedRoutes(t *testing.T) {
	dir := t.TempDir()
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The inbound route with the check turned off.
	off := strings.Replace(string(shipped), `                      # context_extensions: { ratelimit_buckets: "inbound" }
`, `                      # context_extensions: { ratelimit_buckets: "inbound" }
                    disabled: true
`, 1)
	if off == string(shipped) {
		t.Fatal("the shipped bootstrap's inbound route changed: update this test")
	}
	bypass := filepath.Join(dir, "bypass.yaml")
	if err := os.WriteFile(bypass, []byte(off), 0o644); err != nil {
		t.Fatal(err)
	}
	run1 := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"check-config"}, args...), env(nil), &out, &errOut)
		return errOut.String(), err
	}
	if got, err := run1("--envoy", "../../envoy/ratelimit-authz.yaml"); err != nil || strings.Contains(got, "is limited, but") {
		t.Fatalf("the shipped pair: %v\n%s", err, got)
	}
	got, err := run1("--envoy", bypass)
	if exitCode(err) != 1 || !strings.Contains(got, `route /api/inbound/{channel}, line`) ||
		!strings.Contains(got, `sends /api/inbound/x to route inbound of virtual host app with ext_authz off: those requests reach the upstream unlimited`) {
		t.Errorf("a limited route with the check off: exit %d\n%s", exitCode(err), got)
	}
	if strings.Contains(got, "inbound_status") {
		t.Errorf("a route with the check on reported:\n%s", got)
	}
	got, err = run1("--config", "../../config/examples/llm-budget.yaml", "--envoy", "../../envoy/ratelimit-authz.yaml")
	if exitCode(err) != 1 || strings.Count(got, "which Envoy answers itself without the check") != 3 ||
		!strings.Contains(got, "sends /api/batch to route not_found of virtual host app") {
		t.Errorf("the LLM example's routes, which the shipped bootstrap answers 404: exit %d\n%s", exitCode(err), got)
	}
}

// The Envoy changes docs/cost-budgets.md gives for the LLM example, made
// to the shipped bootstrap as written there, pass check-config with the
// example's configuration: every limited route checked, the header its
// token budget charges from logged.
func TestCheckConfigCostExampleAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cost-budgets.md")
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// yamlBlock is the first YAML block of doc after marker, its lines
	// re-indented to indent.
	yamlBlock := func(marker, indent string) string {
		i := strings.Index(string(doc), marker)
		if i < 0 {
			t.Fatalf("docs/cost-budgets.md lacks %q", marker)
		}
		rest := string(doc[i:])
		start := strings.Index(rest, "```yaml\n")
		end := strings.Index(rest[start+8:], "```")
		var out strings.Builder
		for _, l := range strings.Split(strings.TrimRight(rest[start+8:start+8+end], " \n"), "\n") {
			out.WriteString(indent + strings.TrimPrefix(l, "   ") + "\n")
		}
		return out.String()
	}
	routes := yamlBlock("2. Its route table", "              ")
	header := "              additional_response_headers_to_log: [ x-usage-total-tokens ]\n"
	if !strings.Contains(yamlBlock("1. Its access log", ""), strings.TrimSpace(header)) {
		t.Fatal("the documented access log does not log x-usage-total-tokens")
	}
	bootstrap := string(shipped)
	for _, e := range []struct{ anchor, add string }{
		{"              # Login routes:", routes},
		{"              # A cost bucket charged from a response header", header},
	} {
		i := strings.Index(bootstrap, e.anchor)
		if i < 0 {
			t.Fatalf("the shipped bootstrap lacks %q", e.anchor)
		}
		bootstrap = bootstrap[:i] + e.add + bootstrap[i:]
	}
	p := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(p, []byte(bootstrap), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err = run(context.Background(), []string{"check-config", "--config", "../../config/examples/llm-budget.yaml", "--envoy", p}, env(nil), &out, &errOut)
	if err != nil || strings.Contains(errOut.String(), "does not log it") || strings.Contains(errOut.String(), "may drop the entries") || strings.Contains(errOut.String(), "is limited, but") {
		t.Fatalf("the documented changes: %v\n%s%s", err, out.String(), errOut.String())
	}
}

// check-config --envoy with a bootstrap that runs no ext_authz filter
// says what it still limits: the quota section's buckets through RLQS,
// the RLS rules through the rate limit filter, or nothing.
func TestCheckConfigWithoutExtAuthz(t *testing.T) {
	shipped, err := os.ReadFile("../../envoy/ratelimit-quota.yaml")
	if err != nil {
		t.Fatal(err)
	}
	noQuota := filepath.Join(t.TempDir(), "no-quota.yaml")
	stripped := strings.ReplaceAll(string(shipped), "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig", "envoy.extensions.filters.http.router.v3.Router")
	if stripped == string(shipped) {
		t.Fatal("the quota bootstrap names no rate_limit_quota filter")
	}
	writeFile(t, noQuota, stripped)
	for _, tc := range []struct{ bootstrap, want string }{
		{"../../envoy/ratelimit-quota.yaml", "runs no ext_authz filter: its route rules are never checked; only the quota section's buckets are limited, through the rate_limit_quota filter"},
		{"../../envoy/ratelimit-rls.yaml", "runs no ext_authz filter: its route rules are never checked; only the RLS rules (--rls-config-dir) are limited"},
		{noQuota, "runs no ext_authz filter: nothing is limited"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"check-config", "--config", "../../config/ratelimit.yaml", "--envoy", tc.bootstrap, "--check-addr", "off"}, env(nil), &out, &errOut)
		if err != nil || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: %v, stderr %q; want a warning %q", tc.bootstrap, err, errOut.String(), tc.want)
		}
	}
}
