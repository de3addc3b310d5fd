package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/failures"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/server"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

type serveConfig struct {
	configPath      string
	configExplicit  bool
	grpcAddr        string
	accessLogAddr   string // "" = on the gRPC port
	httpAddr        string
	pprofAddr       string // "" = no profiles
	logLevel        string
	logFormat       string
	drainDelay      time.Duration
	shutdownTimeout time.Duration
	sweepInterval   time.Duration
	failuresToken   string
	grpcTLS         server.TLS
	alsAllowed      []string // nil = the gRPC port's allow-list
	grpcLimits      server.Limits
	grpcMaxStreams  int
	overrides       overridesConfig // tenant overrides; no database = configured limits only
	cluster         clusterConfig
}

func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var c serveConfig
	f := newEnvFlags("serve", "Serve Envoy's ext_authz Check on gRPC and /metrics, /healthz, /readyz on HTTP.\nSIGINT or SIGTERM shuts down gracefully.\nRATELIMIT_AUTHZ_FAILURES_TOKEN, or a file named by RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE,\nholds the bearer token that enables POST /v1/failures (never a flag).", getenv)
	f.String(&c.configPath, "config", "RATELIMIT_AUTHZ_CONFIG", defaultConfigPath, "configuration `file`; when the default path is missing, the shipped configuration is used")
	f.String(&c.grpcAddr, "grpc-addr", "RATELIMIT_AUTHZ_GRPC_ADDR", "127.0.0.1:9001", "gRPC listen `address` (ext_authz Check, grpc.health.v1, and the access-log service unless --access-log-addr is set)")
	f.String(&c.accessLogAddr, "access-log-addr", "RATELIMIT_AUTHZ_ACCESS_LOG_ADDR", "", "gRPC listen `address` of Envoy's access-log service (failed logins) on its own; the gRPC port then no longer serves it; empty: on the gRPC port")
	f.String(&c.httpAddr, "http-addr", "RATELIMIT_AUTHZ_HTTP_ADDR", "127.0.0.1:9090", "HTTP listen `address` (/metrics, /healthz, /readyz, /v1/failures)")
	f.String(&c.pprofAddr, "pprof-addr", "RATELIMIT_AUTHZ_PPROF_ADDR", "", "listen `address` of Go's profiles (/debug/pprof/, without cmdline), never the HTTP address; empty: off (keep it private)")
	f.String(&c.logLevel, "log-level", "RATELIMIT_AUTHZ_LOG_LEVEL", "info", "log `level`: debug, info, warn, error (debug logs every denial)")
	f.String(&c.logFormat, "log-format", "RATELIMIT_AUTHZ_LOG_FORMAT", "text", "log `format`: text or json")
	f.Duration(&c.drainDelay, "drain-delay", "RATELIMIT_AUTHZ_DRAIN_DELAY", 2*time.Second, "on shutdown, report NOT_SERVING this long before refusing new checks")
	f.Duration(&c.shutdownTimeout, "shutdown-timeout", "RATELIMIT_AUTHZ_SHUTDOWN_TIMEOUT", 10*time.Second, "longest wait for in-flight checks on shutdown")
	f.Duration(&c.sweepInterval, "sweep-interval", "RATELIMIT_AUTHZ_SWEEP_INTERVAL", 10*time.Second, "how often expired counters are reclaimed")
	f.String(&c.grpcTLS.CertFile, "grpc-tls-cert", "RATELIMIT_AUTHZ_GRPC_TLS_CERT", "", "certificate `file` (PEM): the gRPC listeners speak TLS only (reloaded when the file changes)")
	f.String(&c.grpcTLS.KeyFile, "grpc-tls-key", "RATELIMIT_AUTHZ_GRPC_TLS_KEY", "", "private key `file` (PEM) of --grpc-tls-cert")
	f.String(&c.grpcTLS.ClientCAFile, "grpc-tls-client-ca", "RATELIMIT_AUTHZ_GRPC_TLS_CLIENT_CA", "", "CA `file` (PEM): require client certificates signed by it (mTLS), on every gRPC listener")
	f.List(&c.grpcTLS.AllowedClients, "grpc-tls-allowed-clients", "RATELIMIT_AUTHZ_GRPC_TLS_ALLOWED_CLIENTS", "comma-separated `names`: with mTLS, a client certificate must carry one as a DNS or URI SAN (e.g. spiffe://…), else the handshake fails; empty: any certificate of the CA")
	f.List(&c.alsAllowed, "access-log-tls-allowed-clients", "RATELIMIT_AUTHZ_ACCESS_LOG_TLS_ALLOWED_CLIENTS", "comma-separated `names` allowed on --access-log-addr (as --grpc-tls-allowed-clients); empty: the same as the gRPC port's")
	f.Int(&c.grpcLimits.MaxConnections, "grpc-max-connections", "RATELIMIT_AUTHZ_GRPC_MAX_CONNECTIONS", server.DefaultMaxConnections, "most connections open at once per gRPC listener; more are closed on accept (Envoy opens one or more per worker thread)")
	f.Int(&c.grpcMaxStreams, "grpc-max-streams", "RATELIMIT_AUTHZ_GRPC_MAX_STREAMS", server.DefaultMaxConcurrentStreams, "most concurrent streams per gRPC connection; more are refused (set Envoy's cluster http2_protocol_options.max_concurrent_streams to at most this)")
	f.Int(&c.grpcLimits.MaxRecvMsgBytes, "grpc-max-recv-bytes", "RATELIMIT_AUTHZ_GRPC_MAX_RECV_BYTES", server.DefaultMaxRecvMsgBytes, "largest gRPC message received, in bytes (a CheckRequest: request headers plus the body Envoy buffers); larger: RESOURCE_EXHAUSTED")
	f.Duration(&c.grpcLimits.KeepaliveMinTime, "grpc-keepalive-min-time", "RATELIMIT_AUTHZ_GRPC_KEEPALIVE_MIN_TIME", server.DefaultKeepaliveMinTime, "shortest interval allowed between a client's keepalive pings; faster: GOAWAY ENHANCE_YOUR_CALM (keep Envoy's connection_keepalive interval at least this)")
	c.overrides.addFlags(f)
	c.cluster.addFlags(f)
	if done, err := parseFlags(f.fs, args, stdout, stderr); done {
		return err
	}
	if err := errors.Join(f.errs...); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if getenv("RATELIMIT_AUTHZ_PPROF") != "" {
		return exitError{code: 2, msg: "ratelimit-authz serve: RATELIMIT_AUTHZ_PPROF is no longer read: profiles are served on their own address, --pprof-addr (RATELIMIT_AUTHZ_PPROF_ADDR)"}
	}
	if err := c.limits(); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	// A secret: from the environment or a file, never a flag (ps would
	// show it), and only its source is logged.
	var tokenSource string
	var err error
	if c.failuresToken, tokenSource, err = secretFromEnv(getenv, "RATELIMIT_AUTHZ_FAILURES_TOKEN"); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	c.configExplicit = f.set("config", "RATELIMIT_AUTHZ_CONFIG")
	if err := c.cluster.resolve(getenv); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if c.sweepInterval <= 0 {
		return exitError{code: 2, msg: "ratelimit-authz serve: --sweep-interval must be positive"}
	}
	log, err := newLogger(c.logLevel, c.logFormat, stderr)
	if err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if tokenSource != "" {
		log.Info("failure reports over HTTP enabled", "token_from", tokenSource)
	}
	return serve(ctx, c, log)
}

// limits checks the gRPC bounds given as integers; zero or less is a
// usage error (a bound of zero would mean the default, which the flag
// already shows).
func (c *serveConfig) limits() error {
	switch {
	case c.grpcLimits.MaxConnections <= 0:
		return fmt.Errorf("--grpc-max-connections %d: must be positive", c.grpcLimits.MaxConnections)
	case c.grpcMaxStreams <= 0 || c.grpcMaxStreams > 1<<20:
		return fmt.Errorf("--grpc-max-streams %d: must be from 1 to %d", c.grpcMaxStreams, 1<<20)
	case c.grpcLimits.MaxRecvMsgBytes <= 0:
		return fmt.Errorf("--grpc-max-recv-bytes %d: must be positive", c.grpcLimits.MaxRecvMsgBytes)
	case c.grpcLimits.KeepaliveMinTime <= 0:
		return fmt.Errorf("--grpc-keepalive-min-time %v: must be positive", c.grpcLimits.KeepaliveMinTime)
	}
	c.grpcLimits.MaxConcurrentStreams = uint32(c.grpcMaxStreams)
	return nil
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	l, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: use text or json", format)
}

func serve(ctx context.Context, c serveConfig, log *slog.Logger) error {
	r, source, err := loadRules(c.configPath, c.configExplicit, log)
	if err != nil {
		if ps, ok := rules.AsProblems(err); ok {
			return fmt.Errorf("configuration has %d problem(s):\n%w", len(ps), ps)
		}
		return err
	}
	log.Info("configuration loaded", "source", source, "buckets", len(r.Buckets), "routes", len(r.Routes))
	for _, w := range trustWarnings(r, "", nil) {
		log.Warn("configuration trusts what a client may set; check-config --envoy checks the bootstrap in front", "warning", w)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "ratelimit_authz", Name: "build_info", Help: "Always 1; the version is a label.",
		ConstLabels: prometheus.Labels{"version": version},
	}, func() float64 { return 1 }))

	store, err := counter.New(c.cluster.counterConfig(r.Counter))
	if err != nil {
		return fmt.Errorf("create counter: %w", err)
	}
	if err := registerCounterMetrics(reg, store); err != nil {
		return err
	}
	matcher, err := descriptors.New(r.Descriptors())
	if err != nil {
		return fmt.Errorf("compile routes: %w", err)
	}
	overrides, runOverrides, overridesState, err := newOverrides(ctx, c.overrides, r, reg, log)
	if err != nil {
		return err
	}
	limits := tenantlimits.NewResolver(wiring.Limits(r), overrides)
	svc, err := authz.New(wiring.Authz(r), matcher, store, limits, reg, log, authz.Options{})
	if err != nil {
		return err
	}
	repl, err := newReplicator(&c.cluster, r, store, reg, log)
	if err != nil {
		return err
	}
	rec, err := failures.New(wiring.Failures(r), store, limits, reg, log, failures.Options{Token: c.failuresToken})
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{
		GRPCAddr: c.grpcAddr, AccessLogAddr: c.accessLogAddr,
		HTTPAddr: c.httpAddr, PprofAddr: c.pprofAddr,
		DrainDelay: c.drainDelay, ShutdownTimeout: c.shutdownTimeout,
		ReadyAfter:              readyAfter(repl), // a cluster node warms up from its peers first
		ReadyDetail:             overridesState,   // where the overrides served come from
		TLS:                     c.grpcTLS,
		AccessLogAllowedClients: c.alsAllowed,
		Limits:                  c.grpcLimits,
	}, server.Services{Authz: svc, AccessLog: rec, Failures: rec}, reg, log)
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	srvDone := make(chan struct{})
	g.Go(func() error { defer close(srvDone); return srv.Run(gctx) })
	g.Go(func() error { return runReplicator(gctx, srvDone, repl) }) // final batch after gRPC stops
	g.Go(func() error { return store.Run(gctx, c.sweepInterval) })
	g.Go(func() error { return runOverrides(gctx) }) // closes its Postgres connection on return
	err = g.Wait()
	srv.Close()
	return err
}

// registerCounterMetrics exports the counter's own figures, read at scrape
// time so that the counter needs no metrics library.
func registerCounterMetrics(reg prometheus.Registerer, s *counter.Store) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "live_keys",
			Help: "(bucket, key) pairs held in memory.",
		}, func() float64 { return float64(s.Len()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "keys_refused_total",
			Help: "New keys not tracked because the counter was at counter.max_keys; the bucket's on_overflow decided.",
		}, func() float64 { return float64(s.Refused()) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register counter metrics: %w", err)
		}
	}
	return nil
}
