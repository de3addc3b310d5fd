package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func exitCode(err error) int {
	var ee exitError
	if errors.As(err, &cli.UsageError{}) {
		return 2
	}
	if errors.As(err, &ee) {
		return ee.code
	}
	if err != nil {
		return 1
	}
	return 0
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	ctx := context.Background()
	if err := run(ctx, nil, env(nil), &out, &errOut); exitCode(err) != 2 || !strings.Contains(errOut.String(), "Usage:") {
		t.Errorf("no args: %v %q", err, errOut.String())
	}
	errOut.Reset()
	if err := run(ctx, []string{"frobnicate"}, env(nil), &out, &errOut); exitCode(err) != 2 || !strings.Contains(errOut.String(), `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %v %q", err, errOut.String())
	}
	out.Reset()
	if err := run(ctx, []string{"serve", "--help"}, env(nil), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-grpc-addr", "RATELIMIT_AUTHZ_GRPC_ADDR", "-http-addr", "-config", "127.0.0.1:9001", "127.0.0.1:9090", "config/ratelimit.yaml"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("serve --help lacks %q:\n%s", want, out.String())
		}
	}
	errOut.Reset()
	if err := run(ctx, []string{"serve", "--bogus"}, env(nil), &out, &errOut); exitCode(err) != 2 {
		t.Errorf("bad flag: %v", err)
	}
	if err := run(ctx, []string{"serve"}, env(map[string]string{"RATELIMIT_AUTHZ_DRAIN_DELAY": "soon"}), &out, &errOut); exitCode(err) != 2 || !strings.Contains(err.Error(), "RATELIMIT_AUTHZ_DRAIN_DELAY") {
		t.Errorf("bad env duration: %v", err)
	}
	out.Reset()
	if err := run(ctx, []string{"help"}, env(nil), &out, &errOut); err != nil || !strings.Contains(out.String(), "ratelimit-authz probe [flags]") {
		t.Errorf("help does not list probe: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"help", "probe"}, env(nil), &out, &errOut); err != nil || !strings.Contains(out.String(), "-timeout") {
		t.Errorf("help probe: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(ctx, []string{"version"}, env(nil), &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "ratelimit-authz ") {
		t.Errorf("version: %v %q", err, out.String())
	}
}

func TestCheckConfig(t *testing.T) {
	var out, errOut bytes.Buffer
	ctx := context.Background()
	err := run(ctx, []string{"check-config", "--config", "../../config/ratelimit.yaml"}, env(nil), &out, &errOut)
	if err != nil || !strings.Contains(out.String(), "OK (7 buckets, 10 routes)") {
		t.Fatalf("shipped config: %v %q %q", err, out.String(), errOut.String())
	}

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("buckets:\n  b: {limit: 5, per: 1x, key: tenant}\nroutes:\n  - {path: /x, buckets: [b, c]}\n"), 0o644)
	out.Reset()
	errOut.Reset()
	// The path may also come from the environment.
	err = run(ctx, []string{"check-config"}, env(map[string]string{"RATELIMIT_AUTHZ_CONFIG": bad}), &out, &errOut)
	if exitCode(err) != 1 {
		t.Fatalf("bad config: exit %d (%v)", exitCode(err), err)
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 problems, got:\n%s", errOut.String())
	}
	loc := regexp.MustCompile(`^` + regexp.QuoteMeta(bad) + `:\d+:\d+: `)
	for _, l := range lines {
		if !loc.MatchString(l) {
			t.Errorf("problem without file:line:col: %q", l)
		}
	}

	err = run(ctx, []string{"check-config", "--config", filepath.Join(t.TempDir(), "missing.yaml")}, env(nil), &out, &errOut)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing explicit config: %v", err)
	}
}

// check-config warns, exit 0, about what a valid configuration trusts
// that a client can set, and says what to deploy; with --envoy it checks
// the bootstrap in front.
func TestCheckConfigTrustWarnings(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(args ...string) (string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(ctx, append([]string{"check-config"}, args...), env(nil), &out, &errOut); err != nil {
			t.Fatalf("check-config %v: %v (a warning must not fail it)\n%s", args, err, errOut.String())
		}
		if !strings.Contains(out.String(), ": OK (") {
			t.Errorf("check-config %v: stdout %q", args, out.String())
		}
		return out.String(), errOut.String()
	}
	risky := write("risky.yaml", `
keys: {trusted_hops: 1}
buckets:
  per_tenant: {limit: 5, per: 1s, key: tenant}
  per_key: {limit: 5, per: 1s, key: "header:x-api-key"}
  fails: {limit: 5, per: 1m, key: ip, count: failures, on_overflow: allow}
routes:
  - {path: /x, buckets: [per_tenant, per_key, fails]}
`)
	_, warns := check("--config", risky)
	for _, want := range []string{
		"WARN: header x-tenant-id is trusted as sent (buckets per_tenant)",
		"WARN: header x-api-key is trusted as sent (buckets per_key)",
		"request_mutations: [{remove: x-api-key}]",
		"WARN: keys.trusted_hops is 1",
		"WARN: bucket fails counts failures with on_overflow: allow",
	} {
		if !strings.Contains(warns, want) {
			t.Errorf("warnings lack %q:\n%s", want, warns)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(warns), "\n") {
		if !strings.HasPrefix(l, risky+": WARN: ") {
			t.Errorf("warning line without the file and WARN: %q", l)
		}
	}

	// A bootstrap that strips the client's copies, trusts one hop and
	// sets x-envoy-external-address leaves only the overflow warning; one
	// that does none of it is named in each warning.
	safeEnvoy := write("safe.yaml", `
static_resources:
  listeners:
  - name: edge
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          use_remote_address: true
          xff_num_trusted_hops: 1
          http_filters:
          - name: strip
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations: {request_mutations: [{remove: x-tenant-id}, {remove: x-api-key}]}
          - name: envoy.filters.http.ext_authz
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz}
`)
	_, warns = check("--config", risky, "--envoy", safeEnvoy)
	if strings.Contains(warns, "is trusted as sent") || strings.Contains(warns, "make them equal") || !strings.Contains(warns, "on_overflow: allow") {
		t.Errorf("with a bootstrap that strips both headers:\n%s", warns)
	}
	safe, err := os.ReadFile(safeEnvoy)
	if err != nil {
		t.Fatal(err)
	}
	unsafeEnvoy := write("unsafe.yaml", strings.NewReplacer(
		"use_remote_address: true", "internal_address_config: {cidr_ranges: [{address_prefix: 10.0.0.0, prefix_len: 8}]}",
		"xff_num_trusted_hops: 1", "xff_num_trusted_hops: 2",
		"{remove: x-api-key}", "{remove: x-other}",
	).Replace(string(safe)))
	_, warns = check("--config", risky, "--envoy", unsafeEnvoy)
	for _, want := range []string{
		`header x-api-key is trusted as sent (buckets per_key): a client that sets it chooses its own key, and with it the tenant's override, and listener "edge" of ` + unsafeEnvoy + ` does not remove or overwrite it`,
		`lacks use_remote_address: true`,
		`marks 10.0.0.0/8 internal`,
		`has xff_num_trusted_hops 2`,
	} {
		if !strings.Contains(warns, want) {
			t.Errorf("unsafe bootstrap: warnings lack %q:\n%s", want, warns)
		}
	}
	if strings.Contains(warns, "header x-tenant-id is trusted") {
		t.Errorf("x-tenant-id is stripped, yet warned about:\n%s", warns)
	}

	// A bootstrap that cannot be read is an error, not a warning.
	var out, errOut bytes.Buffer
	err = run(ctx, []string{"check-config", "--config", risky, "--envoy", write("broken.yaml", "admin: {}")}, env(nil), &out, &errOut)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "no static listener") {
		t.Errorf("unreadable bootstrap: %v", err)
	}
}

// servedNode is a `serve` running in this process, alone or as one
// node of a cluster, with the addresses its node bound.
type servedNode struct {
	id         string
	node       *node.Node
	grpc, http string
	logs       *logbuf.Buffer
	stop       func() error // cancels serve and returns its error
	client     authv3.AuthorizationClient
	conn       *grpc.ClientConn
}

// startServe runs `serve` on free loopback ports (see serveReady) and
// returns its addresses, its log and its stop function.
func startServe(t *testing.T, vars map[string]string) (grpcAddr, httpAddr string, logs *logbuf.Buffer, stop func() error) {
	t.Helper()
	n := serveReady(t, vars)
	return n.grpc, n.http, n.logs, n.stop
}

// serveReady runs `serve` with the flags of vars (its environment) and
// args on free loopback ports, with the shipped configuration unless they
// name another, and returns once the node is ready.
func serveReady(t *testing.T, vars map[string]string, args ...string) *servedNode {
	t.Helper()
	n := launch(t, vars, args...)
	n.waitReady(t)
	return n
}

// launch runs `serve` as serveReady does, and returns once the node
// serves HTTP: readiness may still wait (a cluster's warm start). The
// addresses come from the node itself, never from its log.
func launch(t *testing.T, vars map[string]string, args ...string) *servedNode {
	t.Helper()
	all := map[string]string{
		"RATELIMIT_AUTHZ_GRPC_ADDR":   "127.0.0.1:0",
		"RATELIMIT_AUTHZ_HTTP_ADDR":   "127.0.0.1:0",
		"RATELIMIT_AUTHZ_CHECK_ADDR":  "127.0.0.1:0", // not the default port: nodes run side by side
		"RATELIMIT_AUTHZ_ADMIN_ADDR":  "off",
		"RATELIMIT_AUTHZ_DRAIN_DELAY": "300ms",
		"RATELIMIT_AUTHZ_CONFIG":      "../../config/ratelimit.yaml",
		// The memory limit is the process's: nodes run side by side here
		// would each set it. TestServeMemoryLimit tests it, alone.
		"RATELIMIT_AUTHZ_MEMORY_LIMIT": "off",
	}
	for k, v := range vars {
		all[k] = v
	}
	n := &servedNode{id: all["RATELIMIT_AUTHZ_NODE_ID"], logs: &logbuf.Buffer{}}
	if n.id == "" {
		n.id = "serve"
	}
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *node.Node, 1)
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, args, env(all), io.Discard, n.logs, func(nd *node.Node) { started <- nd })
	}()
	var stopped bool
	n.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: serve did not stop; log:\n%s", n.id, n.logs)
			return nil
		}
	}
	t.Cleanup(func() {
		if n.conn != nil {
			n.conn.Close()
		}
		n.stop()
	})
	// New waits at most 5 s for Postgres; the rest is quick.
	select {
	case n.node = <-started:
	case err := <-done:
		stopped = true
		t.Fatalf("%s: serve exited early: %v\n%s", n.id, err, n.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no node after 20 s; log:\n%s", n.id, n.logs)
	}
	n.grpc, n.http = n.node.GRPCAddr().String(), n.node.HTTPAddr().String()
	conn, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	n.conn, n.client = conn, authv3.NewAuthorizationClient(conn)
	// The listeners are bound in New: this request waits until Run
	// serves it.
	if code, _ := scrape.Page(t, "http://"+n.http+"/healthz"); code != http.StatusOK {
		t.Fatalf("%s: /healthz %d", n.id, code)
	}
	return n
}

func activity(tenant string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "192.0.2.1"},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/activities",
			Headers: map[string]string{":method": "POST", ":path": "/api/activities", "x-tenant-id": tenant},
		}},
	}}
}

// TestServe drives the real command as Envoy would: gRPC Check and health
// on one port, metrics and probes on the other, then a graceful stop.
func TestServe(t *testing.T) {
	grpcAddr, httpAddr, logs, stop := startServe(t, map[string]string{
		"RATELIMIT_AUTHZ_LOG_LEVEL":      "debug",
		"RATELIMIT_AUTHZ_FAILURES_TOKEN": "t0ken",
	})
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.auth.v3.Authorization"})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hc, err)
	}
	if code, body := scrape.Page(t, "http://"+httpAddr+"/readyz"); code != 200 || !strings.Contains(body, "overrides: off") {
		t.Errorf("readyz %d %q, want 200 with the overrides' state", code, body)
	}
	// The shipped configuration keys by x-tenant-id as sent: the node
	// says what to deploy in front.
	if !strings.Contains(logs.String(), "configuration trusts what a client may set") || !strings.Contains(logs.String(), "x-tenant-id") {
		t.Errorf("no start-up warning about the trusted tenant header:\n%s", logs)
	}
	if code, _ := scrape.Page(t, "http://"+httpAddr+"/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
	if code, _ := scrape.Page(t, "http://"+httpAddr+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof served without --pprof: %d", code)
	}

	// 100 activities per tenant per wall-clock second, then 429. A burst
	// that straddles a second boundary proves nothing: try again then.
	var denied *authv3.CheckResponse
	for attempt := 0; attempt < 5 && denied == nil; attempt++ {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
		start := time.Now()
		tenant := "acme-" + start.Format("150405.000")
		var allowedN int
		var last *authv3.CheckResponse
		for i := 0; i < 101; i++ {
			resp, err := client.Check(ctx, activity(tenant))
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetStatus().GetCode() == int32(codes.OK) {
				allowedN++
			}
			last = resp
		}
		if time.Now().Truncate(time.Second) != start.Truncate(time.Second) {
			continue // crossed a window edge
		}
		if allowedN != 100 || last.GetDeniedResponse() == nil {
			t.Fatalf("allowed %d of 101 in one window, last %v", allowedN, last)
		}
		denied = last
	}
	if denied == nil {
		t.Fatal("could not fit 101 checks in one second in 5 attempts")
	}
	var retry string
	for _, h := range denied.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = h.GetHeader().GetValue()
		}
	}
	if retry != "1" {
		t.Errorf("retry-after %q", retry)
	}
	if !strings.Contains(logs.String(), "msg=\"rate limited\" bucket=activity_create") {
		t.Errorf("no debug line for the denial:\n%s", logs)
	}

	// Failed logins reported over HTTP lock the account for the Check.
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequest("POST", "http://"+httpAddr+"/v1/failures", strings.NewReader(`{"ip":"203.0.113.4","account":"eve@x"}`))
		req.Header.Set("Authorization", "Bearer t0ken")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("failure report: %d", resp.StatusCode)
		}
	}
	loginReq := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/portal/login",
			Headers: map[string]string{"x-login-account": "eve@x", "x-envoy-external-address": "192.0.2.50"},
		}},
	}}
	if resp, err := client.Check(ctx, loginReq); err != nil || resp.GetStatus().GetCode() == int32(codes.OK) {
		t.Errorf("reported account not locked: %v %v", resp, err)
	}
	// The access-log service shares the gRPC port.
	if _, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx); err != nil {
		t.Errorf("access log stream: %v", err)
	}

	_, metrics := scrape.Page(t, "http://"+httpAddr+"/metrics")
	for _, want := range []string{
		`ratelimit_authz_checks_total{bucket="activity_create",decision="denied"} `,
		`ratelimit_authz_exceeded_total{bucket="activity_create"} `,
		"ratelimit_authz_check_duration_seconds_bucket",
		"ratelimit_authz_counter_live_keys ",
		"ratelimit_authz_counter_keys_refused_total 0",
		"ratelimit_authz_build_info{version=",
		`ratelimit_authz_failures_counted_total{bucket="login_account"} 5`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(metrics, "acme-") {
		t.Error("a key leaked into a metric label")
	}

	// Graceful stop: NOT_SERVING during the drain delay, then exit 0.
	errc := make(chan error, 1)
	go func() { errc <- stop() }()
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && hc.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
			return nil
		}
		return errors.New("still serving")
	})
	if err := <-errc; err != nil {
		t.Fatalf("serve returned %v", err)
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("no stop line:\n%s", logs)
	}
}

func TestServeTLSFlags(t *testing.T) {
	dir := t.TempDir()
	err := run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--grpc-tls-cert", filepath.Join(dir, "cert.pem")}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "both a certificate and a key") {
		t.Errorf("cert without key: %v", err)
	}
	err = run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"},
		env(map[string]string{"RATELIMIT_AUTHZ_GRPC_TLS_CERT": filepath.Join(dir, "c.pem"), "RATELIMIT_AUTHZ_GRPC_TLS_KEY": filepath.Join(dir, "k.pem")}), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing files from the environment: %v", err)
	}
}

func TestServeRefusesBadConfig(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("buckets: {}\nroutes: []\n"), 0o644)
	err := run(context.Background(), []string{"serve", "--config", bad, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "problem") || !strings.Contains(err.Error(), bad) {
		t.Errorf("bad config: %v", err)
	}
	err = run(context.Background(), []string{"serve", "--config", filepath.Join(t.TempDir(), "none.yaml")}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing config: %v", err)
	}
}

// check-config --envoy says when a bucket charges from a response header
// or trailer the bootstrap's gRPC access log does not log: every response
// would charge the cost's missing.
func TestCheckConfigWarnsOfUnloggedCostHeaders(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	logged := strings.Replace(string(shipped), "                buffer_flush_interval: 0.1s\n",
		"                buffer_flush_interval: 0.1s\n              additional_response_headers_to_log: [ X-Usage-Total-Tokens ]\n              additional_response_trailers_to_log: [ x-tokens ]\n", 1)
	if logged == string(shipped) {
		t.Fatal("the shipped bootstrap's access log changed: update this test")
	}
	withLog := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(withLog, []byte(logged), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "cost.yaml")
	os.WriteFile(cfg, []byte(`
buckets:
  tokens: {limit: 100, per: 1m, key: "header:x-org", cost: {response_header: x-usage-total-tokens}}
  trailer: {limit: 100, per: 1m, key: "header:x-org", cost: {response_trailer: x-tokens}}
routes: [{path: /api/activities, buckets: [tokens, trailer]}]
`), 0o644)
	for _, tc := range []struct {
		envoy string
		want  []string
	}{
		{"../../envoy/ratelimit-authz.yaml", []string{
			`bucket tokens charges response_header x-usage-total-tokens, but the gRPC access log of listener "ingress"`,
			"add x-usage-total-tokens to the access log's additional_response_headers_to_log",
			"add x-tokens to the access log's additional_response_trailers_to_log",
		}},
		{withLog, nil},
	} {
		var out, errOut bytes.Buffer
		if err := run(ctx, []string{"check-config", "--config", cfg, "--envoy", tc.envoy}, env(nil), &out, &errOut); err != nil {
			t.Fatalf("%s: %v", tc.envoy, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut.String(), w) {
				t.Errorf("%s: no %q in\n%s", tc.envoy, w, errOut.String())
			}
		}
		if tc.want == nil && strings.Contains(errOut.String(), "charges response_") {
			t.Errorf("%s logs both, yet:\n%s", tc.envoy, errOut.String())
		}
	}
}

// check-config --envoy says when a route spends a bucket read from the
// access log (a concurrency bucket's leases, a response-charged cost, a
// failure count) but the bootstrap would not send the entries that carry
// it: no gRPC access log, one whose filter drops them, or one whose
// metadata_filter names the ext_authz filter instead of its metadata
// namespace. The shipped bootstrap sends them all.
func TestCheckConfigWarnsOfLostAccessLogEntries(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	branch := func(key string) string {
		return `                - metadata_filter:
                    matcher:
                      filter: envoy.filters.http.ext_authz
                      path: [ { key: ` + key + ` } ]
                      value: { present_match: true }
                    match_if_key_not_found: false
`
	}
	for _, k := range []string{"charges", "leases"} {
		if !strings.Contains(string(shipped), branch(k)) {
			t.Fatalf("the shipped bootstrap's access-log filter changed (%s): update this test", k)
		}
	}
	start := strings.Index(string(shipped), "          access_log:\n")
	end := strings.Index(string(shipped), "          route_config:\n")
	if start < 0 || end < start {
		t.Fatal("the shipped bootstrap's access log moved: update this test")
	}
	noLog := write("no-log.yaml", string(shipped[:start])+string(shipped[end:]))
	unfiltered := write("unfiltered.yaml", strings.Replace(string(shipped), "            filter:\n              or_filter:", "            unused_filter:\n              or_filter:", 1))
	noLeases := write("no-leases.yaml", strings.Replace(string(shipped), branch("leases"), "", 1))
	// The filter's name where its metadata namespace belongs.
	misnamed := write("misnamed.yaml", strings.Replace(string(shipped), branch("charges"), strings.Replace(branch("charges"), "filter: envoy.filters.http.ext_authz", "filter: ext_authz", 1), 1))
	noFailures := write("no-failures.yaml", strings.Replace(string(shipped), "                        comparison: { op: EQ, value: { default_value: 401, runtime_key: ratelimit_authz.failure_status } }\n",
		"                        comparison: { op: EQ, value: { default_value: 401, runtime_key: ratelimit_authz.failure_status } }\n                    - duration_filter: { comparison: { op: GE, value: { default_value: 1000, runtime_key: slow } } }\n", 1))
	cfg := write("read-from-log.yaml", `
buckets:
  db_pool: {count: concurrency, limit: 5, lease_ttl: 30s, key: tenant}
  tokens: {limit: 1000, per: 1m, key: tenant, cost: {response_header: x-tokens, max: 100}}
  guesses: {limit: 5, per: 1m, key: ip, count: failures}
  unused: {count: concurrency, limit: 5, key: tenant}
  rate: {limit: 10, per: 1s, key: tenant}
routes: [{path: /api/activities, buckets: [db_pool, rate, tokens]}, {path: /admin/login, buckets: [guesses]}, {path: /api/v1/tokens, buckets: [rate]}]
`)
	const (
		leasesLost = `bucket db_pool counts requests in flight, but`
		chargeLost = `bucket tokens is charged`
		failLost   = `bucket guesses counts failures from the access log, but`
	)
	for _, tc := range []struct {
		envoy string
		want  []string
	}{
		{"../../envoy/ratelimit-authz.yaml", nil},
		{unfiltered, nil},
		{noLog, []string{leasesLost, chargeLost, failLost}},
		{noLeases, []string{leasesLost}},
		{misnamed, []string{chargeLost}},
		{noFailures, []string{failLost}},
	} {
		var out, errOut bytes.Buffer
		if err := run(ctx, []string{"check-config", "--config", cfg, "--envoy", tc.envoy}, env(nil), &out, &errOut); err != nil {
			t.Fatalf("%s: %v", tc.envoy, err)
		}
		got := errOut.String()
		for _, w := range []string{leasesLost, chargeLost, failLost} {
			want := slices.Contains(tc.want, w)
			if n := strings.Count(got, w); n != map[bool]int{true: 1, false: 0}[want] {
				t.Errorf("%s: %d warnings %q, want %v (a bucket no route spends has none):\n%s", filepath.Base(tc.envoy), n, w, want, got)
			}
		}
		if slices.Contains(tc.want, leasesLost) && !strings.Contains(got, "lease_ttl (30s)") {
			t.Errorf("%s: the lease warning does not name the TTL:\n%s", filepath.Base(tc.envoy), got)
		}
	}
}
