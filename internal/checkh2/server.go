package checkh2

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// Config configures a Server. Zero fields take the defaults below.
type Config struct {
	// Check answers Check. Required.
	Check checkwire.Server
	// RateLimit, when set, answers ShouldRateLimit (RLS v3); nil: it is
	// UNIMPLEMENTED.
	RateLimit checkwire.RateLimitServer
	// Serving reports whether health answers SERVING; nil: always.
	Serving func() bool
	// TLS, when set, makes every connection TLS with ALPN h2 (its
	// NextProtos are set to h2); nil: cleartext HTTP/2 with prior knowledge.
	TLS *tls.Config
	// Log receives connection errors at debug level; nil: discarded.
	Log *slog.Logger

	MaxConnections       int           // open at once; more are closed on accept
	MaxConcurrentStreams uint32        // per connection, advertised
	MaxRecvMsgBytes      int           // one request message
	MaxHeaderListBytes   uint32        // one request's header list, advertised
	HandshakeTimeout     time.Duration // TLS handshake, preface and first SETTINGS
	IdleTimeout          time.Duration // without open streams since the last one, whatever else arrives: GOAWAY, close
	ReadTimeout          time.Duration // silence with open streams: GOAWAY "read timeout", close
	WriteTimeout         time.Duration // one flush
	MaxResetsPerSecond   int           // the peer's RST_STREAMs on streams not yet answered, less the answers written since, within a second; 0: 4 × MaxConcurrentStreams
	PingMinInterval      time.Duration // between the peer's pings
}

// Defaults of Config.
const (
	DefaultMaxConnections       = 4096
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxRecvMsgBytes      = 4 << 20 // grpc-go's default
	DefaultMaxHeaderListBytes   = 16 << 10
	DefaultHandshakeTimeout     = 10 * time.Second
	DefaultIdleTimeout          = 5 * time.Minute
	DefaultReadTimeout          = 30 * time.Second
	DefaultWriteTimeout         = 10 * time.Second
	DefaultPingMinInterval      = 5 * time.Second

	// maxRecvMsgBytesLimit keeps a stream's receive window an HTTP/2
	// window (below 2^31).
	maxRecvMsgBytesLimit = 64 << 20
)

func (c *Config) setDefaults() error {
	if c.Check == nil {
		return errors.New("checkh2: no Check handler")
	}
	if c.MaxConnections < 0 || c.MaxRecvMsgBytes < 0 || c.HandshakeTimeout < 0 || c.IdleTimeout < 0 ||
		c.ReadTimeout < 0 || c.WriteTimeout < 0 || c.MaxResetsPerSecond < 0 || c.PingMinInterval < 0 {
		return errors.New("checkh2: bounds must not be negative")
	}
	if c.MaxRecvMsgBytes > maxRecvMsgBytesLimit {
		return fmt.Errorf("checkh2: max receive size %d bytes: at most %d", c.MaxRecvMsgBytes, maxRecvMsgBytesLimit)
	}
	setInt := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	setDur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	setInt(&c.MaxConnections, DefaultMaxConnections)
	setInt(&c.MaxRecvMsgBytes, DefaultMaxRecvMsgBytes)
	if c.MaxConcurrentStreams == 0 {
		c.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	// As Go's net/http2 bounds the streams waiting for a handler: 4 ×
	// the streams a peer may have open.
	setInt(&c.MaxResetsPerSecond, 4*int(c.MaxConcurrentStreams))
	if c.MaxHeaderListBytes == 0 {
		c.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	setDur(&c.HandshakeTimeout, DefaultHandshakeTimeout)
	setDur(&c.IdleTimeout, DefaultIdleTimeout)
	setDur(&c.ReadTimeout, DefaultReadTimeout)
	setDur(&c.WriteTimeout, DefaultWriteTimeout)
	setDur(&c.PingMinInterval, DefaultPingMinInterval)
	if c.Serving == nil {
		c.Serving = func() bool { return true }
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.TLS != nil {
		c.TLS = c.TLS.Clone()
		c.TLS.NextProtos = []string{"h2"}
	}
	return nil
}

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = errors.New("checkh2: server closed")

// Server serves Check, ShouldRateLimit and health. Safe for concurrent use.
type Server struct {
	cfg     Config
	health  healthAnswers
	refused atomic.Uint64

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	closing   bool
	done      chan struct{} // closed when conns becomes empty while closing
	wg        sync.WaitGroup
}

// New returns a server for cfg.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	h, err := newHealthAnswers()
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, health: h, listeners: map[net.Listener]struct{}{}, conns: map[*conn]struct{}{}, done: make(chan struct{})}, nil
}

// Serve accepts connections on l until Shutdown or Close, and returns
// ErrServerClosed then, or the listener's error. It closes l.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		l.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			if acceptRetryable(err) {
				// Out of descriptors and the like: wait, as net/http does.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("checkh2: accept: %w", err)
		}
		backoff = 0
		s.ServeConn(nc)
	}
}

// acceptRetryable reports whether an Accept error passes: the process
// or the system out of descriptors or buffers, a connection aborted
// before it was accepted, a timeout. Any other ends Serve.
func acceptRetryable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ServeConn serves nc on a goroutine of its own, or closes it when the
// server is at MaxConnections or closing.
func (s *Server) ServeConn(nc net.Conn) {
	c := newConn(s, nc)
	s.mu.Lock()
	if s.closing || len(s.conns) >= s.cfg.MaxConnections {
		closing := s.closing
		s.mu.Unlock()
		if !closing {
			s.refused.Add(1)
		}
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.conns, c)
		if s.closing && len(s.conns) == 0 {
			closeOnce(s.done)
		}
		s.mu.Unlock()
	}()
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

// Open is the number of connections being served.
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Refused is the number of connections closed on accept at MaxConnections.
func (s *Server) Refused() uint64 { return s.refused.Load() }

// Shutdown stops accepting, closes every connection gracefully (GOAWAY
// naming every stream and a PING, then on its ack, or a second on, GOAWAY
// naming the last stream received), lets the streams in progress finish,
// and returns once every connection is closed; when ctx ends first it
// closes them and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	conns := s.beginClose()
	for _, c := range conns {
		c.drain()
	}
	select {
	case <-s.done:
		s.wg.Wait()
		return nil
	case <-ctx.Done():
		s.Close()
		return fmt.Errorf("checkh2: shutdown: %w", ctx.Err())
	}
}

// Close closes the listeners and every connection at once, and waits for
// their goroutines.
func (s *Server) Close() {
	for _, c := range s.beginClose() {
		c.raw.Close()
	}
	s.wg.Wait()
}

// beginClose marks the server closing, closes its listeners and returns
// the connections open.
func (s *Server) beginClose() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	if len(s.conns) == 0 {
		closeOnce(s.done)
	}
	return slices.Collect(maps.Keys(s.conns))
}
