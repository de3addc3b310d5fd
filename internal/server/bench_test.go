package server_test

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// BenchmarkGRPCCheck is one Check round trip over loopback through the
// server's listener and options (the handler answers at once), to show
// what the transport and its bounds cost per check: with the default
// stream workers and with a goroutine per call, 16 checks in flight per
// GOMAXPROCS on one connection.
func BenchmarkGRPCCheck(b *testing.B) {
	for _, bc := range []struct {
		name    string
		workers int
	}{{"workers=default", 0}, {"workers=off", -1}} {
		b.Run(bc.name, func(b *testing.B) { benchGRPCCheck(b, bc.workers) })
	}
}

func benchGRPCCheck(b *testing.B, workers int) {
	srv, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", StreamWorkers: workers},
		server.Services{Authz: allowAll{}}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()

	conn, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := authv3.NewAuthorizationClient(conn)
	req := benchRequest()
	if _, err := client.Check(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetParallelism(16)
	cpu0 := processCPU(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := client.Check(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	// CPU time, client and server together: on a shared machine it
	// varies far less than the wall time per check.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchRequest is a CheckRequest of the size Envoy sends for an API call.
func benchRequest() *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "192.0.2.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 41234}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/activities", Host: "api.example.com",
			Headers: map[string]string{
				":method": "POST", ":path": "/api/activities", ":authority": "api.example.com", ":scheme": "https",
				"x-tenant-id": "acme", "user-agent": "bench/1.0", "content-type": "application/json",
				"x-forwarded-for": "203.0.113.7", "x-envoy-external-address": "203.0.113.7",
				"x-request-id": "2f6b1c3e-8d4a-4a53-9f0e-0c1d2e3f4a5b",
			},
		}},
	}}
}
