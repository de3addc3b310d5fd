package rlqs

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// hourlyRules: one budget of 100 an hour, so that no window ends during a
// test; assignments live 5 s, refreshed every 2.5 s.
const hourlyRules = `
buckets:
  hourly: {limit: 100, per: 1h, key: tenant}
routes:
  - {path: /t, buckets: [hourly]}
quota:
  domains: [api]
  buckets:
    - {match: {name: t}, bucket: hourly, key: tenant}
`

// peer stands for the other nodes of a 3-node cluster: their
// participants' usage and announcements reach the counter, as
// replication would bring them.
type peer struct {
	store      *counter.Store
	usage      counter.Bucket
	lim        counter.Limit
	announceTo counter.Bucket
}

// join announces one of their participants of key in the participants
// window of now, and counts spent for it.
func (p peer) join(key string, spent int64, now time.Time) {
	if spent > 0 {
		p.store.Incr(p.usage, key, p.lim, spent, now)
	}
	p.store.Incr(p.announceTo, key, ParticipantsLimit, 1, now)
}

// growStream is one stream of a Service on a cluster of 3 nodes (Settle
// 200 ms), driven by hand, and the cluster's other nodes.
func growStream(t *testing.T) (*stream, peer) {
	t.Helper()
	r, err := configfile.Parse([]byte(hourlyRules), "hourly.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := ConfigFrom(snapshottest.ByIndex(t, r), snapshot.NewResolver(snapshottest.ByIndex(t, r), nil))
	store, err := counter.New(counter.Config{Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(cfg, store, prometheus.NewRegistry(), slog.New(slog.DiscardHandler), Options{
		Nodes: func() int { return 3 }, Settle: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Quota.Buckets[0].Bucket
	lim, _ := cfg.Resolver.Limit(int(b), "acme")
	p := peer{store: store, usage: cfg.Buckets[b].ID, lim: lim, announceTo: cfg.Buckets[b].Participants.ID}
	return &stream{s: svc, id: 1, ids: map[string]*tracked{}}, p
}

// assigned is the last action of resp: "tokens N", a blanket rule, or ""
// for none.
func assigned(resp *rlqspb.RateLimitQuotaResponse) string {
	as := resp.GetBucketAction()
	if len(as) == 0 {
		return ""
	}
	rs := as[len(as)-1].GetQuotaAssignmentAction().GetRateLimitStrategy()
	if tb := rs.GetTokenBucket(); tb != nil {
		return fmt.Sprintf("tokens %d", tb.GetMaxTokens())
	}
	return rs.GetBlanketRule().String()
}

// reporter reports id's usage on str, returning what it is assigned.
func reporter(t *testing.T, str *stream, id map[string]string) func(allowed uint64, now time.Time) string {
	return func(allowed uint64, now time.Time) string {
		t.Helper()
		resp, err := str.report(&rlqspb.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqspb.BucketId{Bucket: id}, NumRequestsAllowed: allowed},
		}}, now)
		if err != nil {
			t.Fatal(err)
		}
		return assigned(resp)
	}
}

// dayStart is the start of a day: of an hour's window and of a participants
// window.
var dayStart = time.Unix(1764547200, 0).UTC()

// A first share counted every live node; once the count is known it grows
// to the fair share, even when a refresh of it went out in between: the
// refresh re-sends the share that counted every node, and says so.
func TestStreamShareGrowsAfterARefresh(t *testing.T) {
	str, other := growStream(t)
	id := map[string]string{"name": "t", "tenant": "acme"}
	report := reporter(t, str, id)
	at := dayStart.Add(time.Second)
	if got := report(10, at); got != "tokens 30" {
		t.Fatalf("first share: %q, want tokens 30 (90 over the 3 nodes)", got)
	}
	// The other node's participant joins and spends 10: 80 left, 2
	// participants.
	other.join("acme", 10, at.Add(10*time.Millisecond))
	// The first report after the settle time comes late: a tick refreshes
	// the assignment first (half the TTL), with the count known by then.
	if got := assigned(str.tick(at.Add(2500 * time.Millisecond))); got != "tokens 30" {
		t.Fatalf("refresh: %q, want the same tokens 30", got)
	}
	if got := report(0, at.Add(2600*time.Millisecond)); got != "tokens 40" {
		t.Fatalf("the report after the refresh: %q, want tokens 40 (80 over the 2 participants)", got)
	}
}

// A share that did not count every live node does not grow within its
// window, even when a refresh of it went out while the count was unknown.
func TestStreamShareKnownDoesNotGrowAfterARefresh(t *testing.T) {
	str, other := growStream(t)
	id := map[string]string{"name": "t", "tenant": "acme"}
	report := reporter(t, str, id)
	// Participants windows: [0 s, 5 s), …, [15 s, 20 s) from dayStart.
	// Two participants on the other nodes spent 10 each.
	other.join("acme", 10, dayStart.Add(900*time.Millisecond))
	other.join("acme", 10, dayStart.Add(900*time.Millisecond))
	if got := report(10, dayStart.Add(time.Second)); got != "tokens 23" {
		t.Fatalf("first share: %q, want tokens 23 (70 over the 3 nodes)", got)
	}
	// Settled: the count says 3; the same tokens, now a share of the
	// known count.
	if got := report(0, dayStart.Add(1500*time.Millisecond)); got != "tokens 23" {
		t.Fatalf("known: %q, want tokens 23 (70 over the 3 participants)", got)
	}
	// No report for two participants windows; a refresh goes out early in
	// the third, before its count can be known.
	if got := assigned(str.tick(dayStart.Add(15050 * time.Millisecond))); got != "tokens 23" {
		t.Fatalf("refresh: %q, want the same tokens 23", got)
	}
	// One of the other participants is back; the count, known, says 2.
	// The share sent counted the participants, not every node: it does
	// not grow (the one gone may have usage unreported).
	other.join("acme", 0, dayStart.Add(15100*time.Millisecond))
	if got := report(0, dayStart.Add(15300*time.Millisecond)); got != "" {
		t.Fatalf("the report after the refresh: %q, want nothing (tokens 23 stand; not 35, 70 over 2)", got)
	}
}
