package checkh2_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// BenchmarkCheckLoopback calls Check over loopback with a grpc-go client,
// many in flight on one connection, against the product's handler served
// by grpc-go (as on the gRPC port) and by this package. cpu-µs/op is the
// process's CPU (client and server both) per check: compare the two
// within one run.
func BenchmarkCheckLoopback(b *testing.B) {
	svc := newAuthz(b)
	req := upload("bench")
	req.Attributes.Request.Http.Path = "/not/limited" // allowed, no bucket spent
	serveGRPC := func(b *testing.B) string {
		s := grpc.NewServer(grpc.ForceServerCodecV2(checkgrpc.NewCodec()))
		checkgrpc.Register(s, svc)
		return serveLoopback(b, s)
	}
	serveLean := func(b *testing.B) string {
		_, addr := serve(b, checkh2.Config{Check: svc})
		return addr
	}
	for _, tc := range []struct {
		name  string
		serve func(*testing.B) string
	}{{"grpc-go", serveGRPC}, {"checkh2", serveLean}} {
		b.Run(tc.name, func(b *testing.B) {
			client := authv3.NewAuthorizationClient(dialGRPC(b, tc.serve(b)))
			loopback(b, func(c context.Context) error { _, err := client.Check(c, req); return err })
		})
	}
}

// BenchmarkRateLimitLoopback is BenchmarkCheckLoopback for
// ShouldRateLimit on the product's rate limit service, allowed (counted)
// and denied: grpc-go (the gRPC port) against this package.
func BenchmarkRateLimitLoopback(b *testing.B) {
	svc := checkh2.NewTestRLS(b, nil)
	serveGRPC := func(b *testing.B) string {
		s := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(s, svc)
		return serveLoopback(b, s)
	}
	serveLean := func(b *testing.B) string {
		_, addr := serve(b, checkh2.Config{RateLimit: svc})
		return addr
	}
	for _, tc := range []struct {
		name  string
		serve func(*testing.B) string
	}{{"grpc-go", serveGRPC}, {"checkh2", serveLean}} {
		for _, key := range []string{"allowed", "denied"} {
			b.Run(tc.name+"/"+key, func(b *testing.B) {
				client := rlsv3.NewRateLimitServiceClient(dialGRPC(b, tc.serve(b)))
				req := checkh2.RLSRequest(key, "bench")
				loopback(b, func(c context.Context) error { _, err := client.ShouldRateLimit(c, req); return err })
			})
		}
	}
}

// serveLoopback serves s on a loopback port until the test ends and
// returns its address.
func serveLoopback(b testing.TB, s *grpc.Server) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(lis)
	b.Cleanup(s.Stop)
	return lis.Addr().String()
}

// loopback runs call, once first and then many in flight at once, and
// reports the process's CPU (client and server both) per call.
func loopback(b *testing.B, call func(context.Context) error) {
	if err := call(ctx(b)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(8)
	c0 := cpuTime(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := ctx(b)
		for pb.Next() {
			if err := call(c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((cpuTime(b)-c0).Microseconds())/float64(b.N), "cpu-µs/op")
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
