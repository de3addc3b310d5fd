package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
)

// defaultNoop is the ext_authz server anyone would write first: generated
// code, one shared OK answer, nothing else. Its gRPC server has no options
// at all, so it is the floor of a default-configured grpc-go ext_authz
// server on this machine, independent of what internal/server tunes.
type defaultNoop struct {
	authv3.UnimplementedAuthorizationServer
	ok *authv3.CheckResponse
}

func (n *defaultNoop) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return n.ok, nil
}

// serveNoopGRPC serves defaultNoop on a plain grpc.NewServer() at
// c.grpcAddr, /healthz and /readyz on c.httpAddr, and Go's profiles on
// c.pprofAddr when set, each on a listener of its own so the gRPC server
// stays default-configured; until ctx ends or the lifetime is over.
func serveNoopGRPC(ctx context.Context, c serveConfig, log *slog.Logger) error {
	lis, err := net.Listen("tcp", c.grpcAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.grpcAddr, err)
	}
	gs := grpc.NewServer()
	authv3.RegisterAuthorizationServer(gs, &defaultNoop{ok: &authv3.CheckResponse{Status: &rpcstatus.Status{}}})

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
	var listeners []net.Listener
	for _, s := range servers {
		l, err := net.Listen("tcp", s.Addr)
		if err != nil {
			lis.Close()
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("listen on %s: %w", s.Addr, err)
		}
		listeners = append(listeners, l)
	}

	errc := make(chan error, 1+len(servers))
	go func() { errc <- gs.Serve(lis) }()
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	log.Info("default grpc-go no-op serving", "grpc", lis.Addr().String(), "http", c.httpAddr, "pprof", c.pprofAddr)

	ctx, cancel := context.WithTimeout(ctx, c.lifetime)
	defer cancel()
	var serveErr error
	select {
	case err := <-errc:
		serveErr = fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(shutdownTimeout):
		gs.Stop()
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
