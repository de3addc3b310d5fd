package admin

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// Config is the admin listener's configuration.
type Config struct {
	// Addr is the listen address; required. An address that is not
	// loopback requires Token.
	Addr string
	// Token, when set, is the bearer token every request must carry.
	Token string
	// HideKeys shows a keyed hash instead of each key.
	HideKeys bool
	// Refresh is how often the status page reloads itself; default 5 s.
	Refresh time.Duration
}

// Bucket is one bucket of the configuration the node serves.
type Bucket struct {
	ID   counter.Bucket
	Name string
	// Limit is the bucket's own limit, 0 when it has none (each key's
	// comes from an override, a route default or a descriptor).
	Limit     int64
	WindowMS  int64
	Algorithm counter.Algorithm
	// Protocol is what configures it: "ext_authz" (the rules file) or
	// "rls" (envoyproxy/ratelimit's descriptors).
	Protocol string
	// Unit is what its admitted hits count ("requests", "hits",
	// UnitInFlight acquisitions, "failures", "content-bytes", "cost"),
	// DeniedUnit its denied ones: the same, or "requests" where a check
	// refuses a budget spent from the response.
	Unit, DeniedUnit string
}

// UnitInFlight is the unit of a bucket of requests in flight: its hits
// are acquisitions of slots, and it lists who holds slots now
// (Deps.InFlight).
const UnitInFlight = "concurrent-requests"

// Deps is what the listener reads.
type Deps struct {
	// Buckets returns the buckets of the configuration served now.
	Buckets func() []Bucket
	// Sketch holds the top keys; nil reads empty.
	Sketch *top.Sketch
	// InFlight calls f with every key of a bucket of requests in flight
	// holding leases on this node now; nil: none.
	InFlight func(bucket counter.Bucket, f func(key string, leases int64))
	// Gatherer is the node's registry, for the status page's state.
	Gatherer prometheus.Gatherer
	// Cluster returns what the node knows of its cluster; nil: the node
	// is not in one.
	Cluster func() Cluster
	// Ask sends a query to the cluster's peers and returns their answers
	// (each peer's identity, node id/incarnation, and body) and the peers
	// that did not answer in time; nil: the node is not in a cluster. The
	// peers answer with Server.Answer.
	Ask func(ctx context.Context, query []byte) (answers []PeerAnswer, missing []string, err error)
	// State is the node's configuration and overrides, for the status
	// page; nil: not shown.
	State State
}

// State reads what the status page shows of the node besides its tops.
// Its methods must be safe for concurrent use and must not block on a
// reload or on Postgres.
type State interface {
	Config() ConfigState
	Overrides() OverridesState
}

// ConfigState is the configuration a node serves and its last reload.
type ConfigState struct {
	// Generation counts the configurations applied: 1 is the one the
	// node started with, each applied reload adds one.
	Generation uint64
	// Applied is when the configuration served was applied.
	Applied time.Time
	// Last is the last reload tried; nil: none since start.
	Last *Reload
}

// Reload is one reload's result.
type Reload struct {
	At time.Time
	// Err is why it was refused (the previous configuration keeps
	// serving); empty: applied.
	Err string
	// Problems are the refusal's located problems (file:line:col:
	// message), when it carries any.
	Problems []string
}

// OverridesState is where the tenant overrides in effect come from.
type OverridesState struct {
	// Source is "postgres" (the last refresh), "snapshot" (the snapshot
	// file: Postgres not reached since start), "none" (the configured
	// limits: nothing loaded) or "off" (no database configured).
	Source string
	// Detail is one line: the overrides and key owners in effect, how
	// current they are and, when degraded, why.
	Detail string
}

// PeerAnswer is one peer's answer to a query.
type PeerAnswer struct {
	Peer string // node id/incarnation
	Body []byte
}

// Cluster is a cluster node's view of its cluster.
type Cluster struct {
	// Self is this node's identity: node id/incarnation.
	Self string
	// Sealed: messages are sealed with a cluster key.
	Sealed bool
	Peers  []Peer
}

// Peer is one peer as the node knows it.
type Peer struct {
	Node        string
	Incarnation uint64
	// LastHeard is when it last sent a message itself; zero: only named
	// by others.
	LastHeard time.Time
	// DelayMS is its latest batch's delivery delay (clock skew
	// included), SkewMS its clock skew, RoundTripMS its latest link
	// probe's round trip (-1: it echoed none).
	DelayMS, SkewMS, RoundTripMS int64
}

// Server is a running admin listener. Its methods are safe for
// concurrent use.
type Server struct {
	cfg     Config
	deps    Deps
	lis     net.Listener
	http    *http.Server
	page    *template.Template
	hashKey []byte // HMAC key of HideKeys, drawn at New
	log     *slog.Logger
	closed  sync.Once
}

// ErrUnsafe is returned by New for a listener that would serve keys to
// anyone who can reach it.
var ErrUnsafe = errors.New("admin: an address that is not loopback requires a bearer token (--admin-token-file)")

//go:embed page.html
var pageFS embed.FS

// New validates cfg and binds the listener; the caller must call Run or
// Close.
func New(cfg Config, deps Deps, log *slog.Logger) (*Server, error) {
	if cfg.Addr == "" {
		return nil, errors.New("admin: no address")
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.Refresh < time.Second {
		return nil, fmt.Errorf("admin: refresh %v: at least 1 s", cfg.Refresh)
	}
	if cfg.Token == "" && !loopback(cfg.Addr) {
		return nil, fmt.Errorf("%w: %s", ErrUnsafe, cfg.Addr)
	}
	if deps.Buckets == nil {
		deps.Buckets = func() []Bucket { return nil }
	}
	page, err := template.New("page.html").Funcs(template.FuncMap{"spark": spark, "rate": rate, "window": windowText, "ago": ago}).ParseFS(pageFS, "page.html")
	if err != nil {
		return nil, fmt.Errorf("admin: parse the status page: %w", err)
	}
	s := &Server{cfg: cfg, deps: deps, page: page, log: log}
	if cfg.HideKeys {
		s.hashKey = make([]byte, 32)
		_, _ = rand.Read(s.hashKey) // crypto/rand.Read never fails
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s: %w", cfg.Addr, err)
	}
	if tcp, ok := lis.Addr().(*net.TCPAddr); ok && cfg.Token == "" && !tcp.IP.IsLoopback() {
		lis.Close()
		return nil, fmt.Errorf("%w: %s is bound to %s", ErrUnsafe, cfg.Addr, tcp.IP)
	}
	s.lis = lis
	s.http = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
	return s, nil
}

// loopback reports whether addr's host is a loopback address or
// "localhost"; an empty host (every interface) is not.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Run serves until ctx ends, then shuts the listener down and returns
// nil, or returns the error that stopped it.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.lis) }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("admin: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s.http.Shutdown(sctx) != nil {
		s.http.Close()
	}
	<-errc
	return nil
}

// Close stops the listener at once. It is idempotent.
func (s *Server) Close() {
	s.closed.Do(func() {
		s.http.Close()
		s.lis.Close()
	})
}

// maxQueryBytes bounds a request's query string.
const maxQueryBytes = 512

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", s.servePage)
	mux.HandleFunc("/v1/top", s.serveTop)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
		if s.cfg.Token != "" {
			if !bearer(r.Header.Get("Authorization"), s.cfg.Token) {
				h.Set("WWW-Authenticate", `Bearer realm="ratelimit-authz admin"`)
				http.Error(w, "a bearer token is required", http.StatusUnauthorized)
				return
			}
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "only GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		if len(r.URL.RawQuery) > maxQueryBytes {
			http.Error(w, "query too long", http.StatusRequestURITooLong)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// bearer reports whether an Authorization header value carries token
// under the Bearer scheme, whose name is case-insensitive (RFC 7235
// §2.1), compared in constant time.
func bearer(header, token string) bool {
	scheme, got, ok := strings.Cut(header, " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimLeft(got, " ")), []byte(token)) == 1
}

// shownKey is key as the listener shows it: itself, or with HideKeys its
// keyed hash.
func (s *Server) shownKey(key string) string {
	if s.hashKey == nil {
		return key
	}
	m := hmac.New(sha256.New, s.hashKey)
	m.Write([]byte(key))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:12])
}
