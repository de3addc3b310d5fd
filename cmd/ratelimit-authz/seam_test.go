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
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	rlsextv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	alsv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ratelimit-authz/ratelimit-authz/internal/accesslog"
	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/top"
)

// The seam table: every kind of bucket the rules file declares, on every
// surface that serves, shows or changes one. Each cell either works,
// asserted end to end on running nodes, or is refused at configuration
// load with a documented message, or has no way to be expressed there,
// which the named document says. A kind without a row, or a row without
// a cell for some surface, fails the test.

// Surfaces, the table's columns.
const (
	surfCheckLean   = "check-lean"   // ext_authz Check on the lean listener (--check-addr)
	surfCheckGRPC   = "check-grpc"   // ext_authz Check on the gRPC port
	surfAccessLog   = "access-log"   // Envoy's gRPC access log: charges, failures, releases
	surfMetrics     = "metrics"      // /metrics
	surfTopAPI      = "top-api"      // the admin listener's /v1/top
	surfStatusPage  = "status-page"  // the admin listener's page
	surfTopCLI      = "top-cli"      // ratelimit-authz top
	surfShadow      = "shadow"       // mode: shadow
	surfOverrides   = "overrides"    // tenant overrides from Postgres (limits set)
	surfRLQS        = "rlqs"         // Envoy's rate_limit_quota filter
	surfRLS         = "rls"          // ShouldRateLimit, the RLS rule of the same kind
	surfCheckConfig = "check-config" // check-config, with and without --envoy
	surfReplication = "replication"  // two nodes over NATS
	surfReload      = "reload"       // an edit of the rules file, reloaded
)

// seamSurfaces are the columns in the order they run: the live view
// reads the last minute, so its cells run first.
var seamSurfaces = []string{
	surfCheckLean, surfCheckGRPC, surfAccessLog, surfMetrics, surfTopAPI, surfStatusPage, surfTopCLI,
	surfShadow, surfOverrides, surfRLQS, surfRLS, surfCheckConfig, surfReplication, surfReload,
}

// cell is how a kind fares on a surface: works (the zero value); refused
// at load with a message; or none, inexpressible there, as doc says.
type cell struct {
	refused string // check-config's message
	none    string // a document and the sentence in it, "doc: text"
}

var works = cell{}

// seamKind is a row: one kind of bucket.
type seamKind struct {
	name string // the bucket's name and its routes' (/k/<name>, /s/<name>)
	// yaml is the bucket's fields other than limit (and shadow).
	yaml        string
	limit       int
	concurrency bool
	// perUse is what one admitted use adds to the admitted series; a use
	// is a check and, when the kind is read from the response, the access
	// log's report of it.
	perUse int
	// deniedBy is what one refused check adds to the denied series.
	deniedBy            int
	headers             map[string]string // of a use's check
	status              uint32            // of a use's response, as logged
	unit, deniedUnit    string            // the live view's
	admitted, denied    string            // the metrics' series (bucket="…" added)
	settle              string            // the series a report moves, awaited; "" none
	cells               map[string]cell
	rlsRule             string // the kind's RLS rule
	rlsCheck, rlsCharge int    // a request-phase addend; a stream-done charge (0: none)
}

// fromResponse: the access log spends it (a failure, a charge).
func (k *seamKind) fromResponse() bool { return k.settle != "" }

// usesFor is how many uses limit admits: request costs are all or
// nothing, response costs are counted past the limit.
func (k *seamKind) usesFor(limit int) int {
	switch {
	case k.perUse == 1:
		return limit
	case k.fromResponse():
		return (limit + k.perUse - 1) / k.perUse
	}
	return limit / k.perUse
}

const checksSeries = `ratelimit_authz_checks_total{bucket="%s",decision="%s"}`

func seamKinds() []*seamKind {
	const tokens = 600 // a response's reported cost
	response := func(name, cost string) *seamKind {
		return &seamKind{name: name, yaml: "cost: " + cost, limit: 1000, perUse: tokens, deniedBy: 1, status: 200,
			unit: "cost", deniedUnit: "requests", admitted: "ratelimit_authz_cost_charged_total", denied: "checks:denied",
			settle: "ratelimit_authz_cost_charged_total",
			cells:  map[string]cell{surfRLQS: {refused: `charges its cost from the response`}},
			// Envoy reads the charge from the response (%RESP(…)%, a trailer,
			// the bytes sent): to the server it is a stream-done charge.
			rlsRule: "{unit: hour, requests_per_unit: 1000, charge: true}", rlsCheck: 0, rlsCharge: tokens}
	}
	bytes := response("response_bytes", "response_bytes")
	bytes.unit = "content-bytes"
	return []*seamKind{
		{name: "requests", limit: 3, perUse: 1, deniedBy: 1, status: 200, unit: "requests", deniedUnit: "requests",
			admitted: "checks:allowed", denied: "checks:denied", rlsRule: "{unit: hour, requests_per_unit: 3}", rlsCheck: 1},
		{name: "request_header", yaml: "cost: {request_header: x-cost, max: 1000}", limit: 100, perUse: 60, deniedBy: 60, status: 200,
			headers: map[string]string{"x-cost": "60"}, unit: "cost", deniedUnit: "cost",
			admitted: "ratelimit_authz_cost_admitted_total", denied: "ratelimit_authz_cost_denied_total",
			rlsRule: "{unit: hour, requests_per_unit: 100}", rlsCheck: 60},
		{name: "content_length", yaml: "cost: content_length", limit: 100, perUse: 60, deniedBy: 60, status: 200,
			headers: map[string]string{"content-length": "60"}, unit: "content-bytes", deniedUnit: "content-bytes",
			admitted: "ratelimit_authz_cost_admitted_total", denied: "ratelimit_authz_cost_denied_total",
			// Envoy's hits_addend reads it: %REQ(content-length)%.
			rlsRule: "{unit: hour, requests_per_unit: 100}", rlsCheck: 60},
		{name: "failures", yaml: "count: failures", limit: 2, perUse: 1, deniedBy: 1, status: 401, unit: "failures", deniedUnit: "requests",
			admitted: "ratelimit_authz_failures_counted_total", denied: "checks:denied", settle: "ratelimit_authz_failures_counted_total",
			cells: map[string]cell{
				surfRLQS: {refused: `counts failures: Envoy's quota reports count requests`},
				surfRLS:  {none: "rls.md: Failures (a rules-file bucket with `count: failures`) have no rule here"},
			}},
		response("response_header", "{response_header: x-tokens, max: 100000}"),
		response("response_trailer", "{response_trailer: x-tokens, max: 100000}"),
		bytes,
		{name: "concurrency", yaml: "count: concurrency, lease_ttl: 1m", limit: 2, perUse: 1, deniedBy: 1, status: 200, concurrency: true,
			unit: admin.UnitInFlight, deniedUnit: admin.UnitInFlight, admitted: "checks:allowed", denied: "checks:denied",
			cells:   map[string]cell{surfRLQS: {refused: `counts requests in flight: Envoy's quota reports count requests`}},
			rlsRule: "{count: concurrency, requests_per_unit: 2, lease_ttl: 60s}", rlsCheck: 1},
	}
}

// series is the metric series of name for bucket: "checks:<decision>"
// is ratelimit_authz_checks_total.
func series(name, bucket string) string {
	if d, ok := strings.CutPrefix(name, "checks:"); ok {
		return fmt.Sprintf(checksSeries, bucket, d)
	}
	return name + `{bucket="` + bucket + `"}`
}

// seamConfig is the rules file of every row: each kind's bucket (limit
// times factor) and its shadow twin, and a quota entry for each kind RLQS
// serves. quotaFor adds an entry for that kind whatever its cell says.
func seamConfig(kinds []*seamKind, factor int, quotaFor string) string {
	var b strings.Builder
	b.WriteString("keys: {tenant_header: x-tenant-id}\nfailures: {status_codes: [401]}\nbuckets:\n")
	for _, k := range kinds {
		for _, twin := range []string{"", "_shadow"} {
			per := ", per: 1h"
			if k.concurrency {
				per = ""
			}
			extra := ""
			if k.yaml != "" {
				extra = ", " + k.yaml
			}
			mode := "enforce"
			if twin != "" {
				mode = "shadow"
			}
			fmt.Fprintf(&b, "  %s%s: {limit: %d%s, key: tenant, overridable: true, mode: %s%s}\n", k.name, twin, k.limit*factor, per, mode, extra)
		}
	}
	b.WriteString("routes:\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "  - {method: POST, path: /k/%s, buckets: [%s]}\n  - {method: POST, path: /s/%s, buckets: [%s_shadow]}\n", k.name, k.name, k.name, k.name)
	}
	var quota strings.Builder
	for _, k := range kinds {
		if k.cells[surfRLQS] == works || k.name == quotaFor {
			cost := ""
			if k.perUse > 1 && !k.fromResponse() {
				cost = fmt.Sprintf(", cost: %d", k.perUse)
			}
			fmt.Fprintf(&quota, "    - {match: {name: %s}, bucket: %s, key: tenant%s}\n", k.name, k.name, cost)
		}
	}
	if quota.Len() > 0 {
		b.WriteString("quota:\n  domains: [seam]\n  buckets:\n" + quota.String())
	}
	return b.String()
}

// seamRLSFile is the RLS rules file: each kind's rule under kind=<name>,
// per tenant (a concurrency rule per request id below it).
func seamRLSFile(kinds []*seamKind) string {
	var b strings.Builder
	b.WriteString("domain: seam\ndescriptors:\n")
	for _, k := range kinds {
		if k.rlsRule == "" {
			continue
		}
		fmt.Fprintf(&b, "  - key: kind\n    value: %s\n    descriptors:\n      - key: tenant\n", k.name)
		if k.concurrency {
			fmt.Fprintf(&b, "        descriptors:\n          - key: request_id\n            rate_limit: %s\n", k.rlsRule)
		} else {
			fmt.Fprintf(&b, "        rate_limit: %s\n", k.rlsRule)
		}
	}
	return b.String()
}

// seamNode is a node under test with its access-log stream.
type seamNode struct {
	*servedNode
	ctx  context.Context
	mu   sync.Mutex
	als  alsv3.AccessLogService_StreamAccessLogsClient
	reqs int                              // request ids handed out
	ids  map[*authv3.CheckResponse]string // the request id of each check's answer
}

func (n *seamNode) check(t *testing.T, lean bool, k *seamKind, route, tenant string) *authv3.CheckResponse {
	t.Helper()
	path := "/" + route + "/" + k.name
	h := map[string]string{":path": path, ":method": "POST", "x-tenant-id": tenant}
	for name, v := range k.headers {
		h[name] = v
	}
	n.mu.Lock()
	n.reqs++
	h["x-request-id"] = fmt.Sprintf("req-%d", n.reqs)
	n.mu.Unlock()
	client := n.client
	if lean {
		client = authv3.NewAuthorizationClient(grpcConn(t, n.node.CheckAddr().String(), nil))
	}
	resp, err := client.Check(n.ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Method: "POST", Path: path, Headers: h}}}})
	if err != nil {
		t.Fatalf("%s: Check %s: %v", n.id, path, err)
	}
	n.mu.Lock()
	if n.ids == nil {
		n.ids = map[*authv3.CheckResponse]string{}
	}
	n.ids[resp] = h["x-request-id"]
	n.mu.Unlock()
	return resp
}

// report logs the response to an admitted check as Envoy's access log
// does, with the check's dynamic metadata.
func (n *seamNode) report(t *testing.T, k *seamKind, resp *authv3.CheckResponse) {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.als == nil {
		als, err := alsv3.NewAccessLogServiceClient(n.conn).StreamAccessLogs(n.ctx)
		if err != nil {
			t.Fatal(err)
		}
		n.als = als
	}
	v := strconv.Itoa(k.perUse)
	e := &accesslogv3.HTTPAccessLogEntry{
		CommonProperties: &accesslogv3.AccessLogCommon{Metadata: &corev3.Metadata{
			FilterMetadata: map[string]*structpb.Struct{accesslog.MetadataNamespace: resp.GetDynamicMetadata()}}},
		Request: &accesslogv3.HTTPRequestProperties{RequestId: n.ids[resp]},
		Response: &accesslogv3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(k.status),
			ResponseHeaders: map[string]string{"x-tokens": v}, ResponseTrailers: map[string]string{"x-tokens": v}, ResponseBodyBytes: uint64(k.perUse)},
	}
	if err := n.als.Send(&alsv3.StreamAccessLogsMessage{LogEntries: &alsv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &alsv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: []*accesslogv3.HTTPAccessLogEntry{e}}}}); err != nil {
		t.Fatal(err)
	}
}

func (n *seamNode) metric(t *testing.T, s string) float64 {
	t.Helper()
	page, err := scrape.Get(http.DefaultClient, "http://"+n.http+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	v, _ := page.Get(s) // 0 while absent
	return v
}

// logEntries is how many access-log entries the node has received.
func (n *seamNode) logEntries(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for _, r := range []string{"counted", "released", "ignored", "malformed"} {
		sum += n.metric(t, `ratelimit_authz_failures_accesslog_entries_total{result="`+r+`"}`)
	}
	return sum
}

func allowed(resp *authv3.CheckResponse) bool { return resp.GetStatus().GetCode() == int32(codes.OK) }

func deniedWith429(t *testing.T, resp *authv3.CheckResponse) {
	t.Helper()
	if allowed(resp) {
		t.Fatalf("admitted past the limit")
	}
	if c := resp.GetDeniedResponse().GetStatus().GetCode(); c != 429 {
		t.Fatalf("denied with %v, want 429", c)
	}
}

// use makes one admitted use of bucket (route k: the kind's own; s: its
// shadow twin) for tenant: the check, and, unless the kind holds a slot,
// the access log's report of its response, awaited where it spends.
func (n *seamNode) use(t *testing.T, lean bool, k *seamKind, route, tenant string) *authv3.CheckResponse {
	t.Helper()
	resp := n.check(t, lean, k, route, tenant)
	if !allowed(resp) {
		t.Fatalf("%s: use for %s denied within the limit (%v)", n.id, tenant, resp.GetDeniedResponse().GetStatus().GetCode())
	}
	if k.concurrency {
		return resp // held until released
	}
	bucket := k.name
	if route == "s" {
		bucket += "_shadow"
	}
	var before float64
	if k.fromResponse() {
		before = n.metric(t, series(k.settle, bucket))
	}
	n.report(t, k, resp)
	if k.fromResponse() {
		poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
			if got := n.metric(t, series(k.settle, bucket)); got < before+float64(k.perUse) {
				return fmt.Errorf("%s: %s %v, want %v", n.id, series(k.settle, bucket), got, before+float64(k.perUse))
			}
			return nil
		})
	}
	return resp
}

// spend uses tenant's whole limit of k's bucket and wants the next check
// refused with 429.
func (n *seamNode) spend(t *testing.T, lean bool, k *seamKind, tenant string, uses int) {
	t.Helper()
	for range uses {
		n.use(t, lean, k, "k", tenant)
	}
	deniedWith429(t, n.check(t, lean, k, "k", tenant))
}

func TestEveryBucketKindOnEverySurface(t *testing.T) {
	outer := t
	kinds := seamKinds()
	// Every kind has its row, and every row a cell for every surface.
	have := map[string]bool{}
	dir := t.TempDir()
	for _, k := range kinds {
		r, err := configfile.Parse([]byte(seamConfig([]*seamKind{k}, 1, "")), k.name+".yaml")
		if err != nil {
			t.Fatalf("row %s: %v", k.name, err)
		}
		b := r.Buckets[0]
		kind := b.Cost.Source.String()
		if k.concurrency {
			kind = "concurrency"
		}
		if kind != k.name {
			t.Errorf("row %s is a bucket of kind %s", k.name, kind)
		}
		have[kind] = true
		if k.cells == nil {
			k.cells = map[string]cell{}
		}
		for s := range k.cells {
			if !slices.Contains(seamSurfaces, s) {
				t.Errorf("row %s: a cell for an unknown surface %s", k.name, s)
			}
		}
	}
	for _, s := range configfile.CostSources() {
		if !have[s.String()] {
			t.Errorf("no row for buckets whose cost is %s", s)
		}
	}
	if !have["concurrency"] {
		t.Error("no row for concurrency buckets")
	}
	for _, k := range kinds {
		for _, c := range k.cells {
			if c.none != "" {
				doc, text, _ := strings.Cut(c.none, ": ")
				b, err := os.ReadFile(filepath.Join("../../docs", doc))
				if err != nil || !strings.Contains(strings.Join(strings.Fields(string(b)), " "), strings.Join(strings.Fields(text), " ")) {
					t.Errorf("row %s: docs/%s does not say %q (%v)", k.name, doc, text, err)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	cfg := filepath.Join(dir, "seam.yaml")
	writeFile(t, cfg, seamConfig(kinds, 1, ""))
	rlsDir := filepath.Join(dir, "rls")
	writeFile(t, filepath.Join(rlsDir, "seam.yaml"), seamRLSFile(kinds))
	pg, _ := migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// One hour windows: start away from an hour's end (the test takes
	// about 20 s).
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < time.Minute {
		time.Sleep(left + 100*time.Millisecond)
	}
	a := &seamNode{ctx: ctx, servedNode: serveReady(t, map[string]string{
		"RATELIMIT_AUTHZ_CONFIG": cfg, "RATELIMIT_AUTHZ_ADMIN_ADDR": "127.0.0.1:0", "DATABASE_URL": pg.URL(),
		"RATELIMIT_AUTHZ_RLS_CONFIG_DIR": rlsDir,
	})}

	// Two nodes over one NATS server, started at the first replication
	// cell and kept to the test's end.
	var b, c *seamNode
	cluster := func(t *testing.T) (*seamNode, *seamNode) {
		if b == nil {
			srv := testnats.Run(outer)
			b = &seamNode{ctx: ctx, servedNode: startNode(outer, "b", cfg, srv.ClientURL(), nil)}
			c = &seamNode{ctx: ctx, servedNode: startNode(outer, "c", cfg, srv.ClientURL(), nil)}
			b.waitReady(t)
			c.waitReady(t)
		}
		return b, c
	}
	runners := map[string]func(t *testing.T, k *seamKind){
		surfCheckLean: func(t *testing.T, k *seamKind) { a.spend(t, true, k, "lean-"+k.name, k.usesFor(k.limit)) },
		surfCheckGRPC: func(t *testing.T, k *seamKind) { a.spend(t, false, k, "grpc-"+k.name, k.usesFor(k.limit)) },
		surfAccessLog: func(t *testing.T, k *seamKind) { seamAccessLog(t, a, k) },
		surfMetrics:   func(t *testing.T, k *seamKind) { seamMetrics(t, a, k) },
		surfTopAPI:    func(t *testing.T, k *seamKind) { seamTopAPI(t, a, k) },
		surfStatusPage: func(t *testing.T, k *seamKind) {
			code, page := adminGet(t, "http://"+a.node.AdminAddr().String()+"/", "")
			unit := k.unit
			if k.deniedUnit != k.unit {
				unit += ", " + k.deniedUnit
			}
			want := fmt.Sprintf(`(?s)<a href="#b-%s">%s</a>.*?<td>%s</td>`, k.name, k.name, regexp.QuoteMeta(unit))
			if code != 200 || !regexp.MustCompile(want).Match(page) {
				t.Errorf("the status page (%d) has no row %s in %s:\n%s", code, k.name, unit, page)
			}
			if !bytes.Contains(page, []byte(`id="b-`+k.name+`"`)) {
				t.Errorf("the status page lists no top keys of %s", k.name)
			}
		},
		surfTopCLI: func(t *testing.T, k *seamKind) {
			var out bytes.Buffer
			if err := run(ctx, []string{"top", "--once", "--admin-addr", a.node.AdminAddr().String()}, env(nil), &out, io.Discard); err != nil {
				t.Fatal(err)
			}
			rate := func(unit string) string { // the line's rate of unit
				if unit == "requests" {
					return `[0-9.]+/s`
				}
				return `[0-9.]+ ` + unit + `/s`
			}
			want := k.name + `  \(\d+ / 1h, fixed\)  admitted ` + rate(k.unit) + `  denied ` + rate(k.deniedUnit)
			if k.concurrency {
				want = k.name + `  \(\d+ in flight, fixed\)(.*\n)+?in flight now: `
			}
			if !regexp.MustCompile(want).MatchString(out.String()) {
				t.Errorf("top has no line %s:\n%s", want, out.String())
			}
		},
		surfShadow:      func(t *testing.T, k *seamKind) { seamShadow(t, a, k) },
		surfOverrides:   func(t *testing.T, k *seamKind) { seamOverride(t, a, k, cfg, pg.URL()) },
		surfRLQS:        func(t *testing.T, k *seamKind) { seamRLQS(t, a, k) },
		surfRLS:         func(t *testing.T, k *seamKind) { seamRLS(t, a, k) },
		surfCheckConfig: func(t *testing.T, k *seamKind) { seamCheckConfig(t, k) },
		surfReplication: func(t *testing.T, k *seamKind) { b, c := cluster(t); seamReplication(t, k, b, c) },
		surfReload:      func(t *testing.T, k *seamKind) { seamReload(t, a, k) },
	}
	for _, s := range seamSurfaces {
		if runners[s] == nil {
			t.Fatalf("surface %s has no runner", s)
		}
	}
	// Reload rewrites every limit: once, before its column.
	reloaded := false
	for _, s := range seamSurfaces {
		if s == surfReload && !reloaded {
			reloaded = true
			before := a.metric(t, `ratelimit_authz_config_reloads_total{result="success"}`)
			writeFile(t, cfg, seamConfig(kinds, 2, ""))
			poll.Until(t, 20*time.Second, 20*time.Millisecond, func() error {
				if got := a.metric(t, `ratelimit_authz_config_reloads_total{result="success"}`); got <= before {
					return fmt.Errorf("no reload yet (%v)", got)
				}
				return nil
			})
		}
		for _, k := range kinds {
			t.Run(s+"/"+k.name, func(t *testing.T) {
				c := k.cells[s]
				switch {
				case c.refused != "":
					seamRefused(t, kinds, k, s, c.refused)
				case c.none != "":
					t.Logf("none: %s", c.none) // the document's sentence was checked above
				default:
					runners[s](t, k)
				}
			})
		}
	}
}

// seamRefused: the configuration putting k on surface s is refused at
// load, by check-config and serve alike, with msg.
func seamRefused(t *testing.T, kinds []*seamKind, k *seamKind, s, msg string) {
	if s != surfRLQS {
		t.Fatalf("no way to put a bucket on %s to be refused", s)
	}
	cfg := filepath.Join(t.TempDir(), "refused.yaml")
	writeFile(t, cfg, seamConfig(kinds, 1, k.name))
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"check-config", "--config", cfg}, env(nil), &out, &errOut)
	if exitCode(err) != 1 || !strings.Contains(errOut.String(), msg) {
		t.Errorf("check-config: %v, stderr %q; want exit 1 and %q", err, errOut.String(), msg)
	}
	err = runServe(context.Background(), []string{"--config", cfg}, env(nil), io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("serve: %v, want %q", err, msg)
	}
}

// seamAccessLog: what the access log does to each kind. Read from the
// response (failures, charges): the checks alone spend nothing, and the
// reports spend the limit. Taken at the check: reports spend nothing more.
// In flight: a report releases the slot.
func seamAccessLog(t *testing.T, a *seamNode, k *seamKind) {
	tenant := "log-" + k.name
	uses := k.usesFor(k.limit)
	switch {
	case k.concurrency:
		var held []*authv3.CheckResponse
		for range uses {
			held = append(held, a.use(t, false, k, "k", tenant))
		}
		deniedWith429(t, a.check(t, false, k, "k", tenant))
		gauge := series("ratelimit_authz_inflight_requests", k.name)
		before := a.metric(t, gauge)
		a.report(t, k, held[0])
		poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
			if got := a.metric(t, gauge); got != before-1 {
				return fmt.Errorf("%s %v, want %v", gauge, got, before-1)
			}
			return nil
		})
		if resp := a.check(t, false, k, "k", tenant); !allowed(resp) {
			t.Fatal("a released slot is not free")
		}
	case k.fromResponse():
		var resps []*authv3.CheckResponse
		for range uses + 1 {
			resp := a.check(t, false, k, "k", tenant)
			if !allowed(resp) {
				t.Fatal("checks spent what only the response reports")
			}
			resps = append(resps, resp)
		}
		for _, r := range resps[:uses] {
			before := a.metric(t, series(k.settle, k.name))
			a.report(t, k, r)
			poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
				if got := a.metric(t, series(k.settle, k.name)); got != before+float64(k.perUse) {
					return fmt.Errorf("%s %v, want %v", series(k.settle, k.name), got, before+float64(k.perUse))
				}
				return nil
			})
		}
		deniedWith429(t, a.check(t, false, k, "k", tenant))
	default:
		admitted := series(k.admitted, k.name)
		before, entries := a.metric(t, admitted), a.logEntries(t)
		for range uses {
			a.use(t, false, k, "k", tenant)
		}
		deniedWith429(t, a.check(t, false, k, "k", tenant))
		poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error {
			if got := a.logEntries(t); got < entries+float64(uses) {
				return fmt.Errorf("%v access-log entries received, want %v", got, entries+float64(uses))
			}
			return nil
		})
		if got := a.metric(t, admitted); got != before+float64(uses*k.perUse) {
			t.Errorf("%s %v after %d uses reported, want %v", admitted, got, uses, before+float64(uses*k.perUse))
		}
	}
}

// seamMetrics: a tenant's limit spent and one refusal move the kind's
// admitted and denied series by exactly that.
func seamMetrics(t *testing.T, a *seamNode, k *seamKind) {
	admitted, denied := series(k.admitted, k.name), series(k.denied, k.name)
	a0, d0 := a.metric(t, admitted), a.metric(t, denied)
	uses := k.usesFor(k.limit)
	a.spend(t, false, k, "metrics-"+k.name, uses)
	if got := a.metric(t, admitted) - a0; got != float64(uses*k.perUse) {
		t.Errorf("%s moved by %v, want %d", admitted, got, uses*k.perUse)
	}
	if got := a.metric(t, denied) - d0; got != float64(k.deniedBy) {
		t.Errorf("%s moved by %v, want %d", denied, got, k.deniedBy)
	}
}

// seamTopAPI: /v1/top reads the kind's unit, the metrics' figures, the
// tenants refused, and for slots in flight the leases held now.
func seamTopAPI(t *testing.T, a *seamNode, k *seamKind) {
	code, body := adminGet(t, "http://"+a.node.AdminAddr().String()+"/v1/top?n=20", "")
	if code != 200 {
		t.Fatalf("GET /v1/top: %d %s", code, body)
	}
	var tops admin.TopResponse
	if err := json.Unmarshal(body, &tops); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(tops.Buckets, func(b admin.BucketTops) bool { return b.Bucket == k.name })
	if i < 0 {
		t.Fatalf("%s is not in the live view", k.name)
	}
	b := tops.Buckets[i]
	wantA, wantD := a.metric(t, series(k.admitted, k.name)), a.metric(t, series(k.denied, k.name))
	if float64(b.Minute.Admitted) != wantA || float64(b.Minute.Denied) != wantD || b.Unit != k.unit || b.DeniedUnit != k.deniedUnit {
		t.Errorf("the live view reads %d %s admitted, %d %s denied; the metrics %v, %v (%s, %s)",
			b.Minute.Admitted, b.Unit, b.Minute.Denied, b.DeniedUnit, wantA, wantD, k.unit, k.deniedUnit)
	}
	if !slices.ContainsFunc(b.Minute.TopDenied, func(e top.Key) bool { return e.Key == "lean-"+k.name }) {
		t.Errorf("top denied %+v lacks lean-%s", b.Minute.TopDenied, k.name)
	}
	if k.concurrency {
		var held uint64
		for _, f := range b.InFlight {
			held += f.Hits
		}
		if g := a.metric(t, series("ratelimit_authz_inflight_requests", k.name)); held == 0 || float64(held) != g {
			t.Errorf("in flight now %+v, %d held; ratelimit_authz_inflight_requests %v", b.InFlight, held, g)
		}
	} else if b.InFlight != nil {
		t.Errorf("lists requests in flight: %+v", b.InFlight)
	}
}

// seamShadow: the shadow twin counts and reports but never refuses.
func seamShadow(t *testing.T, a *seamNode, k *seamKind) {
	tenant := "shadow-" + k.name
	bucket := k.name + "_shadow"
	sd := fmt.Sprintf(checksSeries, bucket, "shadow_denied")
	before := a.metric(t, sd)
	for range k.usesFor(k.limit) + 2 {
		a.use(t, false, k, "s", tenant)
	}
	if got := a.metric(t, sd); got < before+2 {
		t.Errorf("%s %v after 2 uses past the limit, want %v", sd, got, before+2)
	}
}

// seamOverride: a tenant's override doubles its limit; another tenant
// keeps the configured one.
func seamOverride(t *testing.T, a *seamNode, k *seamKind, cfg, db string) {
	tenant := "over-" + k.name
	limit := strconv.Itoa(2*k.limit) + "/1h" // a limit in flight ignores the window
	before := a.metric(t, "ratelimit_authz_overrides_loaded")
	code, out, errOut := cliWith(t, map[string]string{"DATABASE_URL": db, "RATELIMIT_AUTHZ_CONFIG": cfg}, "limits", "set", tenant, k.name, limit, "--actor", "seam")
	if code != 0 {
		t.Fatalf("limits set: exit %d\n%s%s", code, out, errOut)
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := a.metric(t, "ratelimit_authz_overrides_loaded"); got <= before {
			return fmt.Errorf("overrides loaded %v", got)
		}
		return nil
	})
	a.spend(t, false, k, tenant, k.usesFor(2*k.limit))
	a.spend(t, false, k, "notover-"+k.name, k.usesFor(k.limit))
}

// quotaStream is one Envoy's RLQS stream.
type quotaStream struct {
	s    rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	recv chan *rlqspb.RateLimitQuotaResponse
}

// seamRLQS: usage reported over RLQS spends the bucket: the assignment
// turns to DENY_ALL and Check refuses the same tenant.
func seamRLQS(t *testing.T, a *seamNode, k *seamKind) {
	s, err := rlqspb.NewRateLimitQuotaServiceClient(a.conn).StreamRateLimitQuotas(a.ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv := make(chan *rlqspb.RateLimitQuotaResponse, 64)
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				close(recv)
				return
			}
			recv <- m
		}
	}()
	t.Cleanup(func() { s.CloseSend() })
	tenant := "rlqs-" + k.name
	id := &rlqspb.BucketId{Bucket: map[string]string{"name": k.name, "tenant": tenant}}
	send := func(n int) {
		t.Helper()
		if err := s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "seam", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: id, NumRequestsAllowed: uint64(n)}}}); err != nil {
			t.Fatal(err)
		}
	}
	send(0)
	send(k.usesFor(k.limit))
	var last string
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() error {
		send(0)
	drain:
		for {
			select {
			case m, ok := <-recv:
				if !ok {
					t.Fatal("the stream ended")
				}
				for _, act := range m.GetBucketAction() {
					last = act.GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String()
				}
			case <-time.After(50 * time.Millisecond):
				break drain
			}
		}
		if last != "DENY_ALL" {
			return fmt.Errorf("assignment %q after the limit was reported", last)
		}
		return nil
	})
	deniedWith429(t, a.check(t, false, k, "k", tenant))
}

// seamRLS: the kind's RLS rule, through the lean listener as the shipped
// bootstrap calls it, admits the limit and then answers OVER_LIMIT.
func seamRLS(t *testing.T, a *seamNode, k *seamKind) {
	c := rlsv3.NewRateLimitServiceClient(grpcConn(t, a.node.CheckAddr().String(), nil))
	tenant := "rls-" + k.name
	call := func(i, addend int, negative bool) rlsv3.RateLimitResponse_Code {
		t.Helper()
		e := []*rlsextv3.RateLimitDescriptor_Entry{{Key: "kind", Value: k.name}, {Key: "tenant", Value: tenant}}
		if k.concurrency {
			e = append(e, &rlsextv3.RateLimitDescriptor_Entry{Key: "request_id", Value: fmt.Sprint("r", i)})
		}
		resp, err := c.ShouldRateLimit(a.ctx, &rlsv3.RateLimitRequest{Domain: "seam", Descriptors: []*rlsextv3.RateLimitDescriptor{{
			Entries: e, HitsAddend: wrapperspb.UInt64(uint64(addend)), IsNegativeHits: negative}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	uses := k.usesFor(k.limit)
	for i := range uses {
		if got := call(i, k.rlsCheck, false); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("use %d: %v", i+1, got)
		}
		if k.rlsCharge > 0 {
			call(i, k.rlsCharge, false)
		}
	}
	if got := call(uses, k.rlsCheck, false); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("past the limit: %v", got)
	}
	if k.concurrency {
		call(0, 1, true) // the release of the first
		if got := call(uses+1, k.rlsCheck, false); got != rlsv3.RateLimitResponse_OK {
			t.Fatalf("after a release: %v", got)
		}
	}
}

// seamCheckConfig: check-config accepts a file of the kind alone; with an
// Envoy bootstrap whose access log is gone, a kind the access log spends
// or releases is warned about by name, and no other.
func seamCheckConfig(t *testing.T, k *seamKind) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "one.yaml")
	text := seamConfig([]*seamKind{k}, 1, "")
	text, _, _ = strings.Cut(text, "quota:")
	// Two routes the shipped bootstrap sends through the check.
	text = strings.ReplaceAll(text, "/k/"+k.name, "/api/activities")
	text = strings.ReplaceAll(text, "/s/"+k.name, "/api/converger/uploads")
	writeFile(t, cfg, text)
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"check-config", "--config", cfg}, env(nil), &out, &errOut); err != nil || !strings.Contains(out.String(), "OK (2 buckets, 2 routes)") {
		t.Fatalf("check-config: %v\n%s%s", err, out.String(), errOut.String())
	}
	shipped, err := os.ReadFile("../../envoy/ratelimit-authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	noLog := regexp.MustCompile(`(?s)\n\s*access_log:.*?\n(\s*route_config:)`).ReplaceAllString(string(shipped), "\n${1}")
	if noLog == string(shipped) {
		t.Fatal("found no access log in the shipped bootstrap")
	}
	bootstrap := filepath.Join(dir, "envoy.yaml")
	writeFile(t, bootstrap, noLog)
	out.Reset()
	errOut.Reset()
	err = run(context.Background(), []string{"check-config", "--config", cfg, "--envoy", bootstrap}, env(nil), &out, &errOut)
	if err != nil {
		t.Fatalf("check-config --envoy: %v\n%s", err, errOut.String())
	}
	warned := regexp.MustCompile(`WARN: [^\n]*\b` + k.name + `\b[^\n]*access log`).MatchString(errOut.String())
	if want := k.fromResponse() || k.concurrency; warned != want {
		t.Errorf("with no access log, warned about %s: %v, want %v\n%s", k.name, warned, want, errOut.String())
	}
}

// seamReplication: a tenant's limit spent on one node is refused on the
// other once it has merged.
func seamReplication(t *testing.T, k *seamKind, b, c *seamNode) {
	tenant := "repl-" + k.name
	// One use at a time, each merged before the next: a node spends at
	// most its share of a key's budget until its hits are known to the
	// others (docs/design/budget-shares.md).
	for range k.usesFor(k.limit) {
		b.use(t, false, k, "k", tenant)
		synced(t, b.servedNode, c.servedNode)
	}
	deniedWith429(t, c.check(t, false, k, "k", tenant))
}

// seamReload: the reloaded file doubled every limit.
func seamReload(t *testing.T, a *seamNode, k *seamKind) {
	a.spend(t, false, k, "reload-"+k.name, k.usesFor(2*k.limit))
}
