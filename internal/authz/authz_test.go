package authz_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkgrpc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/inflight"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// t0 is the start of a minute, so 1 s and 1 min windows both begin here.
var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

type harness struct {
	t     testing.TB
	rules *configfile.Rules
	clock *testclock.Clock
	store *counter.Store
	// leases holds the concurrency buckets' leases.
	leases *inflight.Table
	reg    *prometheus.Registry
	svc    *authz.Service
	// clients call the Service through the lean path (checkwire's codec
	// and service, as internal/server registers it) and through the generic
	// one (grpc-go's proto codec and the generated service), in turn:
	// every test holds both to the same decisions, on shared counters.
	clients [2]authv3.AuthorizationClient
	calls   int
}

// newHarness serves the Service on two loopback gRPC listeners, the lean
// and the generic path, and dials both, so every check goes through the
// real wire format, as Envoy's do.
func newHarness(t testing.TB, yaml string) *harness {
	t.Helper()
	return newHarnessWith(t, yaml, nil)
}

// newHarnessWith is newHarness with tenant overrides (nil: none).
func newHarnessWith(t testing.TB, yaml string, over limits.Overrides) *harness {
	t.Helper()
	data := config.Default()
	if yaml != "" {
		data = []byte(yaml)
	}
	r, err := configfile.Parse(data, "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := match.New(r.Descriptors())
	if err != nil {
		t.Fatal(err)
	}
	store, err := counter.New(r.Counter)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, rules: r, clock: &testclock.Clock{}, store: store, reg: prometheus.NewRegistry()}
	if h.leases, err = inflight.New(inflight.Config{}); err != nil {
		t.Fatal(err)
	}
	h.clock.Set(t0)
	snap := snapshottest.ByIndex(t, r)
	h.svc, err = authz.New(authz.ConfigFrom(snap), m, store, snapshot.NewResolver(snap, over), h.reg, slog.New(slog.NewTextHandler(io.Discard, nil)), authz.Options{Now: h.clock.Now, Leases: h.leases})
	if err != nil {
		t.Fatal(err)
	}
	lean := grpc.NewServer(grpc.ForceServerCodecV2(checkgrpc.NewCodec()))
	checkgrpc.Register(lean, h.svc)
	generic := grpc.NewServer()
	authv3.RegisterAuthorizationServer(generic, h.svc)
	for i, srv := range []*grpc.Server{lean, generic} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(lis)
		t.Cleanup(srv.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		h.clients[i] = authv3.NewAuthorizationClient(conn)
	}
	return h
}

type req struct {
	method, path, peer, body string
	headers                  map[string]string
	ext                      map[string]string
}

func checkRequest(r req) *authv3.CheckRequest {
	if r.method == "" {
		r.method = "POST"
	}
	if r.peer == "" {
		r.peer = "192.0.2.10"
	}
	headers := map[string]string{":method": r.method, ":path": r.path, ":authority": "api.example", "user-agent": "test"}
	if r.body != "" {
		headers["x-envoy-auth-partial-body"] = "false" // as Envoy sets it on a buffered body
	}
	for k, v := range r.headers {
		headers[k] = v
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: r.peer, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: r.method, Path: r.path, Host: "api.example", Headers: headers, Body: r.body,
		}},
		ContextExtensions: r.ext,
	}}
}

func (h *harness) check(r req) *authv3.CheckResponse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	path := h.calls % 2
	h.calls++
	resp, err := h.clients[path].Check(ctx, checkRequest(r))
	if err != nil {
		h.t.Fatalf("Check %s %s (%s path): gRPC error %v (decisions must be answers)", r.method, r.path, [2]string{"lean", "generic"}[path], err)
	}
	return resp
}

func allowed(resp *authv3.CheckResponse) bool { return resp.GetStatus().GetCode() == int32(codes.OK) }

// expectRun checks n requests and requires them all allowed (or all denied).
func (h *harness) expectRun(n int, wantAllowed bool, r req) {
	h.t.Helper()
	for i := 0; i < n; i++ {
		if got := allowed(h.check(r)); got != wantAllowed {
			h.t.Fatalf("%s %s %v: request %d of %d: allowed=%v, want %v", r.method, r.path, r.headers, i+1, n, got, wantAllowed)
		}
	}
}

func responseHeaders(resp *authv3.CheckResponse) map[string]string {
	out := map[string]string{}
	var hs []*corev3.HeaderValueOption
	if d := resp.GetDeniedResponse(); d != nil {
		hs = d.GetHeaders()
	} else {
		hs = resp.GetOkResponse().GetResponseHeadersToAdd()
	}
	for _, h := range hs {
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			panic("header without OVERWRITE_IF_EXISTS_OR_ADD: " + h.GetHeader().GetKey())
		}
		out[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return out
}

// metric reads one sample from the registry; the series must exist.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	return scrape.Must(h.t, h.reg, name, labels...)
}

func tenant(id string) map[string]string { return map[string]string{"x-tenant-id": id} }

func TestActivityCreateSharedByBothRoutes(t *testing.T) {
	h := newHarness(t, "")
	a := req{path: "/api/activities", headers: tenant("acme")}
	c := req{path: "/api/converger/activities?x=1", headers: tenant("acme")}

	first := h.check(a)
	if !allowed(first) {
		t.Fatal("first activity denied")
	}
	hd := responseHeaders(first)
	if hd["ratelimit"] != `"activity_create";r=99;t=1` || hd["ratelimit-policy"] != `"activity_create";q=100;w=1` {
		t.Errorf("allowed headers: %v", hd)
	}
	h.expectRun(49, true, a)
	h.expectRun(50, true, c) // 100 in all, across both routes

	h.clock.Add(300 * time.Millisecond)
	denied := h.check(c)
	if allowed(denied) {
		t.Fatal("101st activity allowed")
	}
	if got := denied.GetStatus().GetCode(); got != int32(codes.ResourceExhausted) {
		t.Errorf("status code %d", got)
	}
	d := denied.GetDeniedResponse()
	if d.GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Errorf("HTTP status %v", d.GetStatus().GetCode())
	}
	hd = responseHeaders(denied)
	want := map[string]string{
		"retry-after":      "1",
		"ratelimit-policy": `"activity_create";q=100;w=1`,
		"ratelimit":        `"activity_create";r=0;t=1`,
		"content-type":     "application/json",
	}
	for k, v := range want {
		if hd[k] != v {
			t.Errorf("denied header %s = %q, want %q", k, hd[k], v)
		}
	}
	var body struct {
		Error      string `json:"error"`
		Bucket     string `json:"bucket"`
		Limit      int    `json:"limit"`
		Window     int    `json:"window_seconds"`
		RetryAfter int    `json:"retry_after_seconds"`
	}
	if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
		t.Fatalf("body %q: %v", d.GetBody(), err)
	}
	if body.Error != "rate_limited" || body.Bucket != "activity_create" || body.Limit != 100 || body.Window != 1 || body.RetryAfter != 1 {
		t.Errorf("body %+v", body)
	}

	// Another tenant has its own budget.
	h.expectRun(100, true, req{path: "/api/activities", headers: tenant("globex")})
	// The next one-second window starts afresh.
	h.clock.Set(t0.Add(time.Second))
	h.expectRun(100, true, a)
	h.expectRun(1, false, a)

	if got := h.metric("ratelimit_authz_checks_total", "bucket", "activity_create", "decision", "denied"); got != 2 {
		t.Errorf("denied metric = %v, want 2", got)
	}
	if got := h.metric("ratelimit_authz_exceeded_total", "bucket", "activity_create"); got != 2 {
		t.Errorf("exceeded metric = %v, want 2", got)
	}
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "activity_create", "decision", "allowed"); got != 300 {
		t.Errorf("allowed metric = %v, want 300", got)
	}
	if got := h.metric("ratelimit_authz_check_duration_seconds"); got != 302 {
		t.Errorf("latency histogram count = %v, want 302", got)
	}
}

func TestShippedLimits(t *testing.T) {
	tests := []struct {
		name     string
		limit    int
		scale    time.Duration
		req      req
		other    req // a different key: unaffected
		sibling  *req
		retryAt  time.Duration // offset into the window of the denied check
		retryHdr string
	}{
		{name: "upload per tenant", limit: 10, scale: time.Second,
			req:   req{path: "/api/converger/uploads", headers: tenant("acme")},
			other: req{path: "/api/converger/uploads", headers: tenant("initech")}, retryAt: 200 * time.Millisecond, retryHdr: "1"},
		{name: "inbound per channel, shared with status", limit: 500, scale: time.Second,
			req:     req{path: "/api/inbound/ch-1"},
			sibling: &req{path: "/api/inbound/ch-1/status"},
			other:   req{path: "/api/inbound/ch-2"}, retryAt: 999 * time.Millisecond, retryHdr: "1"},
		{name: "token_create per client IP", limit: 10, scale: time.Minute,
			req:   req{path: "/api/v1/tokens", peer: "198.51.100.7"},
			other: req{path: "/api/v1/tokens", peer: "198.51.100.8"}, retryAt: 15 * time.Second, retryHdr: "45"},
		{name: "token_generate per channel, shared with refresh", limit: 10, scale: time.Minute,
			req:     req{path: "/api/converger/channels/c1/token"},
			sibling: &req{path: "/api/converger/channels/c1/token/refresh"},
			other:   req{path: "/api/converger/channels/c2/token"}, retryAt: 59500 * time.Millisecond, retryHdr: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "")
			half := tc.limit / 2
			h.expectRun(half, true, tc.req)
			if tc.sibling != nil {
				h.expectRun(tc.limit-half, true, *tc.sibling)
			} else {
				h.expectRun(tc.limit-half, true, tc.req)
			}
			h.clock.Set(t0.Add(tc.retryAt))
			resp := h.check(tc.req)
			if allowed(resp) {
				t.Fatalf("request %d allowed", tc.limit+1)
			}
			if got := responseHeaders(resp)["retry-after"]; got != tc.retryHdr {
				t.Errorf("retry-after %q, want %q", got, tc.retryHdr)
			}
			if tc.sibling != nil {
				h.expectRun(1, false, *tc.sibling)
			}
			h.expectRun(tc.limit, true, tc.other)
			h.clock.Set(t0.Add(tc.scale))
			h.expectRun(1, true, tc.req)
		})
	}
}

func TestUnmatchedIsAllowedAndNotCounted(t *testing.T) {
	h := newHarness(t, "")
	for _, r := range []req{
		{method: "GET", path: "/api/activities", headers: tenant("acme")}, // method differs
		{path: "/api/activities/", headers: tenant("acme")},               // trailing slash: another route
		{path: "/healthz"},
		{path: "/static/app.js?" + strings.Repeat("q", 20000)}, // a long query is fine
	} {
		resp := h.check(r)
		if !allowed(resp) || resp.GetHttpResponse() != nil {
			t.Errorf("%s %.40s: %v", r.method, r.path, resp)
		}
	}
	if h.store.Len() != 0 {
		t.Errorf("unmatched requests created %d keys", h.store.Len())
	}
	if got := h.metric("ratelimit_authz_checks_unmatched_total"); got != 4 {
		t.Errorf("unmatched metric %v", got)
	}
}

// A path longer than any route can be is refused, not waved through
// uncounted: otherwise long paths would slip past every limit.
func TestAbsurdPathIsRefused(t *testing.T) {
	h := newHarness(t, "")
	resp := h.check(req{path: "/api/inbound/" + strings.Repeat("a", 9000), headers: tenant("acme")})
	if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != typev3.StatusCode_URITooLong {
		t.Fatalf("absurd path: %v", resp)
	}
	if h.store.Len() != 0 || h.metric("ratelimit_authz_paths_too_long_total") != 1 {
		t.Errorf("keys %d, metric %v", h.store.Len(), h.metric("ratelimit_authz_paths_too_long_total"))
	}
}

func TestMissingTenantIsNotCountedUnderAnEmptyKey(t *testing.T) {
	h := newHarness(t, "")
	h.expectRun(150, true, req{path: "/api/activities"}) // default: allow
	if h.store.Len() != 0 {
		t.Errorf("missing-key requests created %d keys", h.store.Len())
	}
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "activity_create", "decision", "missing_key"); got != 150 {
		t.Errorf("missing_key metric %v", got)
	}

	// Configured to deny: 403, with a body naming the bucket.
	h = newHarness(t, `
buckets:
  b: {limit: 5, per: 1s, key: tenant, on_missing_key: deny}
routes: [{path: /x, buckets: [b]}]`)
	resp := h.check(req{path: "/x"})
	d := resp.GetDeniedResponse()
	if allowed(resp) || d.GetStatus().GetCode() != typev3.StatusCode_Forbidden || !strings.Contains(d.GetBody(), `"bucket":"b"`) {
		t.Errorf("missing key with deny: %v", resp)
	}
}

func TestLoginPeeksAndReportsWhoInMetadata(t *testing.T) {
	h := newHarness(t, "")
	login := req{path: "/admin/login", peer: "203.0.113.9", headers: map[string]string{"x-login-account": "  Alice@Example.COM "}}
	// The check never counts login attempts: only failures do.
	h.expectRun(20, true, login)
	resp := h.check(login)
	md := resp.GetDynamicMetadata().GetFields()
	if md[accesslog.MetaIP].GetStringValue() != "203.0.113.9" || md[accesslog.MetaAccount].GetStringValue() != "alice@example.com" || md[accesslog.MetaRoute].GetStringValue() != "login" {
		t.Errorf("metadata %v", md)
	}
	fails := md[accesslog.MetaFailures].GetStructValue().GetFields()
	if fails["login_ip"].GetStringValue() != "203.0.113.9" || fails["login_account"].GetStringValue() != "alice@example.com" {
		t.Errorf("failures metadata %v", fails)
	}
	// Five failures on the account (as the access-log receiver will count
	// them) lock it, from any IP, until the minute ends.
	lim := counter.Limit{Limit: 5, ScaleMS: 60000}
	h.store.Incr(counter.Bucket(h.rules.BucketIndex("login_account")), "alice@example.com", lim, 5, h.clock.Now())
	h.clock.Set(t0.Add(20 * time.Second))
	other := req{path: "/portal/login", peer: "203.0.113.50", body: `{"email":"alice@example.com"}`, headers: map[string]string{"content-type": "application/json"}}
	resp = h.check(other)
	if allowed(resp) {
		t.Fatal("locked account allowed")
	}
	if got := responseHeaders(resp)["retry-after"]; got != "40" {
		t.Errorf("retry-after %q, want 40", got)
	}
	if resp.GetDynamicMetadata().GetFields()[accesslog.MetaAccount].GetStringValue() != "alice@example.com" {
		t.Error("denied login lacks metadata")
	}
	h.expectRun(1, true, req{path: "/portal/login", peer: "203.0.113.50", headers: map[string]string{"x-login-account": "bob@example.com"}})
	h.clock.Set(t0.Add(time.Minute))
	h.expectRun(1, true, other)
}

// overrides is a fixed table of tenant overrides.
type overrides map[string]map[counter.Bucket]counter.Limit

func (o overrides) OverrideFor(bucket counter.Bucket, key string) (counter.Limit, bool) {
	l, ok := o[key][bucket]
	return l, ok
}

func TestTenantOverridesComeFirst(t *testing.T) {
	r, _ := configfile.Parse(config.Default(), "")
	act, tok := counter.Bucket(r.BucketIndex("activity_create")), counter.Bucket(r.BucketIndex("token_create"))
	h := newHarnessWith(t, "", overrides{
		"big": {act: {Limit: 200, ScaleMS: 1000}},
		// token_create is not overridable: an override for it is ignored.
		"any": {tok: {Limit: 1000, ScaleMS: 60000}},
	})
	big := req{path: "/api/activities", headers: tenant("big")}
	resp := h.check(big)
	if got := responseHeaders(resp)["ratelimit-policy"]; got != `"activity_create";q=200;w=1` {
		t.Errorf("policy with override %q", got)
	}
	h.expectRun(199, true, big)
	h.expectRun(1, false, big)
	h.expectRun(100, true, req{path: "/api/activities", headers: tenant("small")})
	h.expectRun(1, false, req{path: "/api/activities", headers: tenant("small")})
	tokens := req{path: "/api/v1/tokens", headers: tenant("any")}
	h.expectRun(10, true, tokens)
	h.expectRun(1, false, tokens)
}

func TestShadowModeNeverDenies(t *testing.T) {
	h := newHarness(t, `
buckets:
  b: {limit: 3, per: 1s, key: tenant, mode: shadow}
routes: [{path: /x, buckets: [b]}]`)
	r := req{path: "/x", headers: tenant("t")}
	h.expectRun(10, true, r)
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "b", "decision", "shadow_denied"); got != 7 {
		t.Errorf("shadow_denied %v, want 7", got)
	}
	if got := h.metric("ratelimit_authz_exceeded_total", "bucket", "b"); got != 7 {
		t.Errorf("exceeded %v, want 7", got)
	}
	if got := responseHeaders(h.check(r))["ratelimit"]; got != `"b";r=0;t=1` {
		t.Errorf("shadow ratelimit header %q", got)
	}
}

func TestDeniedRequestCostsNoBudget(t *testing.T) {
	h := newHarness(t, `
buckets:
  wide: {limit: 10, per: 1s, key: tenant}
  narrow: {limit: 2, per: 1s, key: "header:x-user"}
routes: [{path: /x, buckets: [wide, narrow]}]`)
	u1 := req{path: "/x", headers: map[string]string{"x-tenant-id": "t", "x-user": "u1"}}
	h.expectRun(2, true, u1)
	h.expectRun(5, false, u1) // narrow denies; wide gives its hits back
	// One node: the window's count is this node's own.
	if got := h.store.Peek(0, "t", counter.Limit{Limit: 10, ScaleMS: 1000}, h.clock.Now()).Count; got != 2 {
		t.Errorf("wide bucket counted %d, want 2", got)
	}
	resp := h.check(req{path: "/x", headers: map[string]string{"x-tenant-id": "t", "x-user": "u2"}})
	hd := responseHeaders(resp)
	if !allowed(resp) || hd["ratelimit"] != `"wide";r=7;t=1, "narrow";r=1;t=1` || hd["ratelimit-policy"] != `"wide";q=10;w=1, "narrow";q=2;w=1` {
		t.Errorf("two buckets: %v", hd)
	}
}

func TestContextExtensionsNameBuckets(t *testing.T) {
	h := newHarness(t, "")
	// Envoy names the upload bucket for a path the config does not know.
	r := req{path: "/legacy/upload", headers: tenant("acme"), ext: map[string]string{"ratelimit_buckets": "upload,nope"}}
	h.expectRun(10, true, r)
	h.expectRun(1, false, r)
	if got := h.metric("ratelimit_authz_unknown_buckets_total"); got != 11 {
		t.Errorf("unknown buckets metric %v, want 11", got)
	}
}

func TestHostileInput(t *testing.T) {
	h := newHarness(t, `
counter: {max_keys: 64, shards: 1}
buckets:
  open: {limit: 5, per: 1s, key: tenant}
  closed: {limit: 5, per: 1s, key: tenant, on_overflow: deny}
routes:
  - {path: /open, buckets: [open]}
  - {path: /closed, buckets: [closed]}`)
	huge := strings.Repeat("x", 1<<20)
	h.expectRun(5, true, req{path: "/open", headers: tenant(huge)})
	h.expectRun(1, false, req{path: "/open", headers: tenant(huge)})
	// Thousands of distinct keys: memory stays at the bound, the rest are
	// refused and decided by on_overflow.
	for i := 0; i < 2000; i++ {
		h.check(req{path: "/open", headers: tenant(fmt.Sprint("t", i))})
	}
	if n := h.store.Len(); n > 64 {
		t.Errorf("live keys %d over the bound", n)
	}
	if h.store.Refused() == 0 || h.metric("ratelimit_authz_checks_total", "bucket", "open", "decision", "overflow") == 0 {
		t.Error("overflow not counted")
	}
	h.expectRun(1, true, req{path: "/open", headers: tenant("fresh")})
	resp := h.check(req{path: "/closed", headers: tenant("fresh")})
	if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Errorf("overflow with deny: %v", resp)
	}
}

// The in-process Check must stay cheap; the benchmark shows the figures,
// this guards the budget: decoding the request's wire form with the lean
// decoder and deciding, as the server does per call (the response's
// encoding aside).
func TestCheckAllocations(t *testing.T) {
	h := newHarness(t, "")
	for _, tc := range []struct {
		name string
		req  *authv3.CheckRequest
		max  float64
	}{
		// The reply and its header values.
		{"allowed activity", checkRequest(req{path: "/api/activities", headers: tenant("acme")}), 2},
		{"inbound", checkRequest(req{path: "/api/inbound/abc"}), 2},
		{"unmatched", checkRequest(req{path: "/nothing"}), 0},
		// The metadata Envoy's access log carries back: a few more.
		{"login", checkRequest(req{path: "/admin/login", headers: map[string]string{"x-login-account": "alice@example.com"}}), 9},
	} {
		got := allocsPerCheck(t, h, marshalRequest(t, tc.req))
		t.Logf("%s: %.1f allocs per check", tc.name, got)
		if got > tc.max {
			t.Errorf("%s: %.1f allocs per check, budget %.0f", tc.name, got, tc.max)
		}
	}
}

// allocsPerCheck is the allocations of one check of wire on the lean
// path, a minute later each time (a fresh window: under every limit).
func allocsPerCheck(t *testing.T, h *harness, wire []byte) float64 {
	t.Helper()
	if raceBuild {
		t.Skip("allocations are judged without the race detector; make test runs this without it")
	}
	var r checkwire.Request
	return testing.AllocsPerRun(200, func() {
		h.clock.Add(time.Minute)
		if err := r.Decode(h.svc.Decoder(), wire); err != nil {
			t.Fatal(err)
		}
		resp, err := h.svc.CheckWire(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		if hold := resp.Hold(); hold != nil {
			hold.Keep() // as the transport does once the answer is read
		}
	})
}

// reload makes yaml the Service's configuration as a node's reload does
// (Prepare, then the swap), on the same counter: ids are indices, so a
// bucket keeps its counts by position.
func (h *harness) reload(yaml string) {
	h.t.Helper()
	next, err := configfile.Parse([]byte(yaml), "next.yaml")
	if err != nil {
		h.t.Fatal(err)
	}
	swap, err := h.svc.Prepare(snapshottest.ByIndex(h.t, next))
	if err != nil {
		h.t.Fatal(err)
	}
	swap()
	h.rules = next
}

// id is the counter id of the named bucket (its index: see newHarness).
func (h *harness) id(name string) counter.Bucket { return counter.Bucket(h.rules.BucketIndex(name)) }

func marshalRequest(t testing.TB, m *authv3.CheckRequest) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// benchCases are the shipped routes, with limits high enough that
// "allowed" stays allowed.
func benchCases() []struct {
	name string
	yaml string
	req  *authv3.CheckRequest
} {
	shipped := string(config.Default())
	roomy := strings.NewReplacer("limit: 500\n", "limit: 2000000000\n", "limit: 100\n", "limit: 2000000000\n").Replace(shipped)
	return []struct {
		name string
		yaml string
		req  *authv3.CheckRequest
	}{
		{"allowed-inbound", roomy, checkRequest(req{path: "/api/inbound/abc"})},
		{"allowed-activity", roomy, checkRequest(req{path: "/api/activities", headers: tenant("acme")})},
		{"denied", shipped, checkRequest(req{path: "/api/v1/tokens", peer: "198.51.100.1"})},
		{"unmatched", shipped, checkRequest(req{path: "/static/app.js"})},
		{"login", shipped, checkRequest(req{path: "/admin/login", headers: map[string]string{"x-login-account": "alice@example.com"}})},
	}
}

// BenchmarkCheck measures a check in process, without the gRPC transport,
// as the server runs it per call: the request's wire form decoded by the
// lean decoder, then the decision (the response's encoding aside).
func BenchmarkCheck(b *testing.B) {
	ctx := context.Background()
	for _, bc := range benchCases() {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b, bc.yaml)
			wire := marshalRequest(b, bc.req)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var r checkwire.Request
				for pb.Next() {
					if err := r.Decode(h.svc.Decoder(), wire); err != nil {
						b.Error(err)
						return
					}
					h.svc.CheckWire(ctx, &r)
				}
			})
		})
	}
}

// BenchmarkCheckGeneric is BenchmarkCheck on the generic path, the
// reference: proto.Unmarshal of the whole request, then Check.
func BenchmarkCheckGeneric(b *testing.B) {
	ctx := context.Background()
	for _, bc := range benchCases() {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b, bc.yaml)
			wire := marshalRequest(b, bc.req)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					var m authv3.CheckRequest
					if err := proto.Unmarshal(wire, &m); err != nil {
						b.Error(err)
						return
					}
					h.svc.Check(ctx, &m)
				}
			})
		})
	}
}

// A login counts against every account it presents: a decoy header does
// not take the check (or, through the metadata, the failure) away from the
// account in the body.
func TestLoginDecoyAccountHeader(t *testing.T) {
	h := newHarness(t, "")
	acct := counter.Bucket(h.rules.BucketIndex("login_account"))
	lim := counter.Limit{Limit: 5, ScaleMS: 60000}
	json := map[string]string{"content-type": "application/json", "x-login-account": "decoy1@example.com"}
	resp := h.check(req{path: "/admin/login", peer: "203.0.113.1", body: `{"email":"Alice@Example.com"}`, headers: json})
	if !allowed(resp) {
		t.Fatalf("first login: %v", resp)
	}
	if got := responseHeaders(resp)["ratelimit-policy"]; strings.Count(got, `"login_account"`) != 1 {
		t.Errorf("ratelimit-policy %q: want one login_account item for two accounts", got)
	}
	keys := resp.GetDynamicMetadata().GetFields()[accesslog.MetaFailures].GetStructValue().GetFields()["login_account"].GetListValue().GetValues()
	if len(keys) != 2 || keys[0].GetStringValue() != "decoy1@example.com" || keys[1].GetStringValue() != "alice@example.com" {
		t.Fatalf("login_account keys in the metadata: %v, want the decoy and the body account", keys)
	}
	// The body account locked: any decoy header, any IP, is still denied.
	h.store.Incr(acct, "alice@example.com", lim, 5, h.clock.Now())
	for i := range 5 {
		json["x-login-account"] = fmt.Sprintf("decoy%d@example.com", i)
		resp := h.check(req{path: "/admin/login", peer: fmt.Sprintf("203.0.113.%d", 10+i), body: `{"email":"alice@example.com"}`, headers: json})
		if allowed(resp) || !strings.Contains(responseHeaders(resp)["ratelimit-policy"], "login_account") {
			t.Fatalf("decoy %d: %v", i, resp)
		}
	}
	// The header account locked: the body cannot dodge it either.
	h.store.Incr(acct, "bob@example.com", lim, 5, h.clock.Now())
	json["x-login-account"] = "Bob@Example.com"
	if resp := h.check(req{path: "/portal/login", body: `{"email":"carol@example.com"}`, headers: json}); allowed(resp) {
		t.Fatalf("header account locked, other body account: %v", resp)
	}
}

// A login whose account cannot be read is never "no account": by default
// it counts under one shared key; with unreadable_account: deny it is
// refused with 403.
func TestLoginUnreadableAccount(t *testing.T) {
	json := map[string]string{"content-type": "application/json"}
	oversized := `{"email":"alice@example.com","pad":"` + strings.Repeat("x", 9000) + `"}`
	unreadable := []req{
		{path: "/admin/login", body: `{"email":"alice@example.com"`, headers: json},                                             // truncated
		{path: "/admin/login", body: `{"email":"alice@example.com","email":"bob@example.com"}`, headers: json},                  // duplicated
		{path: "/admin/login", body: `{"email":"alice@example.com"}`, headers: map[string]string{"content-type": "text/plain"}}, // wrong type
		{path: "/admin/login", body: oversized[:8192], headers: map[string]string{"content-type": "application/json", "x-envoy-auth-partial-body": "true"}},
		{path: "/admin/login"}, // no account at all
	}
	h := newHarness(t, "")
	for i, r := range unreadable {
		resp := h.check(r)
		if !allowed(resp) {
			t.Fatalf("unreadable %d before any failure: %v", i, resp)
		}
		got := resp.GetDynamicMetadata().GetFields()[accesslog.MetaFailures].GetStructValue().GetFields()["login_account"].GetStringValue()
		if got != match.UnreadableAccount {
			t.Errorf("unreadable %d: login_account key %q, want the shared key", i, got)
		}
	}
	// Five failures of unreadable logins lock every unreadable login, not
	// readable ones.
	lim := counter.Limit{Limit: 5, ScaleMS: 60000}
	h.store.Incr(counter.Bucket(h.rules.BucketIndex("login_account")), match.UnreadableAccount, lim, 5, h.clock.Now())
	for i, r := range unreadable {
		r.peer = fmt.Sprintf("198.51.100.%d", i+1)
		if resp := h.check(r); allowed(resp) {
			t.Errorf("unreadable %d with the shared key locked: allowed", i)
		}
	}
	h.expectRun(1, true, req{path: "/admin/login", body: `{"email":"alice@example.com"}`, headers: json})

	deny := strings.Replace(string(config.Default()), "unreadable_account: shared_key", "unreadable_account: deny", 1)
	h = newHarness(t, deny)
	for i, r := range unreadable {
		resp := h.check(r)
		if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != typev3.StatusCode_Forbidden ||
			!strings.Contains(resp.GetDeniedResponse().GetBody(), `"unreadable_account"`) {
			t.Errorf("unreadable %d with deny: %v", i, resp)
		}
	}
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "login_account", "decision", "unreadable_account"); got != float64(len(unreadable)) {
		t.Errorf("unreadable_account metric %v, want %d", got, len(unreadable))
	}
	h.expectRun(1, true, req{path: "/admin/login", body: `{"email":"alice@example.com"}`, headers: json})
}

// With the key table full, a failure-counting bucket cannot know a new
// key's count: it denies (fail closed) by default, while request buckets
// keep their allow default.
func TestFailureBucketsFailClosedOnOverflow(t *testing.T) {
	cfg := strings.Replace(string(config.Default()), "max_keys: 1000000", "max_keys: 4\n  shards: 1", 1)
	h := newHarness(t, cfg)
	for i := range 4 {
		h.expectRun(1, true, req{path: "/api/v1/tokens", peer: fmt.Sprintf("198.51.100.%d", i+1)})
	}
	if h.store.Len() != 4 {
		t.Fatalf("store holds %d keys, want 4", h.store.Len())
	}
	// token_create is on_overflow: allow (the default for requests).
	h.expectRun(1, true, req{path: "/api/v1/tokens", peer: "198.51.100.99"})
	resp := h.check(req{path: "/admin/login", peer: "203.0.113.7", headers: map[string]string{"x-login-account": "alice@example.com"}})
	if allowed(resp) || resp.GetDeniedResponse().GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		t.Fatalf("login with a full key table: %v", resp)
	}
	if got := h.metric("ratelimit_authz_checks_total", "bucket", "login_ip", "decision", "overflow"); got != 1 {
		t.Errorf("login_ip overflow metric %v, want 1", got)
	}
}

// IPv6 clients are counted per /64, IPv4-mapped ones as IPv4, and the
// login metadata carries the same key the check used.
func TestIPv6ClientsByNetwork(t *testing.T) {
	h := newHarness(t, "")
	for i := range 15 {
		resp := h.check(req{path: "/api/v1/tokens", peer: fmt.Sprintf("2001:db8:7:9::%x", i+1)})
		if allowed(resp) != (i < 10) {
			t.Fatalf("address %d of one /64: allowed=%v, want %v", i+1, allowed(resp), i < 10)
		}
	}
	h.expectRun(1, true, req{path: "/api/v1/tokens", peer: "2001:db8:7:a::1"}) // the next /64
	h.expectRun(10, true, req{path: "/api/v1/tokens", peer: "198.51.100.200"})
	h.expectRun(1, false, req{path: "/api/v1/tokens", peer: "::ffff:198.51.100.200"})

	resp := h.check(req{path: "/admin/login", peer: "2001:db8:7:9::abcd", headers: map[string]string{"x-login-account": "alice@example.com"}})
	fails := resp.GetDynamicMetadata().GetFields()[accesslog.MetaFailures].GetStructValue().GetFields()
	if got := fails["login_ip"].GetStringValue(); got != "2001:db8:7:9::/64" {
		t.Errorf("login_ip key in the metadata %q, want the /64", got)
	}
}
