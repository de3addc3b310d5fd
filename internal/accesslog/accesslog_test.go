package accesslog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/authz"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testclock"
)

// t0 starts a minute: the login buckets' windows begin here.
var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

type harness struct {
	t      *testing.T
	clock  *testclock.Clock
	reg    *prometheus.Registry
	rec    *accesslog.Recorder
	authz  authv3.AuthorizationClient
	logs   alsv3.AccessLogServiceClient
	stream grpc.ClientStreamingClient[alsv3.StreamAccessLogsMessage, alsv3.StreamAccessLogsResponse]
}

// newHarness serves Check and StreamAccessLogs on one loopback gRPC port,
// sharing one counter, as a node does.
func newHarness(t *testing.T, token string) *harness {
	t.Helper()
	return newHarnessFor(t, token, config.Default())
}

// newHarnessFor is newHarness on the configuration yaml.
func newHarnessFor(t *testing.T, token string, yaml []byte) *harness {
	t.Helper()
	r, err := configfile.Parse(yaml, config.Name)
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
	h := &harness{t: t, clock: &testclock.Clock{}, reg: prometheus.NewRegistry()}
	h.clock.Set(t0)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	limits := snapshot.NewResolver(snapshottest.ByIndex(t, r), nil)
	svc, err := authz.New(authz.ConfigFrom(snapshottest.ByIndex(t, r)), m, store, limits, h.reg, log, authz.Options{Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.rec, err = accesslog.New(accesslog.ConfigFrom(snapshottest.ByIndex(t, r)), store, limits, h.reg, log, accesslog.Options{Token: token, Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	authv3.RegisterAuthorizationServer(srv, svc)
	alsv3.RegisterAccessLogServiceServer(srv, h.rec)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h.authz = authv3.NewAuthorizationClient(conn)
	h.logs = alsv3.NewAccessLogServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	h.stream, err = h.logs.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

type login struct {
	path, ip, account, body, contentType string
	raw                                  []byte // pack_as_bytes: any bytes
}

// check sends a login Check as Envoy would: with_request_body on, the
// client IP in x-envoy-external-address.
func (h *harness) check(l login) *authv3.CheckResponse {
	h.t.Helper()
	if l.path == "" {
		l.path = "/admin/login"
	}
	headers := map[string]string{":method": "POST", ":path": l.path, "x-envoy-external-address": l.ip}
	if l.account != "" {
		headers["x-login-account"] = l.account
	}
	if l.contentType != "" {
		headers["content-type"] = l.contentType
	}
	if l.body != "" || len(l.raw) > 0 {
		headers["x-envoy-auth-partial-body"] = "false" // Envoy sets it on a buffered body
	}
	return h.checkRequest(l.path, headers, l.body, l.raw)
}

// checkHeaders sends a Check of POST path with headers and no body.
func (h *harness) checkHeaders(path string, headers map[string]string) *authv3.CheckResponse {
	h.t.Helper()
	headers[":method"], headers[":path"] = "POST", path
	return h.checkRequest(path, headers, "", nil)
}

func (h *harness) checkRequest(path string, headers map[string]string, body string, raw []byte) *authv3.CheckResponse {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "127.0.0.1"},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: path, Headers: headers, Body: body, RawBody: raw,
		}},
	}})
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

func allowed(r *authv3.CheckResponse) bool { return r.GetStatus().GetCode() == int32(codes.OK) }

// entry is the access-log entry Envoy sends for a response to a checked
// request: the Check's dynamic metadata in common_properties.metadata.
func entry(resp *authv3.CheckResponse, code uint32) *accesslogv3.HTTPAccessLogEntry {
	return &accesslogv3.HTTPAccessLogEntry{
		CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{
			FilterMetadata: map[string]*structpb.Struct{accesslog.MetadataNamespace: resp.GetDynamicMetadata()},
		}},
		Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(code)},
	}
}

func (h *harness) send(entries ...*accesslogv3.HTTPAccessLogEntry) {
	h.t.Helper()
	err := h.stream.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: entries},
	}})
	if err != nil {
		h.t.Fatal(err)
	}
}

// fail runs one login attempt that the application answers with code.
func (h *harness) attempt(l login, code uint32) *authv3.CheckResponse {
	h.t.Helper()
	resp := h.check(l)
	if allowed(resp) {
		h.send(entry(resp, code))
	}
	return resp
}

// waitCounted waits until the receiver has processed n entries as result:
// the stream is asynchronous, as Envoy's is.
func (h *harness) waitCounted(result string, n float64) {
	h.t.Helper()
	poll.Until(h.t, 5*time.Second, 2*time.Millisecond, func() error {
		if got := h.metric("ratelimit_authz_failures_accesslog_entries_total", "result", result); got < n {
			return fmt.Errorf("%s entries: %v, want %v", result, got, n)
		}
		return nil
	})
}

// metric reads one sample from the registry; the series must exist.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	return scrape.Must(h.t, h.reg, name, labels...)
}

func TestFiveFailuresLockTheIPAcrossAccounts(t *testing.T) {
	h := newHarness(t, "")
	for i, acct := range []string{"a@x", "b@x", "c@x", "d@x", "e@x"} {
		if !allowed(h.attempt(login{ip: "203.0.113.7", account: acct}, 401)) {
			t.Fatalf("attempt %d denied before the limit", i+1)
		}
	}
	h.waitCounted("counted", 5)
	// Locked for the IP, whatever the account, even with the right password.
	h.clock.Set(t0.Add(42 * time.Second))
	resp := h.check(login{ip: "203.0.113.7", account: "fresh@x"})
	if allowed(resp) {
		t.Fatal("sixth attempt from the IP allowed")
	}
	var retry string
	for _, hv := range resp.GetDeniedResponse().GetHeaders() {
		if hv.GetHeader().GetKey() == "retry-after" {
			retry = hv.GetHeader().GetValue()
		}
	}
	if retry != "18" {
		t.Errorf("retry-after %q, want 18 (end of the minute)", retry)
	}
	// Denials do not extend the lockout: many of them, then the next
	// window is open again.
	for i := 0; i < 20; i++ {
		if allowed(h.check(login{ip: "203.0.113.7", account: "fresh@x"})) {
			t.Fatal("allowed during lockout")
		}
	}
	if !allowed(h.check(login{ip: "203.0.113.8", account: "fresh@x"})) {
		t.Error("another IP is locked too")
	}
	h.clock.Set(t0.Add(time.Minute))
	if !allowed(h.check(login{ip: "203.0.113.7", account: "fresh@x"})) {
		t.Error("lock did not lift in the next window")
	}
	if got := h.metric("ratelimit_authz_failures_lockouts_total", "bucket", "login_ip"); got != 1 {
		t.Errorf("lockouts{login_ip} = %v, want 1", got)
	}
}

func TestFiveFailuresLockTheAccountAcrossIPs(t *testing.T) {
	h := newHarness(t, "")
	for i := 0; i < 5; i++ {
		// The account arrives in different spellings; one account.
		acct := []string{"Alice@Example.com", " alice@example.com", "ALICE@EXAMPLE.COM ", "alice@example.com", "alice@Example.com"}[i]
		h.attempt(login{ip: "198.51.100." + string(rune('1'+i)), account: acct}, 401)
	}
	h.waitCounted("counted", 5)
	// From a new IP, through the other login route, the account in a JSON
	// body: still locked.
	resp := h.check(login{path: "/portal/login", ip: "192.0.2.99", body: `{"email":"alice@example.com","password":"right"}`, contentType: "application/json"})
	if allowed(resp) {
		t.Fatal("locked account allowed from a new IP")
	}
	// Other accounts from that IP are fine.
	if !allowed(h.check(login{ip: "192.0.2.99", account: "bob@example.com"})) {
		t.Error("unrelated account locked")
	}
}

func TestSuccessesAndOtherEntriesNeverCount(t *testing.T) {
	h := newHarness(t, "")
	for i := 0; i < 10; i++ {
		h.attempt(login{ip: "203.0.113.1", account: "ok@x"}, 200)
		h.attempt(login{ip: "203.0.113.1", account: "ok@x"}, 302)
	}
	// A non-login route's entry (no failure metadata) with a 401.
	h.send(&accesslogv3.HTTPAccessLogEntry{Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(401)}})
	h.waitCounted("ignored", 21)
	if !allowed(h.check(login{ip: "203.0.113.1", account: "ok@x"})) {
		t.Error("successes locked the login")
	}
	if got := h.metric("ratelimit_authz_failures_accesslog_entries_total", "result", "counted"); got != 0 {
		t.Errorf("counted %v", got)
	}
}

func TestMalformedAndHostileEntries(t *testing.T) {
	h := newHarness(t, "")
	md := func(fields map[string]*structpb.Value) *accesslogv3.HTTPAccessLogEntry {
		return &accesslogv3.HTTPAccessLogEntry{
			CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				accesslog.MetadataNamespace: {Fields: fields},
			}}},
			Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(401)},
		}
	}
	h.send(
		md(map[string]*structpb.Value{accesslog.MetaFailures: structpb.NewStringValue("not a struct")}),
		md(map[string]*structpb.Value{accesslog.MetaFailures: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"login_ip": structpb.NewNumberValue(7), // not a string
		}})}),
		md(map[string]*structpb.Value{accesslog.MetaFailures: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"inbound": structpb.NewStringValue("ch"), // not a failure bucket
		}})}),
		md(map[string]*structpb.Value{accesslog.MetaFailures: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"login_account": structpb.NewStringValue(strings.Repeat("a", 1<<20)), // huge
		}})}),
		&accesslogv3.HTTPAccessLogEntry{}, // nothing at all
	)
	h.waitCounted("malformed", 4)
	h.waitCounted("ignored", 1)

	// A huge account in the login body and a non-UTF-8 body: the check
	// neither crashes nor keys by them; the IP still counts.
	huge := login{ip: "203.0.113.5", body: `{"email":"` + strings.Repeat("x", 100000) + `"}`, contentType: "application/json"}
	bad := login{ip: "203.0.113.5", raw: []byte("email=\xff\xfe%ZZ"), contentType: "application/x-www-form-urlencoded"}
	for i := 0; i < 3; i++ {
		h.attempt(huge, 401)
		h.attempt(bad, 401)
	}
	h.waitCounted("counted", 5)
	if allowed(h.check(login{ip: "203.0.113.5", account: "someone@x"})) {
		t.Error("IP not locked after five failures without a usable account")
	}
}

func TestHTTPReports(t *testing.T) {
	h := newHarness(t, "s3cret")
	post := func(auth, body string) (int, string) {
		req := httptest.NewRequest("POST", "/v1/failures", strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.rec.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	if code, _ := post("", `{"ip":"203.0.113.9","account":"a@x"}`); code != http.StatusUnauthorized {
		t.Errorf("no token: %d", code)
	}
	if code, _ := post("Bearer wrong", `{"ip":"203.0.113.9","account":"a@x"}`); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	for _, body := range []string{`{"ip":"not-an-ip"}`, `{"ip":"203.0.113.9","account":"\u0000` + strings.Repeat("a", 2000) + `"}`, `{"ip":"203.0.113.9","extra":1}`, `[`, `{"ip":"203.0.113.9","route":"nope"}`} {
		if code, resp := post("Bearer s3cret", body); code != http.StatusBadRequest || !strings.Contains(resp, "error") {
			t.Errorf("%.40s: %d %s", body, code, resp)
		}
	}
	var last accesslog.ReportResult
	for i := 0; i < 5; i++ {
		code, body := post("Bearer s3cret", `{"ip":"203.0.113.9","account":" Mallory@X ","route":"login"}`)
		if code != 200 {
			t.Fatalf("report %d: %d %s", i, code, body)
		}
		json.Unmarshal([]byte(body), &last)
	}
	acct := last.Counted["login_account"]
	if acct.Key != "mallory@x" || acct.Count != 5 || acct.Limit != 5 || !acct.Locked || acct.RetryAfterMS != 60000 {
		t.Errorf("account state %+v", acct)
	}
	// The Check sees what the reports counted.
	if allowed(h.check(login{ip: "192.0.2.1", account: "mallory@x"})) {
		t.Error("reported account not locked")
	}
	if allowed(h.check(login{ip: "203.0.113.9", account: "other@x"})) {
		t.Error("reported IP not locked")
	}

	// Disabled without a token.
	h2 := newHarness(t, "")
	req := httptest.NewRequest("POST", "/v1/failures", strings.NewReader(`{"ip":"203.0.113.9"}`))
	req.Header.Set("Authorization", "Bearer ")
	w := httptest.NewRecorder()
	h2.rec.ServeHTTP(w, req)
	if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "RATELIMIT_AUTHZ_FAILURES_TOKEN") {
		t.Errorf("disabled endpoint: %d %s", w.Code, w.Body.String())
	}
}

// At shutdown the long-lived stream ends with UNAVAILABLE so that the
// server's graceful stop need not wait for Envoy to hang up.
func TestCloseStreamsEndsOpenStreams(t *testing.T) {
	h := newHarness(t, "")
	h.send(&accesslogv3.HTTPAccessLogEntry{})
	h.waitCounted("ignored", 1)
	h.rec.CloseStreams()
	h.rec.CloseStreams() // idempotent
	if _, err := h.stream.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("open stream after CloseStreams: %v, want UNAVAILABLE", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := h.logs.StreamAccessLogs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CloseAndRecv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("new stream after CloseStreams: %v, want UNAVAILABLE", err)
	}
}

// The decoy attack at the node: five wrong passwords for one account in
// the body, each with another decoy x-login-account and from another IP,
// then the right password from yet another IP: locked, because every
// failure counted against every account the login presented.
func TestDecoyAccountHeadersDoNotDodgeTheLock(t *testing.T) {
	h := newHarness(t, "")
	for i := range 5 {
		l := login{ip: fmt.Sprintf("198.51.100.%d", 10+i), account: fmt.Sprintf("decoy%d@example.com", i),
			body: `{"email":"victim@example.com","password":"wrong"}`, contentType: "application/json"}
		if resp := h.attempt(l, 401); !allowed(resp) {
			t.Fatalf("failure %d denied before the limit", i+1)
		}
	}
	h.waitCounted("counted", 5)
	resp := h.check(login{ip: "192.0.2.200", body: `{"email":"victim@example.com","password":"right"}`, contentType: "application/json"})
	if allowed(resp) {
		t.Fatal("the right password after five decoyed failures: allowed, want locked")
	}
	if got := h.metric("ratelimit_authz_failures_counted_total", "bucket", "login_account"); got != 10 {
		t.Errorf("login_account failures counted %v, want 10 (five decoys and five times the body account)", got)
	}
}

func TestMalformedKeyLists(t *testing.T) {
	h := newHarness(t, "")
	list := func(vals ...*structpb.Value) *accesslogv3.HTTPAccessLogEntry {
		return &accesslogv3.HTTPAccessLogEntry{
			CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
				accesslog.MetadataNamespace: {Fields: map[string]*structpb.Value{
					accesslog.MetaFailures: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
						"login_account": structpb.NewListValue(&structpb.ListValue{Values: vals}),
					}}),
				}},
			}}},
			Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(401)},
		}
	}
	s := structpb.NewStringValue
	var many []*structpb.Value
	for i := range 100 {
		many = append(many, s(fmt.Sprint("a", i)))
	}
	h.send(
		list(),                                   // empty
		list(many...),                            // too many
		list(s("a"), s("a")),                     // repeated
		list(s("a"), structpb.NewNumberValue(1)), // not a string
		list(s("a"), s("")),                      // empty key
	)
	h.waitCounted("malformed", 5)
	if got := h.metric("ratelimit_authz_failures_counted_total", "bucket", "login_account"); got != 0 {
		t.Errorf("malformed lists counted %v failures, want none", got)
	}
	h.send(list(s("a@x"), s("b@x")))
	h.waitCounted("counted", 1)
	if got := h.metric("ratelimit_authz_failures_counted_total", "bucket", "login_account"); got != 2 {
		t.Errorf("a list of two counted %v failures, want 2", got)
	}
}

// overflowing is a counter whose key table is always full.
type overflowing struct{}

func (overflowing) Incr(counter.Bucket, string, counter.Limit, int64, time.Time) counter.Result {
	return counter.Result{Overflow: true, RetryAfterMS: 1000, ResetMS: 1000}
}

// A failure the counter cannot keep is counted as refused, not lost
// silently, and a report says so.
func TestFailureOnAFullStoreIsCountedAsRefused(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := accesslog.New(accesslog.ConfigFrom(snapshottest.ByIndex(t, r)), overflowing{}, snapshot.NewResolver(snapshottest.ByIndex(t, r), nil), reg, slog.New(slog.NewTextHandler(io.Discard, nil)), accesslog.Options{Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rec.Report(accesslog.Report{IP: "203.0.113.1", Account: "a@x", Route: "login"})
	if err != nil {
		t.Fatal(err)
	}
	if st := res.Counted["login_account"]; !st.Refused || st.Count != 0 {
		t.Errorf("report on a full store: %+v", st)
	}
	refused := func(bucket string) float64 {
		return scrape.Must(t, reg, "ratelimit_authz_failures_refused_total", "bucket", bucket)
	}
	if a, ip := refused("login_account"), refused("login_ip"); a != 1 || ip != 1 {
		t.Errorf("refused login_account %v, login_ip %v, want 1 per bucket", a, ip)
	}
	if got := scrape.Must(t, reg, "ratelimit_authz_failures_counted_total", "bucket", "login_account"); got != 0 {
		t.Errorf("a refused failure counted as counted: %v", got)
	}
}

// Failures reported over HTTP key an IPv6 client by its network, as the
// check does.
func TestHTTPReportKeysIPv6ByNetwork(t *testing.T) {
	h := newHarness(t, "")
	for i := range 5 {
		if _, err := h.rec.Report(accesslog.Report{IP: fmt.Sprintf("2001:db8:5:6::%x", i+1), Route: "login", Account: "x@y"}); err != nil {
			t.Fatal(err)
		}
	}
	if allowed(h.check(login{ip: "2001:db8:5:6:aaaa::1", account: "other@y"})) {
		t.Error("another address of the reported /64 is not locked")
	}
	if !allowed(h.check(login{ip: "2001:db8:5:7::1", account: "other@y"})) {
		t.Error("the next /64 is locked too")
	}
}

// A report names a route by its name, or an unnamed one by its path.
func TestRouteIndex(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := accesslog.ConfigFrom(snapshottest.ByIndex(t, r))
	if i := accesslog.RouteIndex(cfg, "login"); i < 0 || cfg.Routes[i].Path != "/admin/login" {
		t.Errorf("route login at %d", i)
	}
	if i := accesslog.RouteIndex(cfg, "/api/v1/tokens"); i < 0 || cfg.Routes[i].Path != "/api/v1/tokens" {
		t.Errorf("route by path at %d", i)
	}
	if accesslog.RouteIndex(cfg, "nope") != -1 {
		t.Error("unknown route found")
	}
}

// A reload that removes a failure bucket, or makes it count requests,
// deletes its series, so a renamed bucket leaves no frozen one behind; the
// buckets that stay keep theirs, and the new one counts.
func TestReloadForgetsRemovedBuckets(t *testing.T) {
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	store, err := counter.New(r.Counter)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec, err := accesslog.New(accesslog.ConfigFrom(snapshottest.ByIndex(t, r)), store, snapshot.NewResolver(snapshottest.ByIndex(t, r), nil), reg, slog.New(slog.NewTextHandler(io.Discard, nil)), accesslog.Options{Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	report := func() {
		t.Helper()
		if _, err := rec.Report(accesslog.Report{IP: "203.0.113.1", Account: "a@x", Route: "login"}); err != nil {
			t.Fatal(err)
		}
	}
	series := func(bucket string) bool {
		t.Helper()
		_, ok, err := scrape.Gathered(reg, "ratelimit_authz_failures_counted_total", "bucket", bucket)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	report()
	if !series("login_ip") || !series("login_account") {
		t.Fatal("no series for the login buckets after a failure")
	}
	next, err := configfile.Parse([]byte(`keys:
  account_header: x-login-account
buckets:
  login_addr:    {limit: 5, per: 1m, key: ip, count: failures}
  login_account: {limit: 5, per: 1m, key: account, count: failures}
routes:
  - {name: login, method: POST, paths: [/admin/login], buckets: [login_addr, login_account]}
`), "next.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// New ids, as a reload may give: the counts are kept by id.
	ids := []counter.Bucket{20, 1}
	snap, err := snapshot.CompileWith(snapshot.Sources{Rules: next}, func(snapshot.Key) counter.Bucket {
		id := ids[0]
		ids = ids[1:]
		return id
	})
	if err != nil {
		t.Fatal(err)
	}
	swap, err := rec.Prepare(snap)
	if err != nil {
		t.Fatal(err)
	}
	swap()
	if series("login_ip") {
		t.Error("login_ip's series survived the reload that removed it")
	}
	if !series("login_account") {
		t.Error("login_account's series went, though the bucket stayed")
	}
	report()
	if !series("login_addr") {
		t.Error("the new bucket counted no failure")
	}
}
