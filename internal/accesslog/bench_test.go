package accesslog_test

import (
	"io"
	"log/slog"
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// BenchmarkCharge measures one access-log entry charged, as the receiver
// handles each: the metadata read, the cost read from the response, the
// limit resolved and the counter charged, over 1000 keys.
func BenchmarkCharge(b *testing.B) {
	r, err := configfile.Parse([]byte(costYAML), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name, field, bucket string
		code                uint32
		headers             map[string]string
	}{
		{"response_header", accesslog.MetaCharges, "tokens", 200, map[string]string{"x-usage-total-tokens": "1234"}},
		{"failure", accesslog.MetaFailures, "guesses", 401, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			store, err := counter.New(counter.Config{})
			if err != nil {
				b.Fatal(err)
			}
			snap := snapshottest.ByIndex(b, r)
			rec, err := accesslog.New(accesslog.ConfigFrom(snap), store, snapshot.NewResolver(snap, nil), prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)), accesslog.Options{})
			if err != nil {
				b.Fatal(err)
			}
			entries := make([]*accesslogv3.HTTPAccessLogEntry, 1000)
			for i := range entries {
				key := "tenant-" + strconv.Itoa(i)
				md := &structpb.Struct{Fields: map[string]*structpb.Value{
					bc.field: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{bc.bucket: structpb.NewStringValue(key)}}),
				}}
				entries[i] = &accesslogv3.HTTPAccessLogEntry{
					CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{accesslog.MetadataNamespace: md}}},
					Response:         &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(bc.code), ResponseHeaders: bc.headers},
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if res := rec.Entry(entries[i%len(entries)]); res != "counted" {
						b.Errorf("entry %s", res)
						return
					}
					i++
				}
			})
		})
	}
}
