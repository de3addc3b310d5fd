package checkh2_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// newAuthz is the product's Check handler on the shipped configuration,
// on a clock that stands still (the upload bucket allows 10 per second
// per tenant).
func newAuthz(t testing.TB) *authz.Service {
	t.Helper()
	r, err := configfile.Parse(config.Default(), "ratelimit.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := match.New(r.Descriptors())
	if err != nil {
		t.Fatal(err)
	}
	store, err := counter.New(r.Counter)
	if err != nil {
		t.Fatal(err)
	}
	clock := &testclock.Clock{}
	clock.Set(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	svc, err := authz.New(authz.ConfigFrom(snapshottest.ByIndex(t, r)), m, store, snapshot.NewResolver(snapshottest.ByIndex(t, r), nil),
		prometheus.NewRegistry(), slog.New(slog.DiscardHandler), authz.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// serve starts a server for cfg (Check defaulting to newAuthz) on a
// loopback port and stops it at the end of the test.
func serve(t testing.TB, cfg checkh2.Config) (*checkh2.Server, string) {
	t.Helper()
	if cfg.Check == nil {
		cfg.Check = newAuthz(t)
	}
	s, err := checkh2.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Close()
		select {
		case err := <-done:
			if !errors.Is(err, checkh2.ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return s, lis.Addr().String()
}

func dialGRPC(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func upload(tenant string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "192.0.2.10", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/converger/uploads", Host: "api.example",
			Headers: map[string]string{":method": "POST", ":path": "/api/converger/uploads", ":authority": "api.example", "x-tenant-id": tenant},
		}},
	}}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func retryAfter(resp *authv3.CheckResponse) string {
	for _, h := range resp.GetDeniedResponse().GetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			return h.GetHeader().GetValue()
		}
	}
	return ""
}

// A grpc-go client calls Check and health on the lean listener as on the
// gRPC port: allowed, then denied 429 with Retry-After past the bucket.
func TestGRPCClientCheck(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	client := authv3.NewAuthorizationClient(dialGRPC(t, addr))
	for i := range 10 {
		resp, err := client.Check(ctx(t), upload("t1"))
		if err != nil {
			t.Fatalf("check %d: %v", i+1, err)
		}
		if resp.GetStatus().GetCode() != int32(codes.OK) || resp.GetOkResponse() == nil {
			t.Fatalf("check %d: not allowed: %v", i+1, resp)
		}
	}
	resp, err := client.Check(ctx(t), upload("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetStatus().GetCode() != int32(codes.ResourceExhausted) || resp.GetDeniedResponse().GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Fatalf("11th upload: %v, want denied 429", resp)
	}
	if ra := retryAfter(resp); ra == "" {
		t.Fatalf("denied without retry-after: %v", resp)
	}
	// Another tenant has its own budget.
	if resp, err := client.Check(ctx(t), upload("t2")); err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
		t.Fatalf("other tenant: %v, %v", resp, err)
	}
}

// Many checks in flight at once on one connection are each answered.
func TestGRPCClientConcurrent(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	client := authv3.NewAuthorizationClient(dialGRPC(t, addr))
	const n = 200
	errs := make(chan error, n)
	var allowed atomic.Int32
	for i := range n {
		go func() {
			resp, err := client.Check(ctx(t), upload("c"+string(rune('a'+i%20))))
			if err == nil && resp.GetStatus().GetCode() == int32(codes.OK) {
				allowed.Add(1)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// 20 tenants of 10 each: exactly the budget.
	if got := allowed.Load(); got != n {
		t.Fatalf("%d allowed of %d within budget", got, n)
	}
}

func TestGRPCClientHealth(t *testing.T) {
	var serving atomic.Bool
	_, addr := serve(t, checkh2.Config{Serving: serving.Load})
	h := healthpb.NewHealthClient(dialGRPC(t, addr))
	for _, want := range []healthpb.HealthCheckResponse_ServingStatus{healthpb.HealthCheckResponse_NOT_SERVING, healthpb.HealthCheckResponse_SERVING} {
		serving.Store(want == healthpb.HealthCheckResponse_SERVING)
		for _, svc := range []string{"", authv3.Authorization_ServiceDesc.ServiceName} {
			resp, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetStatus() != want {
				t.Fatalf("health %q: %v, want %v", svc, resp.GetStatus(), want)
			}
		}
	}
	_, err := h.Check(ctx(t), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("health of a service not served here: %v, want NotFound", err)
	}
}

func TestGRPCClientErrors(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxRecvMsgBytes: 1 << 10})
	cc := dialGRPC(t, addr)
	client := authv3.NewAuthorizationClient(cc)

	_, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx(t), &rlsv3.RateLimitRequest{Domain: "d"})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("RLS on the lean listener: %v, want Unimplemented", err)
	}
	_, err = healthpb.NewHealthClient(cc).List(ctx(t), &healthpb.HealthListRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("health List: %v, want Unimplemented", err)
	}

	big := upload("t")
	big.Attributes.Request.Http.Headers["x-pad"] = strings.Repeat("p", 2<<10)
	_, err = client.Check(ctx(t), big)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "larger than max") {
		t.Errorf("a request over the max size: %v, want ResourceExhausted", err)
	}

	_, err = client.Check(ctx(t), upload("t"), grpc.UseCompressor(gzip.Name))
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("a compressed request: %v, want Unimplemented", err)
	}

	// The connection is still good for the next check.
	if _, err := client.Check(ctx(t), upload("t")); err != nil {
		t.Fatalf("a check after the errors: %v", err)
	}
}

// The handler's error reaches the client as its gRPC status.
func TestHandlerError(t *testing.T) {
	_, addr := serve(t, checkh2.Config{Check: failing{newAuthz(t)}})
	_, err := authv3.NewAuthorizationClient(dialGRPC(t, addr)).Check(ctx(t), upload("t"))
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "no decision: 100% down" {
		t.Fatalf("got %v, want Unavailable with the handler's message", err)
	}
}

type failing struct{ *authz.Service }

func (failing) CheckWire(context.Context, *checkwire.Request) (checkwire.Response, error) {
	return checkwire.Response{}, status.Error(codes.Unavailable, "no decision: 100% down")
}

func TestTLS(t *testing.T) {
	ca := testcert.New(t)
	srvCert := ca.KeyPair(t, testcert.Leaf{Name: "server", Usage: x509.ExtKeyUsageServerAuth, DNS: []string{"localhost"}})
	_, addr := serve(t, checkh2.Config{TLS: &tls.Config{Certificates: []tls.Certificate{srvCert}, MinVersion: tls.VersionTLS12}})
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, ServerName: "localhost"})
	client := authv3.NewAuthorizationClient(dialGRPC(t, addr, grpc.WithTransportCredentials(creds)))
	resp, err := client.Check(ctx(t), upload("t"))
	if err != nil || resp.GetStatus().GetCode() != int32(codes.OK) {
		t.Fatalf("check over TLS: %v, %v", resp, err)
	}

	// A TLS client without h2 in ALPN is refused.
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err == nil || errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("an http/1.1 TLS client was served: %v", err)
	}
}
