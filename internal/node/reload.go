package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// Sources are the configurations of one snapshot: the ext_authz rules
// and the envoyproxy/ratelimit rules ShouldRateLimit serves, each read
// from its own files and reloaded together.
type Sources = snapshot.Sources

// Reload makes r the configuration of the node: it compiles the snapshot
// and has every component prepare it first (any error: nothing changes,
// and the error says why), then swaps each component to it, then drops
// the counts of the buckets that went away. A check in flight finishes on
// the old snapshot; the next one uses the new. A bucket whose name, window,
// algorithm and reserve are unchanged keeps its counts, under its new
// limit from the next check; one whose window or algorithm changed starts
// from zero. Settings that only a restart applies (the counter's bounds)
// must be unchanged, or the reload is refused. Reloads are serialised.
// The RLS rules in force stay (see ReloadSources).
func (n *Node) Reload(ctx context.Context, r *configfile.Rules) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.reload(ctx, Sources{Rules: r, RLS: n.cur.RLS})
	n.reloads.record(err, start)
	return err
}

// ReloadSources is Reload of both formats at once, as one snapshot.
func (n *Node) ReloadSources(ctx context.Context, s Sources) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.reload(ctx, s)
	n.reloads.record(err, start)
	return err
}

// reload makes the snapshot of s the one served: compile (every
// refusal happens here or in a component's Prepare, before anything
// changes), swap every component to it, then drop the counts of the
// buckets it no longer has. n.mu must be held.
func (n *Node) reload(ctx context.Context, s Sources) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	old := n.cur
	if s.Rules == nil {
		return errors.New("node: reload: no rules")
	}
	if s.RLS != nil && n.cfg.RLS == nil {
		return errors.New("node: reload: RLS rules given, but this node does not serve ShouldRateLimit")
	}
	if err := restartOnly(old.Rules, s.Rules); err != nil {
		return err
	}
	if (old.Rules.Quota != nil) != (s.Rules.Quota != nil) {
		return errors.New("node: reload refused: the quota section (RLQS) is added or removed only with a restart")
	}
	snap, err := snapshot.Compile(s)
	if err != nil {
		return err
	}
	swaps := make([]func(), 0, len(n.parts))
	for _, p := range n.parts {
		swap, err := p.svc.Prepare(snap)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		swaps = append(swaps, swap)
	}
	for _, swap := range swaps {
		swap()
	}
	n.store.SetReserved(snap.Reserved())
	n.cur = snap
	reset := snap.Dropped(old)
	dropped := n.store.DropBuckets(reset)
	n.sketch.Forget(reset)
	r := snap.Rules
	attrs := []any{"buckets", len(r.Buckets), "routes", len(r.Routes), "buckets_reset", len(reset), "keys_dropped", dropped}
	if snap.RLS != nil {
		attrs = append(attrs, "rls_rules", len(snap.RLS.Rules()))
	}
	n.reloads.log.Info("configuration reloaded", attrs...)
	return nil
}

// restartOnly refuses a reload that changes what only a restart applies:
// the counter's bounds size its tables when the node starts.
func restartOnly(old, r *configfile.Rules) error {
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

// reloadMetrics are the outcomes of reloads, exported and kept for the
// status page.
type reloadMetrics struct {
	log         *slog.Logger
	total       map[bool]prometheus.Counter
	lastSuccess prometheus.Gauge
	successful  prometheus.Gauge

	mu         sync.Mutex // guards the fields below; never held across a reload
	generation uint64     // configurations applied: 1 at start
	applied    time.Time  // when the one served was applied
	last       *reloadResult
}

// reloadResult is one reload's outcome: when it was tried and, when it
// was refused, why.
type reloadResult struct {
	at  time.Time
	err error
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
	m.generation, m.applied = 1, time.Now()
	m.lastSuccess.Set(float64(m.applied.UnixNano()) / 1e9)
	m.successful.Set(1)
	return m, nil
}

func (m *reloadMetrics) record(err error, start time.Time) {
	m.mu.Lock()
	m.last = &reloadResult{at: start, err: err}
	if err == nil {
		m.generation++
		m.applied = start
	}
	m.mu.Unlock()
	m.total[err == nil].Inc()
	if err != nil {
		m.successful.Set(0)
		return
	}
	m.successful.Set(1)
	m.lastSuccess.Set(float64(start.UnixNano()) / 1e9)
}

// state is the generation served, when it was applied, and the last
// reload tried (nil: none).
func (m *reloadMetrics) state() (generation uint64, applied time.Time, last *reloadResult) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.generation, m.applied, m.last
}
