package overrides

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the cache's; children are created here, once.
type metrics struct {
	reloads      map[string]prometheus.Counter  // by kind: full, incremental
	duration     map[string]prometheus.Observer // by kind
	reloadErrors prometheus.Counter
	invalidRows  prometheus.Gauge
	loaded       prometheus.Gauge
	ownersLoaded prometheus.Gauge
	fileErrors   map[string]prometheus.Counter // by op: read, write
}

// newMetrics creates the cache's metrics and registers them with reg.
func newMetrics(reg prometheus.Registerer, c *Cache) (*metrics, error) {
	const ns, sub = "ratelimit_authz", "overrides"
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "reloads_total",
		Help: "Successful refreshes of the tenant overrides from Postgres, by kind: full or incremental.",
	}, []string{"kind"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "reload_duration_seconds",
		Help:    "Time to read and publish a refresh of the tenant overrides, by kind.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1 ms … 65 s
	}, []string{"kind"})
	m := &metrics{
		reloads:  map[string]prometheus.Counter{},
		duration: map[string]prometheus.Observer{},
		reloadErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reload_errors_total",
			Help: "Failed attempts to connect to Postgres or refresh the tenant overrides.",
		}),
		invalidRows: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "invalid_rows",
			Help: "Tenants whose row (or part of it) is skipped: bad shape, or a bucket this node does not let tenants override.",
		}),
		loaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "loaded",
			Help: "(tenant, bucket) overrides in effect on this node.",
		}),
		ownersLoaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "key_owners",
			Help: "Key owners in effect on this node: keys (such as channels) whose buckets take their owner's overrides.",
		}),
	}
	fileErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_file_errors_total",
		Help: "Failures of the overrides snapshot file, by op: write (after a refresh), read (a missing file is not counted; a corrupt, truncated or hostile one is, and is rejected whole).",
	}, []string{"op"})
	m.fileErrors = map[string]prometheus.Counter{}
	for _, op := range []string{"read", "write"} {
		m.fileErrors[op] = fileErrors.WithLabelValues(op)
	}
	for _, kind := range []string{"full", "incremental"} {
		m.reloads[kind] = reloads.WithLabelValues(kind)
		m.duration[kind] = duration.WithLabelValues(kind)
	}
	cols := []prometheus.Collector{reloads, duration, m.reloadErrors, m.invalidRows, m.loaded, m.ownersLoaded, fileErrors}
	for _, col := range append(cols, stateCollectors(ns, sub, c)...) {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("overrides: register metrics: %w", err)
		}
	}
	return m, nil
}

// stateCollectors are the metrics of c's state read at scrape time: the
// source, the snapshot's age and whether c is degraded.
func stateCollectors(ns, sub string, c *Cache) []prometheus.Collector {
	source := prometheus.NewDesc(prometheus.BuildFQName(ns, sub, "source"),
		"Where the overrides served come from: 1 for the current source (postgres: the last refresh; snapshot: the snapshot file, Postgres not reached since start; none: the configured limits only), 0 for the others.",
		[]string{"source"}, nil)
	return []prometheus.Collector{
		sourceCollector{desc: source, c: c},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "snapshot_age_seconds",
			Help: "Time since the overrides were last refreshed successfully (since start when never).",
		}, func() float64 { return c.snapshotAge().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "degraded",
			Help: "1 while the node cannot refresh from Postgres and serves the last snapshot (or the configured limits); else 0.",
		}, func() float64 {
			if c.degraded.Load() {
				return 1
			}
			return 0
		}),
	}
}

// sourceCollector exports the source gauge, one series per source, read
// at scrape time.
type sourceCollector struct {
	desc *prometheus.Desc
	c    *Cache
}

func (s sourceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s sourceCollector) Collect(ch chan<- prometheus.Metric) {
	cur := s.c.Source()
	for i, name := range sourceNames {
		v := 0.0
		if i == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, v, name)
	}
}
