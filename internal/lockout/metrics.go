package lockout

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

type reportResult = string

const (
	reportCounted reportResult = "counted"
)

type bucketMetrics struct {
	failures prometheus.Counter
	lockouts prometheus.Counter
	refused  prometheus.Counter
}

type metrics struct {
	failures, lockouts, refused *prometheus.CounterVec
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
	streams := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "accesslog_streams_open",
		Help: "Envoy access-log streams currently open.",
	})
	entries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "accesslog_entries_total",
		Help: "Access-log entries received, by result: counted, ignored (not a failure or not a login route), malformed.",
	}, []string{"result"})
	reports := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "http_reports_total",
		Help: "POST /v1/failures requests, by result: counted, bad_request, unauthorized, disabled.",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{failures, lockouts, refused, streams, entries, reports} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("failures: register metrics: %w", err)
		}
	}
	m := &metrics{failures: failures, lockouts: lockouts, refused: refused, streams: streams, reports: map[reportResult]prometheus.Counter{}}
	for i, name := range entryResultNames {
		m.entries[i] = entries.WithLabelValues(name)
	}
	for _, r := range []reportResult{reportCounted, "bad_request", "unauthorized", "disabled"} {
		m.reports[r] = reports.WithLabelValues(r)
	}
	return m, nil
}

// forget deletes the bucket's series.
func (m *metrics) forget(name string) {
	m.failures.DeleteLabelValues(name)
	m.lockouts.DeleteLabelValues(name)
	m.refused.DeleteLabelValues(name)
}

// forBuckets are the children of the buckets' metrics, by bucket index;
// set for failure buckets.
func (m *metrics) forBuckets(buckets []snapshot.Bucket) []bucketMetrics {
	bm := make([]bucketMetrics, len(buckets))
	for i, b := range buckets {
		if b.CountFailures {
			bm[i] = bucketMetrics{
				failures: m.failures.WithLabelValues(b.Name),
				lockouts: m.lockouts.WithLabelValues(b.Name),
				refused:  m.refused.WithLabelValues(b.Name),
			}
		}
	}
	return bm
}
