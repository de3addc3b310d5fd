package overridedb_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

func TestStoreSetGetDeleteAudit(t *testing.T) {
	e := setup(t)
	s, err := overridedb.NewStore(e.Conn, snapshottest.ByIndex(t, e.rules))
	if err != nil {
		t.Fatal(err)
	}
	ctx := e.Ctx
	o := func(b string, l, ms int64) limits.Override {
		return limits.Override{Bucket: b, Limit: l, ScaleMS: ms}
	}

	if _, ok, err := s.Get(ctx, "acme"); ok || err != nil {
		t.Fatalf("get before set: %v %v", ok, err)
	}
	ch, err := s.Set(ctx, "acme", o("activity_create", 200, 1000), "alice")
	if err != nil || ch.Old != nil || *ch.New != o("activity_create", 200, 1000) {
		t.Fatalf("set: %+v %v", ch, err)
	}
	if _, err := s.Set(ctx, "acme", o("upload", 50, 60_000), "alice"); err != nil {
		t.Fatal(err)
	}
	ch, err = s.Set(ctx, "acme", o("activity_create", 300, 1000), "bob")
	if err != nil || ch.Old == nil || ch.Old.Limit != 200 || ch.New.Limit != 300 {
		t.Fatalf("change: %+v %v", ch, err)
	}
	if _, err := s.Set(ctx, "globex", o("inbound", 1000, 1000), "alice"); err != nil {
		t.Fatal(err)
	}

	got, ok, err := s.Get(ctx, "acme")
	want := []limits.Override{o("activity_create", 300, 1000), o("upload", 50, 60_000)}
	if err != nil || !ok || !reflect.DeepEqual(got.Overrides, want) || len(got.Problems) != 0 || got.UpdatedAt.IsZero() {
		t.Fatalf("get: %+v %v %v", got, ok, err)
	}
	var listed []string
	err = s.List(ctx, func(tn overridedb.Tenant) error {
		for _, ov := range tn.Overrides {
			listed = append(listed, tn.Tenant+" "+ov.Bucket+" "+ov.Rate())
		}
		return nil
	})
	if want := "acme activity_create 300/1s|acme upload 50/1m|globex inbound 1000/1s"; err != nil || strings.Join(listed, "|") != want {
		t.Fatalf("list: %q %v, want %q", strings.Join(listed, "|"), err, want)
	}

	// Delete one bucket, then what is left; a second delete finds nothing.
	chs, err := s.Delete(ctx, "acme", "upload", "carol")
	if err != nil || len(chs) != 1 || chs[0].Old.Rate() != "50/1m" {
		t.Fatalf("delete bucket: %+v %v", chs, err)
	}
	if _, err := s.Delete(ctx, "acme", "upload", "carol"); !errors.Is(err, overridedb.ErrNotFound) {
		t.Errorf("delete missing bucket: %v", err)
	}
	if chs, err := s.Delete(ctx, "acme", "", "carol"); err != nil || len(chs) != 1 || chs[0].Bucket != "activity_create" {
		t.Fatalf("delete tenant: %+v %v", chs, err)
	}
	if _, ok, _ := s.Get(ctx, "acme"); ok {
		t.Error("row left after deleting every override")
	}
	if _, err := s.Delete(ctx, "acme", "", "carol"); !errors.Is(err, overridedb.ErrNotFound) {
		t.Errorf("delete missing tenant: %v", err)
	}

	// The audit log has every change, in order, with its actor.
	audit, err := s.Audit(ctx, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, a := range audit {
		for _, c := range a.Changes() {
			lines = append(lines, fmt.Sprintf("%s %s %s→%s", a.Actor, c.Bucket, c.Old, c.New))
		}
		if a.At.IsZero() || a.Tenant != "acme" {
			t.Errorf("audit entry %+v", a)
		}
	}
	wantAudit := []string{
		"alice activity_create -→200/1s",
		"alice upload -→50/1m",
		"bob activity_create 200/1s→300/1s",
		"carol upload 50/1m→-",
		"carol activity_create 300/1s→-",
	}
	if !reflect.DeepEqual(lines, wantAudit) {
		t.Errorf("audit:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(wantAudit, "\n"))
	}
	if audit[len(audit)-1].New != nil {
		t.Error("the deleting entry has a new value")
	}
	if last, _ := s.Audit(ctx, "acme", 2); len(last) != 2 || last[1].ID != audit[len(audit)-1].ID {
		t.Errorf("audit limit: %+v", last)
	}
}

// TestStoreInvalidWritesNothing: every validation error leaves the
// database as it was, audit log included.
func TestStoreInvalidWritesNothing(t *testing.T) {
	e := setup(t)
	s, _ := overridedb.NewStore(e.Conn, snapshottest.ByIndex(t, e.rules))
	ok := limits.Override{Bucket: "activity_create", Limit: 200, ScaleMS: 1000}
	if _, err := s.Set(e.Ctx, "acme", ok, "alice"); err != nil {
		t.Fatal(err)
	}
	before := e.Count(t, "SELECT count(*) FROM tenant_limits_audit")
	for _, tc := range []struct {
		tenant, actor string
		o             limits.Override
		want          string
	}{
		{"acme", "alice", limits.Override{Bucket: "login_ip", Limit: 9, ScaleMS: 60_000}, "buckets that do: activity_create, inbound, token_generate, upload"},
		{"acme", "alice", limits.Override{Bucket: "typo", Limit: 9, ScaleMS: 1000}, `unknown bucket "typo"`},
		{"acme", "alice", limits.Override{Bucket: "upload", Limit: 0, ScaleMS: 1000}, "limit 0"},
		{"acme", "alice", limits.Override{Bucket: "upload", Limit: 5, ScaleMS: 10_000}, "not one of 1s, 1m, 1h, 1d"},
		{"", "alice", ok, "tenant is empty"},
		{"acme", "", ok, "actor is required"},
	} {
		_, err := s.Set(e.Ctx, tc.tenant, tc.o, tc.actor)
		if !errors.Is(err, limits.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("set %q %+v by %q: %v, want %q", tc.tenant, tc.o, tc.actor, err, tc.want)
		}
	}
	if _, err := s.Delete(e.Ctx, "acme", "", ""); !errors.Is(err, limits.ErrInvalid) {
		t.Errorf("delete without actor: %v", err)
	}
	if n := e.Count(t, "SELECT count(*) FROM tenant_limits_audit"); n != before {
		t.Errorf("audit rows %d → %d", before, n)
	}
	got, _, _ := s.Get(e.Ctx, "acme")
	if len(got.Overrides) != 1 || got.Overrides[0] != ok {
		t.Errorf("acme changed: %+v", got)
	}
	if n := e.Count(t, "SELECT count(*) FROM tenant_limits"); n != 1 {
		t.Errorf("%d rows", n)
	}
}

func TestValidateActor(t *testing.T) {
	for _, bad := range []string{"", "  ", "a\x00", strings.Repeat("x", 257)} {
		if err := overridedb.ValidateActor(bad); !errors.Is(err, limits.ErrInvalid) {
			t.Errorf("actor %q: %v", bad, err)
		}
	}
	if err := overridedb.ValidateActor("alice@example.com"); err != nil {
		t.Error(err)
	}
}
