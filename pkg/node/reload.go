package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/authz"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/failures"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// generation is one configuration made into every component's Config,
// with the counter ids of its buckets. It is built whole before anything
// is swapped, so a configuration that cannot be served changes nothing.
// A second configuration format joins as more keys in the one ids plan
// (so that no two buckets of either share an id) and one more Update.
type generation struct {
	rules    *rules.Rules
	ids      wiring.Assignment
	matcher  *descriptors.Engine
	buckets  tenantlimits.Buckets // with ids
	limits   *tenantlimits.Resolver
	authz    authz.Config
	failures failures.Config
	table    replicate.Table
	reserved []counter.Bucket
}

// planGeneration assigns the ids of r's buckets and compiles its routes;
// build completes it once the overrides are known.
func planGeneration(r *rules.Rules, ids *wiring.IDs) (*generation, error) {
	if r == nil {
		return nil, errors.New("node: no rules")
	}
	as, err := ids.Plan(wiring.Keys(r))
	if err != nil {
		return nil, fmt.Errorf("assign bucket ids: %w", err)
	}
	m, err := descriptors.New(r.Descriptors())
	if err != nil {
		return nil, fmt.Errorf("compile routes: %w", err)
	}
	g := &generation{rules: r, ids: as, matcher: m}
	g.buckets = wiring.Limits(r, as.IDs)
	g.authz = wiring.Authz(r, as.IDs)
	g.failures = wiring.Failures(r, as.IDs)
	g.reserved = wiring.Reserved(r, as.IDs)
	keys := wiring.Keys(r)
	g.table = replicate.Table{Buckets: make([]string, len(r.Buckets)), IDs: as.IDs, Algorithms: make([]counter.Algorithm, len(r.Buckets)), Bounds: peerBounds(r)}
	for i, b := range r.Buckets {
		g.table.Buckets[i], g.table.Algorithms[i] = b.Name, keys[i].Algorithm
	}
	return g, nil
}

// build makes the generation's resolver over the node's overrides.
func (g *generation) build(over tenantlimits.Overrides) {
	g.limits = tenantlimits.NewResolver(g.buckets, over)
}

// Reload makes r the configuration of the node: it builds every part of
// the new generation first (any error: nothing changes, and the error
// says why), then swaps each component's configuration, then drops the
// counts of the buckets that went away. A check in flight finishes on the
// old generation; the next one uses the new. A bucket whose name, window,
// algorithm and reserve are unchanged keeps its counts, under its new
// limit from the next check; one whose window or algorithm changed starts
// from zero. Settings that only a restart applies (the counter's bounds)
// must be unchanged, or the reload is refused. Reloads are serialised.
func (n *Node) Reload(ctx context.Context, r *rules.Rules) error {
	start := time.Now()
	err := n.reload(ctx, r)
	n.reloads.record(err, start)
	return err
}

// ReloadFrom loads a configuration with load (the same reading and
// validation as at start) and reloads it; a load error is a refused
// reload too, counted alike.
func (n *Node) ReloadFrom(ctx context.Context, load func() (*rules.Rules, error)) error {
	start := time.Now()
	r, err := load()
	if err == nil {
		err = n.reload(ctx, r)
	}
	n.reloads.record(err, start)
	return err
}

func (n *Node) reload(ctx context.Context, r *rules.Rules) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	old := n.cur
	if r == nil {
		return errors.New("node: reload: no rules")
	}
	if err := restartOnly(old.rules, r); err != nil {
		return err
	}
	g, err := planGeneration(r, n.ids)
	if err != nil {
		return err
	}
	g.build(n.over)
	// Swap. Each Update validates before it swaps; one that fails puts the
	// parts already swapped back, so that the node serves one generation.
	var undo []func()
	fail := func(err error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return err
	}
	if n.cache != nil {
		if err := n.cache.Update(g.buckets); err != nil {
			return fail(fmt.Errorf("tenant overrides: %w", err))
		}
		undo = append(undo, func() { _ = n.cache.Update(old.buckets) })
	}
	if n.repl != nil {
		if err := n.repl.Update(g.table); err != nil {
			return fail(fmt.Errorf("replication: %w", err))
		}
		undo = append(undo, func() { _ = n.repl.Update(old.table) })
	}
	if err := n.rec.Update(g.failures, g.limits); err != nil {
		return fail(fmt.Errorf("failure counting: %w", err))
	}
	undo = append(undo, func() { _ = n.rec.Update(old.failures, old.limits) })
	if err := n.svc.Update(g.authz, g.matcher, g.limits); err != nil {
		return fail(fmt.Errorf("check: %w", err))
	}
	undo = append(undo, func() { _ = n.svc.Update(old.authz, old.matcher, old.limits) })
	if err := n.ids.Commit(g.ids); err != nil {
		return fail(err)
	}
	n.store.SetReserved(g.reserved)
	n.cur = g
	dropped := n.store.DropBuckets(g.ids.Dropped)
	n.reloads.log.Info("configuration reloaded", "buckets", len(r.Buckets), "routes", len(r.Routes),
		"buckets_reset", len(g.ids.Dropped), "keys_dropped", dropped)
	return nil
}

// restartOnly refuses a reload that changes what only a restart applies:
// the counter's bounds size its tables when the node starts.
func restartOnly(old, r *rules.Rules) error {
	var changed []string
	o, c := old.Counter, r.Counter
	if o.MaxKeys != c.MaxKeys {
		changed = append(changed, "counter.max_keys")
	}
	if o.Shards != c.Shards {
		changed = append(changed, "counter.shards")
	}
	if o.MaxKeyBytes != c.MaxKeyBytes {
		changed = append(changed, "counter.max_key_bytes")
	}
	if o.ReservedKeys != c.ReservedKeys {
		changed = append(changed, "counter.reserved_keys")
	}
	if o.MaxPeersPerKey != c.MaxPeersPerKey {
		changed = append(changed, "counter.max_peers_per_key")
	}
	if len(changed) > 0 {
		return fmt.Errorf("node: reload refused: %s only change%s with a restart", strings.Join(changed, ", "), map[bool]string{true: "s", false: ""}[len(changed) == 1])
	}
	return nil
}

// reloadMetrics are the outcomes of reloads.
type reloadMetrics struct {
	log         *slog.Logger
	total       map[bool]prometheus.Counter
	lastSuccess prometheus.Gauge
	successful  prometheus.Gauge
}

func newReloadMetrics(reg prometheus.Registerer, log *slog.Logger) (*reloadMetrics, error) {
	const ns, sub = "ratelimit_authz", "config"
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "reloads_total",
		Help: "Configuration reloads, by result: success, or failure (refused: the previous configuration keeps serving).",
	}, []string{"result"})
	m := &reloadMetrics{
		log:   log,
		total: map[bool]prometheus.Counter{true: vec.WithLabelValues("success"), false: vec.WithLabelValues("failure")},
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_reload_success_timestamp_seconds",
			Help: "Unix time of the last configuration that was applied: the start, or the last successful reload.",
		}),
		successful: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "last_reload_successful",
			Help: "1 when the last reload was applied (or none was tried), 0 when it was refused.",
		}),
	}
	for _, c := range []prometheus.Collector{vec, m.lastSuccess, m.successful} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register reload metrics: %w", err)
		}
	}
	m.lastSuccess.SetToCurrentTime()
	m.successful.Set(1)
	return m, nil
}

func (m *reloadMetrics) record(err error, start time.Time) {
	m.total[err == nil].Inc()
	if err != nil {
		m.successful.Set(0)
		return
	}
	m.successful.Set(1)
	m.lastSuccess.Set(float64(start.UnixNano()) / 1e9)
}
