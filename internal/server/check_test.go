package server_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// leanAllow answers every check on the lean path with a prebuilt allow
// whose message says which path answered.
type leanAllow struct {
	authv3.UnimplementedAuthorizationServer
	pre *checkwire.Prebuilt
}

func newLeanAllow(t *testing.T) leanAllow {
	pre, err := checkwire.Prebuild(&authv3.CheckResponse{HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}})
	if err != nil {
		t.Fatal(err)
	}
	return leanAllow{pre: pre}
}

func (l leanAllow) Decoder() *checkwire.Decoder { return checkwire.NewDecoder(nil, false) }
func (l leanAllow) CheckWire(context.Context, *checkwire.Request) (checkwire.Response, error) {
	return l.pre.Response(), nil
}

func TestCheckListener(t *testing.T) {
	srv, reg := start(t, server.Config{CheckAddr: "127.0.0.1:0"}, server.Services{Authz: newLeanAllow(t), RateLimit: rlsv3.UnimplementedRateLimitServiceServer{}})
	if srv.CheckAddr() == nil || srv.CheckAddr().String() == srv.GRPCAddr().String() {
		t.Fatalf("check address %v", srv.CheckAddr())
	}
	conn, ctx := dialLean(t, srv)
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{})
	if err != nil || resp.GetOkResponse() == nil {
		t.Fatalf("Check on the lean listener: %v, %v", resp, err)
	}
	waitFor(t, func() bool {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
		return err == nil && h.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	// An RLS service without the lean path stays on the gRPC port.
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("RLS on the lean listener: %v, want Unimplemented", err)
	}
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("health of RLS on the lean listener: %v, want NotFound", err)
	}
	if n := metric(t, reg, "ratelimit_authz_server_connections_open", "check"); n != 1 {
		t.Fatalf("check connections_open %v, want 1", n)
	}
}

// dialLean is a client of srv's lean listener, and a context for its
// calls, both ended with the test.
func dialLean(t *testing.T, srv *server.Server) (*grpc.ClientConn, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient(srv.CheckAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return conn, ctx
}

// leanRLS answers every ShouldRateLimit OVER_LIMIT, on both paths.
type leanRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (leanRLS) RateLimitDecoder() *checkwire.RateLimitDecoder {
	return checkwire.NewRateLimitDecoder(1, 1)
}
func (leanRLS) AppendShouldRateLimit(_ context.Context, _ *checkwire.RateLimitRequest, b []byte) ([]byte, checkwire.Hold, error) {
	b, err := checkwire.AppendRateLimitResponse(b, &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT})
	return b, nil, err
}

// A rate limit service with the lean path is served on the lean listener
// too, its health SERVING there.
func TestCheckListenerRateLimit(t *testing.T) {
	srv, _ := start(t, server.Config{CheckAddr: "127.0.0.1:0"}, server.Services{Authz: newLeanAllow(t), RateLimit: leanRLS{}})
	conn, ctx := dialLean(t, srv)
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("ShouldRateLimit on the lean listener: %v, %v", resp, err)
	}
	waitFor(t, func() bool {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
		return err == nil && h.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
}

// The lean listener takes the gRPC port's mTLS allow-list.
func TestCheckListenerAllowList(t *testing.T) {
	p := newPKI(t)
	srv, reg := start(t, server.Config{CheckAddr: "127.0.0.1:0", TLS: server.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.File,
		AllowedClients: []string{"edge.mesh"}}}, server.Services{Authz: newLeanAllow(t)})
	edge := p.clientCert(t, "edge", "edge", []string{"edge.mesh"}, nil)
	other := p.clientCert(t, "other", "edge.mesh", []string{"other.mesh"}, nil)
	if err := check(t, srv.CheckAddr().String(), p.creds(edge)); err != nil {
		t.Fatalf("allowed client refused: %v", err)
	}
	if err := check(t, srv.CheckAddr().String(), p.creds(other)); err == nil {
		t.Fatal("a client not allowed was answered")
	}
	if err := check(t, srv.CheckAddr().String(), insecure.NewCredentials()); err == nil {
		t.Fatal("a plaintext client was answered on a TLS listener")
	}
	if n := metric(t, reg, "ratelimit_authz_server_tls_clients_refused_total", "check"); n < 1 {
		t.Fatalf("check tls_clients_refused_total %v", n)
	}
}

func TestCheckListenerErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg server.Config
		svc server.Services
	}{
		"not lean":         {server.Config{CheckAddr: "127.0.0.1:0"}, server.Services{Authz: allowAll{}}},
		"the gRPC address": {server.Config{GRPCAddr: "127.0.0.1:19411", CheckAddr: "127.0.0.1:19411"}, server.Services{Authz: newLeanAllow(t)}},
		"bad address":      {server.Config{CheckAddr: "256.0.0.1:1"}, server.Services{Authz: newLeanAllow(t)}},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.cfg.GRPCAddr == "" {
				tc.cfg.GRPCAddr = "127.0.0.1:0"
			}
			tc.cfg.HTTPAddr = "127.0.0.1:0"
			srv, err := server.New(tc.cfg, tc.svc, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err == nil {
				srv.Close()
				t.Fatal("New accepted it")
			}
		})
	}
}
