package overrides_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overrides"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
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
	s, err := overridedb.NewStore(e.Conn, snapshottest.ByIndex(t, e.rules))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []limits.Override{{Bucket: "inbound", Limit: 5000, ScaleMS: 1000}, {Bucket: "activity_create", Limit: 300, ScaleMS: 1000}} {
		if _, err := s.Set(e.Ctx, "bigco", o, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	c := startCache(t, e, overrides.Config{})
	big := lim(5000, 1000)

	// A tenant-keyed bucket: its key is the tenant.
	expectFor(t, c, act, "bigco", lim(300, 1000))
	// A channel without an owner: the configured limit, whatever the
	// channel is called, even the name of a tenant with overrides.
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	expectFor(t, c, inb, "bigco", counter.Limit{})
	// Not overridable: never.
	expectFor(t, c, tok, "bigco", counter.Limit{})

	if old, err := s.SetOwner(e.Ctx, "channel", "ch-1", "bigco", "alice"); err != nil || old != "" {
		t.Fatalf("SetOwner: %q %v", old, err)
	}
	expectFor(t, c, inb, "ch-1", big)
	expectFor(t, c, inb, "ch-2", counter.Limit{})
	if got := metric(t, c.reg, "ratelimit_authz_overrides_key_owners"); got != 1 {
		t.Errorf("key_owners %v, want 1", got)
	}

	// Plain SQL: a new owner without overrides, then back.
	e.Exec(t, `UPDATE tenant_key_owners SET tenant = 'small' WHERE key_name = 'channel' AND key_value = 'ch-1'`)
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	e.Exec(t, `UPDATE tenant_key_owners SET tenant = 'bigco' WHERE key_name = 'channel' AND key_value = 'ch-1'`)
	expectFor(t, c, inb, "ch-1", big)
	// The owner's override changes: the channel follows.
	if _, err := s.Set(e.Ctx, "bigco", limits.Override{Bucket: "inbound", Limit: 700, ScaleMS: 1000}, "alice"); err != nil {
		t.Fatal(err)
	}
	expectFor(t, c, inb, "ch-1", lim(700, 1000))

	// A row no bucket of this configuration uses, and a hostile key (only
	// possible with the checks dropped) are skipped and counted.
	e.Exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('header:x-unused', 'v', 'bigco')`)
	e.Exec(t, `ALTER TABLE tenant_key_owners DROP CONSTRAINT tenant_key_owners_key_value_valid`)
	e.Exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', $1, 'bigco')`, "ch\x1b[2J")
	e.Exec(t, `INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ('channel', $1, 'bigco')`, strings.Repeat("k", 5000))
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
	if old, err := s.DeleteOwner(e.Ctx, "channel", "ch-1", "bob"); err != nil || old != "bigco" {
		t.Fatalf("DeleteOwner: %q %v", old, err)
	}
	expectFor(t, c, inb, "ch-1", counter.Limit{})
	if _, err := s.DeleteOwner(e.Ctx, "channel", "ch-1", "bob"); !errors.Is(err, overridedb.ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
	if _, err := s.SetOwner(e.Ctx, "channel", "ch-9", "bigco", "alice"); err != nil {
		t.Fatal(err)
	}
	c2 := startCache(t, e, overrides.Config{})
	expectFor(t, c2, inb, "ch-9", lim(700, 1000))
	expectFor(t, c2, inb, "ch-1", counter.Limit{})
}
