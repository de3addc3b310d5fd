package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
)

// servingAttr is the value of key on the node's serving line (what an
// operator reads), waiting for the line: Run writes it as it starts.
func servingAttr(t *testing.T, logs *logbuf.Buffer, key string) string {
	t.Helper()
	re := regexp.MustCompile(`msg=serving .*\b` + key + `=(\S+)`)
	var m []string
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		if m = re.FindStringSubmatch(logs.String()); m == nil {
			return fmt.Errorf("serving line without %s:\n%s", key, logs)
		}
		return nil
	})
	return m[1]
}

func grpcConn(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestServeHelpSurfaces(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"serve", "--help"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"-access-log-addr", "RATELIMIT_AUTHZ_ACCESS_LOG_ADDR", "-check-addr", "RATELIMIT_AUTHZ_CHECK_ADDR", "-pprof-addr", "RATELIMIT_AUTHZ_PPROF_ADDR",
		"-grpc-tls-allowed-clients", "-access-log-tls-allowed-clients", "-grpc-max-connections", "(default 4096)",
		"-grpc-max-streams", "(default 1024)", "-grpc-max-recv-bytes", "(default 262144)", "-grpc-keepalive-min-time",
		"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE", "-grpc-stream-workers", "RATELIMIT_AUTHZ_GRPC_STREAM_WORKERS", "(default 64)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "-pprof ") || strings.Contains(out.String(), "RATELIMIT_AUTHZ_PPROF)") {
		t.Errorf("serve --help still offers --pprof:\n%s", out.String())
	}
}

// The lean listener is on by default, where every shipped bootstrap sends
// ext_authz and the ratelimit filter (127.0.0.1:9002), and the admin
// listener where top looks (127.0.0.1:9095); "off" turns each off.
func TestServeCheckAddrDefault(t *testing.T) {
	var out bytes.Buffer
	noEnv := func(string) string { return "" }
	if err := run(context.Background(), []string{"serve", "--help"}, noEnv, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `RATELIMIT_AUTHZ_CHECK_ADDR) (default "127.0.0.1:9002")`) {
		t.Errorf("serve --help does not give --check-addr the default 127.0.0.1:9002:\n%s", out.String())
	}
	// The live view too, on loopback, where top looks by default.
	if !strings.Contains(out.String(), `RATELIMIT_AUTHZ_ADMIN_ADDR) (default "127.0.0.1:9095")`) {
		t.Errorf("serve --help does not give --admin-addr the default 127.0.0.1:9095:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"top", "--help"}, noEnv, &out, io.Discard); err != nil || !strings.Contains(out.String(), `(default "127.0.0.1:9095")`) {
		t.Errorf("top --help does not look at 127.0.0.1:9095 by default (%v):\n%s", err, out.String())
	}
	for _, off := range []map[string]string{{"RATELIMIT_AUTHZ_CHECK_ADDR": "off"}} {
		if n := serveReady(t, off); n.node.CheckAddr() != nil {
			t.Errorf("%v: a lean listener on %v", off, n.node.CheckAddr())
		}
	}
	if n := serveReady(t, nil, "--check-addr", "off"); n.node.CheckAddr() != nil {
		t.Errorf("--check-addr off: a lean listener on %v", n.node.CheckAddr())
	}
}

// With --check-addr, Check and health are served on the lean listener too,
// on the same counters as the gRPC port.
func TestServeCheckAddr(t *testing.T) {
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_CHECK_ADDR": "127.0.0.1:0"})
	if n.node.CheckAddr() == nil {
		t.Fatal("no lean Check listener")
	}
	checkAddr := n.node.CheckAddr().String()
	if got := servingAttr(t, n.logs, "check"); got != checkAddr {
		t.Errorf("serving line says check=%s, the listener is on %s", got, checkAddr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lean := grpcConn(t, checkAddr, nil)
	h, err := healthpb.NewHealthClient(lean).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health on the lean listener: %v, %v", h, err)
	}
	upload := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/converger/uploads", Headers: map[string]string{"x-tenant-id": "lean-t"},
		}},
	}}
	// Stay away from a second boundary: the upload bucket allows 10 a second.
	if left := time.Until(time.Now().Truncate(time.Second).Add(time.Second)); left < 500*time.Millisecond {
		time.Sleep(left + 10*time.Millisecond)
	}
	clients := []authv3.AuthorizationClient{authv3.NewAuthorizationClient(lean), authv3.NewAuthorizationClient(grpcConn(t, n.grpc, nil))}
	for i := range 10 {
		resp, err := clients[i%2].Check(ctx, upload)
		if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
			t.Fatalf("upload %d: %v, %v", i+1, resp, err)
		}
	}
	resp, err := clients[0].Check(ctx, upload)
	if err != nil || resp.GetStatus().GetCode() != int32(codes.ResourceExhausted) {
		t.Fatalf("the 11th upload on the lean listener: %v, %v (want denied: one budget across both ports)", resp, err)
	}
}

// With --access-log-addr, Envoy's failed-login reports are taken there and
// only there: a client of the Check port cannot lock an account.
func TestServeAccessLogAddr(t *testing.T) {
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_ACCESS_LOG_ADDR": "127.0.0.1:0"})
	grpcAddr := n.grpc
	if n.node.AccessLogAddr() == nil {
		t.Fatal("no access-log listener of its own")
	}
	alsAddr := n.node.AccessLogAddr().String()
	if alsAddr == grpcAddr {
		t.Fatalf("access log on the gRPC address %s", grpcAddr)
	}
	if got := servingAttr(t, n.logs, "access_log"); got != alsAddr {
		t.Errorf("serving line says access_log=%s, the listener is on %s", got, alsAddr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := authv3.NewAuthorizationClient(grpcConn(t, grpcAddr, nil))
	login := func(account string) *authv3.CheckResponse {
		t.Helper()
		resp, err := check.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "POST", Path: "/portal/login",
				Headers: map[string]string{"x-login-account": account, "x-envoy-external-address": "198.51.100.9"},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Stay away from a minute boundary: the login windows are a minute.
	if left := time.Until(time.Now().Truncate(time.Minute).Add(time.Minute)); left < 10*time.Second {
		time.Sleep(left + 50*time.Millisecond)
	}
	resp := login("victim@example.com")
	if resp.GetStatus().GetCode() != int32(codes.OK) {
		t.Fatalf("login denied before any failure: %v", resp)
	}
	failed := &alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogv3.HTTPAccessLogEntry{{
			CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{
				FilterMetadata: map[string]*structpb.Struct{accesslog.MetadataNamespace: resp.GetDynamicMetadata()},
			}},
			Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(401)},
		}}},
	}}
	send := func(addr string) error {
		st, err := alsv3.NewAccessLogServiceClient(grpcConn(t, addr, nil)).StreamAccessLogs(ctx)
		if err != nil {
			return err
		}
		for range 5 {
			if err := st.Send(failed); err != nil {
				break
			}
		}
		_, err = st.CloseAndRecv()
		return err
	}
	if err := send(grpcAddr); status.Code(err) != codes.Unimplemented {
		t.Errorf("access log on the gRPC port: %v, want UNIMPLEMENTED", err)
	}
	if resp := login("victim@example.com"); resp.GetStatus().GetCode() != int32(codes.OK) {
		t.Fatal("account locked through the gRPC port")
	}
	go send(alsAddr) // the stream stays open until shutdown, as Envoy's does
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if login("victim@example.com").GetStatus().GetCode() == int32(codes.OK) {
			return errAgain
		}
		return nil
	})
}

var errAgain = &net.AddrError{Err: "not yet"}

// --pprof-addr serves profiles on their own address without the command
// line; the removed --pprof and RATELIMIT_AUTHZ_PPROF are usage errors.
func TestServePprof(t *testing.T) {
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_PPROF_ADDR": "127.0.0.1:0"})
	httpAddr, stop := n.http, n.stop
	if n.node.PprofAddr() == nil {
		t.Fatal("no profile listener")
	}
	pprofAddr := n.node.PprofAddr().String()
	if got := servingAttr(t, n.logs, "pprof"); got != pprofAddr {
		t.Errorf("serving line says pprof=%s, the listener is on %s", got, pprofAddr)
	}
	code, body := scrape.Page(t, "http://"+pprofAddr+"/debug/pprof/")
	if code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index: %d", code)
	}
	if code, body := scrape.Page(t, "http://"+pprofAddr+"/debug/pprof/cmdline"); code != http.StatusNotFound || strings.Contains(body, "serve") {
		t.Errorf("cmdline: %d %q", code, body)
	}
	if code, _ := scrape.Page(t, "http://"+httpAddr+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("profiles on the HTTP address: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"serve"}, env(map[string]string{"RATELIMIT_AUTHZ_PPROF": "true"}), io.Discard, io.Discard)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "--pprof-addr") {
		t.Errorf("RATELIMIT_AUTHZ_PPROF: %v", err)
	}
	var errOut bytes.Buffer
	err = run(context.Background(), []string{"serve", "--pprof"}, env(nil), io.Discard, &errOut)
	if exitCode(err) != 2 || !strings.Contains(errOut.String(), "-pprof") {
		t.Errorf("--pprof: %v %q", err, errOut.String())
	}
	err = run(context.Background(), []string{"serve", "--http-addr", "127.0.0.1:9999", "--pprof-addr", "127.0.0.1:9999"}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "own address") {
		t.Errorf("pprof on the HTTP address: %v", err)
	}
}

// The failures token can come from a file; it never reaches the log, and
// a file that cannot be a secret is a usage error naming the variable.
func TestServeFailuresTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("s3cr3t-t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, httpAddr, logs, stop := startServe(t, map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": file, "RATELIMIT_AUTHZ_LOG_LEVEL": "debug"})
	report := func(token string) int {
		req, _ := http.NewRequest("POST", "http://"+httpAddr+"/v1/failures", strings.NewReader(`{"ip":"203.0.113.4","account":"eve@x"}`))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := report("s3cr3t-t0ken"); code != 200 {
		t.Errorf("token from the file: %d", code)
	}
	if code := report("s3cr3t-t0ke"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "token_from=\"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE "+file+"\"") {
		t.Errorf("no line saying where the token came from:\n%s", logs)
	}
	if strings.Contains(logs.String(), "s3cr3t") {
		t.Errorf("the token is in the log:\n%s", logs)
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\r\n"), 0o600)
	big := filepath.Join(dir, "big")
	os.WriteFile(big, bytes.Repeat([]byte("x"), 65<<10), 0o600)
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"both", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN": "a", "RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": file}, "both set"},
		{"missing file", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": filepath.Join(dir, "none")}, "no such file"},
		{"empty file", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": empty}, "empty"},
		{"big file", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": big}, "larger than"},
		{"a device without end", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": "/dev/zero"}, "larger than"},
		{"a directory", map[string]string{"RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE": dir}, "is a directory"},
	} {
		err := run(context.Background(), []string{"serve"}, env(tc.env), io.Discard, io.Discard)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "RATELIMIT_AUTHZ_FAILURES_TOKEN") {
			t.Errorf("%s: %v, want exit 2 with %q", tc.name, err, tc.want)
		}
	}
}

func TestServeGRPCLimitFlags(t *testing.T) {
	_, _, logs, _ := startServe(t, map[string]string{
		"RATELIMIT_AUTHZ_GRPC_MAX_STREAMS": "7", "RATELIMIT_AUTHZ_GRPC_MAX_CONNECTIONS": "9", "RATELIMIT_AUTHZ_GRPC_MAX_RECV_BYTES": "65536",
		"RATELIMIT_AUTHZ_GRPC_STREAM_WORKERS": "3",
	})
	for k, v := range map[string]string{"max_streams": "7", "max_connections": "9", "max_recv_bytes": "65536", "grpc_tls": "off", "stream_workers": "3"} {
		if got := servingAttr(t, logs, k); got != v {
			t.Errorf("%s=%s, want %s", k, got, v)
		}
	}
	// The runtime's choices are logged at start, before serving.
	if want := fmt.Sprintf("msg=runtime gomaxprocs=%d ", runtime.GOMAXPROCS(0)); !strings.Contains(logs.String(), want) {
		t.Errorf("logs lack %q:\n%s", want, logs)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--grpc-max-connections", "0"}, nil, "--grpc-max-connections 0"},
		{[]string{"--grpc-max-streams", "-1"}, nil, "--grpc-max-streams -1"},
		{[]string{"--grpc-max-streams", "4294967297"}, nil, "--grpc-max-streams"},
		{[]string{"--grpc-max-recv-bytes", "0"}, nil, "--grpc-max-recv-bytes 0"},
		{[]string{"--grpc-keepalive-min-time", "0s"}, nil, "--grpc-keepalive-min-time"},
		{[]string{"--grpc-stream-workers", "-1"}, nil, "--grpc-stream-workers -1"},
		{[]string{"--grpc-stream-workers", "1000000"}, nil, "--grpc-stream-workers 1000000"},
		{nil, map[string]string{"RATELIMIT_AUTHZ_GRPC_STREAM_WORKERS": "many"}, "RATELIMIT_AUTHZ_GRPC_STREAM_WORKERS"},
		{nil, map[string]string{"RATELIMIT_AUTHZ_GRPC_MAX_RECV_BYTES": "lots"}, "RATELIMIT_AUTHZ_GRPC_MAX_RECV_BYTES"},
		{nil, map[string]string{"RATELIMIT_AUTHZ_GRPC_KEEPALIVE_MIN_TIME": "often"}, "RATELIMIT_AUTHZ_GRPC_KEEPALIVE_MIN_TIME"},
	} {
		err := run(context.Background(), append([]string{"serve"}, tc.args...), env(tc.env), io.Discard, io.Discard)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: %v, want exit 2 with %q", tc.args, tc.env, err, tc.want)
		}
	}
	err := run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--grpc-max-recv-bytes", "1073741824"}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("1 GiB receive bound: %v", err)
	}
}

// testCA is a throwaway CA with a server certificate; client issues
// client certificates with DNS names.
type testCA struct {
	*testcert.CA
	cert, key string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	c := &testCA{CA: testcert.New(t)}
	c.cert, c.key = c.Issue(t, testcert.Leaf{Name: "server", Usage: x509.ExtKeyUsageServerAuth})
	return c
}

func (c *testCA) client(t *testing.T, name string, dns ...string) credentials.TransportCredentials {
	t.Helper()
	return credentials.NewTLS(c.Client(t, testcert.Leaf{Name: name, DNS: dns}))
}

// The production setting from flags and environment: mTLS on both gRPC
// listeners, each with its own allow-list.
func TestServeMutualTLSAllowLists(t *testing.T) {
	ca := newTestCA(t)
	n := serveReady(t, map[string]string{
		"RATELIMIT_AUTHZ_GRPC_TLS_CERT":                  ca.cert,
		"RATELIMIT_AUTHZ_GRPC_TLS_KEY":                   ca.key,
		"RATELIMIT_AUTHZ_GRPC_TLS_CLIENT_CA":             ca.File,
		"RATELIMIT_AUTHZ_GRPC_TLS_ALLOWED_CLIENTS":       "edge.mesh, internal.mesh",
		"RATELIMIT_AUTHZ_ACCESS_LOG_ADDR":                "127.0.0.1:0",
		"RATELIMIT_AUTHZ_ACCESS_LOG_TLS_ALLOWED_CLIENTS": "edge.mesh",
	})
	grpcAddr, logs := n.grpc, n.logs
	if n.node.AccessLogAddr() == nil {
		t.Fatal("no access-log listener of its own")
	}
	alsAddr := n.node.AccessLogAddr().String()
	if got := servingAttr(t, logs, "grpc_tls"); got != "mtls" {
		t.Errorf("grpc_tls=%s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	edge, internal, other := ca.client(t, "edge", "edge.mesh"), ca.client(t, "internal", "internal.mesh"), ca.client(t, "other", "other.mesh")
	for name, tc := range map[string]struct {
		creds credentials.TransportCredentials
		ok    bool
	}{"edge": {edge, true}, "internal": {internal, true}, "other": {other, false}} {
		_, err := authv3.NewAuthorizationClient(grpcConn(t, grpcAddr, tc.creds)).Check(ctx, &authv3.CheckRequest{})
		if (err == nil) != tc.ok {
			t.Errorf("%s on the gRPC port: %v", name, err)
		}
	}
	// On the access-log port, a Check (unimplemented there) tells a
	// completed handshake from a refused one.
	for name, tc := range map[string]struct {
		creds credentials.TransportCredentials
		ok    bool
	}{"edge": {edge, true}, "internal": {internal, false}, "other": {other, false}} {
		_, err := authv3.NewAuthorizationClient(grpcConn(t, alsAddr, tc.creds)).Check(ctx, &authv3.CheckRequest{})
		if got := status.Code(err) == codes.Unimplemented; got != tc.ok {
			t.Errorf("%s on the access-log port: %v", name, err)
		}
	}
	err := run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--grpc-tls-allowed-clients", "edge.mesh"}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "both a certificate and a key") {
		t.Errorf("allow-list without TLS: %v", err)
	}
	err = run(context.Background(), []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--grpc-tls-cert", ca.cert, "--grpc-tls-key", ca.key, "--grpc-tls-client-ca", ca.File, "--grpc-tls-allowed-clients", "*.mesh"}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no wildcard") {
		t.Errorf("wildcard allowed: %v", err)
	}
}

// No secret reaches the startup log: the failures token (from the
// environment), and the password of a database URL, a NATS URL and
// NATS_PASSWORD.
func TestServeLogsNoSecret(t *testing.T) {
	_, _, logs, stop := startServe(t, map[string]string{
		"RATELIMIT_AUTHZ_FAILURES_TOKEN": "tok-SECRET1",
		"DATABASE_URL":                   "postgres://limits:pw-SECRET2@127.0.0.1:1/limits?connect_timeout=1",
		"RATELIMIT_AUTHZ_LOG_LEVEL":      "debug",
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "SECRET") {
		t.Errorf("a secret is in the log:\n%s", logs)
	}
}
