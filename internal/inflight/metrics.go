package inflight

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

const (
	namespace = "ratelimit_authz"
	subsystem = "inflight"
)

// Reasons a peer's gauge or release is dropped (cast_entries_dropped_total).
const (
	dropMalformed = iota // the cast does not decode (counted once per cast)
	dropUnknownBucket
	dropRefused // no room for the gauge
	dropReasons
)

var dropLabels = [dropReasons]string{"malformed", "unknown_bucket", "refused"}

// syncMetrics are a Sync's own counters; the table's are read from Stats
// at scrape time.
type syncMetrics struct {
	releasesUnknown prometheus.Counter
	forwarded       prometheus.Counter
	forwardsDropped prometheus.Counter
	forwardedFreed  prometheus.Counter
	castErrors      prometheus.Counter
	dropped         [dropReasons]prometheus.Counter
}

func (m *syncMetrics) register(reg prometheus.Registerer, s *Sync) error {
	newCounter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help})
	}
	m.releasesUnknown = newCounter("releases_unknown_total", "Releases (access-log entries) naming no lease this node holds: unknown, already released, expired, or held by a peer (then forwarded).")
	m.forwarded = newCounter("releases_forwarded_total", "Releases of leases this node does not hold, cast to the peers.")
	m.forwardsDropped = newCounter("releases_forward_dropped_total", "Releases not forwarded because max_forwards were waiting (their leases expire instead).")
	m.forwardedFreed = newCounter("releases_from_peers_freed_total", "Leases freed by a release a peer forwarded.")
	m.castErrors = newCounter("cast_errors_total", "Casts of gauges or releases not sent (NATS away, or an entry larger than a message).")
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "cast_entries_dropped_total",
		Help: "Peers' gauges and releases not used: malformed (per cast), unknown_bucket (a bucket this node does not have), refused (no room for the gauge).",
	}, []string{"reason"})
	for i, l := range dropLabels {
		m.dropped[i] = dropped.WithLabelValues(l)
	}
	t := s.t
	stat := func(name, help string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help},
			func() float64 { return float64(f(t.Stats())) })
	}
	denied := func(reason string, f func(Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "acquisitions_denied_total",
			Help:        "Acquisitions denied: limit (the key's requests in flight, here and at the peers, reached the limit), full (max_leases or max_keys reached: fail closed), request_id (missing, too long or repeated).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(f(t.Stats())) })
	}
	for _, c := range []prometheus.Collector{
		m.releasesUnknown, m.forwarded, m.forwardsDropped, m.forwardedFreed, m.castErrors, dropped,
		stat("leases_expired_total", "Leases not released within their time to live (lost access-log entries, a crashed Envoy): each freed its slot at expiry.", func(s Stats) uint64 { return s.Expired }),
		denied("limit", func(s Stats) uint64 { return s.DeniedLimit }),
		denied("full", func(s Stats) uint64 { return s.DeniedFull }),
		denied("request_id", func(s Stats) uint64 { return s.DeniedRequestID }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Subsystem: subsystem, Name: "leases",
			Help: "Leases held by this node (every bucket and key), bounded by max_leases."},
			func() float64 { return float64(t.Stats().Leases) }),
		&requestsCollector{s: s, desc: prometheus.NewDesc(prometheus.BuildFQName(namespace, subsystem, "requests"),
			"Requests in flight on this node's leases, per concurrency bucket (sum over the nodes for the cluster's).", []string{"bucket"}, nil)},
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("inflight: register metrics: %w", err)
		}
	}
	return nil
}

// requestsCollector reports the requests in flight per bucket at scrape
// time, under the bucket's name (configuration, never a key).
type requestsCollector struct {
	s    *Sync
	desc *prometheus.Desc
}

func (c *requestsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *requestsCollector) Collect(ch chan<- prometheus.Metric) {
	names := c.s.names.Load()
	counts := map[string]int64{}
	for _, name := range names.names {
		counts[name] = 0 // every bucket, at 0 when idle
	}
	c.s.t.ByBucket(func(b counter.Bucket, n int64) {
		if name, ok := names.names[b]; ok {
			counts[name] += n
		}
	})
	for name, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), name)
	}
}
