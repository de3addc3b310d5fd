package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// serveConfig is what serve's flags and environment set: most of it the
// node's Config directly, the rest resolved into it by nodeConfig.
type serveConfig struct {
	node           node.Config // listeners, bounds, TLS, intervals; the rest is filled by nodeConfig
	configPath     string
	configExplicit bool
	watchConfig    bool
	logLevel       string
	logFormat      string
	grpcMaxStreams int
	overrides      overridesConfig // tenant overrides; no database = configured limits only
	cluster        clusterConfig
	rls            rlsConfig // Envoy's ratelimit filter; off without a configuration directory
	// started, when set, is handed the node once it is assembled (its
	// listeners bound) and before it runs: tests learn its addresses so.
	started func(*node.Node)

	memory memoryConfig // the Go runtime's soft memory limit

	// The admin listener (top keys, status page); off without an address.
	adminAddr, adminTokenFile string
	adminHideKeys             bool
}

// defaultCheckAddr is where every shipped Envoy bootstrap sends ext_authz
// Check and the ratelimit filter (cluster ratelimit_authz_check, port
// 9002): on by default, so that serve and a shipped bootstrap enforce
// together.
const defaultCheckAddr = "127.0.0.1:9002"

// defaultAdminAddr is the admin listener's, on loopback: where `top`
// looks by default.
const defaultAdminAddr = "127.0.0.1:9095"

// runServe is the serve command; started, when set, is handed the node
// before it runs (see serveConfig.started).
func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, started func(*node.Node)) error {
	c := serveConfig{started: started}
	getenv, c.rls.upstream = upstreamEnv(getenv) // envoyproxy/ratelimit's variables as aliases of ours
	f := c.flags(getenv)
	if done, err := cli.Parse(f.fs, args, stdout, stderr); done {
		return err
	}
	if err := errors.Join(f.errs...); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	tokenSource, err := c.resolve(f, getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(c.logLevel, c.logFormat, stderr)
	if err != nil {
		return exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if tokenSource != "" {
		log.Info("failure reports over HTTP enabled", "token_from", tokenSource)
	}
	c.rls.warn(log)
	logRuntime(log, getenv, os.DirFS("/"))
	return serve(ctx, c, log)
}

// flags is serve's flag set, each flag setting its field of c.
func (c *serveConfig) flags(getenv func(string) string) *envFlags {
	f := newEnvFlags("serve", "Serve Envoy's ext_authz Check on gRPC and /metrics, /healthz, /readyz on HTTP;\nwith --rls-config-dir (or envoyproxy/ratelimit's RUNTIME_* layout), also Envoy's\nratelimit filter (ShouldRateLimit) on the gRPC port. Our variables win over\nenvoyproxy/ratelimit's names.\nSIGINT or SIGTERM shuts down gracefully; SIGHUP reloads the configuration files.\nRATELIMIT_AUTHZ_FAILURES_TOKEN, or a file named by RATELIMIT_AUTHZ_FAILURES_TOKEN_FILE,\nholds the bearer token that enables POST /v1/failures (never a flag).", getenv)
	f.String(&c.configPath, "config", "RATELIMIT_AUTHZ_CONFIG", defaultConfigPath, "configuration `file`; when the default path is missing, the shipped configuration is used")
	f.Bool(&c.watchConfig, "watch-config", "RATELIMIT_AUTHZ_WATCH_CONFIG", true, "reload the configuration file when it changes (SIGHUP reloads it either way); a change that does not validate is refused and the last good configuration keeps serving")
	f.String(&c.node.GRPCAddr, "grpc-addr", "RATELIMIT_AUTHZ_GRPC_ADDR", "127.0.0.1:9001", "gRPC listen `address` (ext_authz Check, grpc.health.v1, and the access-log service unless --access-log-addr is set)")
	f.String(&c.node.CheckAddr, "check-addr", "RATELIMIT_AUTHZ_CHECK_ADDR", defaultCheckAddr, "listen `address` of the lean HTTP/2 listener the shipped Envoy bootstraps send ext_authz Check and the ratelimit filter to: it serves only Check, ShouldRateLimit when RLS is served, and grpc.health.v1 Check (same TLS, allow-list and limits as the gRPC port; RLQS and the access log stay there); off: none")
	f.String(&c.node.AccessLogAddr, "access-log-addr", "RATELIMIT_AUTHZ_ACCESS_LOG_ADDR", "", "gRPC listen `address` of Envoy's access-log service (failed logins) on its own; the gRPC port then no longer serves it; empty: on the gRPC port")
	f.String(&c.node.HTTPAddr, "http-addr", "RATELIMIT_AUTHZ_HTTP_ADDR", "127.0.0.1:9090", "HTTP listen `address` (/metrics, /healthz, /readyz, /v1/failures)")
	f.String(&c.node.PprofAddr, "pprof-addr", "RATELIMIT_AUTHZ_PPROF_ADDR", "", "listen `address` of Go's profiles (/debug/pprof/, without cmdline), never the HTTP address; empty: off (keep it private)")
	f.String(&c.logLevel, "log-level", "RATELIMIT_AUTHZ_LOG_LEVEL", "info", "log `level`: debug, info, warn, error (debug logs every denial)")
	f.String(&c.logFormat, "log-format", "RATELIMIT_AUTHZ_LOG_FORMAT", "text", "log `format`: text or json")
	f.Duration(&c.node.DrainDelay, "drain-delay", "RATELIMIT_AUTHZ_DRAIN_DELAY", 2*time.Second, "on shutdown, report NOT_SERVING this long before refusing new checks")
	f.Duration(&c.node.ShutdownTimeout, "shutdown-timeout", "RATELIMIT_AUTHZ_SHUTDOWN_TIMEOUT", 10*time.Second, "longest wait for in-flight checks on shutdown")
	f.Duration(&c.node.SweepInterval, "sweep-interval", "RATELIMIT_AUTHZ_SWEEP_INTERVAL", node.DefaultSweepInterval, "how often expired counters are reclaimed")
	f.String(&c.node.TLS.CertFile, "grpc-tls-cert", "RATELIMIT_AUTHZ_GRPC_TLS_CERT", "", "certificate `file` (PEM): the gRPC listeners speak TLS only (reloaded when the file changes)")
	f.String(&c.node.TLS.KeyFile, "grpc-tls-key", "RATELIMIT_AUTHZ_GRPC_TLS_KEY", "", "private key `file` (PEM) of --grpc-tls-cert")
	f.String(&c.node.TLS.ClientCAFile, "grpc-tls-client-ca", "RATELIMIT_AUTHZ_GRPC_TLS_CLIENT_CA", "", "CA `file` (PEM): require client certificates signed by it (mTLS), on every gRPC listener")
	f.List(&c.node.TLS.AllowedClients, "grpc-tls-allowed-clients", "RATELIMIT_AUTHZ_GRPC_TLS_ALLOWED_CLIENTS", "comma-separated `names`: with mTLS, a client certificate must carry one as a DNS or URI SAN (e.g. spiffe://…), else the handshake fails; empty: any certificate of the CA")
	f.List(&c.node.AccessLogAllowedClients, "access-log-tls-allowed-clients", "RATELIMIT_AUTHZ_ACCESS_LOG_TLS_ALLOWED_CLIENTS", "comma-separated `names` allowed on --access-log-addr (as --grpc-tls-allowed-clients); empty: the same as the gRPC port's")
	f.Int(&c.node.Bounds.MaxConnections, "grpc-max-connections", "RATELIMIT_AUTHZ_GRPC_MAX_CONNECTIONS", server.DefaultMaxConnections, "most connections open at once per gRPC listener; more are closed on accept (Envoy opens one or more per worker thread)")
	f.Int(&c.grpcMaxStreams, "grpc-max-streams", "RATELIMIT_AUTHZ_GRPC_MAX_STREAMS", server.DefaultMaxConcurrentStreams, "most concurrent streams per gRPC connection; more are refused (set Envoy's cluster http2_protocol_options.max_concurrent_streams to at most this)")
	f.Int(&c.node.Bounds.MaxRecvMsgBytes, "grpc-max-recv-bytes", "RATELIMIT_AUTHZ_GRPC_MAX_RECV_BYTES", server.DefaultMaxRecvMsgBytes, "largest gRPC message received, in bytes (a CheckRequest: request headers plus the body Envoy buffers); larger: RESOURCE_EXHAUSTED")
	f.Duration(&c.node.Bounds.KeepaliveMinTime, "grpc-keepalive-min-time", "RATELIMIT_AUTHZ_GRPC_KEEPALIVE_MIN_TIME", server.DefaultKeepaliveMinTime, "shortest interval allowed between a client's keepalive pings; faster: GOAWAY ENHANCE_YOUR_CALM (keep Envoy's connection_keepalive interval at least this)")
	f.Int(&c.node.StreamWorkers, "grpc-stream-workers", "RATELIMIT_AUTHZ_GRPC_STREAM_WORKERS", server.DefaultStreamWorkers, "goroutines per gRPC listener that run checks one after another, reusing their grown stacks (a check finding all busy gets its own); about the checks in flight at once plus the long-lived streams (access log, RLQS), which hold one each; 0: a goroutine per check")
	f.String(&c.adminAddr, "admin-addr", "RATELIMIT_AUTHZ_ADMIN_ADDR", defaultAdminAddr, "listen `address` of the admin listener, the live view of who is limited: GET /v1/top (the top keys per bucket, JSON), a status page at /, what `ratelimit-authz top` reads; keys are personal data: an address that is not loopback requires --admin-token-file; off: none")
	f.String(&c.adminTokenFile, "admin-token-file", "RATELIMIT_AUTHZ_ADMIN_TOKEN_FILE", "", "`file` holding the bearer token every admin request must carry")
	f.Bool(&c.adminHideKeys, "admin-hide-keys", "RATELIMIT_AUTHZ_ADMIN_HIDE_KEYS", false, "show a keyed hash (HMAC under a key drawn at start) instead of each key on the admin listener")
	c.overrides.addFlags(f)
	c.cluster.addFlags(f)
	c.rls.addFlags(f)
	c.memory.addFlags(f)
	return f
}

// resolve checks and resolves what the parsed flags and environment set
// into c, returning where the failures token came from (empty: none);
// its error is the exit of serve.
func (c *serveConfig) resolve(f *envFlags, getenv func(string) string) (tokenSource string, err error) {
	if getenv("RATELIMIT_AUTHZ_PPROF") != "" {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: RATELIMIT_AUTHZ_PPROF is no longer read: profiles are served on their own address, --pprof-addr (RATELIMIT_AUTHZ_PPROF_ADDR)"}
	}
	if err := c.limits(); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	// A secret: from the environment or a file, never a flag (ps would
	// show it), and only its source is logged.
	if c.node.FailuresToken, tokenSource, err = secretFromEnv(getenv, "RATELIMIT_AUTHZ_FAILURES_TOKEN"); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	c.configExplicit = f.set("config", "RATELIMIT_AUTHZ_CONFIG")
	if err := c.cluster.resolve(getenv); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if err := c.rls.resolve(f, c.node.TLS); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if err := c.memory.resolve(getenv); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if err := c.resolveAdmin(); err != nil {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: " + err.Error()}
	}
	if c.node.CheckAddr == "off" || c.node.CheckAddr == "" {
		c.node.CheckAddr = "" // the node's zero: no lean listener
	}
	if c.node.SweepInterval <= 0 {
		return "", exitError{code: 2, msg: "ratelimit-authz serve: --sweep-interval must be positive"}
	}
	return tokenSource, nil
}

// resolveAdmin sets the node's admin listener from the flags, reading
// the token file; the listener itself refuses an address that is not
// loopback without a token.
func (c *serveConfig) resolveAdmin() error {
	if c.adminAddr == "" || c.adminAddr == "off" {
		if c.adminTokenFile != "" || c.adminHideKeys {
			return errors.New("--admin-token-file and --admin-hide-keys need the admin listener, which --admin-addr turns off")
		}
		return nil
	}
	c.node.Admin = &admin.Config{Addr: c.adminAddr, HideKeys: c.adminHideKeys}
	if c.adminTokenFile != "" {
		tok, err := readSecretFile(c.adminTokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		c.node.Admin.Token = tok
	}
	return nil
}

// limits checks the gRPC bounds given as integers; zero or less is a
// usage error (a bound of zero would mean the default, which the flag
// already shows).
func (c *serveConfig) limits() error {
	switch {
	case c.node.Bounds.MaxConnections <= 0:
		return fmt.Errorf("--grpc-max-connections %d: must be positive", c.node.Bounds.MaxConnections)
	case c.grpcMaxStreams <= 0 || c.grpcMaxStreams > 1<<20:
		return fmt.Errorf("--grpc-max-streams %d: must be from 1 to %d", c.grpcMaxStreams, 1<<20)
	case c.node.Bounds.MaxRecvMsgBytes <= 0:
		return fmt.Errorf("--grpc-max-recv-bytes %d: must be positive", c.node.Bounds.MaxRecvMsgBytes)
	case c.node.Bounds.KeepaliveMinTime <= 0:
		return fmt.Errorf("--grpc-keepalive-min-time %v: must be positive", c.node.Bounds.KeepaliveMinTime)
	case c.node.StreamWorkers < 0 || c.node.StreamWorkers > maxStreamWorkers:
		return fmt.Errorf("--grpc-stream-workers %d: from 0 (a goroutine per check) to %d", c.node.StreamWorkers, maxStreamWorkers)
	}
	if c.node.StreamWorkers == 0 {
		c.node.StreamWorkers = -1 // none: the server's zero is its default
	}
	c.node.Bounds.MaxConcurrentStreams = uint32(c.grpcMaxStreams)
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
	// SIGHUP is taken before anything else, so that it never ends a node
	// that is starting.
	hup, stopHUP := notifyHUP()
	defer stopHUP()
	cfg, err := c.nodeConfig()
	if err != nil {
		return err
	}
	n, err := node.New(ctx, cfg, log)
	if err != nil {
		if ps, ok := problem.As(err); ok {
			return fmt.Errorf("configuration has %d problem(s):\n%w", len(ps), ps)
		}
		return err
	}
	if c.started != nil {
		c.started(n)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); reloadOnHUP(rctx, n, hup) }()
	memDone := make(chan struct{})
	go func() { defer close(memDone); runMemoryLimit(rctx, c.memory, n.CounterBytes, log) }()
	err = n.Run(ctx)
	cancel()
	<-done
	<-memDone
	return err
}

// nodeConfig completes the node's Config: the rules file (which the node
// reads, at start and at each reload), the version, and the secrets the
// flags name, read from the environment or files here (the database URL,
// the NATS credentials).
func (c *serveConfig) nodeConfig() (node.Config, error) {
	cfg := c.node
	cfg.RulesFile = &configfile.File{Path: c.configPath, Explicit: c.configExplicit}
	cfg.Watch, cfg.Version = c.watchConfig, version
	url, err := c.overrides.db.resolve()
	if err != nil {
		return node.Config{}, err
	}
	cfg.Overrides = node.Overrides{DatabaseURL: url, SnapshotFile: c.overrides.snapshot}
	cfg.RLS = c.rls.nodeRLS()
	if cfg.Cluster, err = c.cluster.nodeCluster(); err != nil {
		return node.Config{}, err
	}
	return cfg, nil
}
