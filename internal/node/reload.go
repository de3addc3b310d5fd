package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/descriptors"
	"github.com/ratelimit-authz/ratelimit-authz/internal/failures"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/replicate"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rules"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
)

// Sources are the configurations of one generation: the ext_authz rules
// and the envoyproxy/ratelimit rules ShouldRateLimit serves, each read
// from its own files and reloaded together.
type Sources struct {
	Rules *rules.Rules      // required
	RLS   *rlsconfig.Config // nil: no RLS rules
}

// generation is one configuration made into every component's Config,
// with the counter ids of its buckets. It is built whole before anything
// is swapped, so a configuration that cannot be served changes nothing.
// Each format is a part of it: its buckets' keys go into the one ids plan
// (so no two buckets of either share an id), its buckets into the one
// replication table and the one override cache, and its component takes
// it with one more Update.
type generation struct {
	rules    *rules.Rules
	ids      wiring.Assignment // the ext_authz buckets, then the RLS rules, then the RLS limit buckets
	matcher  *descriptors.Engine
	buckets  limits.Buckets // with ids
	limits   *limits.Resolver
	authz    authz.Config
	failures failures.Config
	table    replicate.Table
	reserved []counter.Bucket

	// The RLS part; rls nil: none.
	rls                   *rlsconfig.Config
	rlsRuleIDs, rlsLimIDs []counter.Bucket
	overridable           limits.Buckets // every overridable bucket of both formats, for the cache

	// The participants counts of the quota section's buckets (rlqs.go).
	quotaIDs []counter.Bucket
}

// planGeneration assigns the ids of the sources' buckets and compiles the
// routes; build completes it once the overrides are known.
func planGeneration(s Sources, ids *wiring.IDs) (*generation, error) {
	r := s.Rules
	if r == nil {
		return nil, errors.New("node: no rules")
	}
	keys := wiring.Keys(r)
	var rlsKeys []wiring.BucketKey
	if s.RLS != nil {
		if err := checkRLSNames(s.RLS, r); err != nil {
			return nil, err
		}
		rlsKeys = wiring.RLSKeys(s.RLS)
	}
	quotaKeys := quotaKeys(r)
	as, err := ids.Plan(append(append(slices.Clone(keys), rlsKeys...), quotaKeys...), time.Now())
	if err != nil {
		return nil, fmt.Errorf("assign bucket ids: %w", err)
	}
	m, err := descriptors.New(r.Descriptors())
	if err != nil {
		return nil, fmt.Errorf("compile routes: %w", err)
	}
	own := as.IDs[:len(r.Buckets):len(r.Buckets)]
	g := &generation{rules: r, ids: as, matcher: m}
	g.buckets = wiring.Limits(r, own)
	g.authz = wiring.Authz(r, own)
	g.failures = wiring.Failures(r, own)
	g.reserved = wiring.Reserved(r, own)
	bounds := peerBounds(r)
	g.table = replicate.Table{IDs: as.IDs}
	for i, b := range r.Buckets {
		g.table.Buckets = append(g.table.Buckets, b.Name)
		g.table.Algorithms = append(g.table.Algorithms, keys[i].Algorithm)
	}
	g.overridable = g.buckets
	if s.RLS != nil {
		g.rls = s.RLS
		nr := len(s.RLS.Rules())
		g.rlsRuleIDs = as.IDs[len(own) : len(own)+nr]
		g.rlsLimIDs = as.IDs[len(own)+nr : len(own)+len(rlsKeys)]
		g.overridable = append(slices.Clone(g.buckets), wiring.RLSOverridable(s.RLS, g.rlsRuleIDs)...)
		for _, k := range rlsKeys {
			g.table.Buckets = append(g.table.Buckets, k.Name)
			g.table.Algorithms = append(g.table.Algorithms, k.Algorithm)
		}
		bounds = append(bounds, rlsPeerBounds(s.RLS)...)
	}
	g.quotaIDs = as.IDs[len(own)+len(rlsKeys):]
	for _, k := range quotaKeys {
		g.table.Buckets = append(g.table.Buckets, k.Name)
		g.table.Algorithms = append(g.table.Algorithms, k.Algorithm)
	}
	g.table.Bounds = append(bounds, quotaPeerBounds(r)...)
	return g, nil
}

// rlsPeerBounds is what a peer may report of the RLS buckets, in
// RLSKeys' order: a rule's window with its limit × PeerCountFactor, and
// every tenant override window of an overridable one; a bucket of
// descriptor-supplied limits its unit's window with any count a
// requests_per_unit allows. Unlimited rules and limits of 0 count
// nothing, nor do windows the counter cannot hold: no peer count of
// theirs is merged.
func rlsPeerBounds(c *rlsconfig.Config) replicate.BucketWindows {
	var w replicate.BucketWindows
	for _, r := range c.Rules() {
		m := map[int64]int64{}
		if l, ok := r.Limit(); ok {
			m[l.ScaleMS] = replicate.BoundFor(min(l.Limit, counter.MaxLimitFor(l.ScaleMS)))
			if r.Overridable {
				for _, sc := range limits.Scales {
					m[sc.MS] = replicate.BoundFor(counter.MaxLimitFor(sc.MS))
				}
			}
		}
		w = append(w, m)
	}
	for _, lb := range c.LimitBuckets() {
		m := map[int64]int64{}
		if ms := lb.Unit.Seconds() * 1000; ms <= counter.MaxScaleMS {
			m[ms] = replicate.BoundFor(counter.MaxLimitFor(ms))
		}
		w = append(w, m)
	}
	return w
}

// build makes the generation's resolver over the node's overrides.
func (g *generation) build(over limits.Overrides) {
	g.limits = limits.NewResolver(g.buckets, over)
}

// rlsConfig is the RLS service's configuration of the generation.
func (g *generation) rlsConfig(settings rls.Settings) rls.Config {
	return rls.Config{Rules: g.rls, RuleIDs: g.rlsRuleIDs, LimitIDs: g.rlsLimIDs, Settings: settings}
}

// rlsLimits resolves an overridable RLS rule's limit by its counter id:
// the tenant override, if any (the cache files them by id).
type rlsLimits struct{ over limits.Overrides }

func (l rlsLimits) Limit(id counter.Bucket, tenant string) (counter.Limit, bool) {
	if l.over == nil || tenant == "" {
		return counter.Limit{}, false
	}
	return l.over.OverrideFor(id, tenant)
}

var _ rls.Limits = rlsLimits{}

// Reload makes r the configuration of the node: it builds every part of
// the new generation first (any error: nothing changes, and the error
// says why), then swaps each component's configuration, then drops the
// counts of the buckets that went away. A check in flight finishes on the
// old generation; the next one uses the new. A bucket whose name, window,
// algorithm and reserve are unchanged keeps its counts, under its new
// limit from the next check; one whose window or algorithm changed starts
// from zero. Settings that only a restart applies (the counter's bounds)
// must be unchanged, or the reload is refused. Reloads are serialised.
// The RLS rules in force stay (see ReloadSources).
func (n *Node) Reload(ctx context.Context, r *rules.Rules) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.reload(ctx, Sources{Rules: r, RLS: n.cur.rls})
	n.reloads.record(err, start)
	return err
}

// ReloadSources is Reload of both formats at once, as one generation.
func (n *Node) ReloadSources(ctx context.Context, s Sources) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.reload(ctx, s)
	n.reloads.record(err, start)
	return err
}

// ReloadFrom loads the ext_authz rules with load and, when the node
// serves ShouldRateLimit, the RLS rules from their directory (Config.RLS),
// each read and validated as at start, and reloads both as one
// generation; a load error is a refused reload too, counted alike.
func (n *Node) ReloadFrom(ctx context.Context, load func() (*rules.Rules, error)) error {
	start := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	r, err := load()
	var rc *rlsconfig.Config
	if err == nil {
		rc, err = loadRLS(n.cfg.RLS, n.reloads.log)
	}
	if err == nil {
		err = n.reload(ctx, Sources{Rules: r, RLS: rc})
	}
	n.reloads.record(err, start)
	return err
}

// reload swaps in the generation of s. n.mu must be held.
func (n *Node) reload(ctx context.Context, s Sources) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	old := n.cur
	if s.Rules == nil {
		return errors.New("node: reload: no rules")
	}
	if s.RLS != nil && n.rlsSvc == nil {
		return errors.New("node: reload: RLS rules given, but this node does not serve ShouldRateLimit")
	}
	if err := restartOnly(old.rules, s.Rules); err != nil {
		return err
	}
	if (n.rlqsSvc != nil) != (s.Rules.Quota != nil) {
		return errors.New("node: reload refused: the quota section (RLQS) is added or removed only with a restart")
	}
	g, err := planGeneration(s, n.ids)
	if err != nil {
		return err
	}
	r := g.rules
	g.build(n.over)
	// A reused id's previous bucket was dropped long ago, but a late write
	// of it must not count in the new one.
	n.store.DropBuckets(g.ids.Reused)
	// Swap. Each Update validates before it swaps; one that fails puts the
	// parts already swapped back, so that the node serves one generation.
	var undo []func()
	fail := func(err error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		// Checks on the parts swapped meanwhile counted under this plan's
		// fresh ids, which a later plan may give to other buckets.
		n.store.DropBuckets(g.ids.Fresh)
		return err
	}
	if n.cache != nil {
		if err := n.cache.Update(g.overridable); err != nil {
			return fail(fmt.Errorf("tenant overrides: %w", err))
		}
		undo = append(undo, func() { _ = n.cache.Update(old.overridable) })
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
	if n.rlqsSvc != nil {
		if err := n.rlqsSvc.Update(g.rlqsConfig()); err != nil {
			return fail(fmt.Errorf("RLQS: %w", err))
		}
		undo = append(undo, func() { _ = n.rlqsSvc.Update(old.rlqsConfig()) })
	}
	if n.rlsSvc != nil {
		if g.rls == nil {
			return fail(errors.New("ShouldRateLimit: no RLS rules: this node serves ShouldRateLimit"))
		}
		if err := n.rlsSvc.Update(g.rlsConfig(n.rlsSettings)); err != nil {
			return fail(fmt.Errorf("ShouldRateLimit: %w", err))
		}
		undo = append(undo, func() { _ = n.rlsSvc.Update(old.rlsConfig(n.rlsSettings)) })
	}
	if err := n.ids.Commit(g.ids, time.Now()); err != nil {
		return fail(err)
	}
	n.store.SetReserved(g.reserved)
	n.cur = g
	dropped := n.store.DropBuckets(g.ids.Dropped)
	attrs := []any{"buckets", len(r.Buckets), "routes", len(r.Routes), "buckets_reset", len(g.ids.Dropped), "keys_dropped", dropped}
	if g.rls != nil {
		attrs = append(attrs, "rls_rules", len(g.rls.Rules()))
	}
	n.reloads.log.Info("configuration reloaded", attrs...)
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
