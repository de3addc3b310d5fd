package rls_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
)

// benchConfig has limits a benchmark never reaches (allowed) and one it
// fills first (denied).
const benchConfig = `bench.yaml:
domain: bench
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 2000000000}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 2000000000}
  - key: c
    descriptors:
      - key: d
        rate_limit: {unit: hour, requests_per_unit: 2000000000}
  - key: full
    rate_limit: {unit: minute, requests_per_unit: 1}
`

var benchRequests = map[string]*rlsv3.RateLimitRequest{
	"1/allowed": {Domain: "bench", Descriptors: ds(desc("a", "tenant-1"))},
	"3/allowed": {Domain: "bench", Descriptors: ds(desc("a", "tenant-1"), desc("b", "203.0.113.7"), desc("c", "x", "d", "/api/items"))},
	"1/denied":  {Domain: "bench", Descriptors: ds(desc("full", "tenant-1"))},
	"3/denied":  {Domain: "bench", Descriptors: ds(desc("a", "tenant-1"), desc("b", "203.0.113.7"), desc("full", "tenant-1"))},
}

var benchCases = []string{"1/allowed", "3/allowed", "1/denied", "3/denied"}

func newBenchHarness(b *testing.B) *harness {
	h := newHarness(b, rls.Settings{}, benchConfig)
	h.gRPCOnly()
	if _, err := h.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: ds(desc("full", "tenant-1"))}); err != nil {
		b.Fatal(err)
	}
	return h
}

func BenchmarkShouldRateLimit(b *testing.B) {
	h := newBenchHarness(b)
	ctx := context.Background()
	for _, name := range benchCases {
		req := benchRequests[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := h.svc.ShouldRateLimit(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// noop answers OK with one status per descriptor, the least any RLS
// server does: the gRPC stack's own cost.
type noop struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noop) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	r := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range r.Statuses {
		r.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 2000000000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining:     1999999999,
			DurationUntilReset: durationpb.New(1e9),
		}
	}
	return r, nil
}

// serveLoopback serves srv on a loopback TCP listener and returns a
// client of it.
func serveLoopback(b *testing.B, srv rlsv3.RateLimitServiceServer) rlsv3.RateLimitServiceClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, srv)
	go g.Serve(lis)
	b.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func benchGRPC(b *testing.B, c rlsv3.RateLimitServiceClient) {
	ctx := context.Background()
	for _, name := range benchCases {
		req := benchRequests[name]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			start := cpuTime(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.ShouldRateLimit(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			// CPU of the whole process (client and server) per call: the
			// wall time per call of a parallel benchmark hides it.
			b.ReportMetric(float64((cpuTime(b)-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkShouldRateLimitGRPC and BenchmarkNoopRLSGRPC run the same
// requests through the same loopback gRPC stack, client included: their
// ratio is what the service adds to a call.
func BenchmarkShouldRateLimitGRPC(b *testing.B) {
	benchGRPC(b, serveLoopback(b, newBenchHarness(b).svc))
}

func BenchmarkNoopRLSGRPC(b *testing.B) {
	benchGRPC(b, serveLoopback(b, noop{}))
}
