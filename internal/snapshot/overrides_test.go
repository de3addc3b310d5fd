package snapshot_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

func shipped(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return compile(t, r)
}

func TestValidateOverride(t *testing.T) {
	s := shipped(t)
	allowed := "activity_create, inbound, token_generate, upload"
	for _, tc := range []struct {
		o   limits.Override
		err string
	}{
		{o: limits.Override{Bucket: "activity_create", Limit: 200, ScaleMS: 1000}},
		{o: limits.Override{Bucket: "token_generate", Limit: 50, ScaleMS: 60_000}},
		{o: limits.Override{Bucket: "login_ip", Limit: 50, ScaleMS: 60_000}, err: `bucket "login_ip" does not accept tenant overrides; buckets that do: ` + allowed},
		{o: limits.Override{Bucket: "nope", Limit: 50, ScaleMS: 60_000}, err: `unknown bucket "nope"; buckets that accept tenant overrides: ` + allowed},
		{o: limits.Override{Bucket: "upload", Limit: 0, ScaleMS: 1000}, err: "limit 0"},
		{o: limits.Override{Bucket: "upload", Limit: 5, ScaleMS: 1500}, err: "window 1500 ms is not one of 1s, 1m, 1h, 1d"},
	} {
		err := s.ValidateOverride(tc.o)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, limits.ErrInvalid)):
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.err)
		}
	}
	if got := strings.Join(s.OwnerKeyNames(), ","); got != "channel" {
		t.Errorf("owner key names of the shipped config: %s", got)
	}
	if err := s.CheckOwnerKeyName("channel"); err != nil {
		t.Error(err)
	}
	if err := s.CheckOwnerKeyName("header:x-app"); err == nil || !errors.Is(err, limits.ErrInvalid) || !strings.Contains(err.Error(), "key names that take owners: channel") {
		t.Errorf("an unused key name: %v", err)
	}
}

// Overrides of an overridable RLS rule are filed under the rule's name;
// the rules file's buckets keep theirs, overridable or not; other RLS
// buckets and the participants counts are no override's target.
func TestOverrideTargets(t *testing.T) {
	r := parse(t, base)
	rls, err := rlsconfig.Parse([]rlsconfig.File{{Name: "a.yaml", Data: []byte(`domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_tenant, overridable: true}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_ip}
`)}}, rlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Compile(snapshot.Sources{Rules: r, RLS: rls})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.OverrideBucket("per_tenant")
	if err != nil || b != &s.RLSRules[0] {
		t.Fatalf("per_tenant: %+v, %v", b, err)
	}
	if _, err := s.OverrideBucket("per_ip"); err == nil || !strings.Contains(err.Error(), `unknown bucket "per_ip"; buckets that accept tenant overrides: per_tenant`) {
		t.Errorf("a rule that is not overridable: %v", err)
	}
	if _, err := s.OverrideBucket("x"); err == nil || !strings.Contains(err.Error(), `bucket "x" does not accept tenant overrides`) {
		t.Errorf("a rules bucket that is not overridable: %v", err)
	}
	if b, ok := s.OverrideTarget("x"); !ok || b != &s.Buckets[s.Rules.BucketIndex("x")] {
		t.Errorf("OverrideTarget(x) = %+v, %v", b, ok)
	}
	if _, ok := s.OverrideTarget(""); ok {
		t.Error("a bucket without an override name is a target")
	}
}
