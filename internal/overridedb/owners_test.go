package overridedb_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot/snapshottest"
)

// TestSetOwnerValidates: bad input writes nothing and says what is wrong.
func TestSetOwnerValidates(t *testing.T) {
	e := setup(t)
	s, err := overridedb.NewStore(e.Conn, snapshottest.ByIndex(t, e.rules))
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
		_, err := s.SetOwner(e.Ctx, tc.name, tc.key, tc.tenant, tc.actor)
		if !errors.Is(err, limits.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetOwner(%q, %q, %q, %q) = %v; want ErrInvalid with %q", tc.name, tc.key, tc.tenant, tc.actor, err, tc.want)
		}
	}
	if n := e.Count(t, "SELECT count(*) FROM tenant_key_owners") + e.Count(t, "SELECT count(*) FROM tenant_key_owners_audit"); n != 0 {
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
		if _, err := e.Conn.Exec(e.Ctx, sql); err == nil {
			t.Errorf("%s: accepted", sql)
		}
	}
}
