package accesslog_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// FuzzAccessLogEntry: whatever an access-log entry holds (it arrives over
// the gRPC port), decoding it never panics, it counts at most
// maxKeysPerBucket charges per bucket, only in buckets charged after the
// response, each between 0 and the cost's max (1 for a failure).
func FuzzAccessLogEntry(f *testing.F) {
	s := structpb.NewStringValue
	seed := func(fields map[string]*structpb.Value, code uint32, headers ...string) {
		e := &accesslogv3.HTTPAccessLogEntry{
			CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				accesslog.MetadataNamespace: {Fields: fields},
			}}},
			Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code), ResponseHeaders: map[string]string{}, ResponseBodyBytes: 1 << 40},
		}
		for i := 0; i+1 < len(headers); i += 2 {
			e.Response.ResponseHeaders[headers[i]] = headers[i+1]
		}
		b, err := proto.Marshal(e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	keys := func(m map[string]*structpb.Value) *structpb.Value {
		return structpb.NewStructValue(&structpb.Struct{Fields: m})
	}
	seed(map[string]*structpb.Value{accesslog.MetaFailures: keys(map[string]*structpb.Value{"login_ip": s("203.0.113.1"), "login_account": s("a@x")}), accesslog.MetaRoute: s("login")}, 401)
	seed(map[string]*structpb.Value{accesslog.MetaFailures: keys(map[string]*structpb.Value{
		"login_account": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{s("a@x"), s("b@x"), s(" unreadable")}}),
	})}, 401)
	seed(map[string]*structpb.Value{accesslog.MetaFailures: keys(map[string]*structpb.Value{
		"login_account": structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{s("a"), s("a"), structpb.NewNullValue()}}),
		"inbound":       s("c"),
	})}, 401)
	seed(map[string]*structpb.Value{accesslog.MetaFailures: s("x")}, 200)
	seed(map[string]*structpb.Value{accesslog.MetaCharges: keys(map[string]*structpb.Value{"llm_tokens": s("acme")})}, 200, "x-usage-total-tokens", "1234")
	seed(map[string]*structpb.Value{accesslog.MetaCharges: keys(map[string]*structpb.Value{"llm_tokens": s("acme")})}, 200, "x-usage-total-tokens", "-5,99999999999999999999")
	seed(map[string]*structpb.Value{accesslog.MetaCharges: keys(map[string]*structpb.Value{"llm_tokens": s("acme"), "login_ip": s("a")})}, 401)
	f.Add([]byte{0x0a, 0xff})

	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		f.Fatal(err)
	}
	snap := snapshottest.ByIndex(f, r)
	cfg, limits := accesslog.ConfigFrom(snap), snapshot.NewResolver(snap, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		var e accesslogv3.HTTPAccessLogEntry
		if proto.Unmarshal(data, &e) != nil {
			return
		}
		c := &countingCounter{}
		rec, err := accesslog.New(cfg, c, limits, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), accesslog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		res := rec.Entry(&e)
		if res != "counted" && len(c.n) > 0 {
			t.Fatalf("entry %s but %d failures counted", res, len(c.n))
		}
		if c.emptyKey {
			t.Fatal("a failure counted under the empty key")
		}
		for b, n := range c.n {
			if n > match.MaxAccounts+1 {
				t.Fatalf("bucket %d: %d charges from one entry", b, n)
			}
			cost := r.Buckets[b].Cost
			if !cost.AfterResponse() {
				t.Fatalf("charge in bucket %s, which the check counts itself", r.Buckets[b].Name)
			}
			max := cost.Max
			if cost.Source == configfile.CostFailures {
				max = 1
			}
			if c.min[b] < 0 || c.max[b] > max {
				t.Fatalf("bucket %s charged between %d and %d, outside 0 … %d", r.Buckets[b].Name, c.min[b], c.max[b], max)
			}
		}
	})
}

type countingCounter struct {
	n        map[counter.Bucket]int
	min, max map[counter.Bucket]int64 // of the charges
	emptyKey bool
}

func (c *countingCounter) Incr(b counter.Bucket, key string, _ counter.Limit, n int64, _ time.Time) counter.Result {
	if c.n == nil {
		c.n, c.min, c.max = map[counter.Bucket]int{}, map[counter.Bucket]int64{}, map[counter.Bucket]int64{}
	}
	if _, seen := c.n[b]; !seen || n < c.min[b] {
		c.min[b] = n
	}
	c.max[b] = max(c.max[b], n)
	c.n[b]++
	c.emptyKey = c.emptyKey || key == ""
	return counter.Result{Allowed: true}
}
