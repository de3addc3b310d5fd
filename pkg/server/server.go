// Package server runs the node's two listeners: gRPC (Envoy's ext_authz
// Check, its access-log service and grpc.health.v1; plaintext, TLS or mTLS)
// and HTTP (/metrics, /healthz, /readyz, /v1/failures, and /debug/pprof/
// when asked), and shuts them down in order: readiness and health go
// NOT_SERVING, a drain delay lets Envoy and load balancers notice, the
// long-lived access-log streams are ended, then GracefulStop lets in-flight
// checks finish, with a deadline after which remaining streams are cut.
// Readiness can also wait for other components (ReadyAfter), such as a
// cluster node's warm start.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"sync/atomic"
	"time"

	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// Config is the server's own configuration. Zero fields take defaults.
type Config struct {
	GRPCAddr string // default 127.0.0.1:9001
	HTTPAddr string // default 127.0.0.1:9090
	// DrainDelay is how long the node reports NOT_SERVING before it stops
	// accepting checks. Default 0 (tests); main sets its own default.
	DrainDelay time.Duration
	// ShutdownTimeout bounds GracefulStop; default 10 s.
	ShutdownTimeout time.Duration
	// ReadyAfter, when set, holds back SERVING (gRPC health and /readyz)
	// until every channel in it is closed, for example until a cluster
	// node has warmed up from its peers. Checks are answered meanwhile.
	ReadyAfter []<-chan struct{}
	// TLS secures the gRPC port (TLS, or mTLS with a client CA); zero:
	// plaintext HTTP/2, for a port only Envoy on the same host or network
	// can reach.
	TLS TLS
	// Pprof serves Go's profiles under /debug/pprof/ on the HTTP port.
	// Off by default: profiles expose internals; keep the port private.
	Pprof bool
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
	return nil
}

// Services are what the listeners serve.
type Services struct {
	// Authz answers Envoy's ext_authz Check. Required.
	Authz authv3.AuthorizationServer
	// AccessLog, when set, receives Envoy's gRPC access log on the same
	// gRPC port.
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

// Server owns the listeners. New binds them; Run serves until its context
// ends, then shuts down.
type Server struct {
	cfg    Config
	svc    Services
	log    *slog.Logger
	grpc   *grpc.Server
	health *health.Server
	http   *http.Server
	glis   net.Listener
	hlis   net.Listener
	ready  atomic.Bool
	closed sync.Once

	servingMu sync.Mutex
	stopping  bool // set by the first setServing(false): never SERVING again
}

// New binds both listeners and registers the services. The caller must
// call Run or Close.
func New(cfg Config, svc Services, gatherer prometheus.Gatherer, log *slog.Logger) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if svc.Authz == nil {
		return nil, errors.New("server: no ext_authz service")
	}
	opts := []grpc.ServerOption{
		// Envoy keeps long-lived HTTP/2 connections and may ping them.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// A CheckRequest holds headers and at most the body Envoy buffers.
		grpc.MaxRecvMsgSize(4 << 20),
	}
	if cfg.TLS.enabled() {
		tc, err := cfg.TLS.config()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	glis, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("server: listen gRPC on %s: %w", cfg.GRPCAddr, err)
	}
	hlis, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		glis.Close()
		return nil, fmt.Errorf("server: listen HTTP on %s: %w", cfg.HTTPAddr, err)
	}
	s := &Server{cfg: cfg, svc: svc, log: log, glis: glis, hlis: hlis, health: health.NewServer()}
	s.grpc = grpc.NewServer(opts...)
	authv3.RegisterAuthorizationServer(s.grpc, svc.Authz)
	if svc.AccessLog != nil {
		alsv3.RegisterAccessLogServiceServer(s.grpc, svc.AccessLog)
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	if svc.Failures != nil {
		mux.Handle("/v1/failures", svc.Failures)
	}
	writeTimeout := 30 * time.Second
	if cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		writeTimeout = 2 * time.Minute // a CPU profile takes 30 s by default
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready")
			return
		}
		fmt.Fprintln(w, "ready")
	})
	s.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	return s, nil
}

// GRPCAddr is the bound gRPC address (useful with port 0).
func (s *Server) GRPCAddr() net.Addr { return s.glis.Addr() }

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() net.Addr { return s.hlis.Addr() }

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
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(authv3.Authorization_ServiceDesc.ServiceName, st)
}

// Run serves until ctx is done, then shuts down in order and returns nil,
// or returns the first listener error.
func (s *Server) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpc.Serve(s.glis); err != nil {
			return fmt.Errorf("server: serve gRPC: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := s.http.Serve(s.hlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("server: serve HTTP: %w", err)
		}
		return nil
	})
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
	s.log.Info("serving", "grpc", s.GRPCAddr().String(), "http", s.HTTPAddr().String())
	g.Go(func() error {
		<-gctx.Done()
		s.shutdown()
		return nil
	})
	return g.Wait()
}

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
		stopped := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(stopped) }()
		t := time.NewTimer(s.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-stopped:
		case <-t.C:
			s.log.Warn("graceful stop timed out; closing remaining streams", "timeout", s.cfg.ShutdownTimeout.String())
			s.grpc.Stop()
			<-stopped
		}
		hctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
		defer cancel()
		if err := s.http.Shutdown(hctx); err != nil {
			s.http.Close()
		}
		s.log.Info("stopped")
	})
}

// Close stops a server whose Run was never called, or stops it at once.
// It is idempotent.
func (s *Server) Close() {
	s.closed.Do(func() {
		s.grpc.Stop()
		s.http.Close()
		s.glis.Close()
		s.hlis.Close()
	})
}
