package authz

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
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
	decInvalidCost                  // the request's cost cannot be read: refused with 400
	numDecisions
)

var decisionNames = [numDecisions]string{"allowed", "denied", "shadow_denied", "missing_key", "overflow", "unreadable_account", "invalid_cost"}

// bucketMetrics holds one bucket's metric children, created once so that
// Check never looks a label up.
type bucketMetrics struct {
	checks   [numDecisions]prometheus.Counter
	exceeded prometheus.Counter
	// cancelled counts the reservations given back: a lease, or a cost
	// taken, of a check whose answer Envoy did not take.
	cancelled prometheus.Counter
	// Set for buckets whose hits cost more than 1 at the check (a cost
	// or a route's constant): the cost admitted, denied and refused.
	costAdmitted, costDenied prometheus.Counter
	costRefused              [len(configfile.CostProblemNames)]prometheus.Counter
}

type metrics struct {
	checks                   *prometheus.CounterVec
	exceeded                 *prometheus.CounterVec
	cancelled                *prometheus.CounterVec
	costAdmitted, costDenied *prometheus.CounterVec
	costRefused              *prometheus.CounterVec
	unmatched                prometheus.Counter
	unknown                  prometheus.Counter
	pathTooLong              prometheus.Counter
	duration                 prometheus.Histogram
	collectors               []prometheus.Collector
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
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "reservations_cancelled_total",
			Help: "Leases and costs taken at Check given back because Envoy did not take the check's answer (its stream was reset or its deadline passed first), by bucket.",
		}, []string{"bucket"}),
		costAdmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "cost", Name: "admitted_total",
			Help: "Cost taken at Check by the requests a bucket admitted (in the bucket's unit), by bucket; buckets whose hits cost more than 1 only.",
		}, []string{"bucket"}),
		costDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "cost", Name: "denied_total",
			Help: "Cost of the requests a bucket found over its limit at Check (in the bucket's unit, enforced or shadow), by bucket.",
		}, []string{"bucket"}),
		costRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: "cost", Name: "refused_total",
			Help: "Requests refused with 400 because their cost cannot be read, by bucket and problem (missing, invalid, repeated, over_max).",
		}, []string{"bucket", "problem"}),
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
	m.collectors = []prometheus.Collector{m.checks, m.exceeded, m.cancelled, m.costAdmitted, m.costDenied, m.costRefused, m.unmatched, m.unknown, m.pathTooLong, m.duration}
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
	m.cancelled.DeleteLabelValues(name)
	m.costAdmitted.DeleteLabelValues(name)
	m.costDenied.DeleteLabelValues(name)
	m.costRefused.DeletePartialMatch(prometheus.Labels{"bucket": name})
}

// forBucket are the children of one bucket; costed: its hits cost more
// than 1 at the check.
func (m *metrics) forBucket(name string, costed bool) bucketMetrics {
	var bm bucketMetrics
	for d := range numDecisions {
		bm.checks[d] = m.checks.WithLabelValues(name, decisionNames[d])
	}
	bm.exceeded = m.exceeded.WithLabelValues(name)
	bm.cancelled = m.cancelled.WithLabelValues(name)
	if costed {
		bm.costAdmitted = m.costAdmitted.WithLabelValues(name)
		bm.costDenied = m.costDenied.WithLabelValues(name)
		for p, pn := range configfile.CostProblemNames {
			if p != int(configfile.CostOK) {
				bm.costRefused[p] = m.costRefused.WithLabelValues(name, pn)
			}
		}
	}
	return bm
}
