package rlqs_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlqs"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// t0 is the start of a day, so of every window up to a day long.
var t0 = time.Unix(1764547200, 0).UTC()

const testRules = `
buckets:
  tenant_rate: {limit: 10, per: 1s, key: tenant}
  channel_rate: {limit: 6, per: 1m, key: "path:channel", on_missing_key: deny, on_overflow: deny}
  shadowed: {limit: 1, per: 1s, key: tenant, mode: shadow}
routes:
  - {path: "/x/{channel}", buckets: [tenant_rate, channel_rate, shadowed]}
quota:
  domains: [api]
  assignment_ttl: 4s
  abandon_after: 3s
  max_streams: 4
  max_bucket_ids: 3
  buckets:
    - {match: {name: t}, bucket: tenant_rate, key: tenant}
    - {match: {name: c}, bucket: channel_rate, key: channel}
    - {match: {name: s}, bucket: shadowed, key: tenant}
`

// harness is a Service on a real gRPC server over a real counter, with a
// test clock.
type harness struct {
	t     *testing.T
	clock *testclock.Clock
	store *counter.Store
	reg   *prometheus.Registry
	svc   *rlqs.Service
	conn  *grpc.ClientConn
	rules *configfile.Rules
}

func config(t testing.TB, yaml string) (rlqs.Config, *configfile.Rules) {
	t.Helper()
	r, err := configfile.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return rlqs.ConfigFrom(snapshottest.ByIndex(t, r), snapshot.NewResolver(snapshottest.ByIndex(t, r), nil)), r
}

func start(t *testing.T, yaml string, maxKeys int) *harness {
	t.Helper()
	return startTicking(t, yaml, maxKeys, 5*time.Millisecond)
}

// startTicking is start with the service's tick period (real time).
func startTicking(t *testing.T, yaml string, maxKeys int, tick time.Duration) *harness {
	t.Helper()
	return startOpts(t, yaml, maxKeys, rlqs.Options{Tick: tick})
}

// startOpts is start with the service's options (its clock the harness's).
func startOpts(t *testing.T, yaml string, maxKeys int, opts rlqs.Options) *harness {
	t.Helper()
	cfg, r := config(t, yaml)
	h := &harness{t: t, clock: new(testclock.Clock), reg: prometheus.NewRegistry(), rules: r}
	h.clock.Set(t0)
	var err error
	if h.store, err = counter.New(counter.Config{MaxKeys: maxKeys, Shards: 1}); err != nil {
		t.Fatal(err)
	}
	opts.Now = h.clock.Now
	h.svc, err = rlqs.New(cfg, h.store, h.reg, slog.New(slog.DiscardHandler), opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(srv, h.svc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	if h.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	return h
}

// envoy is one client stream.
type envoy struct {
	t      *testing.T
	s      rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	cancel context.CancelFunc
	recv   chan *rlqspb.RateLimitQuotaResponse
	err    chan error
}

func (h *harness) open() *envoy {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	s, err := rlqspb.NewRateLimitQuotaServiceClient(h.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		h.t.Fatal(err)
	}
	e := &envoy{t: h.t, s: s, cancel: cancel, recv: make(chan *rlqspb.RateLimitQuotaResponse, 64), err: make(chan error, 1)}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				e.err <- err
				return
			}
			e.recv <- m
		}
	}()
	h.t.Cleanup(cancel)
	return e
}

type usage struct {
	id              map[string]string
	allowed, denied uint64
	elapsed         time.Duration // time_elapsed
}

func (e *envoy) report(domain string, us ...usage) {
	e.t.Helper()
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	for _, u := range us {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: u.id}, NumRequestsAllowed: u.allowed, NumRequestsDenied: u.denied,
			TimeElapsed: durationpb.New(u.elapsed),
		})
	}
	// io.EOF: the server has ended the stream (a refused one, say); its
	// status is what Recv returns, which end reads.
	if err := e.s.Send(m); err != nil && !errors.Is(err, io.EOF) {
		e.t.Fatal(err)
	}
}

// next is the next response.
func (e *envoy) next() *rlqspb.RateLimitQuotaResponse {
	e.t.Helper()
	select {
	case m := <-e.recv:
		return m
	case err := <-e.err:
		e.t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("no response within 10 s")
	}
	return nil
}

// quiet asserts that nothing arrives for a while.
func (e *envoy) quiet(d time.Duration) {
	e.t.Helper()
	select {
	case m := <-e.recv:
		e.t.Fatalf("unexpected response: %v", m)
	case <-time.After(d):
	}
}

// drain reads responses until none comes for a while.
func (e *envoy) drain() {
	for {
		select {
		case <-e.recv:
		case <-time.After(50 * time.Millisecond):
			return
		}
	}
}

// end is the error the stream ended with.
func (e *envoy) end() error {
	e.t.Helper()
	select {
	case err := <-e.err:
		return err
	case <-time.After(10 * time.Second):
		e.t.Fatal("stream did not end within 10 s")
	}
	return nil
}

// got is one action, as a short text: "tokens 9" (max_tokens, with the
// negligible refill), "tokens 9 refill 9/1s" (refilled once a window:
// tokens_per_fill/fill_interval), "ALLOW_ALL", "DENY_ALL", "abandon".
func got(t *testing.T, a *rlqspb.RateLimitQuotaResponse_BucketAction, ttl time.Duration) string {
	t.Helper()
	if a.GetAbandonAction() != nil {
		return "abandon"
	}
	q := a.GetQuotaAssignmentAction()
	if q == nil {
		t.Fatalf("neither assignment nor abandon: %v", a)
	}
	if d := q.GetAssignmentTimeToLive().AsDuration(); d != ttl {
		t.Errorf("assignment_time_to_live %v, want %v", d, ttl)
	}
	rs := q.GetRateLimitStrategy()
	if tb := rs.GetTokenBucket(); tb != nil {
		every, per := tb.GetFillInterval().AsDuration(), tb.GetTokensPerFill().GetValue()
		if every%time.Second != 0 || every <= 0 {
			t.Errorf("fill_interval %v: Envoy reads whole seconds only", every)
		}
		s := "tokens " + itoa(int64(tb.GetMaxTokens()))
		if every == time.Hour && per == 1 {
			return s
		}
		if per < 2 {
			t.Errorf("tokens_per_fill %d: Envoy would take it for the negligible refill's", per)
		}
		return s + " refill " + itoa(int64(per)) + "/" + every.String()
	}
	if _, ok := rs.GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); !ok {
		t.Fatalf("no strategy: %v", a)
	}
	return rs.GetBlanketRule().String()
}

func itoa(n int64) string {
	return strings.TrimSpace(strings.ReplaceAll(time.Duration(n).String(), "ns", ""))
}

// one returns the only action of the next response, for id: "fresh …"
// when an ALLOW_ALL for the id precedes it (Envoy then starts the token
// bucket after it full).
func (e *envoy) one(id map[string]string) string {
	e.t.Helper()
	m := e.next()
	prefix := ""
	if len(m.BucketAction) == 2 {
		r := m.BucketAction[0]
		if !sameID(r.GetBucketId().GetBucket(), id) || got(e.t, r, time.Second) != "ALLOW_ALL" || m.BucketAction[1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			e.t.Fatalf("two actions, not a restart: %v", m)
		}
		prefix = "fresh "
		m.BucketAction = m.BucketAction[1:]
	}
	if len(m.BucketAction) != 1 {
		e.t.Fatalf("want one action, got %v", m)
	}
	a := m.BucketAction[0]
	if !sameID(a.GetBucketId().GetBucket(), id) {
		e.t.Fatalf("action for %v, want %v", a.GetBucketId().GetBucket(), id)
	}
	return prefix + got(e.t, a, 4*time.Second)
}

func sameID(a, b map[string]string) bool {
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

func (h *harness) count(bucket int, key string) int64 {
	l, _ := snapshot.NewResolver(snapshottest.ByIndex(h.t, h.rules), nil).Limit(bucket, key)
	return h.store.Peek(counter.Bucket(bucket), key, l, h.clock.Now()).Count
}

func (h *harness) metric(name, label, value string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return sum
	}
	return 0
}

var acme = map[string]string{"name": "t", "tenant": "acme"}

func TestStreamReportAssignExhaustRoll(t *testing.T) {
	h := start(t, testRules, 0)
	e := h.open()
	h.clock.Add(100 * time.Millisecond)
	// Envoy's first report of a bucket: the request that created it.
	e.report("api", usage{id: acme, allowed: 1})
	if a := e.one(acme); a != "tokens 9" {
		t.Fatalf("first assignment %q, want tokens 9/1 (10 − 1, window parity even)", a)
	}
	if c := h.count(0, "acme"); c != 1 {
		t.Fatalf("counted %d, want 1", c)
	}
	// Unchanged budget: nothing is re-sent until a refresh is due.
	e.report("api", usage{id: acme})
	e.quiet(50 * time.Millisecond)
	// Usage shrinks the share.
	e.report("api", usage{id: acme, allowed: 4})
	if a := e.one(acme); a != "fresh tokens 5" {
		t.Fatalf("after 5 of 10: %q, want tokens 5/1", a)
	}
	// Usage over the budget (Envoy's tokens plus requests in flight) is
	// counted all the same: it happened.
	e.report("api", usage{id: acme, allowed: 7, denied: 3})
	if a := e.one(acme); a != "DENY_ALL" {
		t.Fatalf("exhausted: %q, want DENY_ALL", a)
	}
	if c := h.count(0, "acme"); c != 12 {
		t.Fatalf("counted %d, want 12", c)
	}
	// The next window's budget is pushed without waiting for a report, with
	// the other parity so that Envoy replaces its bucket.
	h.clock.Set(t0.Add(time.Second))
	if a := e.one(acme); a != "tokens 10" {
		t.Fatalf("new window: %q, want tokens 10/2", a)
	}
	// Two windows on: window 3's budget, odd parity again.
	h.clock.Add(2 * time.Second)
	if a := e.one(acme); a != "fresh tokens 10" {
		t.Fatalf("at t0+3s: %q, want tokens 10/2", a)
	}
	if n := h.metric("ratelimit_authz_rlqs_assignments_total", "strategy", "token_bucket"); n != 4 {
		t.Errorf("token_bucket assignments %v, want 4", n)
	}
	// Each fresh bucket went out after an ALLOW_ALL: two of them.
	if n := h.metric("ratelimit_authz_rlqs_assignments_total", "strategy", "allow_all"); n != 2 {
		t.Errorf("allow_all assignments %v, want 2 (the ALLOW_ALL before each fresh bucket)", n)
	}
	if n := h.metric("ratelimit_authz_rlqs_requests_reported_total", "outcome", "allowed"); n != 12 {
		t.Errorf("allowed reported %v, want 12", n)
	}
}

// A report that arrives in a new window before any tick has pushed that
// window's budget gets the budget as a fresh, full bucket (after
// ALLOW_ALL): a plain replacement would leave Envoy the tokens it had left
// of the window before, none when it spent them, for the whole window.
func TestStreamReportInANewWindowRestarts(t *testing.T) {
	h := startTicking(t, testRules, 0, time.Hour) // no tick: reports only
	e := h.open()
	h.clock.Add(100 * time.Millisecond)
	e.report("api", usage{id: acme, allowed: 1})
	if a := e.one(acme); a != "tokens 9" {
		t.Fatalf("first assignment %q, want tokens 9", a)
	}
	// Envoy spends its 9 tokens and denies one more request; its report
	// comes 50 ms into the next window: of the 9 requests over the 950 ms
	// since the previous report, 1 is taken as this window's. A denial
	// makes it no calm participant, so its bucket does not refill.
	h.clock.Set(t0.Add(time.Second + 50*time.Millisecond))
	e.report("api", usage{id: acme, allowed: 9, denied: 1})
	if a := e.one(acme); a != "fresh tokens 9" {
		t.Fatalf("a report in a new window: %q, want the window's share in a full bucket (fresh tokens 9)", a)
	}
}

// A stream's first report of a bucket id that Envoy has had for a while
// (it reconnected, and reports every bucket again) spreads its usage over
// the time_elapsed Envoy gives: only the part in the current window counts.
func TestStreamReconnectReportSpreads(t *testing.T) {
	h := start(t, testRules, 0)
	e := h.open()
	h.clock.Set(t0.Add(300 * time.Millisecond))
	e.report("api", usage{id: acme, allowed: 40, elapsed: 2 * time.Second})
	if a := e.one(acme); a != "tokens 4" {
		t.Fatalf("assignment %q, want tokens 4/1 (6 of the 40 in this window's 0.3 s of 2 s)", a)
	}
	if c := h.count(0, "acme"); c != 6 {
		t.Fatalf("counted %d, want 40 × 0.3/2 = 6", c)
	}
	// A hostile time_elapsed is bounded by abandon_after (3 s here).
	other := map[string]string{"name": "t", "tenant": "globex"}
	e.report("api", usage{id: other, allowed: 30, elapsed: 1000 * time.Hour})
	e.one(other)
	if c := h.count(0, "globex"); c != 3 {
		t.Fatalf("counted %d, want ceil(30 × 0.3/3) = 3", c)
	}
}

func TestStreamRefreshBeforeTTL(t *testing.T) {
	h := start(t, testRules, 0)
	e := h.open()
	id := map[string]string{"name": "c", "channel": "ch1"} // a one-minute window
	e.report("api", usage{id: id, allowed: 2})
	if a := e.one(id); a != "tokens 4" {
		t.Fatalf("first: %q", a)
	}
	// Half the TTL (2 s) on: the same assignment again, unprompted.
	h.clock.Add(2 * time.Second)
	if a := e.one(id); a != "tokens 4" {
		t.Fatalf("refresh: %q, want the same tokens 4/1", a)
	}
	// Idle past abandon_after (3 s since its last report): abandoned.
	h.clock.Add(1500 * time.Millisecond)
	if a := e.one(id); a != "abandon" {
		t.Fatalf("idle: %q, want abandon", a)
	}
	if n := h.metric("ratelimit_authz_rlqs_bucket_ids", "", ""); n != 0 {
		t.Errorf("bucket ids tracked after abandon: %v", n)
	}
	// Reported again: a new subscription.
	e.report("api", usage{id: id, allowed: 1})
	if a := e.one(id); a != "tokens 3" {
		t.Fatalf("again: %q", a)
	}
}

func TestStreamsSplitAndRelease(t *testing.T) {
	h := start(t, testRules, 0)
	a := h.open()
	a.report("api", usage{id: acme, allowed: 0})
	if got := a.one(acme); got != "tokens 10" {
		t.Fatalf("a alone: %q", got)
	}
	b := h.open() // opened after a's was served: it ranks second
	b.report("api", usage{id: acme, allowed: 2})
	if got := b.one(acme); got != "tokens 4" { // 8 left over a and b; b ranks second
		t.Fatalf("b: %q, want tokens 4/1", got)
	}
	if n := h.svc.Participants(0, "acme"); n != 2 {
		t.Fatalf("participants %d", n)
	}
	a.report("api", usage{id: acme, allowed: 1})
	if got := a.one(acme); got != "tokens 4" { // 7 left: a 4, b 3
		t.Fatalf("a with b: %q, want tokens 4/1", got)
	}
	b.report("api", usage{id: acme})
	if got := b.one(acme); got != "tokens 3" {
		t.Fatalf("b with a: %q, want tokens 3/1", got)
	}
	// b ends its stream: a is the only participant again.
	if err := b.s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := b.end(); !errors.Is(err, io.EOF) {
		t.Fatalf("b's end: %v, want EOF (the server returned OK)", err)
	}
	poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool { return h.svc.Participants(0, "acme") == 1 })
	// b still counts in this participants window (the count other nodes
	// see of it only grows within a window): a's share stays the half of
	// the remainder, rounded down.
	a.report("api", usage{id: acme})
	if got := a.one(acme); got != "tokens 3" {
		t.Fatalf("a right after b left: %q, want tokens 3/1", got)
	}
	// Two participants windows on, a alone has the whole budget. It
	// spends nothing: its bucket refills once a window.
	for range 2 * rlqs.ParticipantsWindow / time.Second {
		h.clock.Add(time.Second)
		a.report("api", usage{id: acme})
		a.drain()
	}
	h.clock.Add(time.Second)
	if got := a.one(acme); got != "tokens 10 refill 10/1s" {
		t.Fatalf("a alone, window 11 pushed: %q, want tokens 10 refill 10/1s (not restarted: it refills)", got)
	}
	// A report whose span began in the window before: its usage in this
	// window is a guess. A smaller share is sent as a plain replacement
	// (Envoy keeps at most the tokens it has left), never a full bucket.
	a.report("api", usage{id: acme, allowed: 1})
	if got := a.one(acme); got != "tokens 9 refill 9/1s" {
		t.Fatalf("after a report spanning the window's start: %q, want tokens 9 refill 9/1s (not fresh)", got)
	}
	// The next reports' spans lie in the window and a is alone: its share
	// may come in a full bucket, all of the window's usage being counted.
	// 2 in 100 ms is more than its share a window: no refill.
	h.clock.Add(100 * time.Millisecond)
	a.report("api", usage{id: acme})
	a.quiet(30 * time.Millisecond) // the same share: nothing to send
	h.clock.Add(100 * time.Millisecond)
	a.report("api", usage{id: acme, allowed: 2})
	if got := a.one(acme); got != "fresh tokens 7" {
		t.Fatalf("a alone, exact: %q, want fresh tokens 7", got)
	}
	// A cancelled stream releases too.
	a.cancel()
	poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool {
		return h.svc.Participants(0, "acme") == 0 && h.svc.Streams() == 0
	})
	if n := h.metric("ratelimit_authz_rlqs_streams", "", ""); n != 0 {
		t.Errorf("streams gauge %v after both ended", n)
	}
}

func TestStreamPolicies(t *testing.T) {
	h := start(t, strings.Replace(testRules, "max_streams: 4", "max_streams: 8", 1), 0)
	for _, tc := range []struct {
		id   map[string]string
		want string
	}{
		{map[string]string{"name": "nope", "tenant": "acme"}, "ALLOW_ALL"},            // unmatched: allow
		{map[string]string{"name": "t", "tenant": "acme", "extra": "x"}, "ALLOW_ALL"}, // an extra entry: no match
		{map[string]string{"name": "t", "tenant": ""}, "ALLOW_ALL"},                   // missing key, on_missing_key allow
		{map[string]string{"name": "c", "channel": ""}, "DENY_ALL"},                   // missing key, on_missing_key deny
		{map[string]string{"name": "s", "tenant": "acme"}, "ALLOW_ALL"},               // shadow: counted, never denied
	} {
		e := h.open()
		e.report("api", usage{id: tc.id, allowed: 5})
		if got := e.one(tc.id); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.id, got, tc.want)
		}
	}
	if c := h.count(0, "acme"); c != 0 {
		t.Errorf("unmatched usage counted in tenant_rate: %d", c)
	}
	if c := h.count(2, "acme"); c != 5 {
		t.Errorf("shadow bucket counted %d, want 5", c)
	}
	if n := h.metric("ratelimit_authz_rlqs_bucket_reports_total", "result", "unmatched"); n != 2 {
		t.Errorf("unmatched %v, want 2", n)
	}
	if n := h.metric("ratelimit_authz_rlqs_bucket_reports_total", "result", "missing_key"); n != 2 {
		t.Errorf("missing_key %v, want 2", n)
	}
}

func TestStreamUnmatchedDeny(t *testing.T) {
	h := start(t, strings.Replace(testRules, "max_streams: 4", "max_streams: 4\n  unmatched: deny", 1), 0)
	e := h.open()
	id := map[string]string{"name": "other"}
	e.report("api", usage{id: id, allowed: 1})
	if got := e.one(id); got != "DENY_ALL" {
		t.Fatalf("unmatched with deny: %q", got)
	}
}

func TestStreamRefusals(t *testing.T) {
	h := start(t, testRules, 0)
	for _, tc := range []struct {
		name   string
		domain string
		code   codes.Code
		msg    string
	}{
		{"no domain", "", codes.InvalidArgument, "names no domain"},
		{"unknown domain", "other", codes.InvalidArgument, `domain "other" is not served`},
		{"huge domain", strings.Repeat("d", 100000), codes.InvalidArgument, "is not served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := h.open()
			e.report(tc.domain, usage{id: acme, allowed: 1})
			err := e.end()
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) || len(err.Error()) > 300 {
				t.Fatalf("got %v, want %v %q", err, tc.code, tc.msg)
			}
		})
	}
	// A second domain on one stream.
	e := h.open()
	e.report("api", usage{id: acme})
	e.next()
	e.report("other")
	if err := e.end(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "open another stream") {
		t.Fatalf("domain change: %v", err)
	}
	if c := h.count(0, "acme"); c != 0 {
		t.Errorf("refused streams counted %d", c)
	}
}

func TestStreamBounds(t *testing.T) {
	h := start(t, testRules, 0)
	// max_streams: 4.
	var open []*envoy
	for range 4 {
		e := h.open()
		e.report("api", usage{id: acme})
		e.next()
		open = append(open, e)
	}
	extra := h.open()
	extra.report("api")
	if err := extra.end(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "quota.max_streams") {
		t.Fatalf("fifth stream: %v", err)
	}
	open[3].cancel()
	poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool { return h.svc.Streams() == 3 })

	// max_bucket_ids: 3 per stream; the fourth is counted, answered with its
	// bucket's on_overflow, and not kept.
	e := open[0]
	ch := func(i string) map[string]string { return map[string]string{"name": "c", "channel": i} }
	e.report("api", usage{id: ch("1")}, usage{id: ch("2")})
	if m := e.next(); len(m.BucketAction) != 2 {
		t.Fatalf("want 2 actions: %v", m)
	}
	e.report("api", usage{id: ch("3"), allowed: 2})
	if got := e.one(ch("3")); got != "DENY_ALL" { // channel_rate: on_overflow deny
		t.Fatalf("fourth id: %q, want DENY_ALL (on_overflow)", got)
	}
	if c := h.count(1, "3"); c != 2 {
		t.Errorf("untracked usage counted %d, want 2", c)
	}
	if n := h.metric("ratelimit_authz_rlqs_bounds_total", "bound", "bucket_ids"); n != 1 {
		t.Errorf("bucket_ids bound %v", n)
	}

	// Bucket ids over the size bounds: DENY_ALL, not kept.
	big := map[string]string{"name": "t", "tenant": strings.Repeat("x", 600)}
	many := map[string]string{}
	for i := range 9 {
		many[string(rune('a'+i))] = "v"
	}
	e2 := open[1]
	e2.report("api", usage{id: big, allowed: 3})
	if got := e2.one(big); got != "DENY_ALL" {
		t.Fatalf("oversized id: %q", got)
	}
	e2.report("api", usage{id: many, allowed: 3})
	if got := e2.one(many); got != "DENY_ALL" {
		t.Fatalf("id of 9 entries: %q", got)
	}
	// An empty bucket id: nothing to answer, nothing kept.
	e2.report("api", usage{id: nil, allowed: 3})
	e2.quiet(30 * time.Millisecond)
	if n := h.metric("ratelimit_authz_rlqs_bounds_total", "bound", "bucket_id_size"); n != 3 {
		t.Errorf("bucket_id_size bound %v, want 3", n)
	}
	if n := h.metric("ratelimit_authz_rlqs_bucket_ids", "", ""); n != 3+2 { // acme on three streams, two channels
		t.Errorf("bucket ids tracked %v, want 5", n)
	}
	// A report claiming 2^64−1 requests: counted, saturating, no crash.
	e2.report("api", usage{id: acme, allowed: ^uint64(0)})
	if got := e2.one(acme); got != "DENY_ALL" {
		t.Fatalf("huge usage: %q", got)
	}
}

func TestStreamOverflow(t *testing.T) {
	h := start(t, testRules, 1) // the counter holds one key
	e := h.open()
	e.report("api", usage{id: acme, allowed: 1})
	if got := e.one(acme); got != "tokens 9" {
		t.Fatalf("first key: %q", got)
	}
	other := map[string]string{"name": "t", "tenant": "globex"}
	e.report("api", usage{id: other, allowed: 1})
	if got := e.one(other); got != "ALLOW_ALL" { // tenant_rate: on_overflow allow
		t.Fatalf("key the counter cannot hold: %q, want ALLOW_ALL", got)
	}
	if n := h.metric("ratelimit_authz_rlqs_bucket_reports_total", "result", "overflow"); n != 1 {
		t.Errorf("overflow %v", n)
	}
}

func TestReloadAbandonsRemovedMapping(t *testing.T) {
	h := start(t, testRules, 0)
	e := h.open()
	ch := map[string]string{"name": "c", "channel": "ch1"}
	e.report("api", usage{id: acme, allowed: 1}, usage{id: ch, allowed: 1})
	if m := e.next(); len(m.BucketAction) != 2 {
		t.Fatalf("want 2 actions: %v", m)
	}
	// The reload drops the channel entry and halves the tenant limit.
	_, r := config(t, strings.Replace(strings.Replace(testRules, "    - {match: {name: c}, bucket: channel_rate, key: channel}\n", "", 1), "limit: 10,", "limit: 5,", 1))
	swap, err := h.svc.Prepare(snapshottest.ByIndex(t, r))
	if err != nil {
		t.Fatal(err)
	}
	swap()
	if got := e.one(ch); got != "abandon" {
		t.Fatalf("removed mapping: %q, want abandon", got)
	}
	e.report("api", usage{id: acme})
	if got := e.one(acme); got != "fresh tokens 4" {
		t.Fatalf("new limit: %q, want tokens 4/1", got)
	}
	// A configuration without a quota section is refused.
	bad := *r
	bad.Quota = nil
	if _, err := h.svc.Prepare(snapshottest.ByIndex(t, &bad)); err == nil {
		t.Fatal("a configuration without quota accepted")
	}
}

func TestCloseEndsStreams(t *testing.T) {
	h := start(t, testRules, 0)
	e := h.open()
	e.report("api", usage{id: acme})
	e.next()
	h.svc.CloseStreams()
	h.svc.CloseStreams() // idempotent
	if err := e.end(); status.Code(err) != codes.Unavailable {
		t.Fatalf("after CloseStreams: %v, want Unavailable", err)
	}
	poll.UntilTrue(t, 5*time.Second, 5*time.Millisecond, func() bool { return h.svc.Participants(0, "acme") == 0 })
}

// A participant whose report shows it spending less than its share, with
// nothing denied, gets a bucket that refills its share once a window, so
// that an Envoy that loses the server goes on admitting it until the
// assignment's TTL; one that spends its share, or had requests denied, or
// has not reported over a span yet, gets the negligible refill, which adds
// nothing to a window's share.
func TestStreamRefillsACalmParticipant(t *testing.T) {
	h := startTicking(t, testRules, 0, time.Hour) // no tick: reports only
	e := h.open()
	ch := map[string]string{"name": "c", "channel": "ch1"} // a one-minute window
	for _, st := range []struct {
		after           time.Duration // clock advance before the report
		id              map[string]string
		allowed, denied uint64
		want, why       string
	}{
		{100 * time.Millisecond, acme, 1, 0, "tokens 9", "the bucket's creation: no span"},
		{time.Second, acme, 4, 0, "tokens 9 refill 9/1s", "4 over 1 s, under its share; not restarted: it refills"},
		{400 * time.Millisecond, acme, 5, 0, "fresh tokens 4", "5 over 400 ms, more than its share a window"},
		{time.Second, acme, 2, 1, "fresh tokens 9", "one denied"},
		{time.Second, acme, 2, 0, "tokens 9 refill 9/1s", "calm again"},
		{1400 * time.Millisecond, acme, 8, 0, "tokens 4 refill 4/1s", "8 over 1.4 s, under its share a window, reported late in a window with little of it left"},
		{0, ch, 1, 0, "tokens 5", "a new id"},
		{time.Second, ch, 0, 0, "tokens 5 refill 5/1m0s", "calm: its share a minute"},
	} {
		h.clock.Add(st.after)
		e.report("api", usage{id: st.id, allowed: st.allowed, denied: st.denied})
		if got := e.one(st.id); got != st.want {
			t.Fatalf("%s: %q, want %s", st.why, got, st.want)
		}
	}
}

// Until a new key's participants on other nodes can be known, each live
// node counts as a participant: the first shares are the budget over the
// nodes, not all of it. A replication round trip after the key's first
// participant, the count is known, and the shares grow within the window
// in a plain replacement (Envoy scales the tokens left to the new
// max_tokens, so each participant's window stays within its new share).
func TestStreamFirstSharesCountEveryNode(t *testing.T) {
	h := startOpts(t, testRules, 0, rlqs.Options{Tick: time.Hour, Nodes: func() int { return 3 }, Settle: 200 * time.Millisecond})
	a := h.open()
	h.clock.Add(100 * time.Millisecond)
	a.report("api", usage{id: acme, allowed: 1})
	if got := a.one(acme); got != "tokens 3" {
		t.Fatalf("a's first share on a 3-node cluster: %q, want tokens 3 (9 left over 3 nodes)", got)
	}
	h.clock.Add(100 * time.Millisecond) // 100 ms after the first: not settled
	a.report("api", usage{id: acme, allowed: 1})
	if got := a.one(acme); got != "tokens 2" {
		t.Fatalf("a within the settle time: %q, want tokens 2 (8 over 3)", got)
	}
	b := h.open() // opened after a's was served: it ranks second
	h.clock.Add(10 * time.Millisecond)
	b.report("api", usage{id: acme})
	if got := b.one(acme); got != "tokens 2" {
		t.Fatalf("b within the settle time: %q, want tokens 2 (8 over 3)", got)
	}
	h.clock.Add(250 * time.Millisecond) // settled: the count says 2
	a.report("api", usage{id: acme})
	if got := a.one(acme); got != "tokens 4 refill 4/1s" {
		t.Fatalf("a, known: %q, want tokens 4 refill 4/1s (8 over 2, not fresh)", got)
	}
	b.report("api", usage{id: acme})
	if got := b.one(acme); got != "tokens 4 refill 4/1s" {
		t.Fatalf("b, known: %q, want tokens 4 refill 4/1s", got)
	}
}
