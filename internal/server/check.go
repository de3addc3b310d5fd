package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/sockio"
)

// listenerCheck names the lean Check listener in the metrics.
const listenerCheck = "check"

// checkListener is the lean Check listener (internal/checkh2): Check,
// ShouldRateLimit when the rate limit service has the lean path, and
// health, with the gRPC port's transport security, allow-list and limits.
type checkListener struct {
	lis        net.Listener
	srv        *checkh2.Server
	tls        string
	tlsRefused atomic.Uint64
}

// newCheck binds the lean Check listener on addr.
func (s *Server) newCheck(addr string, allow allowList) (*checkListener, error) {
	lean, ok := s.svc.Authz.(checkwire.Server)
	if !ok {
		return nil, errors.New("server: the Check listener needs an Authorization service with the lean path (checkwire.Server)")
	}
	cl := &checkListener{tls: "off"}
	l := s.cfg.Bounds
	cfg := checkh2.Config{
		Check: lean, Serving: s.ready.Load, Log: s.log,
		MaxConnections: l.MaxConnections, MaxConcurrentStreams: l.MaxConcurrentStreams,
		MaxRecvMsgBytes: l.MaxRecvMsgBytes, MaxHeaderListBytes: l.MaxHeaderListBytes,
		HandshakeTimeout: l.HandshakeTimeout, IdleTimeout: l.MaxConnectionIdle, PingMinInterval: l.KeepaliveMinTime,
	}
	if rl, ok := s.svc.RateLimit.(checkwire.RateLimitServer); ok {
		cfg.RateLimit = rl
	}
	if s.cfg.TLS.enabled() {
		tc, err := s.cfg.TLS.config(allow, &cl.tlsRefused, func(names []string) {
			s.log.Debug("client certificate refused: no allowed name", "listener", listenerCheck, "names", names)
		})
		if err != nil {
			return nil, err
		}
		cfg.TLS, cl.tls = tc, "tls"
		if tc.ClientCAs != nil {
			cl.tls = "mtls"
		}
	}
	srv, err := checkh2.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("server: Check listener: %w", err)
	}
	if cl.lis, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("server: listen Check on %s: %w", addr, err)
	}
	cl.lis = sockio.Listen(cl.lis)
	cl.srv = srv
	return cl, nil
}

func (cl *checkListener) serve() error {
	if err := cl.srv.Serve(cl.lis); err != nil && !errors.Is(err, checkh2.ErrServerClosed) {
		return fmt.Errorf("server: serve Check: %w", err)
	}
	return nil
}

// shutdown stops the listener gracefully within ctx, then at once.
func (cl *checkListener) shutdown(ctx context.Context) {
	if cl.srv.Shutdown(ctx) != nil {
		cl.srv.Close()
	}
}

func (cl *checkListener) collectors() []prometheus.Collector {
	labels := prometheus.Labels{"listener": listenerCheck}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "server", Name: "connections_open", ConstLabels: labels,
			Help: "Connections open on a gRPC listener.",
		}, func() float64 { return float64(cl.srv.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ratelimit_authz", Subsystem: "server", Name: "connections_refused_total", ConstLabels: labels,
			Help: "Connections closed on accept because the listener was at its connection bound.",
		}, func() float64 { return float64(cl.srv.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ratelimit_authz", Subsystem: "server", Name: "tls_clients_refused_total", ConstLabels: labels,
			Help: "TLS handshakes refused: a client certificate of the CA without an allowed name.",
		}, func() float64 { return float64(cl.tlsRefused.Load()) }),
	}
}
