package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/sockio"
)

// Config is the server's own configuration. Zero fields take defaults.
type Config struct {
	GRPCAddr string // default 127.0.0.1:9001
	// AccessLogAddr, when set, serves the access-log service (and
	// grpc.health.v1) on a listener of its own, and the Check port no
	// longer serves it: the Check port may then be reachable by clients
	// that must not report failed logins. Empty: the Check port serves it.
	AccessLogAddr string
	// CheckAddr, when set, serves ext_authz Check and grpc.health.v1
	// Check, and nothing else, on a lean HTTP/2 listener of its own
	// (internal/checkh2: one goroutine per connection reads, decides and
	// writes), with the gRPC port's TLS, allow-list and Bounds. Empty: off.
	CheckAddr string
	HTTPAddr  string // default 127.0.0.1:9090
	// PprofAddr, when set, serves Go's profiles under /debug/pprof/ on a
	// listener of its own, never on HTTPAddr. Empty: no profiles.
	PprofAddr string
	// DrainDelay is how long the node reports NOT_SERVING before it stops
	// accepting checks. Default 0 (tests); main sets its own default.
	DrainDelay time.Duration
	// ShutdownTimeout bounds GracefulStop; default 10 s.
	ShutdownTimeout time.Duration
	// ReadyAfter, when set, holds back SERVING (gRPC health and /readyz)
	// until every channel in it is closed, for example until a cluster
	// node has warmed up from its peers. Checks are answered meanwhile.
	ReadyAfter []<-chan struct{}
	// ReadyDetail, when set, is called on every GET /readyz and its text
	// is appended to the body (after "ready" or "not ready"), for example
	// the state of the tenant overrides. It must be cheap and not block;
	// it does not change the status code.
	ReadyDetail func() string
	// TLS secures the gRPC listeners (TLS, or mTLS with a client CA and an
	// allow-list of client names); zero: plaintext HTTP/2, for a port only
	// Envoy on the same host or network can reach.
	TLS TLS
	// AccessLogAllowedClients is the allow-list of the access-log listener
	// (see TLS.AllowedClients); nil: the same as the Check port's. Only
	// with AccessLogAddr.
	AccessLogAllowedClients []string
	// Bounds bound what clients of the gRPC listeners can hold.
	Bounds Bounds
	// StreamWorkers is how many long-lived goroutines of each gRPC
	// listener run its calls, one call after another: a check then runs
	// on a goroutine whose stack has already grown, instead of a new
	// goroutine per call whose stack grows again each time. A call that
	// finds every worker busy (running, or waiting for its request's
	// data) gets a goroutine of its own, so a slow call never holds up
	// the others. Zero: DefaultStreamWorkers; negative: none, a goroutine
	// per call.
	StreamWorkers int
}

// DefaultStreamWorkers covers the checks a node has in flight at once
// under load (Envoy with a few workers, a few dozen each). Many more
// would cost more than they save: grpc-go hands each call to the worker
// idle longest, whose stack the garbage collector has shrunk meanwhile,
// and every idle worker's stack is scanned at each collection.
const DefaultStreamWorkers = 64

// maxStreamWorkers rejects a worker count that is no count (a typo):
// each worker is an idle goroutine held for the server's life.
const maxStreamWorkers = 1 << 12

// Bounds bound, per gRPC listener, what its clients can hold: a client
// past a bound is refused, not queued without end. Zero fields take the
// defaults.
type Bounds struct {
	// MaxConnections is the most connections open at once; one more is
	// closed as soon as it is accepted. Default 4096: Envoy opens at least
	// one connection per worker thread, so a node needs about (Envoys ×
	// their --concurrency) plus headroom.
	MaxConnections int
	// MaxConcurrentStreams is the most streams open at once on one
	// connection, advertised in HTTP/2 SETTINGS; streams past it are
	// refused (RST_STREAM REFUSED_STREAM), which a check sees as an error.
	// Envoy does not reliably stay within the advertised value, so set
	// its cluster's http2_protocol_options.max_concurrent_streams to at
	// most this: it then opens more connections instead. Default 1024,
	// Envoy's default max_requests circuit breaker per cluster: an Envoy
	// with default circuit breakers never has more checks in flight.
	MaxConcurrentStreams uint32
	// MaxRecvMsgBytes bounds one received message (a CheckRequest, an
	// access-log batch); a larger one is answered RESOURCE_EXHAUSTED.
	// Default 256 KiB: a CheckRequest carries the request headers (Envoy's
	// max_request_headers_kb, default 60 KiB; the path appears twice) and
	// at most with_request_body.max_request_bytes of body (8 KiB shipped).
	MaxRecvMsgBytes int
	// MaxHeaderListBytes bounds the gRPC request's own HTTP/2 headers
	// (not the HTTP request's, which travel in the message); a larger
	// list has its stream reset. Default 16 KiB.
	MaxHeaderListBytes uint32
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings, with or without streams; a client pinging faster
	// (more than twice in a row) gets GOAWAY ENHANCE_YOUR_CALM and its
	// connection closed. Default 5 s: keep Envoy's
	// http2_protocol_options.connection_keepalive.interval at least this.
	KeepaliveMinTime time.Duration
	// MaxConnectionIdle closes (GOAWAY) a connection without streams for
	// this long. Default 5 min.
	MaxConnectionIdle time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface, so a connection that never completes them gives its slot
	// back. Default 10 s.
	HandshakeTimeout time.Duration
}

// Defaults of Bounds.
const (
	DefaultMaxConnections       = 4096
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxRecvMsgBytes      = 256 << 10
	DefaultMaxHeaderListBytes   = 16 << 10
	DefaultKeepaliveMinTime     = 5 * time.Second
	DefaultMaxConnectionIdle    = 5 * time.Minute
	DefaultHandshakeTimeout     = 10 * time.Second

	// maxRecvMsgBytesLimit rejects a bound that is no bound (a typo).
	maxRecvMsgBytesLimit = 64 << 20
)

func (l *Bounds) setDefaults() error {
	if l.MaxConnections < 0 || l.MaxRecvMsgBytes < 0 || l.KeepaliveMinTime < 0 || l.MaxConnectionIdle < 0 || l.HandshakeTimeout < 0 {
		return errors.New("server: gRPC limits must not be negative")
	}
	if l.MaxRecvMsgBytes > maxRecvMsgBytesLimit {
		return fmt.Errorf("server: gRPC max receive size %d bytes: at most %d", l.MaxRecvMsgBytes, maxRecvMsgBytesLimit)
	}
	def := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultMaxConnections
	}
	if l.MaxConcurrentStreams == 0 {
		l.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if l.MaxRecvMsgBytes == 0 {
		l.MaxRecvMsgBytes = DefaultMaxRecvMsgBytes
	}
	if l.MaxHeaderListBytes == 0 {
		l.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	def(&l.KeepaliveMinTime, DefaultKeepaliveMinTime)
	def(&l.MaxConnectionIdle, DefaultMaxConnectionIdle)
	def(&l.HandshakeTimeout, DefaultHandshakeTimeout)
	return nil
}

func (l Bounds) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(l.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(l.MaxRecvMsgBytes),
		grpc.MaxHeaderListSize(l.MaxHeaderListBytes),
		// Envoy keeps long-lived HTTP/2 connections and may ping them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: l.MaxConnectionIdle,
			Time:              30 * time.Second,
			Timeout:           10 * time.Second,
		}),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
	}
}

func (c *Config) setDefaults() error {
	if c.GRPCAddr == "" {
		c.GRPCAddr = "127.0.0.1:9001"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:9090"
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.DrainDelay < 0 || c.ShutdownTimeout < 0 {
		return errors.New("server: drain delay and shutdown timeout must not be negative")
	}
	if sameFixedAddr(c.AccessLogAddr, c.GRPCAddr) {
		return fmt.Errorf("server: access-log address %s is the gRPC address: leave it empty to serve both on one port", c.AccessLogAddr)
	}
	if sameFixedAddr(c.CheckAddr, c.GRPCAddr) || sameFixedAddr(c.CheckAddr, c.AccessLogAddr) {
		return fmt.Errorf("server: Check address %s is taken by another gRPC listener", c.CheckAddr)
	}
	if sameFixedAddr(c.PprofAddr, c.HTTPAddr) {
		return fmt.Errorf("server: pprof address %s is the HTTP address: profiles are served on their own address only", c.PprofAddr)
	}
	switch {
	case c.StreamWorkers == 0:
		c.StreamWorkers = DefaultStreamWorkers
	case c.StreamWorkers > maxStreamWorkers:
		return fmt.Errorf("server: %d gRPC stream workers: at most %d", c.StreamWorkers, maxStreamWorkers)
	}
	if c.AccessLogAllowedClients != nil && c.AccessLogAddr == "" {
		return errors.New("server: access-log allowed clients need an access-log address of its own (on the gRPC port, its allowed clients apply)")
	}
	return c.Bounds.setDefaults()
}

// sameFixedAddr reports whether a and b name one address (not port 0,
// which binds a new port each time).
func sameFixedAddr(a, b string) bool {
	_, port, err := net.SplitHostPort(a)
	return a != "" && a == b && (err != nil || port != "0")
}

// Services are what the listeners serve.
type Services struct {
	// Authz answers Envoy's ext_authz Check. Required.
	Authz authv3.AuthorizationServer
	// RateLimit, when set, answers Envoy's ratelimit filter
	// (envoy.service.ratelimit.v3 ShouldRateLimit) on the gRPC port,
	// beside Check: the same listener, TLS, allow-list, bounds, health and
	// graceful stop; and on the lean Check listener too when it has the
	// lean path (checkwire.RateLimitServer, as *rls.Service has).
	RateLimit rlsv3.RateLimitServiceServer
	// RateLimitQuota, when set, serves Envoy's rate_limit_quota filter
	// (envoy.service.rate_limit_quota.v3 StreamRateLimitQuotas) on the
	// gRPC port, beside Check.
	RateLimitQuota RateLimitQuota
	// AccessLog, when set, receives Envoy's gRPC access log, on the gRPC
	// port or on Config.AccessLogAddr.
	AccessLog AccessLog
	// Failures, when set, serves POST /v1/failures on the HTTP port.
	Failures http.Handler
}

// AccessLog is an access-log service whose long-lived streams the server
// ends at shutdown (CloseStreams), since a graceful stop waits for every
// stream and Envoy never hangs up on its own.
type AccessLog interface {
	alsv3.AccessLogServiceServer
	CloseStreams()
}

// RateLimitQuota is a quota service whose long-lived streams the server
// ends at shutdown (CloseStreams), after the drain delay, as AccessLog's.
type RateLimitQuota interface {
	rlqsv3.RateLimitQuotaServiceServer
	CloseStreams()
}

// Registry is where the server registers its metrics and what /metrics
// serves (a *prometheus.Registry).
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Listener names, the "listener" label of the server's metrics.
const (
	listenerGRPC      = "grpc"
	listenerAccessLog = "access_log"
)

// grpcListener is one gRPC server on its bounded listener.
type grpcListener struct {
	name       string
	lis        *limitListener
	srv        *grpc.Server
	tls        string        // off, tls or mtls (for the serving log line)
	tlsRefused atomic.Uint64 // client certificates whose names are not allowed
}

// Server owns the listeners. New binds them; Run serves until its context
// ends, then shuts down. Safe for concurrent use.
type Server struct {
	cfg    Config
	svc    Services
	log    *slog.Logger
	grpcs  []*grpcListener // the Check port first, then the access-log port if any
	check  *checkListener  // nil without CheckAddr
	health *health.Server
	http   *http.Server
	hlis   net.Listener
	pprof  *http.Server // nil without PprofAddr
	plis   net.Listener
	ready  atomic.Bool
	closed sync.Once

	servingMu sync.Mutex
	stopping  bool // set by the first setServing(false): never SERVING again
}

// New binds every listener and registers the services and the server's
// metrics. The caller must call Run or Close.
func New(cfg Config, svc Services, reg Registry, log *slog.Logger) (_ *Server, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if svc.Authz == nil {
		return nil, errors.New("server: no ext_authz service")
	}
	if cfg.AccessLogAddr != "" && svc.AccessLog == nil {
		return nil, errors.New("server: an access-log address but no access-log service")
	}
	checkAllow, alsAllow, err := cfg.allowLists()
	if err != nil {
		return nil, err
	}

	s := &Server{cfg: cfg, svc: svc, log: log, health: health.NewServer()}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	if err = s.bindGRPC(checkAllow, alsAllow); err != nil {
		return nil, err
	}
	if cfg.CheckAddr != "" {
		if s.check, err = s.newCheck(cfg.CheckAddr, checkAllow); err != nil {
			return nil, err
		}
	}
	for _, name := range s.healthNames() {
		s.health.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	if err = s.bindHTTP(reg); err != nil {
		return nil, err
	}
	if err := s.registerMetrics(reg); err != nil {
		return nil, err
	}
	return s, nil
}

// allowLists are the allow-lists of the Check port and of the access-log
// port; the access-log port takes the Check port's unless it has its own.
func (c *Config) allowLists() (checkAllow, alsAllow allowList, err error) {
	if checkAllow, err = parseAllowList(c.TLS.AllowedClients); err != nil {
		return checkAllow, alsAllow, err
	}
	alsAllow = checkAllow
	if c.AccessLogAllowedClients != nil {
		if alsAllow, err = parseAllowList(c.AccessLogAllowedClients); err != nil {
			return checkAllow, alsAllow, err
		}
		if alsAllow.empty() {
			return checkAllow, alsAllow, errors.New("server: access-log allowed clients: an empty list (leave it unset to take the gRPC port's)")
		}
	}
	return checkAllow, alsAllow, nil
}

// bindGRPC binds the gRPC port, and the access-log port when configured,
// and registers on them the services and gRPC health. On error the
// listeners bound so far are in s.grpcs, for closeListeners.
func (s *Server) bindGRPC(checkAllow, alsAllow allowList) error {
	check, err := s.newGRPC(listenerGRPC, s.cfg.GRPCAddr, checkAllow)
	if err != nil {
		return err
	}
	if lean, ok := s.svc.Authz.(checkwire.Server); ok {
		checkgrpc.Register(check.srv, lean) // decoded by the codec newGRPC installs
	} else {
		authv3.RegisterAuthorizationServer(check.srv, s.svc.Authz)
	}
	if s.svc.RateLimit != nil {
		rlsv3.RegisterRateLimitServiceServer(check.srv, s.svc.RateLimit)
	}
	if s.svc.RateLimitQuota != nil {
		rlqsv3.RegisterRateLimitQuotaServiceServer(check.srv, s.svc.RateLimitQuota)
	}
	if s.svc.AccessLog != nil {
		als := check
		if s.cfg.AccessLogAddr != "" {
			if als, err = s.newGRPC(listenerAccessLog, s.cfg.AccessLogAddr, alsAllow); err != nil {
				return err
			}
		}
		alsv3.RegisterAccessLogServiceServer(als.srv, s.svc.AccessLog)
	}
	for _, g := range s.grpcs {
		healthpb.RegisterHealthServer(g.srv, s.health)
	}
	return nil
}

// bindHTTP binds the HTTP port, and the pprof port when configured, and
// builds their servers. On error the listeners bound so far are in s, for
// closeListeners.
func (s *Server) bindHTTP(reg prometheus.Gatherer) (err error) {
	if s.hlis, err = net.Listen("tcp", s.cfg.HTTPAddr); err != nil {
		return fmt.Errorf("server: listen HTTP on %s: %w", s.cfg.HTTPAddr, err)
	}
	s.http = &http.Server{
		Handler:           s.adminMux(reg),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	if s.cfg.PprofAddr != "" {
		if s.plis, err = net.Listen("tcp", s.cfg.PprofAddr); err != nil {
			return fmt.Errorf("server: listen pprof on %s: %w", s.cfg.PprofAddr, err)
		}
		s.pprof = &http.Server{
			Handler:           pprofMux(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      2 * time.Minute, // a CPU profile takes 30 s by default
			MaxHeaderBytes:    64 << 10,
		}
	}
	return nil
}

// newGRPC binds a bounded gRPC listener with the configured transport
// security and adds it to s.grpcs.
func (s *Server) newGRPC(name, addr string, allow allowList) (*grpcListener, error) {
	g := &grpcListener{name: name, tls: "off"}
	opts := s.cfg.Bounds.serverOptions()
	if s.cfg.TLS.enabled() {
		tc, err := s.cfg.TLS.config(allow, &g.tlsRefused, func(names []string) {
			s.log.Debug("client certificate refused: no allowed name", "listener", name, "names", names)
		})
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
		g.tls = "tls"
		if tc.ClientCAs != nil {
			g.tls = "mtls"
			if allow.empty() {
				s.log.Warn("mTLS without an allow-list: any certificate of the client CA is accepted", "listener", name)
			}
		}
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("server: listen %s on %s: %w", listenName(name), addr, err)
	}
	g.lis = newLimitListener(sockio.Listen(lis), s.cfg.Bounds.MaxConnections)
	// The Check service's lean decoder; every other message keeps the
	// standard proto codec.
	opts = append(opts, grpc.ForceServerCodecV2(checkgrpc.NewCodec()))
	if s.cfg.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(s.cfg.StreamWorkers)))
	}
	g.srv = grpc.NewServer(opts...)
	s.grpcs = append(s.grpcs, g)
	return g, nil
}

func listenName(listener string) string {
	if listener == listenerAccessLog {
		return "access log"
	}
	return "gRPC"
}

func (s *Server) adminMux(reg prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if s.svc.Failures != nil {
		mux.Handle("/v1/failures", s.svc.Failures)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		body := "ready\n"
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			body = "not ready\n"
		}
		if s.cfg.ReadyDetail != nil {
			if d := s.cfg.ReadyDetail(); d != "" {
				body += d + "\n"
			}
		}
		fmt.Fprint(w, body)
	})
	return mux
}

func (s *Server) registerMetrics(reg prometheus.Registerer) error {
	// ready follows s.ready, which /readyz and gRPC health answer from,
	// so the gauge and the probes never disagree.
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "ratelimit_authz", Name: "ready",
		Help: "1 while /readyz answers 200 and gRPC health is SERVING; 0 while warming up (ReadyAfter) and from the start of the drain.",
	}, func() float64 {
		if s.ready.Load() {
			return 1
		}
		return 0
	})); err != nil {
		return fmt.Errorf("server: register metrics: %w", err)
	}
	if s.check != nil {
		for _, c := range s.check.collectors() {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	for _, g := range s.grpcs {
		labels := prometheus.Labels{"listener": g.name}
		for _, c := range []prometheus.Collector{
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Namespace: "ratelimit_authz", Subsystem: "server", Name: "connections_open", ConstLabels: labels,
				Help: "Connections open on a gRPC listener.",
			}, func() float64 { return float64(g.lis.open.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "ratelimit_authz", Subsystem: "server", Name: "connections_refused_total", ConstLabels: labels,
				Help: "Connections closed on accept because the listener was at its connection bound.",
			}, func() float64 { return float64(g.lis.refused.Load()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Namespace: "ratelimit_authz", Subsystem: "server", Name: "tls_clients_refused_total", ConstLabels: labels,
				Help: "TLS handshakes refused: a client certificate of the CA without an allowed name.",
			}, func() float64 { return float64(g.tlsRefused.Load()) }),
		} {
			if err := reg.Register(c); err != nil {
				return fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	return nil
}

// GRPCAddr is the bound gRPC address (useful with port 0).
func (s *Server) GRPCAddr() net.Addr { return s.grpcs[0].lis.Addr() }

// AccessLogAddr is the bound access-log address, nil when the access log
// shares the gRPC port.
func (s *Server) AccessLogAddr() net.Addr {
	if len(s.grpcs) < 2 {
		return nil
	}
	return s.grpcs[1].lis.Addr()
}

// CheckAddr is the bound address of the lean Check listener, nil when it
// is off.
func (s *Server) CheckAddr() net.Addr {
	if s.check == nil {
		return nil
	}
	return s.check.lis.Addr()
}

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() net.Addr { return s.hlis.Addr() }

// PprofAddr is the bound profile address, nil when profiles are off.
func (s *Server) PprofAddr() net.Addr {
	if s.plis == nil {
		return nil
	}
	return s.plis.Addr()
}

func (s *Server) setServing(ok bool) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	if ok && s.stopping {
		return
	}
	s.stopping = s.stopping || !ok
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.ready.Store(ok)
	for _, name := range s.healthNames() {
		s.health.SetServingStatus(name, st)
	}
}

// healthNames are the names gRPC health answers for: the server ("") and
// each decision service it serves.
func (s *Server) healthNames() []string {
	names := []string{"", authv3.Authorization_ServiceDesc.ServiceName}
	if s.svc.RateLimit != nil {
		names = append(names, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
	if s.svc.RateLimitQuota != nil {
		names = append(names, rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName)
	}
	return names
}

// Run serves until ctx is done, then shuts down in order and returns nil,
// or returns the first listener error.
func (s *Server) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, gl := range s.grpcs {
		g.Go(func() error {
			// ErrServerStopped: the shutdown came before Serve began.
			if err := gl.srv.Serve(gl.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("server: serve %s: %w", listenName(gl.name), err)
			}
			return nil
		})
	}
	if s.check != nil {
		g.Go(s.check.serve)
	}
	serveHTTP := func(what string, hs *http.Server, lis net.Listener) {
		g.Go(func() error {
			if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("server: serve %s: %w", what, err)
			}
			return nil
		})
	}
	serveHTTP("HTTP", s.http, s.hlis)
	if s.pprof != nil {
		serveHTTP("pprof", s.pprof, s.plis)
	}
	if len(s.cfg.ReadyAfter) == 0 {
		s.setServing(true)
	} else {
		g.Go(func() error {
			for _, c := range s.cfg.ReadyAfter {
				select {
				case <-c:
				case <-gctx.Done():
					return nil
				}
			}
			s.setServing(true)
			s.log.Info("ready")
			return nil
		})
	}
	s.log.Info("serving", s.servingAttrs()...)
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown()
		return nil
	})
	return g.Wait()
}

// servingAttrs are the attributes of the "serving" log line: the bound
// addresses, the transport security and the bounds.
func (s *Server) servingAttrs() []any {
	attrs := []any{"grpc", s.GRPCAddr().String(), "http", s.HTTPAddr().String()}
	if a := s.AccessLogAddr(); a != nil {
		attrs = append(attrs, "access_log", a.String())
	}
	if a := s.PprofAddr(); a != nil {
		attrs = append(attrs, "pprof", a.String())
	}
	if a := s.CheckAddr(); a != nil {
		attrs = append(attrs, "check", a.String(), "check_tls", s.check.tls)
	}
	return append(attrs, "grpc_tls", s.grpcs[0].tls,
		"max_connections", s.cfg.Bounds.MaxConnections, "max_streams", s.cfg.Bounds.MaxConcurrentStreams,
		"max_recv_bytes", s.cfg.Bounds.MaxRecvMsgBytes, "stream_workers", max(s.cfg.StreamWorkers, 0))
}

// shutdown: NOT_SERVING, the drain delay, the access-log and quota
// streams ended,
// then every gRPC server stopped gracefully within the shutdown timeout,
// then the HTTP listeners.
func (s *Server) shutdown() {
	s.closed.Do(func() {
		s.setServing(false)
		if s.cfg.DrainDelay > 0 {
			s.log.Info("draining", "delay", s.cfg.DrainDelay.String())
			time.Sleep(s.cfg.DrainDelay)
		}
		if s.svc.AccessLog != nil {
			s.svc.AccessLog.CloseStreams()
		}
		if s.svc.RateLimitQuota != nil {
			s.svc.RateLimitQuota.CloseStreams()
		}
		stopped := make(chan struct{})
		cctx, ccancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer ccancel()
		go func() {
			var wg sync.WaitGroup
			for _, gl := range s.grpcs {
				wg.Go(gl.srv.GracefulStop)
			}
			if s.check != nil {
				wg.Go(func() { s.check.shutdown(cctx) })
			}
			wg.Wait()
			close(stopped)
		}()
		t := time.NewTimer(s.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			s.log.Warn("graceful stop timed out; closing remaining streams", "timeout", s.cfg.ShutdownTimeout.String())
			for _, gl := range s.grpcs {
				gl.srv.Stop()
			}
			<-stopped
		}
		hctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer cancel()
		for _, hs := range []*http.Server{s.http, s.pprof} {
			if hs != nil && hs.Shutdown(hctx) != nil {
				hs.Close()
			}
		}
		s.log.Info("stopped")
	})
}

// Close stops a server whose Run was never called, or stops it at once.
// It is idempotent.
func (s *Server) Close() {
	s.closed.Do(func() {
		for _, gl := range s.grpcs {
			gl.srv.Stop()
		}
		if s.check != nil {
			s.check.srv.Close()
		}
		for _, hs := range []*http.Server{s.http, s.pprof} {
			if hs != nil {
				hs.Close()
			}
		}
		s.closeListeners()
	})
}

// closeListeners closes every bound listener (a server never served, or
// a New that failed half-way).
func (s *Server) closeListeners() {
	for _, gl := range s.grpcs {
		gl.lis.Close()
	}
	if s.check != nil {
		s.check.lis.Close()
	}
	for _, l := range []net.Listener{s.hlis, s.plis} {
		if l != nil {
			l.Close()
		}
	}
}
