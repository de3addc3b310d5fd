package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

const (
	syncInterval = "100ms" // the default, written out
	cliTimeout   = 30 * time.Second
)

// cluster is a stack with several ratelimit-authz nodes behind one Envoy
// (one endpoint per node in each of the ratelimit_authz_check and
// ratelimit_authz clusters), one nats-server
// process and one PostgreSQL server with the overrides schema. Every node
// runs the cluster backend and follows the overrides table.
type cluster struct {
	*stack
	owner     *testing.T // the test whose cleanup stops every process
	serverBin string
	config    string

	natsBin    string
	natsAddr   string
	nats       *process
	natsStarts int

	pg  *testpg.Server
	db  string
	sql *pgx.Conn

	nodes []*node
}

// node is one ratelimit-authz process; a restart keeps its addresses
// and node id.
type node struct {
	name     string
	grpcAddr string
	// checkAddr is the lean Check listener, where Envoy's ext_authz
	// filter sends the node's checks; empty: not opened.
	checkAddr string
	httpAddr  string
	adminAddr string // --admin-addr; empty: off
	starts    int
	proc      *process
}

// newCluster starts PostgreSQL (migrated with the CLI), nats-server, n
// nodes and then Envoy, and waits until Envoy's health checks see every
// node. Prerequisites are resolved first, so a missing one skips (or
// fails under CI=true) before anything starts. Every process, including
// those restarted in subtests, is stopped when t ends.
func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	return newClusterWith(t, n, serverConfigPath(t), nil)
}

// newClusterWith is newCluster with the server configuration config and
// the stack changed by edit before anything starts (nil: none), e.g. the
// shipped bootstrap changed by its envoyEdit, or another upstream.
func newClusterWith(t *testing.T, n int, config string, edit func(*stack)) *cluster {
	t.Helper()
	c := &cluster{owner: t, serverBin: serverBinary(t), config: config, natsBin: testnats.Binary(t)}
	c.stack = prepareStack(t, n)
	if edit != nil {
		edit(c.stack)
	}
	c.pg = testpg.Start(t)
	t.Cleanup(func() { // before the log folder's cleanup, which prints it
		if t.Failed() {
			os.WriteFile(filepath.Join(c.logs.dir, "postgres.log"), []byte(c.pg.Log()), 0o644)
		}
	})
	c.db = c.pg.URL()
	c.cli(t, "migrate")

	c.natsAddr = c.spare[0]
	c.startNATS(t)

	for i := range n {
		nd := &node{name: fmt.Sprintf("node-%d", i+1), grpcAddr: c.addrs.Authz[i], checkAddr: c.check[i], httpAddr: c.spare[1+i]}
		c.nodes = append(c.nodes, nd)
		c.startNode(t, nd)
	}
	for _, nd := range c.nodes {
		waitHTTP200(t, nd.proc, "http://"+nd.httpAddr+"/readyz")
	}
	c.startEnvoy()
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		for _, nd := range c.nodes {
			if h := c.checkHealth(t)[nd.checkAddr]; h != "healthy" {
				return fmt.Errorf("envoy: %s (Check %s) health %q", nd.name, nd.checkAddr, h)
			}
		}
		return nil
	})

	c.sql = testpg.Connect(t, c.db)
	return c
}

// cli runs the built binary with args plus --database-url (and, for the
// limits commands, --config), with a timeout; its output is logged and
// appended to cli.log.
func (c *cluster) cli(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	full := append(append([]string{}, args...), "--database-url", c.db)
	if args[0] == "limits" { // migrate has no --config: the schema does not depend on it
		full = append(full, "--config", c.config)
	}
	out, err := exec.CommandContext(ctx, c.serverBin, full...).CombinedOutput()
	if f, ferr := os.OpenFile(filepath.Join(c.logs.dir, "cli.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); ferr == nil {
		fmt.Fprintf(f, "$ ratelimit-authz %s\n%s[exit: %v]\n", strings.Join(args, " "), out, err)
		f.Close()
	}
	if err != nil {
		t.Fatalf("ratelimit-authz %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("ratelimit-authz %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	return string(out)
}

// sqlExec runs one statement on the overrides database.
func (c *cluster) sqlExec(t *testing.T, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.sql.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// startNATS starts nats-server on the cluster's NATS address (again, after
// a kill) and waits until it accepts connections.
func (c *cluster) startNATS(t *testing.T) {
	t.Helper()
	c.natsStarts++
	host, port, _ := net.SplitHostPort(c.natsAddr)
	c.nats = c.logs.startOwned(c.owner, t, fmt.Sprintf("nats-server-%d", c.natsStarts), c.natsBin, "-a", host, "-p", port, "-n", "e2e")
	poll.Until(t, 15*time.Second, 20*time.Millisecond, func() error {
		if c.nats.Exited() {
			t.Fatalf("nats-server exited at start: %v\n%s", c.nats.Err(), c.nats.Tail(20))
		}
		conn, err := net.DialTimeout("tcp", c.natsAddr, time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	})
}

// startNode starts (or restarts) nd with the cluster backend, NATS and
// Postgres; it does not wait for readiness. A restart logs into
// <name>-start<N>.log.
func (c *cluster) startNode(t *testing.T, nd *node) {
	t.Helper()
	nd.starts++
	logName := nd.name
	if nd.starts > 1 {
		logName = fmt.Sprintf("%s-start%d", nd.name, nd.starts)
	}
	args := []string{"serve",
		"--config", c.config,
		"--grpc-addr", nd.grpcAddr,
		"--http-addr", nd.httpAddr,
		"--node-id", nd.name,
		"--nats-url", "nats://" + c.natsAddr,
		"--sync-interval", syncInterval,
		"--database-url", c.db,
		"--drain-delay", "100ms", // keeps the test's shutdown short
		"--log-level", "info", // debug would log every denial
	}
	args = append(args, "--check-addr", cmp.Or(nd.checkAddr, "off"))
	args = append(args, "--admin-addr", cmp.Or(nd.adminAddr, "off"))
	nd.proc = c.logs.startOwned(c.owner, t, logName, c.serverBin, args...)
}

// metric returns the value of one series, written as in the exposition
// format (`name` or `name{label="v",…}` with the labels in order), from
// the node's /metrics; 0 when absent.
func (nd *node) metric(t *testing.T, series string) float64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	return metricOf(t, c, nd.httpAddr, series)
}

// checks returns the node's count of bucket's checks with decision.
func (nd *node) checks(t *testing.T, bucket, decision string) int {
	t.Helper()
	return int(nd.metric(t, fmt.Sprintf(`ratelimit_authz_checks_total{bucket=%q,decision=%q}`, bucket, decision)))
}

// eachNode checks want on every running node's metrics.
func (c *cluster) eachNode(t *testing.T, series string, want float64) error {
	t.Helper()
	for _, nd := range c.nodes {
		if got := nd.metric(t, series); got != want {
			return fmt.Errorf("%s: %s = %v, want %v", nd.name, series, got, want)
		}
	}
	return nil
}

// allowed returns each node's admitted activity_create checks so far.
func (c *cluster) allowed(t *testing.T) []int {
	t.Helper()
	out := make([]int, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.checks(t, "activity_create", "allowed")
	}
	return out
}

// checkHealth returns Envoy's health flags per endpoint of the
// ratelimit_authz_check cluster, where the ext_authz filter sends its
// checks ("healthy", "/failed_active_hc", …).
func (s *stack) checkHealth(t *testing.T) map[string]string {
	t.Helper()
	resp, err := s.client.Get("http://" + s.addrs.Admin + "/clusters")
	if err != nil {
		t.Fatalf("envoy clusters: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		// ratelimit_authz_check::127.0.0.1:40001::health_flags::healthy
		f := strings.Split(sc.Text(), "::")
		if len(f) == 4 && f[0] == envoyconf.ShippedCheckCluster && f[2] == "health_flags" {
			out[f[1]] = f[3]
		}
	}
	return out
}

// statsOf returns Envoy's integer stats matching filter; safe in subtests.
func (s *stack) statsOf(t *testing.T, filter string) map[string]int64 {
	t.Helper()
	stats, err := scrape.EnvoyStats(s.client, "http://"+s.addrs.Admin, filter)
	if err != nil {
		t.Fatalf("envoy stats: %v", err)
	}
	return stats
}

// nextWindow sleeps until the next wall-clock second, the start of the
// next 1 s window, and returns it.
func nextWindow() time.Time {
	b := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(b))
	return b
}

// windows waits until n windows after from have ended and every request
// started in them has finished, and returns what the app saw of tenant in
// each, with the offered counts.
func (c *cluster) windows(t *testing.T, l *load, tenant string, from time.Time, n int) ([]window, []int) {
	t.Helper()
	to := from.Add(time.Duration(n) * time.Second)
	time.Sleep(time.Until(to)) // the end of the last window
	poll.Until(t, 10*time.Second, 5*time.Millisecond, func() error { return l.settled(to) })
	ws := c.up.perWindow(activitiesPath, tenant, from, to)
	return ws, l.offered(tenant, ws)
}

// checkWindows fails t unless every window admitted what bounds allows
// for the requests offered in it.
func checkWindows(t *testing.T, what string, ws []window, offered []int, bounds func(offered int) (lo, hi int)) {
	t.Helper()
	lo, hi := bounds(loadRate)
	t.Logf("%s: admitted/offered per window (second=admitted/offered): %s; admitted %s (bounds at %d/s offered: %d…%d)",
		what, windowsLine(ws, offered), distribution(ws), loadRate, lo, hi)
	for i, w := range ws {
		if lo, hi := bounds(offered[i]); w.admitted < lo || w.admitted > hi {
			t.Errorf("%s: window %s admitted %d (offered %d), want %d…%d",
				what, w.start.Format("15:04:05"), w.admitted, offered[i], lo, hi)
		}
	}
}
