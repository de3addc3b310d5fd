package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/freeport"
	"github.com/ratelimit-authz/ratelimit-authz/internal/logbuf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

func shipped(t *testing.T) *configfile.Rules {
	t.Helper()
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func parseRules(t *testing.T, text string) *configfile.Rules {
	t.Helper()
	r, err := configfile.Parse([]byte(text), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// local is the configuration of a local node on free loopback ports.
func local(r *configfile.Rules) Config {
	return Config{Rules: r, Version: "v-test", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"}
}

// running is a node whose Run runs until the test ends (or stop).
type running struct {
	*Node
	logs *logbuf.Buffer
	stop func() error // ends Run and returns its error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	logs := &logbuf.Buffer{}
	n, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	var stopped bool
	var runErr error
	stop := func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(20 * time.Second):
				t.Fatalf("Run did not return; log:\n%s", logs)
			}
		}
		return runErr
	}
	t.Cleanup(func() { stop() })
	return &running{Node: n, logs: logs, stop: stop}
}

// request is a CheckRequest as Envoy sends it for method and path, with
// headers (lowercase names).
func request(method, path string, headers map[string]string) *authv3.CheckRequest {
	h := map[string]string{":method": method, ":path": path}
	for k, v := range headers {
		h[k] = v
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: method, Path: path, Headers: h}},
	}}
}

// waitHealth waits until the node behind conn reports want.
func waitHealth(t *testing.T, conn *grpc.ClientConn, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != want {
			return fmt.Errorf("health %v %v, want %v", hc, err, want)
		}
		return nil
	})
}

func dial(t *testing.T, addr net.Addr) (authv3.AuthorizationClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn), conn
}

func allowed(t *testing.T, c authv3.AuthorizationClient, tenant string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, request("POST", "/api/activities", map[string]string{"x-tenant-id": tenant}))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return resp.GetStatus().GetCode() == int32(codes.OK)
}

// listenable reports whether addr can be bound, that is no node holds it.
func listenable(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return l.Close()
}

// A local node from the shipped rules on port 0: the accessors give the
// bound addresses as soon as New returns, it answers checks and serves
// its metrics, and Run releases every port when its context ends.
func TestLocalNode(t *testing.T) {
	cfg := local(shipped(t))
	cfg.AccessLogAddr, cfg.PprofAddr = "127.0.0.1:0", "127.0.0.1:0"
	n := start(t, cfg)
	addrs := map[string]net.Addr{"grpc": n.GRPCAddr(), "access log": n.AccessLogAddr(), "http": n.HTTPAddr(), "pprof": n.PprofAddr()}
	seen := map[string]string{}
	for name, a := range addrs {
		if a == nil {
			t.Fatalf("%s: no address", name)
		}
		if _, port, _ := net.SplitHostPort(a.String()); port == "0" {
			t.Errorf("%s: %s is not a bound address", name, a)
		}
		if other, dup := seen[a.String()]; dup {
			t.Errorf("%s and %s share %s", name, other, a)
		}
		seen[a.String()] = name
	}

	client, conn := dial(t, n.GRPCAddr())
	waitHealth(t, conn, healthpb.HealthCheckResponse_SERVING)
	if !allowed(t, client, "acme") {
		t.Fatal("the first check of a tenant denied")
	}
	http := "http://" + n.HTTPAddr().String()
	if code, body := scrape.Page(t, http+"/readyz"); code != 200 || !strings.Contains(body, overridesOff) {
		t.Errorf("readyz %d %q", code, body)
	}
	if code, body := scrape.Page(t, "http://"+n.PprofAddr().String()+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof %d", code)
	}
	_, page := scrape.Page(t, http+"/metrics")
	m, err := scrape.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`ratelimit_authz_build_info{version="v-test"}`:                              1,
		"ratelimit_authz_counter_live_keys":                                         1,
		"ratelimit_authz_counter_max_keys":                                          1_000_000, // the shipped counter.max_keys
		"ratelimit_authz_counter_reserved_keys":                                     100_000,   // its default tenth
		"ratelimit_authz_counter_keys_refused_total":                                0,
		`ratelimit_authz_checks_total{bucket="activity_create",decision="allowed"}`: 1,
	} {
		if got, ok := m.Get(series); !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := m.Get(name); !ok {
			t.Errorf("no %s: the Go and process collectors are missing", name)
		}
	}
	if !strings.Contains(n.logs.String(), "counter backend: local") {
		t.Errorf("no backend line:\n%s", n.logs)
	}

	if err := n.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for name, a := range addrs {
		if err := listenable(a.String()); err != nil {
			t.Errorf("%s still held after Run: %v", name, err)
		}
	}
}

func TestOptionalListenersOff(t *testing.T) {
	n, err := New(context.Background(), local(shipped(t)), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if a := n.AccessLogAddr(); a != nil {
		t.Errorf("access-log address %v without AccessLogAddr", a)
	}
	if a := n.PprofAddr(); a != nil {
		t.Errorf("pprof address %v without PprofAddr", a)
	}
}

// Close releases a node that never ran, and may be called again; Run
// may be called once.
func TestCloseAndRunOnce(t *testing.T) {
	n, err := New(context.Background(), local(shipped(t)), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr := n.GRPCAddr().String(), n.HTTPAddr().String()
	if listenable(grpcAddr) == nil {
		t.Fatal("the gRPC address is not held after New")
	}
	n.Close()
	n.Close()
	for _, a := range []string{grpcAddr, httpAddr} {
		if err := listenable(a); err != nil {
			t.Errorf("%s still held after Close: %v", a, err)
		}
	}

	r := start(t, local(shipped(t)))
	// Served: the first Run has begun.
	if code, _ := scrape.Page(t, "http://"+r.HTTPAddr().String()+"/healthz"); code != 200 {
		t.Fatalf("healthz %d", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // should the second Run run, it returns at once
	if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a second Run: %v", err)
	}
	if err := r.stop(); err != nil {
		t.Errorf("the first Run: %v", err)
	}
}

// New refuses what it cannot serve and then holds no port.
func TestNewRefuses(t *testing.T) {
	r := shipped(t)
	log := slog.New(slog.DiscardHandler)
	if _, err := New(context.Background(), local(r), nil); err == nil {
		t.Error("no logger accepted")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	grpcAddr, httpAddr := freeport.TestAddr(t), freeport.TestAddr(t)
	for name, tc := range map[string]struct {
		edit func(*Config)
		want string
	}{
		"no rules":             {func(c *Config) { c.Rules = nil }, "no rules"},
		"negative sweep":       {func(c *Config) { c.SweepInterval = -time.Second }, "sweep interval"},
		"cluster without URL":  {func(c *Config) { c.Cluster = &Cluster{} }, "NATS URL"},
		"negative sync":        {func(c *Config) { c.Cluster = &Cluster{URL: "nats://127.0.0.1:1", SyncInterval: -1} }, "must not be negative"},
		"bad node id":          {func(c *Config) { c.Cluster = &Cluster{URL: "nats://127.0.0.1:1", NodeID: "a b"} }, "node id"},
		"pprof address in use": {func(c *Config) { c.PprofAddr = taken.Addr().String() }, "listen pprof"},
		"same address twice":   {func(c *Config) { c.PprofAddr = c.HTTPAddr }, "own address"},
	} {
		cfg := local(r)
		cfg.GRPCAddr, cfg.HTTPAddr = grpcAddr, httpAddr
		tc.edit(&cfg)
		n, err := New(context.Background(), cfg, log)
		if err == nil {
			n.Close()
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		for _, a := range []string{grpcAddr, httpAddr} {
			if err := listenable(a); err != nil {
				t.Errorf("%s: %s held after New failed: %v", name, a, err)
			}
		}
	}
}

// The key table's bounds are exported as configured, so that a dashboard
// or an alert divides live_keys by the bound in force; without failure
// buckets nothing is reserved.
func TestCounterBoundsExported(t *testing.T) {
	for _, c := range []struct {
		counter, buckets  string
		maxKeys, reserved float64
	}{
		{"counter: {max_keys: 5000, reserved_keys: 123}\n", "  login_ip: {key: ip, count: failures}\n", 5000, 123},
		{"counter: {max_keys: 5000}\n", "  login_ip: {key: ip, count: failures}\n", 5000, 500},
		{"counter: {max_keys: 777}\n", "", 777, 0},
	} {
		r := parseRules(t, "keys: {tenant_header: x-tenant-id}\n"+c.counter+
			"buckets:\n  activity_create: {limit: 10, per: 1h, key: tenant}\n"+c.buckets+
			"routes:\n  - {method: POST, path: /a, buckets: [activity_create]}\n")
		n, err := New(context.Background(), local(r), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		n.Close()
		if got := scrape.Must(t, n.Gatherer(), "ratelimit_authz_counter_max_keys"); got != c.maxKeys {
			t.Errorf("%q: max_keys %v, want %v", c.counter, got, c.maxKeys)
		}
		if got := scrape.Must(t, n.Gatherer(), "ratelimit_authz_counter_reserved_keys"); got != c.reserved {
			t.Errorf("%q %q: reserved_keys %v, want %v", c.counter, c.buckets, got, c.reserved)
		}
	}
}

func TestCounterTracksOnlyInCluster(t *testing.T) {
	if counterConfig(counter.Config{MaxKeys: 7}, false).Track {
		t.Error("a local node tracks changes")
	}
	if c := counterConfig(counter.Config{MaxKeys: 7}, true); !c.Track || c.MaxKeys != 7 {
		t.Errorf("a cluster node's counter: %+v", c)
	}
}

func TestPeerBoundsFromRules(t *testing.T) {
	r := parseRules(t, `keys: {tenant_header: x-tenant-id}
buckets:
  activity_create: {limit: 100, per: 1s, key: tenant, overridable: true}
  login_ip: {key: ip, count: failures}
  custom: {key: ip}
routes:
  - {method: POST, path: /a, buckets: [activity_create, login_ip]}
  - {method: POST, path: /b, buckets: [custom], defaults: {custom: {limit: 9, per: 10s}}}
  - {method: POST, path: /c, buckets: [custom]}
`)
	snap, err := snapshot.Compile(Sources{Rules: r})
	if err != nil {
		t.Fatal(err)
	}
	bs := replicationBuckets(snap)
	for _, c := range []struct {
		bucket string
		scale  int64
		want   int64
		ok     bool
	}{
		{"activity_create", 1000, snapshot.BoundFor(counter.MaxLimit), true}, // own 100/s, and overrides
		{"activity_create", 3_600_000, snapshot.BoundFor(counter.MaxLimit), true},
		{"activity_create", 2000, 0, false},
		{"login_ip", 60_000, 5 * snapshot.PeerCountFactor, true}, // built-in 5/min
		{"login_ip", 1000, 0, false},
		{"custom", 10_000, 9 * snapshot.PeerCountFactor, true}, // its route default
		{"custom", 60_000, 0, false},
	} {
		b := bs[r.BucketIndex(c.bucket)]
		if b.Name != c.bucket || b.ID != snap.Buckets[r.BucketIndex(c.bucket)].ID {
			t.Fatalf("replicated bucket %+v for %s", b, c.bucket)
		}
		got, ok := b.Bounds[c.scale]
		if got != c.want || ok != c.ok {
			t.Errorf("%s at %d ms: %d, %v; want %d, %v", c.bucket, c.scale, got, ok, c.want, c.ok)
		}
	}
}

const clusterRules = `keys:
  tenant_header: x-tenant-id
buckets:
  activity_create: {limit: 10, per: 1h, key: tenant}
routes:
  - {method: POST, path: /api/activities, buckets: [activity_create]}
`

// The shutdown order: the replicator stops after the server, so checks
// answered while a node drains reach its peers in the final batch.
func TestClusterFinalBatchCarriesTheDrain(t *testing.T) {
	srv := testnats.Run(t)
	r := parseRules(t, clusterRules)
	cluster := func(id string) Config {
		cfg := local(r)
		cfg.DrainDelay = 500 * time.Millisecond
		cfg.Cluster = &Cluster{URL: srv.ClientURL(), NodeID: id, SyncInterval: 50 * time.Millisecond}
		return cfg
	}
	a, b := start(t, cluster("a")), start(t, cluster("b"))
	ac, aconn := dial(t, a.GRPCAddr())
	bc, _ := dial(t, b.GRPCAddr())
	for _, n := range []*running{a, b} {
		poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
			if code, _ := scrape.Page(t, "http://"+n.HTTPAddr().String()+"/readyz"); code != 200 {
				return errors.New("not ready")
			}
			return nil
		})
	}
	for i := range 3 {
		if !allowed(t, ac, "acme") {
			t.Fatalf("a: check %d denied", i)
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- a.stop() }()
	// NOT_SERVING: a drains, its checks are still answered.
	waitHealth(t, aconn, healthpb.HealthCheckResponse_NOT_SERVING)
	for i := range 4 {
		if !poll.Soon(2*time.Second, 2*time.Millisecond, func() bool { return allowed(t, ac, "acme") }) {
			t.Fatalf("a: check %d during the drain denied", i)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatalf("a: Run: %v", err)
	}
	if !strings.Contains(a.logs.String(), "final batch published") {
		t.Fatalf("a: no final batch:\n%s", a.logs)
	}
	sent, ok, err := scrape.Gathered(a.Gatherer(), "ratelimit_authz_replicate_batches_sent_total")
	if err != nil || !ok || sent < 1 {
		t.Fatalf("a: batches sent %v %v %v", sent, ok, err)
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		got, _, err := scrape.Gathered(b.Gatherer(), "ratelimit_authz_replicate_batches_received_total")
		if err != nil || got < sent {
			return fmt.Errorf("b merged %v of a's %v batches (%v)", got, sent, err)
		}
		return nil
	})
	admitted := poll.Count(500*time.Millisecond, 2*time.Millisecond, func() bool { return allowed(t, bc, "acme") })
	if admitted != 3 {
		t.Errorf("b admitted %d after a's 3 + 4 during its drain of 10, want 3", admitted)
	}
}
