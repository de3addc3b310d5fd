package rlqs

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

const fuzzRules = `
buckets:
  tenant_rate: {limit: 10, per: 1s, key: tenant}
  channel_rate: {limit: 6, per: 1m, key: "path:channel", on_missing_key: deny}
routes:
  - {path: "/x/{channel}", buckets: [tenant_rate, channel_rate]}
quota:
  domains: [api]
  max_bucket_ids: 4
  buckets:
    - {match: {name: t}, bucket: tenant_rate, key: tenant}
    - {match: {name: c, env: prod}, bucket: channel_rate, key: channel}
    - {bucket: tenant_rate, key: org, cost: 2147483647}
`

func fuzzConfig(t testing.TB) Config {
	r, err := configfile.Parse([]byte(fuzzRules), "fuzz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	snap := snapshottest.ByIndex(t, r)
	return ConfigFrom(snap, snapshot.NewResolver(snap, nil))
}

// decodeID reads a bucket id from text: entries separated by \x00, name
// and value by \x01 (the fuzzer explores the bytes freely).
func decodeID(s string) map[string]string {
	id := map[string]string{}
	for _, e := range strings.Split(s, "\x00") {
		k, v, _ := strings.Cut(e, "\x01")
		id[k] = v
	}
	return id
}

// The mapping matches exactly the ids of an entry's shape, and the
// canonical key tells every two different ids apart.
func FuzzMapping(f *testing.F) {
	for _, s := range []string{
		"name\x01t\x00tenant\x01acme",
		"name\x01t\x00tenant\x01",
		"name\x01t\x00tenant\x01acme\x00extra\x01x",
		"name\x01c\x00env\x01prod\x00channel\x01ch",
		"name\x01c\x00env\x01dev\x00channel\x01ch",
		"org\x01o",
		"\x01",
		"name\x01t",
	} {
		f.Add(s, "org\x01o")
	}
	m := NewMapping(fuzzConfig(f).Quota.Buckets)
	f.Fuzz(func(t *testing.T, a, b string) {
		ia, ib := decodeID(a), decodeID(b)
		if mt, ok := m.Lookup(ia); ok {
			e := m.entries[mt.Entry]
			if len(ia) != len(e.match)+1 || ia[e.key] != mt.Key || mt.Bucket != e.bucket {
				t.Fatalf("%q matched entry %d wrongly: %+v", ia, mt.Entry, mt)
			}
			for _, p := range e.match {
				if ia[p.k] != p.v {
					t.Fatalf("%q matched entry %d without %s=%s", ia, mt.Entry, p.k, p.v)
				}
			}
		}
		if idProblem(ia) != "" || idProblem(ib) != "" {
			return
		}
		if (idKey(ia) == idKey(ib)) != sameMap(ia, ib) {
			t.Fatalf("idKey(%q) == idKey(%q) is %v", ia, ib, idKey(ia) == idKey(ib))
		}
	})
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// Any report message, as bytes off the wire: handled without a panic,
// within the stream's bounds, every action naming a bucket id the report
// carried, no token bucket above the limit.
func FuzzReport(f *testing.F) {
	seed := func(m *rlqspb.RateLimitQuotaUsageReports) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, b)
	}
	u := func(id map[string]string, allowed uint64) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: id}, NumRequestsAllowed: allowed}
	}
	seed(&rlqspb.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		u(map[string]string{"name": "t", "tenant": "acme"}, 3),
		u(map[string]string{"name": "c", "env": "prod", "channel": ""}, 1),
		u(map[string]string{"org": "o"}, ^uint64(0)),
		u(nil, 1),
		u(map[string]string{"name": "t", "tenant": strings.Repeat("x", 600)}, 1),
	}})
	seed(&rlqspb.RateLimitQuotaUsageReports{Domain: "other"})
	seed(&rlqspb.RateLimitQuotaUsageReports{})
	f.Add([]byte{0x0a, 0x03, 'a', 'p', 'i', 0x12, 0x00}, []byte{0x12, 0x02, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, first, second []byte) {
		svc, err := New(fuzzConfig(t), mustCounter(t), prometheus.NewRegistry(), slog.New(slog.DiscardHandler), Options{})
		if err != nil {
			t.Fatal(err)
		}
		str := &stream{s: svc, id: 1, ids: map[string]*tracked{}}
		defer str.release()
		now := time.Unix(1764547200, 0)
		for i, data := range [][]byte{first, second} {
			m := &rlqspb.RateLimitQuotaUsageReports{}
			if proto.Unmarshal(data, m) != nil {
				return
			}
			resp, err := str.report(m, now.Add(time.Duration(i)*1500*time.Millisecond))
			if err != nil {
				return // a refused stream ends
			}
			check(t, m, resp)
			check(t, nil, str.tick(now.Add(time.Duration(i)*1500*time.Millisecond+time.Second)))
			if len(str.ids) > 4 {
				t.Fatalf("%d bucket ids tracked, bound 4", len(str.ids))
			}
		}
	})
}

func mustCounter(t *testing.T) *counter.Store {
	s, err := counter.New(counter.Config{MaxKeys: 8, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func check(t *testing.T, m *rlqspb.RateLimitQuotaUsageReports, resp *rlqspb.RateLimitQuotaResponse) {
	t.Helper()
	if m != nil && len(resp.GetBucketAction()) > 2*len(m.GetBucketQuotaUsages()) { // a restart is two actions
		t.Fatalf("%d actions for %d usages (at most two each)", len(resp.GetBucketAction()), len(m.GetBucketQuotaUsages()))
	}
	for _, a := range resp.GetBucketAction() {
		if len(a.GetBucketId().GetBucket()) == 0 {
			t.Fatalf("an action without a bucket id: %v", a)
		}
		if tb := a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb != nil && (tb.GetMaxTokens() == 0 || tb.GetMaxTokens() > 10) {
			t.Fatalf("token bucket of %d tokens, limits at most 10", tb.GetMaxTokens())
		}
		if d := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); a.GetQuotaAssignmentAction() != nil && d != configfile.DefaultQuotaAssignmentTTL && (d != time.Second || a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != 0) {
			t.Fatalf("TTL %v", a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration())
		}
	}
}
