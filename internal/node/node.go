package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/filewatch"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// Config is a node's configuration. Rules or RulesFile is required;
// every other zero field takes the default given with it.
type Config struct {
	// Rules is the validated configuration (buckets, routes, the
	// counter's bounds); nil: read from RulesFile.
	Rules *configfile.Rules
	// RulesFile is where the rules are read: at start when Rules is nil,
	// and at every ReloadFiles.
	RulesFile *configfile.File
	// Watch reloads the configuration files (RulesFile, the RLS files)
	// when they change, as ReloadFiles does.
	Watch bool
	// Version is the version label of ratelimit_authz_build_info; default
	// "dev".
	Version string

	// GRPCAddr serves ext_authz Check, grpc.health.v1 and, without
	// AccessLogAddr, Envoy's access-log service; default 127.0.0.1:9001.
	GRPCAddr string
	// AccessLogAddr, when set, serves the access-log service on a
	// listener of its own and the gRPC port no longer does; empty: on the
	// gRPC port.
	AccessLogAddr string
	// CheckAddr, when set, serves ext_authz Check and grpc.health.v1 on
	// a lean HTTP/2 listener of its own (see server.Config); empty: off.
	CheckAddr string
	// HTTPAddr serves /metrics, /healthz, /readyz and /v1/failures;
	// default 127.0.0.1:9090.
	HTTPAddr string
	// PprofAddr, when set, serves Go's profiles on a listener of its own;
	// empty: no profiles.
	PprofAddr string
	// DrainDelay is how long the node reports NOT_SERVING on shutdown
	// before it refuses new checks; default 0.
	DrainDelay time.Duration
	// ShutdownTimeout bounds the graceful stop; default 10 s.
	ShutdownTimeout time.Duration
	// TLS secures the gRPC listeners (see server.TLS); zero: plaintext.
	TLS server.TLS
	// AccessLogAllowedClients is the allow-list of AccessLogAddr (see
	// server.Config); nil: the gRPC port's.
	AccessLogAllowedClients []string
	// Bounds bound the gRPC listeners' clients; zero fields take the
	// server.Default… values.
	Bounds server.Bounds
	// StreamWorkers is the gRPC listeners' worker goroutines (see
	// server.Config); zero: server.DefaultStreamWorkers, negative: a
	// goroutine per call.
	StreamWorkers int

	// SweepInterval is how often expired counters are reclaimed; default
	// 10 s.
	SweepInterval time.Duration
	// FailuresToken, when set, enables POST /v1/failures for requests
	// that carry it as a bearer token; empty: the endpoint is off.
	FailuresToken string
	// Overrides are the tenant overrides; zero: none (the configured
	// limits only).
	Overrides Overrides
	// Cluster, when set, replicates the counts over NATS (the cluster
	// backend); nil: this node's counts only (the local backend).
	Cluster *Cluster
	// RLS, when set, serves Envoy's ratelimit filter (ShouldRateLimit)
	// on the gRPC port from envoyproxy/ratelimit configuration files;
	// nil: Check only.
	RLS *RLS
	// Admin, when set, serves the top keys and a status page on a
	// listener of its own, and the counter reports its decisions to a
	// top-keys sketch; nil: off, at the cost of a nil check per decision.
	Admin *admin.Config
}

// DefaultSweepInterval is Config.SweepInterval's default.
const DefaultSweepInterval = 10 * time.Second

func (c *Config) setDefaults() error {
	if c.Rules == nil && c.RulesFile == nil {
		return errors.New("node: no rules")
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	switch {
	case c.SweepInterval < 0:
		return fmt.Errorf("node: sweep interval %v: must not be negative", c.SweepInterval)
	case c.SweepInterval == 0:
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Cluster != nil {
		return c.Cluster.setDefaults()
	}
	return nil
}

// Node is one assembled node: New builds it, Run serves it. Its methods
// are safe for concurrent use.
type Node struct {
	cfg          Config
	reg          *prometheus.Registry
	store        *counter.Store
	repl         *replicate.Replicator // nil: the local backend
	leases       *inflight.Sync
	runOverrides func(context.Context) error
	overrides    *overrides.Cache // nil: no database
	srv          *server.Server
	watcher      *filewatch.Watcher // nil: Config.Watch off, or no file to watch
	running      atomic.Bool
	fronts       []*frontEnd

	// What Reload swaps; see reload.go.
	parts   []part // the overrides cache and the replicator, when the node has them, then fronts
	reloads *reloadMetrics
	mu      sync.Mutex         // serialises reloads; guards cur
	cur     *snapshot.Snapshot // the configuration served
	sketch  *top.Sketch        // nil: no admin listener
	admin   *admin.Server      // nil: off
	log     *slog.Logger
}

// New assembles a node and binds its listeners; the caller must call Run
// or Close. ctx bounds the first load of the tenant overrides (itself
// bounded; see the package doc). log receives every component's log.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Node, error) {
	if log == nil {
		return nil, errors.New("node: New needs a logger")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	watcher, err := watchFiles(&cfg, log)
	if err != nil {
		return nil, err
	}
	if cfg.Rules == nil {
		if cfg.Rules, err = loadRules(cfg.RulesFile, log); err != nil {
			return nil, err
		}
	}
	reg := newRegistry(cfg.Version)
	rc, err := loadRLS(cfg.RLS, log)
	if err != nil {
		return nil, err
	}
	snap, err := snapshot.Compile(Sources{Rules: cfg.Rules, RLS: rc})
	if err != nil {
		return nil, err
	}
	sketch, err := newSketch(cfg.Admin, reg)
	if err != nil {
		return nil, err
	}
	store, err := newCounter(snap.Rules, snap.Reserved(), cfg.Cluster != nil, sketch, reg)
	if err != nil {
		return nil, err
	}
	over, cache, runOverrides, overridesState, err := newOverrides(ctx, cfg.Overrides, snap, reg, log)
	if err != nil {
		return nil, err
	}
	repl, err := newReplicator(cfg.Cluster, snap, store, reg, log)
	if err != nil {
		return nil, err
	}
	leases, err := newLeases(repl, snap, sketch, reg, log)
	if err != nil {
		return nil, err
	}
	c := &core{snap: snap, store: store, over: over, repl: repl, leases: leases, cfg: &cfg, reg: reg, log: log}
	services := server.Services{}
	fronts, err := newFrontEnds(c, &services)
	if err != nil {
		return nil, err
	}
	rm, err := newReloadMetrics(reg, log)
	if err != nil {
		return nil, err
	}
	srv, err := newServer(&cfg, services, repl, overridesState, reg, log)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, reg: reg, store: store, repl: repl, leases: leases, runOverrides: runOverrides, overrides: cache, srv: srv, watcher: watcher, fronts: fronts,
		parts: reloadParts(cache, repl, leases, fronts), reloads: rm, cur: snap, sketch: sketch, log: log,
	}
	if n.admin, err = n.newAdmin(sketch); err != nil {
		srv.Close()
		return nil, err
	}
	return n, nil
}

// newFrontEnds builds, in frontEnds' order, the front ends the
// configuration asks for, and adds what each serves to services.
func newFrontEnds(c *core, services *server.Services) ([]*frontEnd, error) {
	var fronts []*frontEnd
	for _, newFront := range frontEnds() {
		f, err := newFront(c)
		if err != nil {
			return nil, err
		}
		if f != nil {
			fronts = append(fronts, f)
			f.serve(services)
		}
	}
	return fronts, nil
}

// reloadParts are the parts Reload swaps, in this order: the overrides
// cache and the replicator when the node has them (cache, repl nil: not),
// the in-flight leases, then the front ends.
func reloadParts(cache *overrides.Cache, repl *replicate.Replicator, leases *inflight.Sync, fronts []*frontEnd) []part {
	var parts []part
	if cache != nil {
		parts = append(parts, part{"tenant overrides", prepareFunc(func(s *snapshot.Snapshot) (func(), error) { return cache.Prepare(s) })})
	}
	if repl != nil {
		parts = append(parts, part{"replication", prepareFunc(func(s *snapshot.Snapshot) (func(), error) { return repl.Prepare(replicationBuckets(s)) })})
	}
	parts = append(parts, part{"in-flight leases", prepareFunc(func(s *snapshot.Snapshot) (func(), error) {
		return func() { leases.SetBuckets(s.Concurrency()) }, nil
	})})
	for _, f := range fronts {
		parts = append(parts, f.part)
	}
	return parts
}

// newServer binds the node's listeners, serving services; overridesState
// is appended to /readyz.
func newServer(cfg *Config, services server.Services, repl *replicate.Replicator, overridesState func() string, reg server.Registry, log *slog.Logger) (*server.Server, error) {
	return server.New(server.Config{
		GRPCAddr: cfg.GRPCAddr, AccessLogAddr: cfg.AccessLogAddr, CheckAddr: cfg.CheckAddr,
		HTTPAddr: cfg.HTTPAddr, PprofAddr: cfg.PprofAddr,
		DrainDelay: cfg.DrainDelay, ShutdownTimeout: cfg.ShutdownTimeout,
		ReadyAfter:              readyAfter(repl), // a cluster node warms up from its peers first
		ReadyDetail:             overridesState,   // where the overrides served come from
		TLS:                     cfg.TLS,
		AccessLogAllowedClients: cfg.AccessLogAllowedClients,
		Bounds:                  cfg.Bounds,
		StreamWorkers:           cfg.StreamWorkers,
	}, services, reg, log)
}

// prepareFunc is a preparer from a function.
type prepareFunc func(*snapshot.Snapshot) (func(), error)

func (f prepareFunc) Prepare(s *snapshot.Snapshot) (func(), error) { return f(s) }

// Run serves until ctx ends, then shuts down in the order of the package
// doc and returns nil, or the first error of a component. It may be
// called once; the node is closed when it returns.
func (n *Node) Run(ctx context.Context) error {
	if !n.running.CompareAndSwap(false, true) {
		return errors.New("node: Run called twice")
	}
	defer n.Close()
	g, gctx := errgroup.WithContext(ctx)
	if n.admin != nil {
		a := n.admin.Addr().String()
		n.log.Info("live view of who is limited", "admin", "http://"+a+"/", "top", "ratelimit-authz top --admin-addr "+a)
		g.Go(func() error { return n.admin.Run(gctx) })
	}
	srvDone := make(chan struct{})
	g.Go(func() error { defer close(srvDone); return n.srv.Run(gctx) })
	g.Go(func() error { return runReplicator(gctx, srvDone, n.repl) }) // final batch after gRPC stops
	g.Go(func() error { return n.store.Run(gctx, n.cfg.SweepInterval) })
	g.Go(func() error { return n.leases.Run(gctx) })
	g.Go(func() error { return n.runOverrides(gctx) }) // closes its Postgres connection on return
	if n.watcher != nil {
		g.Go(func() error { return n.runWatch(gctx) })
	}
	for _, f := range n.fronts {
		if f.run != nil {
			g.Go(func() error { return f.run(gctx) })
		}
	}
	return g.Wait()
}

// Close releases a node whose Run was never called: it closes the
// listeners. It is idempotent; to stop a running node, end Run's context.
func (n *Node) Close() {
	n.srv.Close()
	if n.admin != nil {
		n.admin.Close()
	}
}

// GRPCAddr is the bound address of the gRPC (Check) listener.
func (n *Node) GRPCAddr() net.Addr { return n.srv.GRPCAddr() }

// CheckAddr is the bound address of the lean Check listener, nil when it
// is off.
func (n *Node) CheckAddr() net.Addr { return n.srv.CheckAddr() }

// AccessLogAddr is the bound address of the access-log listener, nil when
// the access log shares the gRPC port.
func (n *Node) AccessLogAddr() net.Addr { return n.srv.AccessLogAddr() }

// HTTPAddr is the bound address of the HTTP (metrics, health) listener.
func (n *Node) HTTPAddr() net.Addr { return n.srv.HTTPAddr() }

// PprofAddr is the bound address of the profile listener, nil when
// profiles are off.
func (n *Node) PprofAddr() net.Addr { return n.srv.PprofAddr() }

// AdminAddr is the bound address of the admin listener, nil when it is
// off.
func (n *Node) AdminAddr() net.Addr {
	if n.admin == nil {
		return nil
	}
	return n.admin.Addr()
}

// Gatherer is the registry every component of the node reports to, what
// /metrics serves; it outlives Run.
func (n *Node) Gatherer() prometheus.Gatherer { return n.reg }

// CounterBytes is the memory the counter's arrays hold (see
// counter.Store.MemoryBytes).
func (n *Node) CounterBytes() int64 { return n.store.MemoryBytes() }

// newLeases is the lease table of the concurrency buckets, run by a Sync
// that shares it with the peers over the replicator's casts (repl nil: a
// node alone).
func newLeases(repl *replicate.Replicator, snap *snapshot.Snapshot, sk *top.Sketch, reg prometheus.Registerer, log *slog.Logger) (*inflight.Sync, error) {
	var cfg inflight.Config
	if sk != nil { // a nil *top.Sketch in the interface would not be a nil Observer
		cfg.Observer = sk
	}
	t, err := inflight.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("create the lease table: %w", err)
	}
	var c inflight.Caster
	if repl != nil {
		c = repl
	}
	s, err := inflight.NewSync(t, c, inflight.SyncConfig{}, reg, log)
	if err != nil {
		return nil, fmt.Errorf("create the lease table: %w", err)
	}
	s.SetBuckets(snap.Concurrency())
	if repl != nil {
		repl.SetCastHandler(s.Receive)
	}
	return s, nil
}

// newRegistry is the node's registry with the process-wide collectors and
// build_info.
func newRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "ratelimit_authz", Name: "build_info", Help: "Always 1; the version is a label.",
		ConstLabels: prometheus.Labels{"version": version},
	}, func() float64 { return 1 }))
	return reg
}

// newCounter is the node's counter and its metrics; a cluster node tracks
// its changes for replication.
func newCounter(r *configfile.Rules, reserved []counter.Bucket, cluster bool, sk *top.Sketch, reg prometheus.Registerer) (*counter.Store, error) {
	cfg := counterConfig(r.Counter, cluster)
	cfg.Reserved = reserved // by id
	if sk != nil {          // a nil *top.Sketch in the interface would not be a nil Observer
		cfg.Observer = sk
	}
	store, err := counter.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("create counter: %w", err)
	}
	if err := registerCounterMetrics(reg, store); err != nil {
		return nil, err
	}
	return store, nil
}

// counterConfig is the counter's configuration for the backend: the
// cluster backend tracks this node's changes for replication.
func counterConfig(cfg counter.Config, cluster bool) counter.Config {
	cfg.Track = cluster
	return cfg
}

// registerCounterMetrics exports the counter's own figures, read at scrape
// time so that the counter needs no metrics library. max_keys and
// reserved_keys let a dashboard or an alert divide by the bound in force.
func registerCounterMetrics(reg prometheus.Registerer, s *counter.Store) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "live_keys",
			Help: "(bucket, key) pairs held in memory.",
		}, func() float64 { return float64(s.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "max_keys",
			Help: "The configured counter.max_keys: the bound on live_keys.",
		}, func() float64 { return float64(s.MaxKeys()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "reserved_keys",
			Help: "The room within max_keys kept for the reserved (failure) buckets; the others may fill max_keys minus this.",
		}, func() float64 { return float64(s.ReservedKeys()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "memory_bytes",
			Help: "Bytes the counter's arrays hold (entries, hash table, key bytes); peers' counts in a cluster are not included.",
		}, func() float64 { return float64(s.MemoryBytes()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "keys_refused_total",
			Help: "New keys not tracked because the counter was at counter.max_keys; the bucket's on_overflow decided.",
		}, func() float64 { return float64(s.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "ratelimit_authz", Subsystem: "counter", Name: "share_denials_total",
			Help: "Hits denied because this node had used its share of a key's budget while the cluster, as far as this node knew, was under the limit; each lasts until its report has reached the peers (see replicate_share_nodes).",
		}, func() float64 { return float64(s.ShareDenials()) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register counter metrics: %w", err)
		}
	}
	return nil
}
