package match

import (
	"slices"
	"testing"
)

func TestHeaderNames(t *testing.T) {
	cfg := exampleConfig()
	cfg.Buckets = append(cfg.Buckets, Bucket{Name: "by_key", Key: KeySpec{Kind: KeyHeader, Name: "x-api-key"}})
	cfg.TrustedHops = 1
	cfg.UseExternalAddressHeader = true
	e := mustNew(t, cfg)
	want := []string{"x-envoy-external-address", "x-forwarded-for", "x-tenant-id", "x-login-account", "x-envoy-auth-partial-body", "content-length", "content-type", "x-api-key"}
	if got := e.HeaderNames(); !slices.Equal(got, want) {
		t.Fatalf("HeaderNames = %q, want %q", got, want)
	}
	if !e.WantsBody() {
		t.Fatal("an account body field: the body is wanted")
	}

	cfg = exampleConfig()
	cfg.AccountBodyField = ""
	cfg.Buckets = cfg.Buckets[:bLoginIP+1] // no account bucket
	cfg.Routes = cfg.Routes[:rAdminLogin]
	e = mustNew(t, cfg)
	if got := e.HeaderNames(); !slices.Equal(got, []string{"x-tenant-id"}) {
		t.Fatalf("HeaderNames = %q", got)
	}
	if e.WantsBody() {
		t.Fatal("no account bucket: the body is not wanted")
	}
	// Cost headers are read by the caller: listed, once, after the rest.
	cfg.CostHeaders = []string{"x-cost", "content-length", "x-tenant-id"}
	e = mustNew(t, cfg)
	if got := e.HeaderNames(); !slices.Equal(got, []string{"x-tenant-id", "x-cost", "content-length"}) {
		t.Fatalf("HeaderNames with cost headers = %q", got)
	}
	cfg.CostHeaders = []string{"X-Cost"}
	if _, err := New(cfg); err == nil {
		t.Fatal("an uppercase cost header was accepted")
	}
	if got := (&Engine{}).HeaderNames(); len(got) != 0 {
		t.Fatalf("zero Engine reads %q", got)
	}
}
