package authz

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// decision is the outcome of one bucket for one check, the value of the
// "decision" label of checks_total.
type decision int

const (
	decAllowed      decision = iota // under the limit
	decDenied                       // over the limit, enforced
	decShadowDenied                 // over the limit in a shadow bucket: allowed
	decMissingKey                   // the request lacked the bucket's key
	decOverflow                     // the counter could not track a new key
	decUnreadable                   // a login whose account cannot be read, refused (keys.unreadable_account: deny)
	numDecisions
)

var decisionNames = [numDecisions]string{"allowed", "denied", "shadow_denied", "missing_key", "overflow", "unreadable_account"}

// bucketMetrics holds one bucket's metric children, created once so that
// Check never looks a label up.
type bucketMetrics struct {
	checks   [numDecisions]prometheus.Counter
	exceeded prometheus.Counter
}

type metrics struct {
	checks      *prometheus.CounterVec
	exceeded    *prometheus.CounterVec
	unmatched   prometheus.Counter
	unknown     prometheus.Counter
	pathTooLong prometheus.Counter
	duration    prometheus.Histogram
	collectors  []prometheus.Collector
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns = "ratelimit_authz"
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "checks_total",
			Help: "Bucket decisions of Check, by bucket and decision (allowed, denied, shadow_denied, missing_key, overflow, unreadable_account).",
		}, []string{"bucket", "decision"}),
		exceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "exceeded_total",
			Help: "Checks over a bucket's limit, enforced or shadow, by bucket.",
		}, []string{"bucket"}),
		unmatched: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "checks_unmatched_total",
			Help: "Checks that matched no route rule: allowed and not counted.",
		}),
		unknown: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "unknown_buckets_total",
			Help: "Bucket names from Envoy context_extensions that the configuration does not have (ignored).",
		}),
		pathTooLong: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "paths_too_long_total",
			Help: "Checks denied with 414 because the path (without its query) is longer than 8 KiB.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "check_duration_seconds",
			Help:    "Time spent in Check, from request decoded to response built.",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2.5, 12), // 2 µs .. ~50 ms
		}),
	}
	m.collectors = []prometheus.Collector{m.checks, m.exceeded, m.unmatched, m.unknown, m.pathTooLong, m.duration}
	for _, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("authz: register metrics: %w", err)
		}
	}
	return m, nil
}

// forget deletes the bucket's series.
func (m *metrics) forget(name string) {
	for d := range numDecisions {
		m.checks.DeleteLabelValues(name, decisionNames[d])
	}
	m.exceeded.DeleteLabelValues(name)
}

func (m *metrics) forBucket(name string) bucketMetrics {
	var bm bucketMetrics
	for d := range numDecisions {
		bm.checks[d] = m.checks.WithLabelValues(name, decisionNames[d])
	}
	bm.exceeded = m.exceeded.WithLabelValues(name)
	return bm
}
