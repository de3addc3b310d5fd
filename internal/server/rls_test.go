package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// gatedRLS answers OVER_LIMIT once its gate opens, counting calls.
type gatedRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	g       atomic.Pointer[gate]
	calls   atomic.Int64
	started chan struct{} // gets a value as each call starts, without blocking
}

func newGatedRLS() *gatedRLS {
	r := &gatedRLS{started: make(chan struct{}, 16)}
	r.g.Store(newGate())
	return r
}

func (r *gatedRLS) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	r.calls.Add(1)
	select {
	case r.started <- struct{}{}:
	default:
	}
	select {
	case <-r.g.Load().open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
}

func rlsClient(t *testing.T, addr string, creds credentials.TransportCredentials) (rlsv3.RateLimitServiceClient, healthpb.HealthClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
}

var rlsRequest = &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}

const rlsName = "envoy.service.ratelimit.v3.RateLimitService"

// ShouldRateLimit is served on the gRPC port beside Check, with the same
// health (SERVING, then NOT_SERVING through the drain) and graceful stop
// (a call in flight completes); a separate access-log port does not serve
// it.
func TestRateLimitService(t *testing.T) {
	svc := newGatedRLS()
	srv, err := server.New(server.Config{
		GRPCAddr: "127.0.0.1:0", AccessLogAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		DrainDelay: 500 * time.Millisecond, ShutdownTimeout: 20 * time.Second,
	}, server.Services{Authz: allowAll{}, RateLimit: svc, AccessLog: &streams{closing: make(chan struct{})}}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()

	client, health := rlsClient(t, srv.GRPCAddr().String(), insecure.NewCredentials())
	rctx, rcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer rcancel()
	waitFor(t, func() bool {
		r, err := health.Check(rctx, &healthpb.HealthCheckRequest{Service: rlsName})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	svc.g.Load().release()
	if r, err := client.ShouldRateLimit(rctx, rlsRequest); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("ShouldRateLimit: %v, %v", r, err)
	}
	alsClient, _ := rlsClient(t, srv.AccessLogAddr().String(), insecure.NewCredentials())
	if _, err := alsClient.ShouldRateLimit(rctx, rlsRequest); status.Code(err) != codes.Unimplemented {
		t.Errorf("ShouldRateLimit on the access-log port: %v, want UNIMPLEMENTED", err)
	}

	// A call in flight when the shutdown begins is answered.
	<-svc.started
	svc.g.Store(newGate())
	inflight := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(rctx, rlsRequest)
		inflight <- err
	}()
	<-svc.started
	cancel()
	waitFor(t, func() bool {
		r, err := health.Check(rctx, &healthpb.HealthCheckRequest{Service: rlsName})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if code := get(t, "http://"+srv.HTTPAddr().String()+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz %d during the drain", code)
	}
	svc.g.Load().release()
	if err := <-inflight; err != nil {
		t.Errorf("the call in flight at shutdown: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-rctx.Done():
		t.Fatal("Run did not return")
	}
}

// Without the service, the port answers it UNIMPLEMENTED and health does
// not know its name.
func TestRateLimitServiceOff(t *testing.T) {
	srv, _ := start(t, server.Config{}, server.Services{Authz: allowAll{}})
	client, health := rlsClient(t, srv.GRPCAddr().String(), insecure.NewCredentials())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.ShouldRateLimit(ctx, rlsRequest); status.Code(err) != codes.Unimplemented {
		t.Errorf("ShouldRateLimit without the service: %v, want UNIMPLEMENTED", err)
	}
	if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: rlsName}); status.Code(err) != codes.NotFound {
		t.Errorf("health of the service: %v, want NOT_FOUND", err)
	}
}

// The allow-list of the gRPC port holds for ShouldRateLimit as for Check.
func TestRateLimitMutualTLSAllowList(t *testing.T) {
	p := newPKI(t)
	svc := newGatedRLS()
	svc.g.Load().release()
	srv, _ := start(t, server.Config{TLS: server.TLS{
		CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File,
		AllowedClients: []string{"edge-envoy.mesh.internal"},
	}}, server.Services{Authz: allowAll{}, RateLimit: svc})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	allowed, _ := rlsClient(t, srv.GRPCAddr().String(), p.creds(p.clientCert(t, "ok", "x", []string{"edge-envoy.mesh.internal"}, nil)))
	if _, err := allowed.ShouldRateLimit(ctx, rlsRequest); err != nil {
		t.Errorf("allowed client: %v", err)
	}
	other, _ := rlsClient(t, srv.GRPCAddr().String(), p.creds(p.clientCert(t, "other", "edge-envoy.mesh.internal", []string{"attacker.mesh.internal"}, nil)))
	if _, err := other.ShouldRateLimit(ctx, rlsRequest); err == nil {
		t.Error("a client outside the allow-list was answered")
	}
	plain, _ := rlsClient(t, srv.GRPCAddr().String(), insecure.NewCredentials())
	if _, err := plain.ShouldRateLimit(ctx, rlsRequest); err == nil {
		t.Error("a plaintext client was answered")
	}
	if n := svc.calls.Load(); n != 1 {
		t.Errorf("%d calls reached the service, want 1", n)
	}
}
