package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
)

// The end-to-end scenario's Envoy: three listeners on the shipped
// bootstrap whose stats envoy() reads, the filter on each as it expects;
// the real Envoy loads it.
func TestEnvoyConfig(t *testing.T) {
	b, err := envoyConfig(root(t), envoyAddrs{Admin: "127.0.0.1:1", On: "127.0.0.1:2", Noop: "127.0.0.1:3", Off: "127.0.0.1:4",
		Authz: "127.0.0.1:5", Check: "127.0.0.1:8", NoopAuthz: "127.0.0.1:6", App: "127.0.0.1:7"})
	if err != nil {
		t.Fatal(err)
	}
	cms, err := envoyconf.Inspect(b)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, c := range cms {
		got[c.Listener] = c.ExtAuthz
	}
	if want := map[string]bool{"authz_on": true, "authz_noop": true, "authz_off": false}; !maps.Equal(got, want) {
		t.Errorf("listeners and their filter %v, want %v", got, want)
	}
	for _, want := range []string{`stat_prefix: "authz_on"`, `stat_prefix: "authz_noop"`, `stat_prefix: "authz_off"`,
		`envoy_grpc: { cluster_name: "noop_authz" }`, "port_value: 6 }", "port_value: 5 }", "port_value: 8 }"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the bootstrap lacks %q", want)
		}
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := envoyconf.Validate(ctx, binaries.InstalledEnvoy(t), path); err != nil {
		t.Fatal(err)
	}
}
