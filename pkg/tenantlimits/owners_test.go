package tenantlimits_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wiring"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/counter"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/tenantlimits"
)

// expectFor waits (up to a second) until OverrideFor(bucket, key) answers
// want (zero: none).
func expectFor(t *testing.T, c *running, bucket counter.Bucket, key string, want counter.Limit) {
	t.Helper()
	poll.Until(t, time.Second, time.Millisecond, func() error {
		got, ok := c.OverrideFor(bucket, key)
		if ok != (want != counter.Limit{}) || got != want {
			return fmt.Errorf("OverrideFor(%d, %q) = %+v, %v; want %+v", bucket, key, got, ok, want)
		}
		return nil
	})
}

// TestOverridesFollowTheKeyOwner: a channel-keyed bucket takes the override
// of the channel's recorded owner and nothing else; owners reach a running
// cache like overrides do (NOTIFY, incremental, deletions, full reload).
func TestOverridesFollowTheKeyOwner(t *testing.T) {
	e := setup(t)
	inb, act, tok := counter.Bucket(e.rules.BucketIndex("inbound")), counter.Bucket(e.rules.BucketIndex("activity_create")), counter.Bucket(e.rules.BucketIndex("token_create"))
	s, err := tenantlimits.NewStore(e.conn, wiring.Limits(e.rules, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []tenantlimits.Override{{Bucket: "inbound", Limit: 5000, ScaleMS: 1000}, {Bucket: "activity_create", Limit: 300, ScaleMS: 1000}} {
		if _, err := s.Set(e.ctx, "bigco", o, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	c := startCache(t, e, tenantlimits.Config{})
	big := lim(5000, 1000)

	// A tenant-keyed bucket: its key is the tenant.
	expectFor(t, c, act, "bigco", lim(300, 1000))
	// A channel without an owner: the configured limit, whatever the
	// channel is called, even the name of a tenant with overrides.
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	expectFor(t, c, inb, "bigco", counter.Limit{})
	// Not overridable: never.
	expectFor(t, c, tok, "bigco", counter.Limit{})

	if old, err := s.SetOwner(e.ctx, "channel", "ch-1", "bigco", "alice"); err != nil || old != "" {
		t.Fatalf("SetOwner: %q %v", old, err)
	}
	expectFor(t, c, inb, "ch-1", big)
	expectFor(t, c, inb, "ch-2", counter.Limit{})
	if got := metric(t, c.reg, "ratelimit_authz_overrides_key_owners"); got != 1 {
		t.Errorf("key_owners %v, want 1", got)
	}

	// Plain SQL: a new owner without overrides, then back.
	e.exec(t, `UPDATE tenant_key_owners SET tenant = 'small' WHERE key_name = 'channel' AND key_value = 'ch-1'`)
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	e.exec(t, `UPDATE tenant_key_owners SET tenant = 'bigco' WHERE key_name = 'channel' AND key_value = 'ch-1'`)
	expectFor(t, c, inb, "ch-1", big)
	// The owner's override changes: the channel follows.
	if _, err := s.Set(e.ctx, "bigco", tenantlimits.Override{Bucket: "inbound", Limit: 700, ScaleMS: 1000}, "alice"); err != nil {
		t.Fatal(err)
	}
	expectFor(t, c, inb, "ch-1", lim(700, 1000))

	// A row no bucket of this configuration uses, and a hostile key (only
	// possible with the checks dropped) are skipped and counted.
	e.exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('header:x-unused', 'v', 'bigco')`)
	e.exec(t, `ALTER TABLE tenant_key_owners DROP CONSTRAINT tenant_key_owners_key_value_valid`)
	e.exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', $1, 'bigco')`, "ch\x1b[2J")
	e.exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', $1, 'bigco')`, strings.Repeat("k", 5000))
	poll.Until(t, time.Second, 5*time.Millisecond, func() error {
		if got := metric(t, c.reg, "ratelimit_authz_overrides_invalid_rows"); got != 3 {
			return fmt.Errorf("invalid_rows %v, want 3", got)
		}
		return nil
	})
	expectFor(t, c, inb, "ch\x1b[2J", counter.Limit{})
	expectFor(t, c, inb, strings.Repeat("k", 5000), counter.Limit{})
	if !contains(c.logs.String(), "key owner skipped", "header:x-unused") {
		t.Errorf("log lacks the skipped owner:\n%s", c.logs)
	}
	expectFor(t, c, inb, "ch-1", lim(700, 1000))

	// Deleted: the configured limit again (an incremental refresh reads the
	// deletion), and a new cache's full load agrees.
	if old, err := s.DeleteOwner(e.ctx, "channel", "ch-1", "bob"); err != nil || old != "bigco" {
		t.Fatalf("DeleteOwner: %q %v", old, err)
	}
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	if _, err := s.DeleteOwner(e.ctx, "channel", "ch-1", "bob"); !errors.Is(err, tenantlimits.ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	if _, err := s.SetOwner(e.ctx, "channel", "ch-9", "bigco", "alice"); err != nil {
		t.Fatal(err)
	}
	c2 := startCache(t, e, tenantlimits.Config{})
	expectFor(t, c2, inb, "ch-9", lim(700, 1000))
	expectFor(t, c2, inb, "ch-1", counter.Limit{})
}

// TestSetOwnerValidates: bad input writes nothing and says what is wrong.
func TestSetOwnerValidates(t *testing.T) {
	e := setup(t)
	s, err := tenantlimits.NewStore(e.conn, wiring.Limits(e.rules, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, key, tenant, actor, want string
	}{
		{"tenant", "x", "acme", "a", `no overridable bucket is keyed by "tenant"`},
		{"ip", "x", "acme", "a", `no overridable bucket is keyed by "ip"`},
		{"header:X-Up", "x", "acme", "a", "key name"},
		{"channel", "", "acme", "a", "the key is empty"},
		{"channel", "a\nb", "acme", "a", "control characters"},
		{"channel", strings.Repeat("k", 1025), "acme", "a", "more than 1024"},
		{"channel", "c", "", "a", "the tenant is empty"},
		{"channel", "c", "acme", "", "an actor is required"},
		{"channel", "c", "acme", "a\x1b[31m", "printable"},
	} {
		_, err := s.SetOwner(e.ctx, tc.name, tc.key, tc.tenant, tc.actor)
		if !errors.Is(err, tenantlimits.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetOwner(%q, %q, %q, %q) = %v; want ErrInvalid with %q", tc.name, tc.key, tc.tenant, tc.actor, err, tc.want)
		}
	}
	if n := e.count(t, "SELECT count(*) FROM tenant_key_owners") + e.count(t, "SELECT count(*) FROM tenant_key_owners_audit"); n != 0 {
		t.Errorf("%d rows written by invalid input", n)
	}
	// The database holds SQL to the same rules.
	for _, sql := range []string{
		`INSERT INTO tenant_key_owners VALUES ('Bad Name', 'k', 't')`,
		`INSERT INTO tenant_key_owners VALUES ('channel', '', 't')`,
		`INSERT INTO tenant_key_owners VALUES ('channel', E'a\tb', 't')`,
		`INSERT INTO tenant_key_owners VALUES ('channel', 'k', E't\n')`,
		`TRUNCATE tenant_key_owners`,
	} {
		if _, err := e.conn.Exec(e.ctx, sql); err == nil {
			t.Errorf("%s: accepted", sql)
		}
	}
}
