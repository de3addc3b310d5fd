package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestQuotaCostThroughEnvoy: the shipped quota bootstrap and
// configuration, but the activity_create mapping entry with cost: 5
// (docs/rlqs.md, Costs): every request Envoy reports spends 5 of the
// tenant's 100 a second, so Envoy's quota filter admits about 20 requests
// a second of a tenant offered 40.
func TestQuotaCostThroughEnvoy(t *testing.T) {
	const cost = 5
	src, err := os.ReadFile(serverConfigPath(t))
	if err != nil {
		t.Fatal(err)
	}
	const entry = "{ match: { name: activity_create }, bucket: activity_create, key: tenant }"
	if strings.Count(string(src), entry) != 1 {
		t.Fatalf("the server config has no line %q", entry)
	}
	cfg := filepath.Join(t.TempDir(), "ratelimit.yaml")
	costly := strings.Replace(string(src), entry, "{ match: { name: activity_create }, bucket: activity_create, key: tenant, cost: 5 }", 1)
	if err := os.WriteFile(cfg, []byte(costly), 0o644); err != nil {
		t.Fatal(err)
	}
	s := prepareStack(t, 1)
	s.startServer(serverBinary(t), cfg)
	s.envoy = s.quotaEnvoyAt(t, "envoy", s.addrs.Admin, s.addrs.Listener, s.addrs.Authz)
	limit := activityLimit / cost
	const tenant = "quota-cost"
	l := s.startLoad(tenant, 2*limit)
	defer l.stop()
	start := nextWindow()
	ws, off := quotaWindows(t, s.up, []*load{l}, tenant, start, 6)
	t.Logf("the first 6 windows of the tenant's load: %s", windowsLine(ws, off))
	checkQuotaWindows(t, "cost 5 at 40/s, from the second window", ws[1:], off[1:], limit)
	l.checkNoFailures(t, "cost 5", start, start.Add(6*time.Second))
}
