package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// noopAuthz answers every Check with OK at once, from one shared response:
// what is left is the cost of the gRPC call itself (decode the request,
// HTTP/2, encode the answer), the floor of any ext_authz server.
type noopAuthz struct {
	authv3.UnimplementedAuthorizationServer
	ok *authv3.CheckResponse
}

func newNoopAuthz() *noopAuthz {
	return &noopAuthz{ok: &authv3.CheckResponse{Status: &rpcstatus.Status{}}}
}

func (n *noopAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return n.ok, nil
}

// noopRLS answers every ShouldRateLimit with OK at once, from one shared
// response: the floor of any rate limit service on this gRPC stack, as
// noopAuthz is of any ext_authz server.
type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok *rlsv3.RateLimitResponse
}

func newNoopRLS() *noopRLS {
	return &noopRLS{ok: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}}
}

func (n *noopRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return n.ok, nil
}

// serveConfig are the flags of the no-op servers.
type serveConfig struct {
	grpcAddr, httpAddr, pprofAddr string
	lifetime                      time.Duration
}

func (c serveConfig) validate() error {
	if c.lifetime <= 0 || c.lifetime > 24*time.Hour {
		return fmt.Errorf("--lifetime %v: must be positive and at most 24h", c.lifetime)
	}
	return nil
}

// serveNoop runs the no-op Check and ShouldRateLimit behind the product's own gRPC and HTTP
// stack (internal/server: the same listeners, options and metrics endpoint, and
// Go's profiles on pprofAddr when set, as serve --pprof-addr serves them)
// until ctx ends or the lifetime is over.
func serveNoop(ctx context.Context, c serveConfig, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := server.New(server.Config{GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr, PprofAddr: c.pprofAddr, ShutdownTimeout: shutdownTimeout},
		server.Services{Authz: newNoopAuthz(), RateLimit: newNoopRLS()}, reg, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.lifetime)
	defer cancel()
	err = srv.Run(ctx)
	srv.Close()
	return err
}

// shutdownTimeout bounds the graceful stop of the servers this tool runs.
const shutdownTimeout = 5 * time.Second

// upstreamHandler is the application behind Envoy: 200 and a small JSON
// body for everything, the request body read and dropped.
func upstreamHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`+"\n")
	})
}

// serveUpstream serves upstreamHandler on addr until ctx ends or the
// lifetime is over.
func serveUpstream(ctx context.Context, addr string, lifetime time.Duration, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: upstreamHandler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("upstream serving", "addr", lis.Addr().String())
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	<-errc
	return nil
}
