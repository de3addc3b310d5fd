package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"

	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// noopAuthz answers every Check with OK at once, from one shared response:
// what is left is the cost of the gRPC call itself (decode the request,
// HTTP/2, encode the answer), the floor of any ext_authz server. It is the
// ext_authz server anyone would write first: generated code, nothing else.
type noopAuthz struct {
	authv3.UnimplementedAuthorizationServer
	ok *authv3.CheckResponse
}

// noopRLS answers every ShouldRateLimit with OK at once, from one shared
// response: the floor of any rate limit service on this gRPC stack, as
// noopAuthz is of any ext_authz server.
type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok *rlsv3.RateLimitResponse
}

// noops are the two no-op services, each with its one answer.
func noops() (noopAuthz, noopRLS) {
	return noopAuthz{ok: &authv3.CheckResponse{Status: &rpcstatus.Status{}}},
		noopRLS{ok: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}}
}

func (n noopAuthz) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return n.ok, nil
}

func (n noopRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return n.ok, nil
}

// serveConfig are the flags of the servers.
type serveConfig struct {
	grpcAddr, httpAddr, pprofAddr string
	lifetime                      time.Duration
}

// serveNoop runs the no-op Check and ShouldRateLimit behind the product's own gRPC and HTTP
// stack (internal/server: the same listeners, options and metrics endpoint, and
// Go's profiles on pprofAddr when set, as serve --pprof-addr serves them)
// until ctx ends or the lifetime is over.
func serveNoop(ctx context.Context, c serveConfig, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	authz, rls := noops()
	srv, err := server.New(server.Config{GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr, PprofAddr: c.pprofAddr, ShutdownTimeout: shutdownTimeout},
		server.Services{Authz: authz, RateLimit: rls}, reg, log)
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
	log.Info("upstream serving", "addr", addr)
	return serveAll(ctx, lifetime, httpService(&http.Server{Addr: addr, Handler: upstreamHandler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}))
}

// serveNoopGRPC serves noopAuthz and noopRLS on a plain grpc.NewServer()
// with no options at c.grpcAddr, so that it is the floor of a
// default-configured grpc-go ext_authz or rate limit server on this machine, independent of what
// internal/server tunes; /healthz and /readyz on c.httpAddr, and Go's
// profiles on c.pprofAddr when set, each on a listener of its own; until
// ctx ends or the lifetime is over.
func serveNoopGRPC(ctx context.Context, c serveConfig, log *slog.Logger) error {
	gs := grpc.NewServer()
	authz, rls := noops()
	authv3.RegisterAuthorizationServer(gs, authz)
	rlsv3.RegisterRateLimitServiceServer(gs, rls)
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", ok)
	mux.Handle("GET /readyz", ok)
	services := []service{grpcService(c.grpcAddr, gs), httpService(&http.Server{Addr: c.httpAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second})}
	if c.pprofAddr != "" {
		pm := http.NewServeMux()
		pm.HandleFunc("/debug/pprof/", pprof.Index)
		pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
		services = append(services, httpService(&http.Server{Addr: c.pprofAddr, Handler: pm, ReadHeaderTimeout: 5 * time.Second}))
	}
	log.Info("default grpc-go no-op serving", "grpc", c.grpcAddr, "http", c.httpAddr, "pprof", c.pprofAddr)
	return serveAll(ctx, c.lifetime, services...)
}

// service is one listener's server for serveAll: how it serves, and how it
// stops, gracefully until its context ends and then at once.
type service struct {
	addr  string
	serve func(net.Listener) error
	stop  func(context.Context)
}

func httpService(s *http.Server) service {
	return service{s.Addr, s.Serve, func(ctx context.Context) {
		if s.Shutdown(ctx) != nil {
			s.Close()
		}
	}}
}

func grpcService(addr string, g *grpc.Server) service {
	return service{addr, g.Serve, func(ctx context.Context) {
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			g.Stop()
		}
	}}
}

// serveAll listens on every service's address and serves until ctx ends,
// the lifetime is over or one fails, then stops them, each gracefully
// within shutdownTimeout.
func serveAll(ctx context.Context, lifetime time.Duration, services ...service) error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, s := range services {
		l, err := net.Listen("tcp", s.addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", s.addr, err)
		}
		listeners = append(listeners, l)
	}
	errc := make(chan error, len(services))
	for i, s := range services {
		go func() { errc <- s.serve(listeners[i]) }()
	}
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	for _, s := range services {
		sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
		s.stop(sctx)
		scancel()
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
