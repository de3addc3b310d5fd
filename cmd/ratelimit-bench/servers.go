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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/server"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
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

// serveConfig are the flags shared by the noop and authz servers.
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

// serveAuthz runs svc behind the product's own gRPC and HTTP stack
// (pkg/server: the same listeners, options and metrics endpoint, and Go's
// profiles on pprofAddr when set, as serve --pprof-addr serves them) until
// ctx ends or the lifetime is over. extra runs alongside (the counter's
// sweeper).
func serveAuthz(ctx context.Context, c serveConfig, svc authv3.AuthorizationServer, reg *prometheus.Registry, log *slog.Logger, extra func(context.Context) error) error {
	srv, err := server.New(server.Config{GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr, PprofAddr: c.pprofAddr, ShutdownTimeout: 5 * time.Second},
		server.Services{Authz: svc}, reg, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.lifetime)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(gctx) })
	if extra != nil {
		g.Go(func() error { return extra(gctx) })
	}
	err = g.Wait()
	srv.Close()
	return err
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// newAuthzService wires the Check service as cmd/ratelimit-authz serve
// does (rules → descriptors, counter → authz), so a profile of this
// process is a profile of the product's Check path. configPath "" means
// the shipped configuration.
func newAuthzService(configPath string, reg *prometheus.Registry, log *slog.Logger) (*authz.Service, *counter.Store, error) {
	var (
		r   *rules.Rules
		err error
	)
	if configPath == "" {
		r, err = rules.Parse(config.Default(), config.Name)
	} else {
		r, err = rules.LoadFile(configPath)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load configuration: %w", err)
	}
	store, err := counter.New(r.Counter)
	if err != nil {
		return nil, nil, fmt.Errorf("create counter: %w", err)
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "ratelimit_authz", Subsystem: "counter", Name: "live_keys",
		Help: "(bucket, key) pairs held in memory.",
	}, func() float64 { return float64(store.Len()) }))
	m, err := descriptors.New(r.Descriptors())
	if err != nil {
		return nil, nil, fmt.Errorf("compile routes: %w", err)
	}
	svc, err := authz.New(wiring.Authz(r), m, store, tenantlimits.NewResolver(wiring.Limits(r), nil), reg, log, authz.Options{})
	if err != nil {
		return nil, nil, err
	}
	return svc, store, nil
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
