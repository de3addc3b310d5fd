package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// code is a request's outcome, the "code" label of rls_requests_total.
type code int

const (
	codeOK              code = iota // overall OK
	codeOverLimit                   // overall OVER_LIMIT
	codeShadowOverLimit             // over, answered OK by the global shadow mode
	codeInvalid                     // refused with InvalidArgument
	numCodes
)

var codeNames = [numCodes]string{"ok", "over_limit", "shadow_over_limit", "invalid"}

// decision is one descriptor's outcome in a bucket, the "decision" label
// of rls_descriptors_total.
type decision int

const (
	decAllowed      decision = iota // under the limit, counted
	decDenied                       // over the limit (OVER_LIMIT)
	decShadowDenied                 // over the limit of a shadow_mode rule: OK
	decOverflow                     // the counter could not track a new key
	decUnlimited                    // an unlimited rule: not counted
	decReplaced                     // replaced by another matched rule: not counted
	decCharged                      // a charge counted within the limit
	decChargedOver                  // a charge counted past the limit
	decNegative                     // is_negative_hits: no refill, nothing freed here
	decReleased                     // is_negative_hits of a concurrency rule: a lease this node held, freed
	decCancelled                    // a lease given back: Envoy did not take the call's answer
	numDecisions
)

var decisionNames = [numDecisions]string{"allowed", "denied", "shadow_denied", "overflow", "unlimited", "replaced", "charged", "charged_over", "negative", "released", "cancelled"}

// unknownDomain is the domain label of requests whose domain is not
// configured: the one value no configured domain can have (upstream
// refuses an empty domain), so any number of unknown domains is one series.
const unknownDomain = ""

type metrics struct {
	requests    *prometheus.CounterVec
	descriptors *prometheus.CounterVec
	unmatched   *prometheus.CounterVec
	ignored     prometheus.Counter
	duration    prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "ratelimit_authz", "rls"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "requests_total",
			Help: "ShouldRateLimit calls by configured domain (\"\" for every unknown one) and code (ok, over_limit, shadow_over_limit, invalid).",
		}, []string{"domain", "code"}),
		descriptors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptors_total",
			Help: "ShouldRateLimit descriptors by bucket (a rule's, or a domain's bucket of descriptor-supplied limits) and decision (allowed, denied, shadow_denied, overflow, unlimited, replaced, charged, charged_over, negative, released, cancelled: a lease given back as Envoy did not take the answer).",
		}, []string{"bucket", "decision"}),
		unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "descriptors_unmatched_total",
			Help: "ShouldRateLimit descriptors that matched no rule (answered OK, not counted), by configured domain (\"\" for every unknown one).",
		}, []string{"domain"}),
		ignored: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "limit_overrides_ignored_total",
			Help: "Descriptor-supplied limits ignored because of their unit (UNKNOWN, out of range, or YEAR); the descriptor was matched against the configuration.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "duration_seconds",
			Help:    "Time spent in ShouldRateLimit, from request decoded to response built.",
			Buckets: prometheus.ExponentialBuckets(2e-6, 2.5, 12), // 2 µs .. ~50 ms
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.descriptors, m.unmatched, m.ignored, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: register metrics: %w", err)
		}
	}
	return m, nil
}

// domainMetrics are one domain label's children, made by Prepare so that
// a call never looks a label up.
type domainMetrics struct {
	requests  [numCodes]prometheus.Counter
	unmatched prometheus.Counter
}

func (m *metrics) forDomain(domain string) *domainMetrics {
	dm := &domainMetrics{unmatched: m.unmatched.WithLabelValues(domain)}
	for c := range numCodes {
		dm.requests[c] = m.requests.WithLabelValues(domain, codeNames[c])
	}
	return dm
}

func (m *metrics) forBucket(bucket string) [numDecisions]prometheus.Counter {
	var bm [numDecisions]prometheus.Counter
	for d := range numDecisions {
		bm[d] = m.descriptors.WithLabelValues(bucket, decisionNames[d])
	}
	return bm
}

// forget deletes the children of the labels old has and next lacks, so
// the series follow the configuration in force and never accumulate over
// reloads.
func (m *metrics) forget(old, next *state) {
	for d := range old.domains {
		if _, ok := next.domains[d]; !ok {
			m.unmatched.DeleteLabelValues(d)
			for c := range numCodes {
				m.requests.DeleteLabelValues(d, codeNames[c])
			}
		}
	}
	keep := make(map[string]bool, len(next.rules)+len(next.limits))
	for i := range next.rules {
		keep[next.rules[i].rule.Bucket] = true
	}
	for i := range next.limits {
		keep[next.limits[i].bucket] = true
	}
	drop := func(b string) {
		if !keep[b] {
			for d := range numDecisions {
				m.descriptors.DeleteLabelValues(b, decisionNames[d])
			}
		}
	}
	for i := range old.rules {
		drop(old.rules[i].rule.Bucket)
	}
	for i := range old.limits {
		drop(old.limits[i].bucket)
	}
}
