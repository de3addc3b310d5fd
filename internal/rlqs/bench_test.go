package rlqs

import (
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

func benchStream(b *testing.B, maxIDs int) *stream {
	cfg := fuzzConfig(b)
	q := *cfg.Quota
	q.MaxBucketIDs = maxIDs
	cfg.Quota = &q
	store, err := counter.New(counter.Config{})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := New(cfg, store, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), Options{})
	if err != nil {
		b.Fatal(err)
	}
	return &stream{s: svc, id: 1, ids: map[string]*tracked{}}
}

func benchReport(ids int) *rlqspb.RateLimitQuotaUsageReports {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "api"}
	for i := range ids {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"name": "t", "tenant": fmt.Sprintf("tenant-%06d", i)}},
			NumRequestsAllowed: 1,
		})
	}
	return m
}

// BenchmarkReport is the server's cost of one periodic report of 100
// bucket ids already tracked (Envoy sends one per stream every 5 s).
func BenchmarkReport(b *testing.B) {
	str := benchStream(b, 1024)
	m := benchReport(100)
	now := time.Unix(1764547200, 0)
	if _, err := str.report(m, now); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := str.report(m, now.Add(time.Duration(i)*time.Microsecond)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100, "ns/usage")
}

// BenchmarkTick is one tick of a stream of 100 bucket ids with nothing
// to send (every 100 ms per stream).
func BenchmarkTick(b *testing.B) {
	str := benchStream(b, 1024)
	now := time.Unix(1764547200, 0)
	if _, err := str.report(benchReport(100), now); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		str.tick(now.Add(10 * time.Millisecond))
	}
}

// BenchmarkTrackedMemory reports the heap one tracked bucket id costs
// (the id as received, the stream's state, its participant group, its
// counter entries: the report's other fields are garbage), for
// sizing max_streams × max_bucket_ids.
func BenchmarkTrackedMemory(b *testing.B) {
	const ids = 1024
	now := time.Unix(1764547200, 0)
	var per float64
	for range b.N {
		str := benchStream(b, ids)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		m := benchReport(ids) // the ids the stream keeps are the report's
		if _, err := str.report(m, now); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / ids
		runtime.KeepAlive(str)
		runtime.KeepAlive(m)
	}
	b.ReportMetric(per, "B/bucket-id")
}
