package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// A node with an admin listener lists, in its bucket's denied top, the
// tenant that sent six times its budget among well-behaved ones.
func TestAdminShowsTheOffender(t *testing.T) {
	cfg := local(shipped(t))
	cfg.Admin = &admin.Config{Addr: "127.0.0.1:0"}
	n := start(t, cfg)
	c, _ := dial(t, n.GRPCAddr())
	for i := range 600 {
		allowed(t, c, "noisy")
		if i%12 == 0 {
			allowed(t, c, fmt.Sprint("calm-", i))
		}
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	resp, err := hc.Get("http://" + n.AdminAddr().String() + "/v1/top?bucket=activity_create&n=3")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var top admin.TopResponse
	if err := json.NewDecoder(resp.Body).Decode(&top); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /v1/top: %d %v", resp.StatusCode, err)
	}
	if len(top.Buckets) != 1 {
		t.Fatalf("buckets %+v", top.Buckets)
	}
	b := top.Buckets[0]
	if b.Limit != 100 || b.WindowMS != 1000 || b.Protocol != "ext_authz" {
		t.Errorf("bucket %+v", b)
	}
	if b.Minute.Admitted+b.Minute.Denied != 650 || b.Minute.Denied == 0 {
		t.Errorf("minute: %d admitted, %d denied; sent 650, 600 of them by one tenant over a 100/s budget", b.Minute.Admitted, b.Minute.Denied)
	}
	if d := b.Minute.TopDenied; len(d) == 0 || d[0].Key != "noisy" || d[0].Hits != b.Minute.Denied {
		t.Errorf("top denied %+v, want noisy with every denial (%d)", d, b.Minute.Denied)
	}
	if mem, ok, err := scrape.Gathered(n.Gatherer(), "ratelimit_authz_top_memory_bytes"); err != nil || !ok || mem <= 0 {
		t.Errorf("ratelimit_authz_top_memory_bytes %v %v %v", mem, ok, err)
	}
}

func TestAdminOffAndUnsafe(t *testing.T) {
	n, err := New(context.Background(), local(shipped(t)), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if a := n.AdminAddr(); a != nil {
		t.Errorf("admin address %v without Admin", a)
	}
	if _, ok, _ := scrape.Gathered(n.Gatherer(), "ratelimit_authz_top_memory_bytes"); ok {
		t.Errorf("the sketch's memory is exported without Admin")
	}
	n.Close()
	cfg := local(shipped(t))
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.Admin = &admin.Config{Addr: "0.0.0.0:0"}
	if _, err := New(context.Background(), cfg, slog.New(slog.DiscardHandler)); !errors.Is(err, admin.ErrUnsafe) {
		t.Fatalf("New with an admin listener on every interface and no token: %v", err)
	}
}

// A cluster node's status page lists its peer by identity, heard from.
func TestAdminPageListsPeers(t *testing.T) {
	srv := testnats.Run(t)
	r := parseRules(t, clusterRules)
	cluster := func(id string) Config {
		cfg := local(r)
		cfg.Cluster = &Cluster{URL: srv.ClientURL(), NodeID: id, SyncInterval: 50 * time.Millisecond}
		cfg.Admin = &admin.Config{Addr: "127.0.0.1:0"}
		return cfg
	}
	a, b := start(t, cluster("node-a")), start(t, cluster("node-b"))
	poll.Until(t, 20*time.Second, 50*time.Millisecond, func() error {
		for _, pair := range [][2]*running{{a, b}, {b, a}} {
			code, page := scrape.Page(t, "http://"+pair[0].AdminAddr().String()+"/")
			id, inc := pair[1].repl.Identity()
			peer := fmt.Sprintf("<td><code>%s</code></td><td><code>%016x</code></td><td>", id, inc)
			if code != 200 || !strings.Contains(page, peer) || strings.Contains(page, "no peer heard from") || !strings.Contains(page, "1 peer(s)") {
				return fmt.Errorf("page %d does not list %s/%016x:\n%s", code, id, inc, page)
			}
		}
		return nil
	})
}

// ?cluster=1 merges the tops of every node that answers and names the one
// that does not (a node without the admin listener keeps no tops).
func TestAdminClusterView(t *testing.T) {
	srv := testnats.Run(t)
	r := parseRules(t, clusterRules)
	cluster := func(id string, withAdmin bool) Config {
		cfg := local(r)
		cfg.Cluster = &Cluster{URL: srv.ClientURL(), NodeID: id, SyncInterval: 50 * time.Millisecond}
		if withAdmin {
			cfg.Admin = &admin.Config{Addr: "127.0.0.1:0"}
		}
		return cfg
	}
	nodes := []*running{start(t, cluster("node-a", true)), start(t, cluster("node-b", true)), start(t, cluster("node-c", false))}
	for _, n := range nodes {
		poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
			if code, _ := scrape.Page(t, "http://"+n.HTTPAddr().String()+"/readyz"); code != 200 {
				return errors.New("not ready")
			}
			return nil
		})
	}
	counts := map[string]int{}
	for i, n := range nodes[:2] {
		c, _ := dial(t, n.GRPCAddr())
		for j := range 20 * (i + 1) {
			allowed(t, c, fmt.Sprint("t-", i, "-", j%3))
			counts[fmt.Sprint("t-", i, "-", j%3)]++
		}
	}
	ids := make([]string, 3)
	for i, n := range nodes {
		id, inc := n.repl.Identity()
		ids[i] = fmt.Sprintf("%s/%016x", id, inc)
	}
	var got admin.TopResponse
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		code, body := scrape.Page(t, "http://"+nodes[0].AdminAddr().String()+"/v1/top?cluster=1&n=10")
		if code != 200 {
			return fmt.Errorf("GET /v1/top?cluster=1: %d %s", code, body)
		}
		got = admin.TopResponse{}
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			return err
		}
		if fmt.Sprint(got.Nodes) != fmt.Sprint(ids[:2]) || fmt.Sprint(got.Missing) != fmt.Sprint(ids[2:]) {
			return fmt.Errorf("nodes %v, missing %v; want %v and %v", got.Nodes, got.Missing, ids[:2], ids[2:])
		}
		return nil
	})
	var total uint64
	listed := map[string]uint64{}
	for _, b := range got.Buckets {
		total += b.Minute.Admitted + b.Minute.Denied
		for _, k := range b.Minute.TopAdmitted {
			listed[k.Key] += k.Hits
		}
		for _, k := range b.Minute.TopDenied {
			listed[k.Key] += k.Hits
		}
	}
	if total != 60 {
		t.Errorf("the cluster's tops count %d hits, sent 60 to the two nodes that answer", total)
	}
	for k, want := range counts {
		if listed[k] != uint64(want) {
			t.Errorf("%s: %d hits listed, sent %d", k, listed[k], want)
		}
	}
}

// The status page shows the configuration's generation and the last
// reload's result with its located problems, and where the tenant
// overrides in effect come from: off without a database, Postgres with
// the overrides it holds once loaded.
func TestAdminPageShowsConfigAndOverrides(t *testing.T) {
	r := shipped(t)
	dbURL := overridesDB(t, Sources{Rules: r}, "big", limits.Override{Bucket: "activity_create", Limit: 500, ScaleMS: 1000})

	page := func(n *running) string {
		t.Helper()
		code, body := scrape.Page(t, "http://"+n.AdminAddr().String()+"/")
		if code != 200 {
			t.Fatalf("GET /: %d", code)
		}
		return body
	}
	has := func(body string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("the page has no %q:\n%s", w, body)
			}
		}
	}

	cfg := local(r)
	cfg.Admin = &admin.Config{Addr: "127.0.0.1:0"}
	off := start(t, cfg)
	has(page(off), `<strong id="generation">1</strong>`, "No reload since start.", `<strong id="overrides-source">off</strong>`)

	cfg.Overrides = Overrides{DatabaseURL: dbURL}
	n := start(t, cfg)
	has(page(n), `<strong id="overrides-source">postgres</strong>`, "postgres, current (1 overrides, 0 key owners)")

	n.cfg.RulesFile = rulesFile(t, "broken.yaml", "buckets:\n  spend: {limit: -1, per: 1s, key: tenant}\n")
	if err := n.ReloadFiles(context.Background(), "test"); err == nil {
		t.Fatal("the broken configuration reloads")
	}
	body := page(n)
	has(body, `<strong id="generation">1</strong>`, "was <strong>refused</strong>", `<table id="reload-problems">`, "<code>"+n.cfg.RulesFile.Path+":2:")

	if err := n.Reload(context.Background(), shipped(t)); err != nil {
		t.Fatal(err)
	}
	body = page(n)
	has(body, `<strong id="generation">2</strong>`, "was applied.")
	if strings.Contains(body, "reload-problems") {
		t.Errorf("the applied reload still shows problems:\n%s", body)
	}
}

// overridesDB starts a Postgres with the overrides schema, stores one
// override of tenant for the overridable buckets of s, and returns the
// database's URL.
func overridesDB(t *testing.T, s Sources, tenant string, o limits.Override) string {
	t.Helper()
	pg := testpg.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := testpg.Connect(t, pg.URL())
	if _, err := overridedb.Migrate(ctx, conn); err != nil {
		t.Fatal(err)
	}
	snap, err := snapshot.Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	store, err := overridedb.NewStore(conn, snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Set(ctx, tenant, o, "test"); err != nil {
		t.Fatal(err)
	}
	return pg.URL()
}
