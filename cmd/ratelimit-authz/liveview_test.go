package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/lockout"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
)

// liveViewConfig has a bucket of every kind: requests, a cost taken at
// the check, a cost charged from the response, failures, requests in
// flight.
const liveViewConfig = `
keys: {tenant_header: x-tenant-id}
buckets:
  calls: {limit: 3, per: 1m, key: tenant}
  prompt: {limit: 100, per: 1m, key: tenant, cost: {request_header: x-cost, max: 100}}
  tokens: {limit: 1000, per: 1m, key: tenant, cost: {response_header: x-tokens, max: 1000}}
  guesses: {limit: 2, per: 1m, key: tenant, count: failures}
  pool: {count: concurrency, limit: 2, lease_ttl: 1m, key: tenant}
routes:
  - {path: /calls, buckets: [calls]}
  - {path: /prompt, buckets: [prompt]}
  - {path: /llm, buckets: [tokens]}
  - {path: /login, buckets: [guesses]}
  - {path: /pool, buckets: [pool]}
`

// The live view counts every bucket kind in its unit, and its figures
// are those of the metrics of the same name: requests allowed and denied;
// a cost taken at the check, admitted and denied; a cost charged from the
// response, and the requests refused once it is spent; failures counted,
// and the logins refused; acquisitions of slots in flight, and refusals.
func TestLiveViewAgreesWithTheMetrics(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "live.yaml")
	if err := os.WriteFile(cfg, []byte(liveViewConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_CONFIG": cfg, "RATELIMIT_AUTHZ_ADMIN_ADDR": "127.0.0.1:0"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(path string, hdr map[string]string) *authv3.CheckResponse {
		t.Helper()
		h := map[string]string{":path": path, ":method": "POST", "x-tenant-id": "acme"}
		for k, v := range hdr {
			h[k] = v
		}
		resp, err := n.client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
			Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: path, Headers: h}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	als, err := alsv3.NewAccessLogServiceClient(n.conn).StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	report := func(resp *authv3.CheckResponse, code uint32, tokens string) {
		t.Helper()
		e := &accesslogv3.HTTPAccessLogEntry{
			CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{
				FilterMetadata: map[string]*structpb.Struct{lockout.MetadataNamespace: resp.GetDynamicMetadata()}}},
			Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code), ResponseHeaders: map[string]string{"x-tokens": tokens}},
		}
		if err := als.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
			HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogv3.HTTPAccessLogEntry{e}}}}); err != nil {
			t.Fatal(err)
		}
	}
	metric := func(series string) float64 { // 0 while absent
		t.Helper()
		page, err := scrape.Get(http.DefaultClient, "http://"+n.http+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		v, _ := page.Get(series)
		return v
	}

	for range 5 {
		check("/calls", nil) // 3 allowed, 2 denied
	}
	for range 2 {
		check("/prompt", map[string]string{"x-cost": "60"}) // 60 admitted, 60 denied
	}
	report(check("/llm", nil), 200, "1500") // charges max, 1000: spent
	for range 3 {
		report(check("/login", nil), 401, "") // the first two count, the third is refused once they arrive
	}
	for i := range 3 {
		check("/pool", map[string]string{"x-request-id": fmt.Sprint("r", i)}) // 2 acquired, 1 refused
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		if v := metric(`ratelimit_authz_cost_charged_total{bucket="tokens"}`); v != 1000 {
			return fmt.Errorf("tokens charged %v", v)
		}
		if v := metric(`ratelimit_authz_failures_counted_total{bucket="guesses"}`); v < 2 {
			return fmt.Errorf("failures counted %v", v)
		}
		return nil
	})
	for range 2 {
		check("/llm", nil) // refused: spent
	}
	check("/login", nil) // refused: locked out

	code, body := adminGet(t, "http://"+n.node.AdminAddr().String()+"/v1/top?n=5", "")
	if code != 200 {
		t.Fatalf("GET /v1/top: %d %s", code, body)
	}
	var tops admin.TopResponse
	if err := json.Unmarshal(body, &tops); err != nil {
		t.Fatal(err)
	}
	byName := map[string]admin.BucketTops{}
	for _, b := range tops.Buckets {
		byName[b.Bucket] = b
	}
	for _, tc := range []struct {
		bucket, unit, deniedUnit string
		admitted, denied         string // the metrics' series
	}{
		{"calls", "requests", "requests", `ratelimit_authz_checks_total{bucket="calls",decision="allowed"}`, `ratelimit_authz_checks_total{bucket="calls",decision="denied"}`},
		{"prompt", "cost", "cost", `ratelimit_authz_cost_admitted_total{bucket="prompt"}`, `ratelimit_authz_cost_denied_total{bucket="prompt"}`},
		{"tokens", "cost", "requests", `ratelimit_authz_cost_charged_total{bucket="tokens"}`, `ratelimit_authz_checks_total{bucket="tokens",decision="denied"}`},
		{"guesses", "failures", "requests", `ratelimit_authz_failures_counted_total{bucket="guesses"}`, `ratelimit_authz_checks_total{bucket="guesses",decision="denied"}`},
		{"pool", "concurrent-requests", "concurrent-requests", `ratelimit_authz_checks_total{bucket="pool",decision="allowed"}`, `ratelimit_authz_checks_total{bucket="pool",decision="denied"}`},
	} {
		b, ok := byName[tc.bucket]
		if !ok {
			t.Errorf("%s: not in the live view", tc.bucket)
			continue
		}
		wantA, wantD := metric(tc.admitted), metric(tc.denied)
		if wantA == 0 || wantD == 0 {
			t.Errorf("%s: the metrics read %v admitted, %v denied: the load did not reach both", tc.bucket, wantA, wantD)
		}
		if float64(b.Minute.Admitted) != wantA || float64(b.Minute.Denied) != wantD || b.Unit != tc.unit || b.DeniedUnit != tc.deniedUnit {
			t.Errorf("%s: the live view reads %d %s admitted, %d %s denied; the metrics %v, %v (%s, %s)",
				tc.bucket, b.Minute.Admitted, b.Unit, b.Minute.Denied, b.DeniedUnit, wantA, wantD, tc.unit, tc.deniedUnit)
		}
		if len(b.Minute.TopDenied) == 0 || b.Minute.TopDenied[0].Key != "acme" {
			t.Errorf("%s: top denied %+v, want acme", tc.bucket, b.Minute.TopDenied)
		}
	}
	// Requests in flight: the leases held now, per key, as the gauge.
	if f := byName["pool"].InFlight; len(f) != 1 || f[0].Key != "acme" || float64(f[0].Hits) != metric(`ratelimit_authz_inflight_requests{bucket="pool"}`) || f[0].Hits != 2 {
		t.Errorf("pool in flight now %+v, want acme 2 as ratelimit_authz_inflight_requests", f)
	}
	if byName["calls"].InFlight != nil {
		t.Errorf("a rate bucket lists requests in flight: %+v", byName["calls"].InFlight)
	}
	var table bytes.Buffer
	if err := run(ctx, []string{"top", "--once", "--admin-addr", n.node.AdminAddr().String()}, env(nil), &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`pool  \(2 in flight, fixed\)`, `in flight now: acme 2`, `tokens  \(1000 / 1m, fixed\)  admitted [0-9.]+ cost/s  denied [0-9.]+/s`} {
		if !regexp.MustCompile(want).MatchString(table.String()) {
			t.Errorf("top lacks %s:\n%s", want, table.String())
		}
	}
}
