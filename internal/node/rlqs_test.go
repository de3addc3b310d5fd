package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// quotaRules: one tenant budget of 100 an hour (no window ends during a
// test), spent by Check on /t and by RLQS bucket ids {name: t, tenant: …}.
func quotaRules(t *testing.T, extra string) *configfile.Rules {
	t.Helper()
	return parseRules(t, `keys:
  tenant_header: x-tenant-id
buckets:
  hourly: {limit: 100, per: 1h, key: tenant}
  channel: {limit: 5, per: 1h, key: "path:channel"}
routes:
  - {method: POST, path: /t, buckets: [hourly]}
  - {method: POST, path: "/c/{channel}", buckets: [channel]}
quota:
  domains: [api]
  buckets:
    - {match: {name: t}, bucket: hourly, key: tenant}
`+extra)
}

// quotaClient is one Envoy's RLQS stream to a node.
type quotaClient struct {
	t    *testing.T
	s    rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	recv chan *rlqspb.RateLimitQuotaResponse
	errs chan error
}

func openQuota(t *testing.T, conn *grpc.ClientConn) *quotaClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := &quotaClient{t: t, s: s, recv: make(chan *rlqspb.RateLimitQuotaResponse, 64), errs: make(chan error, 1)}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				q.errs <- err
				return
			}
			q.recv <- m
		}
	}()
	return q
}

func (q *quotaClient) report(id map[string]string, allowed uint64) {
	q.t.Helper()
	if err := q.s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: id}, NumRequestsAllowed: allowed},
	}}); err != nil {
		q.t.Fatal(err)
	}
}

// next is the next action's strategy, as "tokens N", "DENY_ALL",
// "ALLOW_ALL" or "abandon"; "" when none comes within d.
func (q *quotaClient) next(d time.Duration) string {
	q.t.Helper()
	select {
	case m := <-q.recv:
		a := m.GetBucketAction()[len(m.GetBucketAction())-1]
		if a.GetAbandonAction() != nil {
			return "abandon"
		}
		rs := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
		if tb := rs.GetTokenBucket(); tb != nil {
			return fmt.Sprintf("tokens %d", tb.GetMaxTokens())
		}
		return rs.GetBlanketRule().String()
	case err := <-q.errs:
		q.t.Fatalf("stream ended: %v", err)
	case <-time.After(d):
	}
	return ""
}

// until reports id (with no new usage) until its assignment is want.
func (q *quotaClient) until(id map[string]string, want string) {
	q.t.Helper()
	var last string
	poll.Until(q.t, 20*time.Second, 20*time.Millisecond, func() error {
		q.report(id, 0)
		for a := q.next(100 * time.Millisecond); a != ""; a = q.next(20 * time.Millisecond) {
			last = a
		}
		if last != want {
			return fmt.Errorf("assignment %q, want %q", last, want)
		}
		return nil
	})
}

var acmeID = map[string]string{"name": "t", "tenant": "acme"}

// A node serves RLQS beside Check from one budget: usage Envoy reports
// over RLQS is spent for Check, and Check's hits shrink the share.
func TestRLQSOnTheNode(t *testing.T) {
	n := start(t, local(quotaRules(t, "")))
	c, conn := dial(t, n.GRPCAddr())
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	hc, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of the RLQS service: %v %v", hc, err)
	}
	q := openQuota(t, conn)
	q.report(acmeID, 30)
	if a := q.next(10 * time.Second); a != "tokens 70" {
		t.Fatalf("first assignment %q, want tokens 70", a)
	}
	if got := spendN(t, c, "/t", "acme", 60); got != 60 {
		t.Fatalf("Check admitted %d of 60 with 70 left", got)
	}
	q.until(acmeID, "tokens 10")
	if got := spendN(t, c, "/t", "acme", 20); got != 10 {
		t.Fatalf("Check admitted %d of 20 with 10 left", got)
	}
	q.until(acmeID, "DENY_ALL")
	if v := gathered(t, n, "ratelimit_authz_rlqs_streams"); v != 1 {
		t.Errorf("streams gauge %v", v)
	}
	// The node stopping ends the stream: Envoy keeps its assignment for
	// its TTL and reconnects.
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-q.errs:
		if !strings.Contains(err.Error(), "shutting down") && !strings.Contains(err.Error(), "Unavailable") {
			t.Fatalf("stream ended with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stream outlived the node")
	}
}

// A reload swaps the mapping: a bucket id whose entry went away is
// abandoned; adding or removing the whole section needs a restart.
func TestRLQSReload(t *testing.T) {
	chEntry := "    - {match: {name: c}, bucket: channel, key: channel}\n"
	n := start(t, local(quotaRules(t, chEntry)))
	_, conn := dial(t, n.GRPCAddr())
	q := openQuota(t, conn)
	ch := map[string]string{"name": "c", "channel": "x"}
	q.report(ch, 1)
	if a := q.next(10 * time.Second); a != "tokens 4" {
		t.Fatalf("channel: %q", a)
	}
	if err := n.Reload(t.Context(), quotaRules(t, "")); err != nil {
		t.Fatal(err)
	}
	if a := q.next(10 * time.Second); a != "abandon" {
		t.Fatalf("after the reload removed its entry: %q, want abandon", a)
	}
	plain := parseRules(t, `keys:
  tenant_header: x-tenant-id
buckets:
  hourly: {limit: 100, per: 1h, key: tenant}
routes:
  - {method: POST, path: /t, buckets: [hourly]}
`)
	if err := n.Reload(t.Context(), plain); err == nil || !strings.Contains(err.Error(), "quota section") {
		t.Fatalf("reload without the quota section: %v", err)
	}
	// A node started without one refuses a reload that adds it.
	m := start(t, local(plain))
	if err := m.Reload(t.Context(), quotaRules(t, "")); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("reload adding a quota section: %v", err)
	}
}

// Three nodes over a real nats-server: participants on two of them share
// one tenant budget (each knows the other's through the replicated
// participants count), and Check on the third spends from it too.
func TestRLQSClusterSharesOneBudget(t *testing.T) {
	nats := testnats.StartProcess(t)
	cluster := func(id string) Config {
		cfg := local(quotaRules(t, ""))
		cfg.Cluster = &Cluster{URL: nats.URL(), NodeID: id, SyncInterval: 20 * time.Millisecond, WarmStartTimeout: 200 * time.Millisecond}
		return cfg
	}
	a, b, c := start(t, cluster("a")), start(t, cluster("b")), start(t, cluster("c"))
	for _, n := range []*running{a, b, c} {
		poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
			if code, _ := scrape.Page(t, "http://"+n.HTTPAddr().String()+"/readyz"); code != 200 {
				return errors.New("not ready")
			}
			return nil
		})
	}
	_, aconn := dial(t, a.GRPCAddr())
	_, bconn := dial(t, b.GRPCAddr())
	cc, _ := dial(t, c.GRPCAddr())
	qa, qb := openQuota(t, aconn), openQuota(t, bconn)
	qa.report(acmeID, 10)
	if got := qa.next(10 * time.Second); got != "tokens 30" {
		t.Fatalf("a's first share: %q, want tokens 30 (90 left over the 3 live nodes: a participant on each could be joining)", got)
	}
	// b reports 10 too: once each node has the other's count and
	// participant, each is assigned half of the 80 left (a's grows).
	qb.report(acmeID, 10)
	qb.next(10 * time.Second)
	qb.until(acmeID, "tokens 40")
	qa.until(acmeID, "tokens 40")
	// Check on c spends 30 of the same budget (within its share of it, a
	// few ms apart): 50 left, 25 each.
	for i := range 30 {
		if !poll.Soon(2*time.Second, 2*time.Millisecond, func() bool { return checkPath(t, cc, "/t", "acme") }) {
			t.Fatalf("c: check %d of 30 denied", i)
		}
	}
	qa.until(acmeID, "tokens 25")
	qb.until(acmeID, "tokens 25")
	// Each spends its share; the budget is gone everywhere.
	qa.report(acmeID, 25)
	qb.report(acmeID, 25)
	qa.until(acmeID, "DENY_ALL")
	qb.until(acmeID, "DENY_ALL")
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		if checkPath(t, cc, "/t", "acme") {
			return errors.New("c still admits acme")
		}
		return nil
	})
}

// The RLQS streams are served through the drain delay, as the Check port
// is (Envoy learns of the drain from health checks, and reopens a stream
// only at its next report, up to 5 s later), and end with UNAVAILABLE
// once it is over, before the graceful stop.
func TestRLQSStreamsServeThroughTheDrain(t *testing.T) {
	cfg := local(quotaRules(t, ""))
	cfg.DrainDelay = 5 * time.Second
	n := start(t, cfg)
	_, conn := dial(t, n.GRPCAddr())
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	q := openQuota(t, conn)
	q.report(acmeID, 30)
	if a := q.next(10 * time.Second); a != "tokens 70" {
		t.Fatalf("first assignment %q, want tokens 70", a)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- n.stop() }()
	waitHealth(t, conn, healthpb.HealthCheckResponse_NOT_SERVING) // the drain began
	q.report(acmeID, 10)
	if a := q.next(10 * time.Second); a != "tokens 60" {
		t.Fatalf("a report during the drain: %q, want tokens 60", a)
	}
	select {
	case err := <-q.errs:
		if !strings.Contains(err.Error(), "Unavailable") {
			t.Fatalf("stream ended with %v, want Unavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived the drain")
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}
