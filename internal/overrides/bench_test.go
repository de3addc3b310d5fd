package overrides_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// populated returns a cache holding n tenants, each with an
// activity_create override ("tenant-0" … ).
func populated(b *testing.B, r *configfile.Rules, n int) *overrides.Cache {
	c := newTestCache(b, r)
	rows := make(map[string]string, n)
	for i := range n {
		rows[fmt.Sprintf("tenant-%d", i)] = `{"activity_create": {"limit": 2000000000, "scale_ms": 1000}}`
	}
	c.PublishForTest(rows)
	return c
}

// BenchmarkOverride is the Check path's cost of a tenant override lookup.
func BenchmarkOverride(b *testing.B) {
	r := shippedRules(b)
	act := counter.Bucket(r.BucketIndex("activity_create"))
	for _, bc := range []struct {
		name    string
		tenants int
		tenant  string
	}{
		{"empty", 0, "tenant-1"},
		{"hit-1k", 1000, "tenant-500"},
		{"miss-1k", 1000, "someone-else"},
		{"hit-1M", 1_000_000, "tenant-123456"},
		{"huge-tenant-header", 1000, strings.Repeat("x", 1<<20)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := populated(b, r, bc.tenants)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.Override(bc.tenant, act)
				}
			})
		})
	}
}

// BenchmarkCheckWithOverrides is authz's BenchmarkCheck/allowed-activity
// with the cache wired in as the node does, against none.
func BenchmarkCheckWithOverrides(b *testing.B) {
	roomy := strings.NewReplacer("limit: 100\n", "limit: 2000000000\n", "limit: 500\n", "limit: 2000000000\n").Replace(string(config.Default()))
	r, err := configfile.Parse([]byte(roomy), "roomy")
	if err != nil {
		b.Fatal(err)
	}
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "192.0.2.1"},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/activities",
			Headers: map[string]string{":method": "POST", ":path": "/api/activities", "x-tenant-id": "tenant-42"},
		}},
	}}
	for _, bc := range []struct {
		name string
		over limits.Overrides
	}{
		{"none", nil},
		{"cache-1k-tenants", populated(b, r, 1000)},
	} {
		checkBench(b, r, req, bc.name, bc.over)
	}
	// inbound, keyed by channel: the override of the channel's owner.
	inbound := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: req.Attributes.Source,
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/api/inbound/ch-42",
			Headers: map[string]string{":method": "POST", ":path": "/api/inbound/ch-42"},
		}},
	}}
	owned := newTestCache(b, r)
	rows := map[string]string{}
	owners := map[[2]string]string{}
	for i := range 1000 {
		rows[fmt.Sprintf("tenant-%d", i)] = `{"inbound": {"limit": 2000000000, "scale_ms": 1000}}`
		owners[[2]string{"channel", fmt.Sprintf("ch-%d", i)}] = fmt.Sprintf("tenant-%d", i)
	}
	owned.PublishForTest(rows)
	owned.PublishOwnersForTest(owners)
	if l, ok := owned.OverrideFor(counter.Bucket(r.BucketIndex("inbound")), "ch-42"); !ok || l.Limit != 2000000000 {
		b.Fatalf("owned channel: %v %v", l, ok)
	}
	checkBench(b, r, inbound, "inbound-none", nil)
	checkBench(b, r, inbound, "inbound-owned-channel", owned)
}

func checkBench(b *testing.B, r *configfile.Rules, req *authv3.CheckRequest, name string, over limits.Overrides) {
	for _, bc := range []struct {
		name string
		over limits.Overrides
	}{{name, over}} {
		b.Run(bc.name, func(b *testing.B) {
			m, err := match.New(r.Descriptors())
			if err != nil {
				b.Fatal(err)
			}
			store, err := counter.New(r.Counter)
			if err != nil {
				b.Fatal(err)
			}
			snap := snapshottest.ByIndex(b, r)
			svc, err := authz.New(authz.ConfigFrom(snap), m, store, snapshot.NewResolver(snap, bc.over), newRegistry(), discardLog(), authz.Options{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if resp, _ := svc.Check(ctx, req); resp.GetStatus().GetCode() != 0 {
				b.Fatalf("denied: %v", resp)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					svc.Check(ctx, req)
				}
			})
		})
	}
}

// BenchmarkFullLoad is the CPU side of a full reload: decoding, validating
// and indexing 100k stored rows (the database side is not included).
func BenchmarkFullLoad(b *testing.B) {
	r := shippedRules(b)
	c := newTestCache(b, r)
	rows := make(map[string]string, 100_000)
	for i := range 100_000 {
		rows[fmt.Sprintf("tenant-%d", i)] = `{"upload": {"limit": 20, "scale_ms": 1000}, "activity_create": {"limit": 200, "scale_ms": 1000}}`
	}
	b.ReportAllocs()
	for b.Loop() {
		c.PublishForTest(rows)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/row")
}

// BenchmarkOverrideFor is the Check path's lookup: by tenant for a
// tenant-keyed bucket, through the key's owner for a channel-keyed one.
func BenchmarkOverrideFor(b *testing.B) {
	r := shippedRules(b)
	act, inb := counter.Bucket(r.BucketIndex("activity_create")), counter.Bucket(r.BucketIndex("inbound"))
	c := newTestCache(b, r)
	rows := map[string]string{}
	owners := map[[2]string]string{}
	for i := range 1000 {
		rows[fmt.Sprintf("tenant-%d", i)] = `{"activity_create": {"limit": 200, "scale_ms": 1000}, "inbound": {"limit": 2000, "scale_ms": 1000}}`
		owners[[2]string{"channel", fmt.Sprintf("ch-%d", i)}] = fmt.Sprintf("tenant-%d", i)
	}
	c.PublishForTest(rows)
	c.PublishOwnersForTest(owners)
	for _, bc := range []struct {
		name   string
		bucket counter.Bucket
		key    string
	}{
		{"tenant-hit-1k", act, "tenant-500"},
		{"channel-owned-1k", inb, "ch-500"},
		{"channel-unowned-1k", inb, "ch-none"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.OverrideFor(bc.bucket, bc.key)
				}
			})
		})
	}
}
