package main

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/grpc"
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
	log.Info("upstream serving", "addr", addr)
	return serveAll(ctx, lifetime, nil, &http.Server{Addr: addr, Handler: upstreamHandler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute})
}

// serveNoopGRPC serves noopAuthz and noopRLS on a plain grpc.NewServer()
// with no options at c.grpcAddr, so that it is the floor of a
// default-configured grpc-go ext_authz or rate limit server on this machine, independent of what
// internal/server tunes; /healthz and /readyz on c.httpAddr, and Go's
// profiles on c.pprofAddr when set, each on a listener of its own; until
// ctx ends or the lifetime is over.
func serveNoopGRPC(ctx context.Context, c serveConfig, log *slog.Logger) error {
	gs := grpc.NewServer()
	authv3.RegisterAuthorizationServer(gs, newNoopAuthz())
	rlsv3.RegisterRateLimitServiceServer(gs, newNoopRLS())
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", ok)
	mux.Handle("GET /readyz", ok)
	servers := []*http.Server{{Addr: c.httpAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}}
	if c.pprofAddr != "" {
		pm := http.NewServeMux()
		pm.HandleFunc("/debug/pprof/", pprof.Index)
		pm.HandleFunc("/debug/pprof/profile", pprof.Profile)
		pm.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		pm.HandleFunc("/debug/pprof/trace", pprof.Trace)
		servers = append(servers, &http.Server{Addr: c.pprofAddr, Handler: pm, ReadHeaderTimeout: 5 * time.Second})
	}
	log.Info("default grpc-go no-op serving", "grpc", c.grpcAddr, "http", c.httpAddr, "pprof", c.pprofAddr)
	return serveAll(ctx, c.lifetime, &grpcServer{srv: gs, addr: c.grpcAddr}, servers...)
}

// grpcServer is a gRPC server and the address it serves on.
type grpcServer struct {
	srv  *grpc.Server
	addr string
}

// serveAll listens on every server's address (and g's when set) and
// serves until ctx ends, the lifetime is over or one fails, then stops
// them, gracefully within shutdownTimeout.
func serveAll(ctx context.Context, lifetime time.Duration, g *grpcServer, servers ...*http.Server) error {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	listen := func(addr string) error {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		listeners = append(listeners, l)
		return nil
	}
	for _, s := range servers {
		if err := listen(s.Addr); err != nil {
			return err
		}
	}
	if g != nil {
		if err := listen(g.addr); err != nil {
			return err
		}
	}
	errc := make(chan error, len(listeners))
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	if g != nil {
		go func() { errc <- g.srv.Serve(listeners[len(servers)]) }()
	}
	ctx, cancel := context.WithTimeout(ctx, lifetime)
	defer cancel()
	var serveErr error
	select {
	case err := <-errc:
		serveErr = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	if g != nil {
		stopped := make(chan struct{})
		go func() { g.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(shutdownTimeout):
			g.srv.Stop()
		}
	}
	for _, s := range servers {
		sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
		if err := s.Shutdown(sctx); err != nil {
			s.Close()
		}
		scancel()
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}
