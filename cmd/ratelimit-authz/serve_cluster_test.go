package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc/codes"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/scrape"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

func TestClusterFlagErrors(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(cert, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown backend", []string{"--backend", "redis"}, nil, `--backend "redis"`},
		{"cluster without NATS", []string{"--backend", "cluster"}, nil, "needs --nats-url"},
		{"cluster without NATS, env", nil, map[string]string{"RATE_LIMIT_BACKEND": "cluster"}, "needs --nats-url"},
		{"sync interval", []string{"--nats-url", "nats://127.0.0.1:1", "--sync-interval", "0s"}, nil, "--sync-interval must be positive"},
		{"warm start", nil, map[string]string{"NATS_URL": "nats://127.0.0.1:1", "RATELIMIT_AUTHZ_WARM_START_TIMEOUT": "-1s"}, "--warm-start-timeout must be positive"},
		{"cert without key", []string{"--nats-url", "nats://x", "--nats-tls-cert", cert}, nil, "go together"},
		{"missing creds file", []string{"--nats-url", "nats://x", "--nats-creds", filepath.Join(dir, "nope.creds")}, nil, "--nats-creds"},
		{"user and token", []string{"--nats-url", "nats://x", "--nats-user", "u"}, map[string]string{"NATS_TOKEN": "t"}, "exclude each other"},
	}
	for _, tt := range tests {
		var out, errOut strings.Builder
		err := run(context.Background(), append([]string{"serve"}, tt.args...), env(tt.env), &out, &errOut)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want exit 2 with %q", tt.name, err, tt.want)
		}
	}
}

func TestClusterBackendChoice(t *testing.T) {
	tests := []struct {
		backend, url, want string
	}{
		{"", "", backendLocal},
		{"", "nats://127.0.0.1:4222", backendCluster},
		{"local", "nats://127.0.0.1:4222", backendLocal},
		{"cluster", "nats://127.0.0.1:4222", backendCluster},
	}
	for _, tt := range tests {
		c := clusterConfig{backend: tt.backend, natsURL: tt.url, syncInterval: time.Second, warmStartTimeout: time.Second}
		if err := c.resolve(env(nil)); err != nil {
			t.Fatalf("%+v: %v", tt, err)
		}
		nc, err := c.nodeCluster()
		if err != nil {
			t.Fatal(err)
		}
		if c.backend != tt.want || (nc != nil) != (tt.want == backendCluster) {
			t.Errorf("backend %q with URL %q: %q, want %q", tt.backend, tt.url, c.backend, tt.want)
		}
	}
	c := clusterConfig{natsUser: "u"}
	c.resolve(env(map[string]string{"NATS_PASSWORD": "p"}))
	if opts, err := c.natsOptions(); err != nil || len(opts) != 1 || c.natsPassword != "p" {
		t.Errorf("user and password: %d options, %v", len(opts), err)
	}
}

const clusterTestConfig = `keys:
  tenant_header: x-tenant-id
buckets:
  activity_create: {limit: 10, per: 1h, key: tenant}
routes:
  - {method: POST, path: /api/activities, buckets: [activity_create]}
`

// startNode runs `serve` with the cluster backend on free ports (see
// launch); the test waits for its readiness.
func startNode(t *testing.T, id, configPath, natsURL string, extra map[string]string) *servedNode {
	t.Helper()
	vars := map[string]string{
		"RATELIMIT_AUTHZ_DRAIN_DELAY":   "100ms",
		"RATELIMIT_AUTHZ_NODE_ID":       id,
		"RATELIMIT_AUTHZ_SYNC_INTERVAL": "50ms",
		"NATS_URL":                      natsURL,
	}
	for k, v := range extra {
		vars[k] = v
	}
	var args []string
	if configPath != "" {
		args = append(args, "--config", configPath)
	}
	return launch(t, vars, args...)
}

func (n *servedNode) readyz(t *testing.T) int {
	t.Helper()
	code, _ := scrape.Page(t, "http://"+n.http+"/readyz")
	return code
}

func (n *servedNode) waitReady(t *testing.T) {
	t.Helper()
	poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
		if c := n.readyz(t); c != 200 {
			return fmt.Errorf("%s: readyz %d", n.id, c)
		}
		return nil
	})
}

// metrics reads the node's /metrics page.
func (n *servedNode) metrics(t *testing.T) scrape.Samples {
	t.Helper()
	_, body := scrape.Page(t, "http://"+n.http+"/metrics")
	page, err := scrape.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s /metrics: %v", n.id, err)
	}
	return page
}

// metric reads one unlabelled sample from /metrics; the series must exist.
func (n *servedNode) metric(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := n.metrics(t).Get(name)
	if !ok {
		t.Fatalf("%s /metrics has no series %s", n.id, name)
	}
	return v
}

func (n *servedNode) check(t *testing.T, tenant string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.client.Check(ctx, activity(tenant))
	if err != nil {
		t.Fatalf("%s: Check: %v", n.id, err)
	}
	return resp.GetStatus().GetCode() == int32(codes.OK)
}

// synced waits until from has published all its changes and to has
// merged every batch from has sent.
func synced(t *testing.T, from, to *servedNode) {
	t.Helper()
	// Twice in a row, 10 ms apart: a tick caught between clearing the
	// pending entries and counting its batch as sent must not pass.
	holds := 0
	poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
		if err := syncedOnce(t, from, to); err != nil {
			holds = 0
			return err
		}
		if holds++; holds < 2 {
			return errors.New("once")
		}
		return nil
	})
}

func syncedOnce(t *testing.T, from, to *servedNode) error {
	if p := from.metric(t, "ratelimit_authz_replicate_pending_entries"); p != 0 {
		return fmt.Errorf("%s: %v entries pending", from.id, p)
	}
	sent := from.metric(t, "ratelimit_authz_replicate_batches_sent_total")
	if got := to.metric(t, "ratelimit_authz_replicate_batches_received_total"); got < sent || sent < 1 {
		return fmt.Errorf("%s sent %v batches, %s merged %v", from.id, sent, to.id, got)
	}
	return nil
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ratelimit.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeCluster runs two `serve` nodes on one NATS: one budget.
func TestServeCluster(t *testing.T) {
	srv := testnats.Run(t)
	cfg := writeConfig(t, clusterTestConfig)
	a := startNode(t, "a", cfg, srv.ClientURL(), nil)
	b := startNode(t, "b", cfg, srv.ClientURL(), nil)
	a.waitReady(t)
	b.waitReady(t)
	for _, n := range []*servedNode{a, b} {
		if !strings.Contains(n.logs.String(), "counter backend: cluster") {
			t.Errorf("%s: no backend line in the log:\n%s", n.id, n.logs)
		}
		if got := n.metric(t, "ratelimit_authz_replicate_connected"); got != 1 {
			t.Errorf("%s: connected %v", n.id, got)
		}
	}
	for i := range 6 {
		if !poll.Soon(2*time.Second, 2*time.Millisecond, func() bool { return a.check(t, "acme") }) {
			t.Fatalf("a: check %d denied", i)
		}
	}
	synced(t, a, b)
	admitted := poll.Count(500*time.Millisecond, 2*time.Millisecond, func() bool { return b.check(t, "acme") })
	if admitted != 4 {
		t.Errorf("b admitted %d after a's 6 of 10, want 4", admitted)
	}
	synced(t, b, a)
	if a.check(t, "acme") {
		t.Error("a admits over the cluster's budget")
	}
	for _, n := range []*servedNode{a, b} {
		if err := n.stop(); err != nil {
			t.Errorf("%s: serve returned %v", n.id, err)
		}
		if !strings.Contains(n.logs.String(), "final batch published") {
			t.Errorf("%s: no final batch at shutdown:\n%s", n.id, n.logs)
		}
	}
}

// silentPeer starts a NATS server with a peer that takes sync requests and
// never answers them, so that a node's warm start waits its whole timeout.
// It returns the server's client URL.
func silentPeer(t *testing.T) string {
	t.Helper()
	srv := testnats.Run(t)
	silent, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(silent.Close)
	if _, err := silent.Subscribe("ratelimit.sync", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	return srv.ClientURL()
}

// TestServeReadyAfterWarmStart: a peer that never finishes answering holds
// readiness back until the warm-start deadline, not longer.
func TestServeReadyAfterWarmStart(t *testing.T) {
	url := silentPeer(t)
	a := startNode(t, "a", writeConfig(t, clusterTestConfig), url, map[string]string{"RATELIMIT_AUTHZ_WARM_START_TIMEOUT": "3s"})
	if c := a.readyz(t); c != 503 {
		t.Errorf("readyz %d during the warm start, want 503", c)
	}
	if !a.check(t, "acme") {
		t.Error("checks must be answered during the warm start")
	}
	a.waitReady(t)
	if !strings.Contains(a.logs.String(), `outcome=deadline`) {
		t.Errorf("warm start did not end at its deadline:\n%s", a.logs)
	}
}

func TestClusterKeyAndSecretFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	k1 := strings.Repeat("ab", 32)                       // hex
	k2 := "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=" // base64 of 0..31
	two := write("two.key", "# current, then previous\n"+k1+"\n"+k2+"\n")
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		want  string // error substring; "" = accepted
		nkeys int
	}{
		{"hex key in env", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": k1}, "", 1},
		{"two keys in env", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": k1 + "," + k2}, "", 2},
		{"two keys in a file", []string{"--cluster-key-file", two}, nil, "", 2},
		{"file from env", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY_FILE": two}, "", 2},
		{"short key", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": "c2hvcnQ="}, "decodes to 5 bytes, want 32", 0},
		{"not a key", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": "not a key!"}, "neither 64 hex digits nor base64", 0},
		{"three keys", []string{"--cluster-key-file", write("three.key", k1+"\n"+k2+"\n"+strings.Repeat("cd", 32))}, nil, "at most 2", 0},
		{"same key twice", nil, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": k1 + "," + k1}, "same key", 0},
		{"empty file", []string{"--cluster-key-file", write("empty.key", "\n")}, nil, "empty", 0},
		{"endless password file", []string{"--nats-user", "u", "--nats-password-file", "/dev/zero"}, nil, "not a secret", 0},
		{"missing file", []string{"--cluster-key-file", filepath.Join(dir, "nope")}, nil, "--cluster-key-file", 0},
		{"file and env", []string{"--cluster-key-file", two}, map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": k1}, "exclude each other", 0},
		{"password file and env", []string{"--nats-user", "u", "--nats-password-file", write("pw", "s3cret\n")}, map[string]string{"NATS_PASSWORD": "x"}, "exclude each other", 0},
		{"token file and user", []string{"--nats-user", "u", "--nats-token-file", write("tok", "t0ken\n")}, nil, "exclude each other", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c clusterConfig
			f := newEnvFlags("serve", "", env(tt.env))
			c.addFlags(f)
			if err := f.fs.Parse(append([]string{"--nats-url", "nats://127.0.0.1:1"}, tt.args...)); err != nil {
				t.Fatal(err)
			}
			c.syncInterval, c.warmStartTimeout = time.Second, time.Second
			err := c.resolve(env(tt.env))
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("error %v, want one with %q", err, tt.want)
				}
				if strings.Contains(err.Error(), k1) {
					t.Errorf("the error shows the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(c.clusterKeys) != tt.nkeys {
				t.Errorf("%d keys, want %d", len(c.clusterKeys), tt.nkeys)
			}
		})
	}
	// A password from a file reaches the NATS options.
	c := clusterConfig{natsURL: "nats://127.0.0.1:1", natsUser: "u", natsPasswordFile: write("pw2", "s3cret\n"), syncInterval: time.Second, warmStartTimeout: time.Second}
	if err := c.resolve(env(nil)); err != nil || c.natsPassword != "s3cret" {
		t.Errorf("password from file: %q, %v", c.natsPassword, err)
	}
}

// TestServeClusterSealed: nodes that share a cluster key share one budget;
// a node with another key is not heard, and hears nobody.
func TestServeClusterSealed(t *testing.T) {
	srv := testnats.Run(t)
	cfg := writeConfig(t, clusterTestConfig)
	key := map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": strings.Repeat("11", 32)}
	other := map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": strings.Repeat("22", 32)}
	a := startNode(t, "a", cfg, srv.ClientURL(), key)
	b := startNode(t, "b", cfg, srv.ClientURL(), key)
	x := startNode(t, "x", cfg, srv.ClientURL(), other)
	for _, n := range []*servedNode{a, b, x} {
		n.waitReady(t)
		if strings.Contains(n.logs.String(), "no cluster key") {
			t.Errorf("%s warns of no key although it has one", n.id)
		}
	}
	for i := range 6 {
		if !poll.Soon(2*time.Second, 2*time.Millisecond, func() bool { return a.check(t, "acme") }) {
			t.Fatalf("a: check %d denied", i)
		}
	}
	synced(t, a, b)
	admitted := poll.Count(500*time.Millisecond, 2*time.Millisecond, func() bool { return b.check(t, "acme") })
	if admitted != 4 {
		t.Errorf("b admitted %d after a's 6 of 10, want 4", admitted)
	}
	// x, with another key, dropped every message of a and b as unknown.
	poll.Until(t, 20*time.Second, 10*time.Millisecond, func() error {
		if got := x.metricLabel(t, "ratelimit_authz_replicate_messages_malformed_total", "reason", "unknown_key"); got < 2 {
			return fmt.Errorf("x dropped %v messages of an unknown key", got)
		}
		return nil
	})
	for i := range 10 {
		if !x.check(t, "acme") {
			t.Fatalf("x denied check %d: it counted forged or foreign counts", i)
		}
	}
	if x.check(t, "acme") {
		t.Error("x admits over its own limit")
	}
}

func TestServeClusterWarnsWithoutKey(t *testing.T) {
	srv := testnats.Run(t)
	a := startNode(t, "a", writeConfig(t, clusterTestConfig), srv.ClientURL(), nil)
	a.waitReady(t)
	if !strings.Contains(a.logs.String(), "no cluster key") {
		t.Errorf("no warning about the missing cluster key:\n%s", a.logs)
	}
}

// metricLabel reads the first sample of name whose labels include the
// name/value pairs; -1 when there is none yet.
func (n *servedNode) metricLabel(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	if v, ok := n.metrics(t).Match(name, labels...); ok {
		return v
	}
	return -1
}
