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

// noopAuthz and noopRLS answer every Check and ShouldRateLimit with OK at
// once, from one shared response: what is left is the cost of the gRPC
// call itself (decode the request, HTTP/2, encode the answer), the floor
// of any such server. They are the servers anyone would write first:
// generated code, nothing else.
type noopAuthz struct {
	authv3.UnimplementedAuthorizationServer
	ok *authv3.CheckResponse
}

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

// shutdownTimeout bounds the graceful stop of the servers this tool runs.
const shutdownTimeout = 5 * time.Second

// serveNoop runs the no-ops behind the product's own gRPC and HTTP stack
// (internal/server: the same listeners, options and metrics endpoint, and
// Go's profiles on pprofAddr when set) until ctx ends.
func serveNoop(ctx context.Context, c serveConfig, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	authz, rls := noops()
	srv, err := server.New(server.Config{GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr, PprofAddr: c.pprofAddr, ShutdownTimeout: shutdownTimeout},
		server.Services{Authz: authz, RateLimit: rls}, reg, log)
	if err != nil {
		return err
	}
	err = srv.Run(ctx)
	srv.Close()
	return err
}

// upstreamHandler is the application behind Envoy: 200 and a small JSON
// body for everything, the request body read and dropped.
func upstreamHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`+"\n")
	})
}

func serveUpstream(ctx context.Context, addr string, log *slog.Logger) error {
	log.Info("upstream serving", "addr", addr)
	return serveAll(ctx, httpService(addr, upstreamHandler()))
}

// serveNoopGRPC serves the no-ops on a plain grpc.NewServer() with no
// options, the floor of a default-configured grpc-go server independent of
// what internal/server tunes; /healthz and /readyz on c.httpAddr and Go's
// profiles (without cmdline) on c.pprofAddr when set, each on a listener
// of its own.
func serveNoopGRPC(ctx context.Context, c serveConfig, log *slog.Logger) error {
	gs := grpc.NewServer()
	authz, rls := noops()
	authv3.RegisterAuthorizationServer(gs, authz)
	rlsv3.RegisterRateLimitServiceServer(gs, rls)
	ok := func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) }
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	services := []service{{c.grpcAddr, gs.Serve, func(ctx context.Context) {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-ctx.Done():
			gs.Stop()
		}
	}}, httpService(c.httpAddr, mux)}
	if c.pprofAddr != "" {
		pm := http.NewServeMux()
		pm.HandleFunc("/debug/pprof/", pprof.Index)
		pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
		services = append(services, httpService(c.pprofAddr, pm))
	}
	log.Info("default grpc-go no-op serving", "grpc", c.grpcAddr, "http", c.httpAddr, "pprof", c.pprofAddr)
	return serveAll(ctx, services...)
}

// service is one listener's server for serveAll: how it serves, and how it
// stops, gracefully until its context ends and then at once.
type service struct {
	addr  string
	serve func(net.Listener) error
	stop  func(context.Context)
}

func httpService(addr string, h http.Handler) service {
	s := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	return service{addr, s.Serve, func(ctx context.Context) {
		if s.Shutdown(ctx) != nil {
			s.Close()
		}
	}}
}

// serveAll listens on every service's address, then serves until ctx ends
// or one fails, then stops them, each gracefully within shutdownTimeout.
func serveAll(ctx context.Context, services ...service) error {
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
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
	}
	for _, s := range services {
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		s.stop(sctx)
		cancel()
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
