package server_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

type allowAll struct {
	authv3.UnimplementedAuthorizationServer
}

func (allowAll) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{}, nil
}

// streams holds access-log streams open until CloseStreams, as Envoy does.
type streams struct {
	alsv3.UnimplementedAccessLogServiceServer
	once    sync.Once
	closing chan struct{}
}

func (s *streams) StreamAccessLogs(st grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	select {
	case <-s.closing:
		return status.Error(codes.Unavailable, "shutting down")
	case <-st.Context().Done():
		return st.Context().Err()
	}
}

func (s *streams) CloseStreams() { s.once.Do(func() { close(s.closing) }) }

// Shutdown: readiness drops first, then open access-log streams are ended
// so that the graceful stop completes instead of running into its timeout.
func TestShutdownOrder(t *testing.T) {
	logs := &logbuf.Buffer{}
	reg := prometheus.NewRegistry()
	srv, err := server.New(server.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		DrainDelay: 2 * time.Second, ShutdownTimeout: 30 * time.Second,
	}, server.Services{Authz: allowAll{}, AccessLog: &streams{closing: make(chan struct{})}},
		reg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	health := healthpb.NewHealthClient(conn)
	waitFor(t, func() bool {
		r, err := health.Check(rctx, &healthpb.HealthCheckRequest{Service: "envoy.service.auth.v3.Authorization"})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if code := get(t, "http://"+srv.HTTPAddr().String()+"/readyz"); code != 200 {
		t.Fatalf("readyz %d before shutdown", code)
	}
	if v := scrape.Must(t, reg, "ratelimit_authz_ready"); v != 1 {
		t.Errorf("ready %v while serving, want 1", v)
	}
	stream, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&alsv3.StreamAccessLogsMessage{}); err != nil {
		t.Fatal(err)
	}

	cancel()
	// During the drain: not ready, health NOT_SERVING, checks still served.
	waitFor(t, func() bool {
		return get(t, "http://"+srv.HTTPAddr().String()+"/readyz") == http.StatusServiceUnavailable
	})
	if _, err := authv3.NewAuthorizationClient(conn).Check(rctx, &authv3.CheckRequest{}); err != nil {
		t.Errorf("check during drain: %v", err)
	}
	// The metrics are still served during the drain, and say not ready.
	if _, page := scrape.Page(t, "http://"+srv.HTTPAddr().String()+"/metrics"); !strings.Contains(page, "\nratelimit_authz_ready 0\n") {
		t.Errorf("/metrics during the drain has no ratelimit_authz_ready 0:\n%s", page)
	}
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Errorf("access-log stream at shutdown: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-rctx.Done():
		t.Fatal("Run did not return")
	}
	if strings.Contains(logs.String(), "timed out") {
		t.Errorf("graceful stop ran into its timeout:\n%s", logs)
	}
}

func TestNewErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}, server.Services{}, prometheus.NewRegistry(), log); err == nil {
		t.Error("no authz service accepted")
	}
	if _, err := server.New(server.Config{GRPCAddr: "256.0.0.1:1", HTTPAddr: "127.0.0.1:0"}, server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), log); err == nil || !strings.Contains(err.Error(), "listen gRPC") {
		t.Errorf("bad address: %v", err)
	}
}

// waitFor polls ok until it holds, for up to 10 s.
func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	poll.UntilTrue(t, 10*time.Second, 10*time.Millisecond, ok)
}

func get(t *testing.T, url string) int {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// countingStreams is an access-log service that counts the messages it
// receives, and ends its streams at CloseStreams.
type countingStreams struct {
	streams
	msgs atomic.Int64
}

func (s *countingStreams) StreamAccessLogs(st grpc.ClientStreamingServer[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]) error {
	go func() {
		for {
			if _, err := st.Recv(); err != nil {
				return
			}
			s.msgs.Add(1)
		}
	}()
	select {
	case <-s.closing:
		return status.Error(codes.Unavailable, "shutting down")
	case <-st.Context().Done():
		return st.Context().Err()
	}
}

// With an access-log address, the access-log service is served there and
// only there; Check only on the gRPC port; health on both. Shutdown ends
// the access-log streams, then stops both listeners without running into
// the timeout.
func TestAccessLogListener(t *testing.T) {
	logs := &logbuf.Buffer{}
	als := &countingStreams{streams: streams{closing: make(chan struct{})}}
	srv, err := server.New(server.Config{
		GRPCAddr: "127.0.0.1:0", AccessLogAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		DrainDelay: 100 * time.Millisecond, ShutdownTimeout: 30 * time.Second,
	}, server.Services{Authz: allowAll{}, AccessLog: als}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer cancel()
	if srv.AccessLogAddr() == nil || srv.AccessLogAddr().String() == srv.GRPCAddr().String() {
		t.Fatalf("access-log address %v", srv.AccessLogAddr())
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	conn := func(addr string) *grpc.ClientConn {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	checkConn, alsConn := conn(srv.GRPCAddr().String()), conn(srv.AccessLogAddr().String())
	for _, c := range []*grpc.ClientConn{checkConn, alsConn} {
		waitFor(t, func() bool {
			r, err := healthpb.NewHealthClient(c).Check(rctx, &healthpb.HealthCheckRequest{})
			return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}
	if _, err := authv3.NewAuthorizationClient(checkConn).Check(rctx, &authv3.CheckRequest{}); err != nil {
		t.Errorf("check on the gRPC port: %v", err)
	}
	if _, err := authv3.NewAuthorizationClient(alsConn).Check(rctx, &authv3.CheckRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("check on the access-log port: %v, want UNIMPLEMENTED", err)
	}
	// A client of the Check port cannot report access-log entries.
	bad, err := alsv3.NewAccessLogServiceClient(checkConn).StreamAccessLogs(rctx)
	if err == nil {
		bad.Send(&alsv3.StreamAccessLogsMessage{})
		_, err = bad.CloseAndRecv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("access log on the gRPC port: %v, want UNIMPLEMENTED", err)
	}
	stream, err := alsv3.NewAccessLogServiceClient(alsConn).StreamAccessLogs(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&alsv3.StreamAccessLogsMessage{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return als.msgs.Load() == 1 })

	cancel()
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Errorf("access-log stream at shutdown: %v, want UNAVAILABLE", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-rctx.Done():
		t.Fatal("Run did not return")
	}
	if strings.Contains(logs.String(), "timed out") {
		t.Errorf("graceful stop ran into its timeout:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "access_log="+srv.AccessLogAddr().String()) {
		t.Errorf("serving line lacks the access-log address:\n%s", logs)
	}
}

// Each gRPC listener has its own allow-list: a client allowed to call
// Check is refused on the access-log port unless it is on that list too.
func TestAccessLogAllowList(t *testing.T) {
	p := newPKI(t)
	als := &countingStreams{streams: streams{closing: make(chan struct{})}}
	srv, reg := start(t, server.Config{
		AccessLogAddr: "127.0.0.1:0",
		TLS: server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File,
			AllowedClients: []string{"edge.mesh", "internal.mesh"}},
		AccessLogAllowedClients: []string{"edge.mesh"},
	}, server.Services{Authz: allowAll{}, AccessLog: als})
	edge := p.clientCert(t, "edge", "edge", []string{"edge.mesh"}, nil)
	internal := p.clientCert(t, "internal", "internal", []string{"internal.mesh"}, nil)
	for name, c := range map[string]tls.Certificate{"edge": edge, "internal": internal} {
		if err := check(t, srv.GRPCAddr().String(), p.creds(c)); err != nil {
			t.Errorf("%s: check refused: %v", name, err)
		}
	}
	report := func(c tls.Certificate) error {
		conn, err := grpc.NewClient(srv.AccessLogAddr().String(), grpc.WithTransportCredentials(p.creds(c)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := alsv3.NewAccessLogServiceClient(conn).StreamAccessLogs(ctx, grpc.WaitForReady(false))
		if err != nil {
			return err
		}
		if err := st.Send(&alsv3.StreamAccessLogsMessage{}); err != nil {
			_, err = st.CloseAndRecv()
			return err
		}
		// The stream stays open: its message arrived or the handshake failed.
		for als.msgs.Load() == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if s := conn.GetState(); s.String() == "TRANSIENT_FAILURE" {
				return errors.New("connection failed")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil
	}
	if err := report(internal); err == nil {
		t.Error("internal client reported access-log entries")
	}
	if n := als.msgs.Load(); n != 0 {
		t.Fatalf("%d access-log messages from a client not allowed", n)
	}
	if err := report(edge); err != nil {
		t.Errorf("edge client: %v", err)
	}
	if n := metric(t, reg, "ratelimit_authz_server_tls_clients_refused_total", "access_log"); n < 1 {
		t.Errorf("access_log tls_clients_refused_total %v", n)
	}
	if n := metric(t, reg, "ratelimit_authz_server_tls_clients_refused_total", "grpc"); n != 0 {
		t.Errorf("grpc tls_clients_refused_total %v", n)
	}
}

// Profiles are served on their own address only, never the command line
// nor the environment.
func TestPprof(t *testing.T) {
	t.Setenv("RATELIMIT_AUTHZ_TEST_SECRET", "env-secret-7f3a")
	srv, _ := start(t, server.Config{PprofAddr: "127.0.0.1:0"}, server.Services{Authz: allowAll{}})
	base := "http://" + srv.PprofAddr().String()
	code, body := scrape.Page(t, base+"/debug/pprof/")
	if code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index: %d", code)
	}
	for _, p := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=2",
		"/debug/pprof/threadcreate?debug=1", "/debug/pprof/allocs?debug=1"} {
		code, body := scrape.Page(t, base+p)
		if code != 200 || strings.Contains(body, "env-secret-7f3a") {
			t.Errorf("%s: %d, or the environment in the body", p, code)
		}
	}
	args := strings.Join(os.Args[1:], " ")
	for _, p := range []string{
		"/debug/pprof/cmdline", "/debug/pprof/cmdline/", "/debug/pprof/cmdline?debug=1",
		"/debug/pprof/%63mdline", "/debug/pprof/./cmdline", "/debug/pprof//cmdline", "/debug/pprof/CMDLINE",
	} {
		code, body := scrape.Page(t, base+p)
		if code == 200 || (args != "" && strings.Contains(body, args)) || strings.Contains(body, "test.") {
			t.Errorf("%s: %d %.200q", p, code, body)
		}
	}
	if code := get(t, "http://"+srv.HTTPAddr().String()+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("profiles on the HTTP address: %d", code)
	}
	if code := get(t, base+"/metrics"); code != http.StatusNotFound {
		t.Errorf("metrics on the profile address: %d", code)
	}
	// Off by default.
	off, _ := start(t, server.Config{}, server.Services{Authz: allowAll{}})
	if off.PprofAddr() != nil {
		t.Errorf("profile address %v without PprofAddr", off.PprofAddr())
	}
}

// ReadyDetail is appended to the /readyz body, ready or not, and does not
// change the status code.
func TestReadyDetail(t *testing.T) {
	warm := make(chan struct{})
	srv, reg := start(t, server.Config{
		ReadyAfter:  []<-chan struct{}{warm},
		ReadyDetail: func() string { return "overrides: from snapshot, Postgres unreachable" },
	}, server.Services{Authz: allowAll{}})
	url := "http://" + srv.HTTPAddr().String() + "/readyz"
	if code, body := scrape.Page(t, url); code != 503 || body != "not ready\noverrides: from snapshot, Postgres unreachable\n" {
		t.Errorf("before ready: %d %q", code, body)
	}
	if v := scrape.Must(t, reg, "ratelimit_authz_ready"); v != 0 {
		t.Errorf("ready %v while warming up, want 0", v)
	}
	close(warm)
	waitFor(t, func() bool { return get(t, url) == 200 })
	if v := scrape.Must(t, reg, "ratelimit_authz_ready"); v != 1 {
		t.Errorf("ready %v once /readyz answers 200, want 1", v)
	}
	if _, body := scrape.Page(t, url); body != "ready\noverrides: from snapshot, Postgres unreachable\n" {
		t.Errorf("ready: %q", body)
	}
	plain, _ := start(t, server.Config{}, server.Services{Authz: allowAll{}})
	waitFor(t, func() bool { return get(t, "http://"+plain.HTTPAddr().String()+"/readyz") == 200 })
	if _, body := scrape.Page(t, "http://"+plain.HTTPAddr().String()+"/readyz"); body != "ready\n" {
		t.Errorf("without detail: %q", body)
	}
}

func TestListenerConfigErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	als := &streams{closing: make(chan struct{})}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name string
		cfg  server.Config
		svc  server.Services
		want string
	}{
		{"access-log address without service", server.Config{AccessLogAddr: "127.0.0.1:0"}, server.Services{Authz: allowAll{}}, "no access-log service"},
		{"access-log address is the gRPC address", server.Config{GRPCAddr: "127.0.0.1:9999", AccessLogAddr: "127.0.0.1:9999"}, server.Services{Authz: allowAll{}, AccessLog: als}, "leave it empty"},
		{"access-log address taken", server.Config{AccessLogAddr: taken.Addr().String()}, server.Services{Authz: allowAll{}, AccessLog: als}, "listen access log"},
		{"pprof address is the HTTP address", server.Config{HTTPAddr: "127.0.0.1:9998", PprofAddr: "127.0.0.1:9998"}, server.Services{Authz: allowAll{}}, "own address"},
		{"pprof address taken", server.Config{PprofAddr: taken.Addr().String()}, server.Services{Authz: allowAll{}}, "listen pprof"},
		{"access-log allow-list without its address", server.Config{AccessLogAllowedClients: []string{"edge"}}, server.Services{Authz: allowAll{}, AccessLog: als}, "access-log address of its own"},
		{"empty access-log allow-list", server.Config{AccessLogAddr: "127.0.0.1:0", AccessLogAllowedClients: []string{}}, server.Services{Authz: allowAll{}, AccessLog: als}, "empty list"},
	} {
		if tc.cfg.GRPCAddr == "" {
			tc.cfg.GRPCAddr = "127.0.0.1:0"
		}
		if tc.cfg.HTTPAddr == "" {
			tc.cfg.HTTPAddr = "127.0.0.1:0"
		}
		srv, err := server.New(tc.cfg, tc.svc, prometheus.NewRegistry(), log)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if srv != nil {
			srv.Close()
		}
	}
	// A New that fails half-way releases what it bound: the same
	// addresses bind again.
	g, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gaddr := g.Addr().String()
	g.Close()
	if _, err := server.New(server.Config{GRPCAddr: gaddr, HTTPAddr: "127.0.0.1:0", PprofAddr: taken.Addr().String()},
		server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), log); err == nil {
		t.Fatal("taken pprof address accepted")
	}
	again, err := net.Listen("tcp", gaddr)
	if err != nil {
		t.Errorf("gRPC address still bound after a failed New: %v", err)
	} else {
		again.Close()
	}
}
