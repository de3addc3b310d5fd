package monitoring_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/ratelimit-authz/ratelimit-authz/deploy/internal/serverbin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/proc"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// serverBin is the server, built once for this test binary.
var serverBin string

func TestMain(m *testing.M) { serverbin.Main(m, &serverBin) }

const (
	rulesFile     = "../prometheus/alerts.yaml"
	dashboardFile = "../grafana/ratelimit-authz.json"
)

// External metrics the rules may use: not the node's own, each with why.
var external = map[string]string{
	"up": "Prometheus's own: the scrape of the node failed",
}

var promql = parser.NewParser(parser.Options{})

func loadRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rulefmt: %v", errs)
	}
	return groups
}

// TestRulesParse: Prometheus's rule parser accepts the file with unknown
// fields refused (expressions, durations, label names and annotation
// templates are all validated by it), and each alert carries a severity,
// a summary and a runbook.
func TestRulesParse(t *testing.T) {
	groups := loadRules(t)
	n := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("rule %q: only alerting rules are shipped", r.Record)
				continue
			}
			n++
			if !slices.Contains([]string{"critical", "warning"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s: no %s", r.Alert, a)
				}
			}
		}
	}
	if n < 10 {
		t.Errorf("%d alerts", n)
	}
	// The parser refuses what a typo would produce.
	for _, bad := range []string{
		"groups:\n- name: x\n  rules:\n  - alert: A\n    expr: up ==\n",
		"groups:\n- name: x\n  rules:\n  - alert: A\n    expr: up\n    for: 5 minutes\n",
		"groups:\n- name: x\n  rules:\n  - alert: A\n    expr: up\n    labels: {severity: warning}\n    annotaions: {summary: x}\n",
	} {
		if _, errs := rulefmt.Parse([]byte(bad), false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler)); len(errs) == 0 {
			t.Errorf("rulefmt accepted %q", bad)
		}
	}
}

// dashboard is the part of Grafana's dashboard model the file uses;
// decoding refuses any other field, so a misspelt key fails.
type dashboard struct {
	Inputs []struct {
		Name, Label, Description, Type, PluginID, PluginName string
	} `json:"__inputs"`
	Title, UID, Description, Timezone, Refresh string
	Version, SchemaVersion, GraphTooltip       int
	Tags                                       []string
	Editable                                   bool
	Time                                       struct{ From, To string }
	Templating                                 struct {
		List []struct {
			Name, Label, Type, Definition, AllValue string
			Query                                   any
			Datasource                              *datasource
			Current                                 map[string]any
			IncludeAll, Multi                       bool
			Refresh, Hide                           int
		}
	}
	Annotations struct{ List []any }
	Panels      []panel
}

type datasource struct{ Type, UID string }

type panel struct {
	ID          int
	Type        string
	Title       string
	Description string
	Collapsed   bool
	Datasource  *datasource
	GridPos     struct{ H, W, X, Y int }
	FieldConfig struct {
		Defaults  map[string]any
		Overrides []any
	}
	Options map[string]any
	Panels  []panel
	Targets []struct {
		RefID        string
		Expr         string
		LegendFormat string
		Datasource   *datasource
	}
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	return &d
}

// Grafana's variables, as a query would see them.
var dashboardVars = strings.NewReplacer("$__rate_interval", "1m", "$job", "ratelimit-authz")

// dashboardExprs returns every PromQL expression of the dashboard, with
// Grafana's variables substituted.
func dashboardExprs(t *testing.T, d *dashboard) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			e := dashboardVars.Replace(tg.Expr)
			if strings.Contains(e, "$") {
				t.Errorf("panel %q: unknown variable in %s", p.Title, tg.Expr)
			}
			out[fmt.Sprintf("panel %q %s", p.Title, tg.RefID)] = e
		}
	}
	return out
}

// TestAlertsUseTheNodesOwnFigures: the alerts that depend on a node's
// configuration or state read it from the node's own metrics, not from a
// number copied out of the shipped configuration or from another
// exporter.
func TestAlertsUseTheNodesOwnFigures(t *testing.T) {
	want := map[string][]string{
		"RatelimitAuthzKeyTableNearFull": {"ratelimit_authz_counter_live_keys", "ratelimit_authz_counter_max_keys"},
		"RatelimitAuthzNotReady":         {"ratelimit_authz_ready"},
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			names, ok := want[r.Alert]
			if !ok {
				continue
			}
			delete(want, r.Alert)
			used := metricNames(t, r.Alert, r.Expr)
			for _, n := range names {
				if !slices.Contains(used, n) {
					t.Errorf("%s does not read %s: %s", r.Alert, n, r.Expr)
				}
			}
			if regexp.MustCompile(`\d{4,}`).MatchString(r.Expr) {
				t.Errorf("%s has a hard-coded bound: %s", r.Alert, r.Expr)
			}
		}
	}
	for a := range want {
		t.Errorf("no alert %s", a)
	}
}

// TestDashboard: the dashboard decodes strictly, its panels fit Grafana's
// 24-column grid without overlapping, every query names the data source
// variable and parses as PromQL, and it covers what the issue lists.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatal("no uid, title or panels")
	}
	ids := map[int]bool{}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if !slices.Contains([]string{"row", "timeseries", "stat"}, p.Type) {
			t.Errorf("panel %q: type %q", p.Title, p.Type)
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				used[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: no query on the datasource variable", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if refs[tg.RefID] || tg.RefID == "" {
				t.Errorf("panel %q: refId %q empty or twice", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
		}
	}
	for where, e := range dashboardExprs(t, d) {
		if _, err := promql.ParseExpr(e); err != nil {
			t.Errorf("%s: %v\n%s", where, err, e)
		}
	}
	// What the dashboard must show.
	all := ""
	for _, e := range dashboardExprs(t, d) {
		all += e + "\n"
	}
	for what, metric := range map[string]string{
		"checks by decision and bucket": "ratelimit_authz_checks_total",
		"denials":                       `decision="denied"`,
		"check latency":                 "ratelimit_authz_check_duration_seconds_bucket",
		"replication health":            "ratelimit_authz_replicate_connected",
		"replication lag":               "ratelimit_authz_replicate_publish_duration_seconds_bucket",
		"peers":                         "ratelimit_authz_replicate_peers",
		"skew":                          "ratelimit_authz_replicate_clock_skew_seconds",
		"overrides state":               "ratelimit_authz_overrides_degraded",
		"key-table fill":                "ratelimit_authz_counter_live_keys",
		"key-table bound":               "ratelimit_authz_counter_max_keys",
		"configuration reloads":         "ratelimit_authz_config_reloads_total",
		"last reload applied":           "ratelimit_authz_config_last_reload_successful",
	} {
		if !strings.Contains(all, metric) {
			t.Errorf("the dashboard does not show %s (%s)", what, metric)
		}
	}
}

// metricNames returns the metric names an expression selects.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				t.Errorf("%s: a selector without a metric name: %s", where, vs)
			}
			names = append(names, name)
		}
		return nil
	})
	return names
}

// usedMetrics maps every metric the rules and the dashboard name to where.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			for _, n := range metricNames(t, r.Alert, r.Expr) {
				used[n] = append(used[n], "alert "+r.Alert)
			}
		}
	}
	for where, e := range dashboardExprs(t, loadDashboard(t)) {
		for _, n := range metricNames(t, where, e) {
			used[n] = append(used[n], where)
		}
	}
	return used
}

// startNode runs the server with the shipped configuration on free ports
// (gRPC, HTTP; no lean or admin listener), env added, and waits until it
// is ready; it is stopped when the test ends.
func startNode(ctx context.Context, t *testing.T, env ...string) (addrs []string, node *proc.Process) {
	t.Helper()
	addrs, err := freeport.Addrs(2)
	if err != nil {
		t.Fatal(err)
	}
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	node, err = proc.Start(ctx, proc.Config{
		Name: "node", Path: serverBin, Args: []string{"serve"}, LogDir: t.TempDir(), Lifetime: 3 * time.Minute,
		Env: append([]string{
			"RATELIMIT_AUTHZ_CONFIG=" + filepath.Join(root, "config", "ratelimit.yaml"),
			"RATELIMIT_AUTHZ_GRPC_ADDR=" + addrs[0],
			"RATELIMIT_AUTHZ_HTTP_ADDR=" + addrs[1],
			"RATELIMIT_AUTHZ_CHECK_ADDR=off",
			"RATELIMIT_AUTHZ_ADMIN_ADDR=off",
			"RATELIMIT_AUTHZ_DRAIN_DELAY=100ms",
		}, env...),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Stop() })
	if err := node.WaitHTTP200(ctx, "http://"+addrs[1]+"/readyz"); err != nil {
		t.Fatalf("node: %v\n%s", err, node.Tail(30))
	}
	return addrs, node
}

// TestMetricsExistOnARealNode starts a real node in the cluster backend
// with tenant overrides (a real nats-server, a real Postgres migrated by
// the binary), sends it Checks, scrapes /metrics, and fails when the rules
// or the dashboard name a metric it does not export.
func TestMetricsExistOnARealNode(t *testing.T) {
	nats := testnats.StartProcess(t)
	pg := testpg.Start(t)
	dbURL := pg.CreateDatabase(t, "monitoring")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	migrate, err := proc.Start(ctx, proc.Config{Name: "migrate", Path: serverBin, Args: []string{"migrate"},
		Env: []string{"DATABASE_URL=" + dbURL}, LogDir: t.TempDir(), Lifetime: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	<-migrate.Done()
	if err := migrate.Err(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, migrate.Tail(20))
	}
	addrs, node := startNode(ctx, t,
		"RATELIMIT_AUTHZ_CLUSTER_KEY=MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
		"NATS_URL="+nats.URL(),
		"DATABASE_URL="+dbURL)
	serverbin.AwayFromMinuteEdge()
	if _, _, err := serverbin.DenyToken(ctx, addrs[0], "198.51.100.30", 1000); err != nil {
		t.Fatalf("checks: %v\n%s", err, node.Tail(30))
	}
	samples, err := scrape.Get(&http.Client{Timeout: 10 * time.Second}, "http://"+addrs[1]+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range samples {
		exported[s.Name] = true
	}
	// The node is what the alerts assume: connected, overrides from Postgres.
	if v, ok := samples.Get("ratelimit_authz_replicate_connected"); !ok || v != 1 {
		t.Errorf("replicate_connected %v %v: the node should be connected to NATS", v, ok)
	}
	if v, ok := samples.Match("ratelimit_authz_overrides_source", "source", "postgres"); !ok || v != 1 {
		t.Errorf("overrides_source{source=postgres} %v %v: the node should read overrides from Postgres", v, ok)
	}
	used := usedMetrics(t)
	if len(used) < 20 {
		t.Fatalf("%d metrics used: fewer than the dashboard shows", len(used))
	}
	for name, where := range used {
		if _, ok := external[name]; ok {
			continue
		}
		if !exported[name] {
			t.Errorf("metric %s (%s) is not exported by a node with NATS and Postgres", name, strings.Join(where, ", "))
		}
	}
}

// TestMetricsDocumented: every metric of the node the rules and the
// dashboard use is listed in docs/metrics.md.
func TestMetricsDocumented(t *testing.T) {
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		t.Fatalf("reading the metrics reference: %v", err)
	}
	section := string(b)
	subsystem := regexp.MustCompile(`^ratelimit_authz_[a-z]+_`)
	for name := range usedMetrics(t) {
		if _, ok := external[name]; ok {
			continue
		}
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} { // a histogram's series
			if b := strings.TrimSuffix(name, suffix); b != name && strings.HasSuffix(b, "_seconds") {
				base = b
			}
		}
		if strings.Contains(section, "`"+base+"`") {
			continue
		}
		// "`ratelimit_authz_replicate_batches_sent_total` / `…_entries_sent_total`"
		if p := subsystem.FindString(base); p != "" && strings.Contains(section, "`…_"+strings.TrimPrefix(base, p)+"`") {
			continue
		}
		t.Errorf("metric %s is not in docs/metrics.md", base)
	}
}

// TestRunbooks: every alert's runbook_url points at a section of
// docs/operations.md that exists (GitHub's heading anchors).
func TestRunbooks(t *testing.T) {
	root, err := serverbin.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "#") {
			h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			h = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(h, "")
			anchors[strings.ReplaceAll(h, " ", "-")] = true
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			u := r.Annotations["runbook_url"]
			_, anchor, ok := strings.Cut(u, "docs/operations.md#")
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q: want …docs/operations.md#%s", r.Alert, u, strings.ToLower(r.Alert))
				continue
			}
			if !anchors[anchor] {
				t.Errorf("%s: docs/operations.md has no section %q", r.Alert, anchor)
			}
		}
	}
}
