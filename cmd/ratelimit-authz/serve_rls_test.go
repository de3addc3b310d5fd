package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
)

func TestUpstreamEnv(t *testing.T) {
	for _, tt := range []struct {
		name  string
		env   map[string]string
		want  map[string]string // our variable → its value
		warn  []string          // in the warnings, in any order
		error string            // in the errors
	}{
		{name: "plain aliases", env: map[string]string{"RUNTIME_ROOT": "/srv/rt", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "cfg",
			"RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true", "MERGE_DOMAIN_CONFIG": "1", "SHADOW_MODE": "TRUE",
			"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-L", "LIMIT_REMAINING_HEADER": "X-R", "LIMIT_RESET_HEADER": "X-T"},
			want: map[string]string{"RATELIMIT_AUTHZ_RLS_RUNTIME_ROOT": "/srv/rt", "RATELIMIT_AUTHZ_RLS_RUNTIME_SUBDIRECTORY": "ratelimit",
				"RATELIMIT_AUTHZ_RLS_RUNTIME_APPDIRECTORY": "cfg", "RATELIMIT_AUTHZ_RLS_RUNTIME_WATCH_ROOT": "false",
				"RATELIMIT_AUTHZ_RLS_IGNORE_DOTFILES": "true", "RATELIMIT_AUTHZ_RLS_MERGE_DOMAINS": "1", "RATELIMIT_AUTHZ_RLS_SHADOW_MODE": "TRUE",
				"RATELIMIT_AUTHZ_RLS_RESPONSE_HEADERS": "true", "RATELIMIT_AUTHZ_RLS_LIMIT_HEADER": "X-L",
				"RATELIMIT_AUTHZ_RLS_REMAINING_HEADER": "X-R", "RATELIMIT_AUTHZ_RLS_RESET_HEADER": "X-T"}},
		{name: "ours wins", env: map[string]string{"SHADOW_MODE": "true", "RATELIMIT_AUTHZ_RLS_SHADOW_MODE": "false"},
			want: map[string]string{"RATELIMIT_AUTHZ_RLS_SHADOW_MODE": "false"}, warn: []string{"SHADOW_MODE is ignored: RATELIMIT_AUTHZ_RLS_SHADOW_MODE is set, and wins"}},
		{name: "a bad boolean", env: map[string]string{"SHADOW_MODE": "maybe"}, error: `SHADOW_MODE="maybe": not a boolean`},
		{name: "log levels", env: map[string]string{"LOG_LEVEL": "WARNING", "LOG_FORMAT": "JSON"},
			want: map[string]string{"RATELIMIT_AUTHZ_LOG_LEVEL": "warn", "RATELIMIT_AUTHZ_LOG_FORMAT": "json"}},
		{name: "trace", env: map[string]string{"LOG_LEVEL": "trace", "LOG_FORMAT": "logfmt"},
			want: map[string]string{"RATELIMIT_AUTHZ_LOG_LEVEL": "debug", "RATELIMIT_AUTHZ_LOG_FORMAT": "text"}},
		{name: "a bad level", env: map[string]string{"LOG_LEVEL": "loud"}, error: `LOG_LEVEL="loud"`},
		{name: "port only", env: map[string]string{"GRPC_PORT": "8081"}, want: map[string]string{"RATELIMIT_AUTHZ_GRPC_ADDR": "0.0.0.0:8081"}},
		{name: "host only", env: map[string]string{"GRPC_HOST": "::1"}, want: map[string]string{"RATELIMIT_AUTHZ_GRPC_ADDR": "[::1]:8081"}},
		{name: "a bad port", env: map[string]string{"GRPC_PORT": "80a"}, error: `GRPC_PORT="80a": not a port`},
		{name: "a port too big", env: map[string]string{"GRPC_PORT": "65536"}, error: `GRPC_PORT="65536": not a port`},
		{name: "prometheus", env: map[string]string{"USE_PROMETHEUS": "true"}, want: map[string]string{"RATELIMIT_AUTHZ_HTTP_ADDR": ":9090"}},
		{name: "prometheus address", env: map[string]string{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": "127.0.0.1:9102", "PROMETHEUS_PATH": "/stats"},
			want: map[string]string{"RATELIMIT_AUTHZ_HTTP_ADDR": "127.0.0.1:9102"}, warn: []string{"PROMETHEUS_PATH has no effect"}},
		{name: "prometheus address alone", env: map[string]string{"PROMETHEUS_ADDR": ":9102"},
			want: map[string]string{"RATELIMIT_AUTHZ_HTTP_ADDR": ""}, warn: []string{"PROMETHEUS_ADDR has no effect without USE_PROMETHEUS=true"}},
		{name: "no effect", env: map[string]string{"REDIS_URL": "redis:6379", "USE_STATSD": "false", "TRACING_ENABLED": "true", "LOCAL_CACHE_SIZE_IN_BYTES": "1024"},
			warn: []string{"REDIS_URL has no effect: counts are in memory, shared over NATS", "USE_STATSD has no effect: metrics are Prometheus's",
				"TRACING_ENABLED has no effect", "LOCAL_CACHE_SIZE_IN_BYTES has no effect: counts are in memory"}},
		{name: "TLS", env: map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c.pem", "GRPC_SERVER_TLS_KEY": "/k.pem",
			"GRPC_CLIENT_TLS_CACERT": "/ca.pem", "GRPC_CLIENT_TLS_SAN": "envoy.mesh"},
			want: map[string]string{"RATELIMIT_AUTHZ_GRPC_TLS_CERT": "/c.pem", "RATELIMIT_AUTHZ_GRPC_TLS_KEY": "/k.pem",
				"RATELIMIT_AUTHZ_GRPC_TLS_CLIENT_CA": "/ca.pem", "RATELIMIT_AUTHZ_GRPC_TLS_ALLOWED_CLIENTS": "envoy.mesh"}},
		{name: "TLS files without TLS", env: map[string]string{"GRPC_SERVER_TLS_CERT": "/c.pem"},
			want: map[string]string{"RATELIMIT_AUTHZ_GRPC_TLS_CERT": ""}, warn: []string{"GRPC_SERVER_TLS_CERT has no effect without GRPC_SERVER_USE_TLS=true"}},
		{name: "unix socket", env: map[string]string{"GRPC_UDS": "/tmp/rl.sock"}, error: "GRPC_UDS: a unix socket is not served"},
		{name: "xDS", env: map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}, error: `CONFIG_TYPE="GRPC_XDS_SOTW": only FILE`},
		{name: "file", env: map[string]string{"CONFIG_TYPE": "file", "QUOTA_MODE": "false"}},
		{name: "quota mode", env: map[string]string{"QUOTA_MODE": "true"}, error: "QUOTA_MODE=true: quota mode is not supported"},
	} {
		getenv, u := upstreamEnv(env(tt.env))
		for k, v := range tt.want {
			if got := getenv(k); got != v {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, got, v)
			}
		}
		all := strings.Join(u.warnings, "\n")
		for _, w := range tt.warn {
			if !strings.Contains(all, w) {
				t.Errorf("%s: warnings %q lack %q", tt.name, u.warnings, w)
			}
		}
		if len(u.warnings) != len(tt.warn) {
			t.Errorf("%s: warnings %q, want %d", tt.name, u.warnings, len(tt.warn))
		}
		var errs []string
		for _, e := range u.errs {
			errs = append(errs, e.Error())
		}
		if got := strings.Join(errs, "\n"); tt.error == "" && got != "" || !strings.Contains(got, tt.error) {
			t.Errorf("%s: errors %q, want %q", tt.name, got, tt.error)
		}
	}
}

// writeLayout writes one configuration file in upstream's default layout
// under a fresh root and returns the root.
func writeLayout(t *testing.T, text string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "current")
	dir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

const edgeRLS = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"

func rlsCall(t *testing.T, n *servedNode, value string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rlsv3.NewRateLimitServiceClient(n.conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: value}}},
	}})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return r
}

// A deployment of envoyproxy/ratelimit's, environment unchanged: its
// layout, shadow mode and headers are honoured, and each setting that has
// no effect here is named once.
func TestServeRLSUpstreamEnvironment(t *testing.T) {
	n := serveReady(t, map[string]string{
		"RUNTIME_ROOT": writeLayout(t, edgeRLS), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
		"SHADOW_MODE": "true", "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Remaining",
		"REDIS_URL": "redis:6379", "REDIS_SOCKET_TYPE": "tcp", "USE_STATSD": "false", "LOG_LEVEL": "debug",
	})
	for range 3 {
		rlsCall(t, n, "203.0.113.9")
	}
	r := rlsCall(t, n, "203.0.113.9")
	if r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("shadow mode: %v", r)
	}
	hs := r.GetResponseHeadersToAdd()
	if len(hs) != 3 || hs[1].GetKey() != "X-Remaining" || hs[1].GetValue() != "0" {
		t.Errorf("headers %v", hs)
	}
	logs := n.logs.String()
	for _, name := range []string{"REDIS_URL", "REDIS_SOCKET_TYPE", "USE_STATSD"} {
		if c := strings.Count(logs, name+" has no effect"); c != 1 {
			t.Errorf("%d warnings of %s, want 1:\n%s", c, name, logs)
		}
	}
	if !strings.Contains(logs, "level=DEBUG") {
		t.Errorf("LOG_LEVEL=debug did not set the level:\n%s", logs)
	}
}

// GRPC_HOST and GRPC_PORT choose the gRPC address when ours is not set;
// --rls-config-dir reads a plain directory.
func TestServeRLSUpstreamPort(t *testing.T) {
	port := freeport.TestPort(t)
	root := writeLayout(t, edgeRLS)
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_GRPC_ADDR": "", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": strconv.Itoa(port)},
		"--rls-config-dir", filepath.Join(root, "ratelimit", "config"))
	if want := "127.0.0.1:" + strconv.Itoa(port); n.grpc != want {
		t.Errorf("gRPC address %s, want %s", n.grpc, want)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if r := rlsCall(t, n, "198.51.100.2"); r.GetOverallCode() != want {
			t.Errorf("call %d: %v, want %v", i, r, want)
		}
	}
}

func TestServeRLSErrors(t *testing.T) {
	root := writeLayout(t, edgeRLS)
	bad := writeLayout(t, "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"dir and layout", []string{"--rls-config-dir", root}, map[string]string{"RUNTIME_ROOT": root}, 2, "exclude each other"},
		{"bad boolean", nil, map[string]string{"SHADOW_MODE": "maybe"}, 2, `SHADOW_MODE="maybe"`},
		{"bad port", nil, map[string]string{"GRPC_PORT": "x"}, 2, `GRPC_PORT="x"`},
		{"bad overflow", []string{"--rls-on-overflow", "maybe"}, nil, 2, `--rls-on-overflow "maybe"`},
		{"bad algorithm", []string{"--rls-default-algorithm", "token"}, nil, 2, `--rls-default-algorithm "token"`},
		{"bad header", nil, map[string]string{"LIMIT_LIMIT_HEADER": "Rate Limit"}, 2, `response header name "Rate Limit"`},
		{"same headers", []string{"--rls-reset-header", "ratelimit-limit"}, nil, 2, "must differ"},
		{"app directory", []string{"--rls-runtime-appdirectory", "../x"}, nil, 2, "want a directory name"},
		{"unix socket", nil, map[string]string{"GRPC_UDS": "/tmp/x.sock"}, 2, "GRPC_UDS"},
		{"TLS without files", nil, map[string]string{"GRPC_SERVER_USE_TLS": "true"}, 2, "the port would be plaintext"},
		{"a problem in a file", nil, map[string]string{"RUNTIME_ROOT": bad, "RUNTIME_SUBDIRECTORY": "ratelimit"}, 1, "invalid rate limit unit 'fortnight'"},
	} {
		vars := map[string]string{"RATELIMIT_AUTHZ_GRPC_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_HTTP_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_CONFIG": "../../config/ratelimit.yaml"}
		for k, v := range tt.env {
			vars[k] = v
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, append([]string{"serve"}, tt.args...), env(vars), io.Discard, io.Discard)
		cancel()
		if exitCode(err) != tt.code || err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v (exit %d), want exit %d with %q", tt.name, err, exitCode(err), tt.code, tt.want)
		}
	}
}

func TestServeRLSHelp(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-rls-config-dir", "RATELIMIT_AUTHZ_RLS_CONFIG_DIR", "-rls-runtime-root", "RUNTIME_ROOT too (ours wins)",
		"RUNTIME_SUBDIRECTORY too", "RUNTIME_APPDIRECTORY too", "RUNTIME_WATCH_ROOT too", "RUNTIME_IGNOREDOTFILES too",
		"MERGE_DOMAIN_CONFIG too", "SHADOW_MODE too", "LIMIT_RESPONSE_HEADERS_ENABLED too", "LIMIT_LIMIT_HEADER too",
		"LIMIT_REMAINING_HEADER too", "LIMIT_RESET_HEADER too", "LOG_LEVEL too", "GRPC_HOST and GRPC_PORT too",
		"USE_PROMETHEUS and PROMETHEUS_ADDR too", "-rls-on-overflow", "-rls-default-algorithm", "Our variables win",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
}
