package server_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
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

	"github.com/ratelimit-authz/ratelimit-authz/pkg/server"
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

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Shutdown: readiness drops first, then open access-log streams are ended
// so that the graceful stop completes instead of running into its timeout.
func TestShutdownOrder(t *testing.T) {
	logs := &syncBuf{}
	srv, err := server.New(server.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		DrainDelay: 200 * time.Millisecond, ShutdownTimeout: 30 * time.Second,
	}, server.Services{Authz: allowAll{}, AccessLog: &streams{closing: make(chan struct{})}},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(logs, nil)))
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

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
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
