package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/admin"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testnats"
)

// adminGet GETs url with token and returns the status and body.
func adminGet(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// comparable is a /v1/top answer without the instants of the read.
func comparable(t *testing.T, body []byte) admin.TopResponse {
	t.Helper()
	var r admin.TopResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	r.Time = time.Time{}
	for i := range r.Buckets {
		r.Buckets[i].Minute.End = time.Time{}
		if w := r.Buckets[i].Window; w != nil {
			w.End = time.Time{}
		}
	}
	return r
}

// serve with an admin listener and a token: the tenant over its budget
// is first in `top`'s table and in `top --once --json`, which is what
// /v1/top answers; without the token both are refused.
func TestServeAdminAndTop(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("adm1n-t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := serveReady(t, map[string]string{"RATELIMIT_AUTHZ_ADMIN_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_ADMIN_TOKEN_FILE": tokenFile})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hostile := "\x1b[31mred\x1b[0m"
	for i := range 800 {
		tenant := "noisy"
		if i%4 == 0 {
			tenant = hostile
		}
		if _, err := n.client.Check(ctx, activity(tenant)); err != nil {
			t.Fatal(err)
		}
	}
	url := "http://" + n.node.AdminAddr().String()
	if code, _ := adminGet(t, url+"/v1/top", ""); code != http.StatusUnauthorized {
		t.Fatalf("GET /v1/top without the token: %d", code)
	}
	err := run(ctx, []string{"top", "--once", "--admin", url}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("top without the token: %v", err)
	}

	var js bytes.Buffer
	if err := run(ctx, []string{"top", "--once", "--json", "--admin", url, "--admin-token-file", tokenFile, "--bucket", "activity_create"}, env(nil), &js, io.Discard); err != nil {
		t.Fatal(err)
	}
	code, body := adminGet(t, url+"/v1/top?bucket=activity_create&n=10", "adm1n-t0ken")
	if code != 200 {
		t.Fatalf("GET /v1/top: %d", code)
	}
	got, want := comparable(t, js.Bytes()), comparable(t, body)
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(want)
	if !bytes.Equal(gb, wb) {
		t.Errorf("top --once --json:\n%s\n/v1/top:\n%s", gb, wb)
	}
	if d := want.Buckets[0].Minute.TopDenied; len(d) == 0 || d[0].Key != "noisy" {
		t.Errorf("top denied %+v, want noisy first", d)
	}

	var table bytes.Buffer
	if err := run(ctx, []string{"top", "--once", "--admin", url, "--admin-token-file", tokenFile}, env(nil), &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	if strings.Contains(out, "\x1b") || !strings.Contains(out, `\x1b[31mred\x1b[0m`) {
		t.Errorf("a key's escape sequences reach the terminal:\n%q", out)
	}
	lines := strings.Split(out, "\n")
	i := slicesIndexPrefix(lines, "activity_create")
	if i < 0 || i+2 >= len(lines) || !strings.Contains(lines[i+2], "noisy") {
		t.Errorf("noisy is not first under activity_create:\n%s", out)
	}
	if !strings.Contains(lines[i], "(100 / 1s, fixed)") || strings.Contains(out, "e+0") {
		t.Errorf("the bucket's line: %q", lines[i])
	}

	// Refreshing into a pipe (not a terminal): tables one after another,
	// never the codes that clear a screen.
	rctx, rcancel := context.WithTimeout(ctx, 2500*time.Millisecond)
	defer rcancel()
	var piped bytes.Buffer
	if err := run(rctx, []string{"top", "--interval", "1s", "--admin", url, "--admin-token-file", tokenFile}, env(nil), &piped, io.Discard); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(piped.String(), "\x1b") || strings.Count(piped.String(), "--- ") < 2 {
		t.Errorf("top refreshing into a pipe:\n%q", piped.String())
	}
}

func slicesIndexPrefix(lines []string, prefix string) int {
	for i, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

// An admin listener on every interface without a token is refused at
// start; top's flags are checked before anything is fetched.
func TestAdminAndTopUsage(t *testing.T) {
	err := run(context.Background(), []string{"serve", "--admin-addr", "0.0.0.0:0"}, env(map[string]string{
		"RATELIMIT_AUTHZ_GRPC_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_HTTP_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_MEMORY_LIMIT": "off",
		"RATELIMIT_AUTHZ_CHECK_ADDR": "127.0.0.1:0", "RATELIMIT_AUTHZ_CONFIG": "../../config/ratelimit.yaml",
	}), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not loopback requires a bearer token (--admin-token-file)") {
		t.Errorf("serve --admin-addr 0.0.0.0:0 without a token: %v", err)
	}
	if err := run(context.Background(), []string{"serve", "--admin-addr", "off", "--admin-hide-keys"}, env(nil), io.Discard, io.Discard); exitCode(err) != 2 {
		t.Errorf("--admin-hide-keys with the admin listener off: %v", err)
	}
	for _, args := range [][]string{
		{"--once", "--n", "0"}, {"--once", "--n", "101"}, {"--interval", "10ms"}, {"--json"}, {"--once", "--admin", "ftp://x"},
		{"--once", "--admin-addr", "http://"}, {"--once", "--admin-token-file", "/nonexistent"}, {"--once", "extra"},
	} {
		if err := run(context.Background(), append([]string{"top"}, args...), env(nil), io.Discard, io.Discard); exitCode(err) != 2 {
			t.Errorf("top %v: %v, want a usage error", args, err)
		}
	}
	// Nothing listening: top says where the admin listener comes from.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	err = run(context.Background(), []string{"top", "--once", "--admin-addr", closed}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no admin listener at "+closed+" (serve opens it with --admin-addr, by default 127.0.0.1:9095") {
		t.Errorf("top against a closed port: %v", err)
	}
}

// In a sealed cluster of three, `top --cluster --once --json` on one node
// merges the tops of all three: every check of the tenant sent to any
// node is counted once, and no peer is missing.
func TestServeClusterTop(t *testing.T) {
	srv := testnats.Run(t)
	cfg := writeConfig(t, clusterTestConfig)
	vars := map[string]string{"RATELIMIT_AUTHZ_CLUSTER_KEY": strings.Repeat("11", 32), "RATELIMIT_AUTHZ_ADMIN_ADDR": "127.0.0.1:0"}
	var nodes []*servedNode
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, startNode(t, id, cfg, srv.ClientURL(), vars))
	}
	for _, n := range nodes {
		n.waitReady(t)
		for range 20 {
			n.check(t, "noisy")
		}
	}
	url := "http://" + nodes[0].node.AdminAddr().String()
	var got admin.TopResponse
	poll.Until(t, 20*time.Second, 100*time.Millisecond, func() error {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"top", "--once", "--json", "--cluster", "--admin", url}, env(nil), &out, io.Discard); err != nil {
			return err
		}
		got = admin.TopResponse{}
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			return err
		}
		if len(got.Nodes) != 3 || len(got.Missing) != 0 {
			return fmt.Errorf("nodes %v, missing %v", got.Nodes, got.Missing)
		}
		return nil
	})
	m := got.Buckets[0].Minute
	if m.Admitted+m.Denied != 60 || len(m.TopDenied) == 0 || m.TopDenied[0].Key != "noisy" || m.TopDenied[0].Hits != m.Denied {
		t.Errorf("cluster-wide: %d admitted, %d denied, top denied %+v; sent 60 checks of noisy to three nodes", m.Admitted, m.Denied, m.TopDenied)
	}
	var table bytes.Buffer
	if err := run(context.Background(), []string{"top", "--once", "--cluster", "--admin", url}, env(nil), &table, io.Discard); err != nil || !strings.Contains(table.String(), "cluster: 3 node(s)") {
		t.Errorf("top --cluster: %v\n%s", err, table.String())
	}
}
