package configfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
)

// A File reads its path; a missing default path is the shipped default,
// a missing path asked for is an error.
func TestFileLoad(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if _, _, err := (configfile.File{Path: missing, Explicit: true}).Load(); err == nil {
		t.Error("a missing file asked for loaded")
	}
	f := configfile.File{Path: missing}
	r, source, err := f.Load()
	if err != nil || source != config.Name || len(r.Buckets) == 0 || !f.Shipped() {
		t.Errorf("a missing default path: %v from %q (shipped %v)", err, source, f.Shipped())
	}
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte("keys: {tenant_header: x-tenant-id}\nbuckets:\n  b: {limit: 1, per: 1s, key: tenant}\nroutes:\n  - {path: /a, buckets: [b]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f = configfile.File{Path: path}
	if r, source, err := f.Load(); err != nil || source != path || len(r.Buckets) != 1 || f.Shipped() {
		t.Errorf("a file at the default path: %v from %q", err, source)
	}
	if err := os.WriteFile(path, []byte("buckets: ["), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Load(); err == nil {
		t.Error("a broken file at the default path loaded (the shipped default must not stand in for it)")
	}
}
