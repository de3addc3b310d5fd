package accesslog

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

type reportResult = string

const (
	reportCounted reportResult = "counted"
)

// bucketMetrics are one bucket's children: a failure bucket's in the
// failures family, a response-charged cost bucket's in the cost family.
type bucketMetrics struct {
	counted  prometheus.Counter // failures counted, or cost charged
	lockouts prometheus.Counter // failure buckets only
	refused  prometheus.Counter
	values   [len(configfile.CostProblemNames)]prometheus.Counter // cost buckets only
}

type metrics struct {
	failures, lockouts, refused *prometheus.CounterVec
	charged, values, chargesRef *prometheus.CounterVec
	streams                     prometheus.Gauge
	entries                     [numEntryResults]prometheus.Counter
	reports                     map[reportResult]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "ratelimit_authz", "failures"
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "counted_total",
		Help: "Failures (failed logins) counted, by bucket.",
	}, []string{"bucket"})
	lockouts := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "lockouts_total",
		Help: "Failures that brought a key to its bucket's limit (a lockout began), by bucket.",
	}, []string{"bucket"})
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "refused_total",
		Help: "Failures that could not be counted because the counter's key table is full, by bucket (checks of such keys fail closed).",
	}, []string{"bucket"})
	charged := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "cost", Name: "charged_total",
		Help: "Cost charged from Envoy's access log (in the bucket's unit), by bucket charged after the response.",
	}, []string{"bucket"})
	values := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "cost", Name: "charge_values_total",
		Help: "Response costs read from the access log, by bucket and outcome: ok (charged as reported), missing and invalid (charged the cost's missing), repeated (charged the largest), over_max (charged max).",
	}, []string{"bucket", "outcome"})
	chargesRef := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: "cost", Name: "charges_refused_total",
		Help: "Response costs that could not be charged because the counter's key table is full, by bucket.",
	}, []string{"bucket"})
	streams := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "accesslog_streams_open",
		Help: "Envoy access-log streams currently open.",
	})
	entries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "accesslog_entries_total",
		Help: "Access-log entries received, by result: counted (charged in a bucket), released (the request's leases of concurrency buckets released, nothing charged), ignored (not a failure, or not a route with buckets charged after the response, and no lease), malformed.",
	}, []string{"result"})
	reports := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "http_reports_total",
		Help: "POST /v1/failures requests, by result: counted, bad_request, unauthorized, disabled.",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{failures, lockouts, refused, charged, values, chargesRef, streams, entries, reports} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("failures: register metrics: %w", err)
		}
	}
	m := &metrics{failures: failures, lockouts: lockouts, refused: refused, charged: charged, values: values, chargesRef: chargesRef,
		streams: streams, reports: map[reportResult]prometheus.Counter{}}
	for i, name := range entryResultNames {
		m.entries[i] = entries.WithLabelValues(name)
	}
	for _, r := range []reportResult{reportCounted, "bad_request", "unauthorized", "disabled"} {
		m.reports[r] = reports.WithLabelValues(r)
	}
	return m, nil
}

// forget deletes the bucket's series of one family ("failures", "cost").
func (m *metrics) forget(name, family string) {
	if family == "failures" {
		m.failures.DeleteLabelValues(name)
		m.lockouts.DeleteLabelValues(name)
		m.refused.DeleteLabelValues(name)
		return
	}
	m.charged.DeleteLabelValues(name)
	m.chargesRef.DeleteLabelValues(name)
	m.values.DeletePartialMatch(prometheus.Labels{"bucket": name})
}

// forBuckets are the children of the buckets' metrics, by bucket index;
// set for the buckets charged after the response.
func (m *metrics) forBuckets(buckets []snapshot.Bucket) []bucketMetrics {
	bm := make([]bucketMetrics, len(buckets))
	for i, b := range buckets {
		switch family(b) {
		case "failures":
			bm[i] = bucketMetrics{
				counted:  m.failures.WithLabelValues(b.Name),
				lockouts: m.lockouts.WithLabelValues(b.Name),
				refused:  m.refused.WithLabelValues(b.Name),
			}
		case "cost":
			bm[i] = bucketMetrics{
				counted: m.charged.WithLabelValues(b.Name),
				refused: m.chargesRef.WithLabelValues(b.Name),
			}
			for p, name := range configfile.CostProblemNames {
				bm[i].values[p] = m.values.WithLabelValues(b.Name, name)
			}
		}
	}
	return bm
}
