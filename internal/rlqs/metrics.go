package rlqs

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// strategy is what an action told Envoy, the "strategy" label of
// rlqs_assignments_total.
type strategy uint8

const (
	stratTokenBucket strategy = iota
	stratAllowAll
	stratDenyAll
	stratAbandon
	numStrategies
)

var strategyNames = [numStrategies]string{"token_bucket", "allow_all", "deny_all", "abandon"}

// result is what a reported bucket id was, the "result" label of
// rlqs_bucket_reports_total.
type result uint8

const (
	resCounted    result = iota // matched, usage counted
	resUnmatched                // no mapping entry
	resMissingKey               // matched, empty key value
	resOverflow                 // matched, the counter could not track the key
	resUntracked                // over quota.max_bucket_ids on its stream
	resInvalid                  // over the bucket id bounds, or empty
	numResults
)

var resultNames = [numResults]string{"counted", "unmatched", "missing_key", "overflow", "untracked", "invalid"}

// bound is a bound a stream hit, the "bound" label of rlqs_bounds_total.
type bound uint8

const (
	boundStreams   bound = iota // quota.max_streams: stream refused
	boundBucketIDs              // quota.max_bucket_ids: a bucket id not tracked
	boundIDSize                 // MaxIDEntries or MaxIDBytes: a bucket id refused
	boundDomain                 // a domain not served: stream ended
	numBounds
)

var boundNames = [numBounds]string{"streams", "bucket_ids", "bucket_id_size", "domain"}

type metrics struct {
	streams     prometheus.Gauge
	bucketIDs   prometheus.Gauge
	reports     prometheus.Counter
	results     [numResults]prometheus.Counter
	requests    [2]prometheus.Counter // denied, allowed
	assignments [numStrategies]prometheus.Counter
	bounds      [numBounds]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "ratelimit_authz", "rlqs"
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "streams",
			Help: "RLQS streams (StreamRateLimitQuotas) open.",
		}),
		bucketIDs: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "bucket_ids",
			Help: "Bucket ids tracked over every open stream.",
		}),
		reports: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "reports_total",
			Help: "Usage report messages received.",
		}),
	}
	results := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bucket_reports_total",
		Help: "Bucket usages reported, by result: counted, unmatched (no quota.buckets entry), missing_key, overflow (counter at max_keys), untracked (over quota.max_bucket_ids), invalid (over the bucket id bounds).",
	}, []string{"result"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "requests_reported_total",
		Help: "Requests Envoy reported, by outcome: allowed (num_requests_allowed, counted in the buckets) or denied (num_requests_denied).",
	}, []string{"outcome"})
	assignments := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "assignments_total",
		Help: "Bucket actions sent, by strategy: token_bucket, allow_all, deny_all, abandon; a window's fresh share is an allow_all and a token_bucket.",
	}, []string{"strategy"})
	bounds := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "bounds_total",
		Help: "Bounds hit, by bound: streams (a stream refused at quota.max_streams), bucket_ids (a bucket id not tracked past quota.max_bucket_ids), bucket_id_size (a bucket id over the size bounds), domain (a stream of a domain not served).",
	}, []string{"bound"})
	for i := range m.results {
		m.results[i] = results.WithLabelValues(resultNames[i])
	}
	m.requests[0] = requests.WithLabelValues("denied")
	m.requests[1] = requests.WithLabelValues("allowed")
	for i := range m.assignments {
		m.assignments[i] = assignments.WithLabelValues(strategyNames[i])
	}
	for i := range m.bounds {
		m.bounds[i] = bounds.WithLabelValues(boundNames[i])
	}
	for _, c := range []prometheus.Collector{m.streams, m.bucketIDs, m.reports, results, requests, assignments, bounds} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rlqs: register metrics: %w", err)
		}
	}
	return m, nil
}
