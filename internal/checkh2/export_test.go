package checkh2

import (
	"io"
	"log/slog"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// testRLSConfig has a key no test reaches (allowed), one always over
// (denied, a limit of 0) and one of 3 a minute (tenant).
const testRLSConfig = `domain: lean
descriptors:
  - key: allowed
    rate_limit: {unit: second, requests_per_unit: 2000000000}
  - key: denied
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// NewTestRLS is the product's rate limit service on testRLSConfig, over
// a counter of its own, on the clock now (nil: time.Now).
func NewTestRLS(tb testing.TB, now func() time.Time) *rls.Service {
	tb.Helper()
	c, err := rlsconfig.Parse([]rlsconfig.File{{Name: "lean.yaml", Data: []byte(testRLSConfig)}}, rlsconfig.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := rls.Config{Snapshot: snapshottest.RLS(tb, c)}
	store, err := counter.New(counter.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	svc, err := rls.New(cfg, store, nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), rls.Options{Now: now})
	if err != nil {
		tb.Fatal(err)
	}
	return svc
}

// RLSRequest is a request of one descriptor key=value of testRLSConfig.
func RLSRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "lean", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}},
	}}
}

// RaceBuild is raceBuild for the external tests.
const RaceBuild = raceBuild
