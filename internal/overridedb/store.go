package overridedb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

// ErrNotFound is wrapped by Store.Delete when there is nothing to delete.
var ErrNotFound = errors.New("no such override")

// maxActorBytes bounds the --actor recorded in the audit log.
const maxActorBytes = 256

// ValidateActor checks the name recorded in the audit log.
func ValidateActor(actor string) error {
	switch {
	case strings.TrimSpace(actor) == "":
		return fmt.Errorf("%w: an actor is required (--actor NAME): who made the change, for the audit log", limits.ErrInvalid)
	case len(actor) > maxActorBytes || !utf8.ValidString(actor) || strings.ContainsFunc(actor, unicode.IsControl):
		return fmt.Errorf("%w: the actor must be at most %d bytes of printable UTF-8", limits.ErrInvalid, maxActorBytes)
	}
	return nil
}

// Store reads and changes the overrides in Postgres; the CLI uses it. Every
// change is validated against the configuration first (an invalid one
// writes nothing) and runs in one transaction with its audit row. A Store
// wraps one connection and is not safe for concurrent use; create it with
// NewStore (the zero Store is not usable).
type Store struct {
	conn *pgx.Conn
	snap *snapshot.Snapshot
}

// NewStore returns a Store on conn that validates buckets against the
// configuration snap (its override targets, see snapshot.OverrideBucket).
func NewStore(conn *pgx.Conn, snap *snapshot.Snapshot) (*Store, error) {
	if conn == nil || snap == nil {
		return nil, errors.New("overridedb: NewStore needs a connection and the configured buckets")
	}
	return &Store{conn: conn, snap: snap}, nil
}

// Tenant is one row of tenant_limits.
type Tenant struct {
	Tenant    string
	Overrides []limits.Override // the usable entries, by bucket
	// Problems are entries that fail the shape checks (possible only when
	// the database checks were bypassed); nodes skip them.
	Problems  []string
	UpdatedAt time.Time
}

func newTenant(tenant string, raw []byte, updated time.Time) Tenant {
	t := Tenant{Tenant: tenant, UpdatedAt: updated}
	entries, problems, err := ParseLimits(raw)
	if err != nil {
		t.Problems = []string{err.Error()}
		return t
	}
	t.Overrides = entries
	for _, p := range problems {
		t.Problems = append(t.Problems, fmt.Sprintf("%s: %v", p.Bucket, p.Err))
	}
	return t
}

// Get returns a tenant's overrides; ok is false when it has none.
func (s *Store) Get(ctx context.Context, tenant string) (t Tenant, ok bool, err error) {
	var raw []byte
	var updated time.Time
	err = s.conn.QueryRow(ctx, "SELECT limits::text, updated_at FROM tenant_limits WHERE tenant = $1", tenant).Scan(&raw, &updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return Tenant{}, false, nil
	}
	if err != nil {
		return Tenant{}, false, fmt.Errorf("overridedb: get %q: %w", tenant, schemaError(err))
	}
	return newTenant(tenant, raw, updated), true, nil
}

// List calls fn for every tenant with overrides, by tenant, streaming.
func (s *Store) List(ctx context.Context, fn func(Tenant) error) error {
	rows, err := s.conn.Query(ctx, "SELECT tenant, limits::text, updated_at FROM tenant_limits ORDER BY tenant")
	if err != nil {
		return fmt.Errorf("overridedb: list: %w", schemaError(err))
	}
	defer rows.Close()
	var (
		tenant  string
		raw     []byte
		updated time.Time
	)
	for rows.Next() {
		if err := rows.Scan(&tenant, &raw, &updated); err != nil {
			return fmt.Errorf("overridedb: list: %w", err)
		}
		if err := fn(newTenant(tenant, raw, updated)); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("overridedb: list: %w", schemaError(err))
	}
	return nil
}

// Change is what a Set or Delete did to one bucket.
type Change struct {
	Bucket   string
	Old, New *limits.Override // nil: no override before / after
}

// Set sets one bucket's override for a tenant, recording actor in the
// audit log. Validation errors wrap limits.ErrInvalid and write nothing.
func (s *Store) Set(ctx context.Context, tenant string, o limits.Override, actor string) (Change, error) {
	if err := errors.Join(limits.ValidateTenant(tenant), ValidateActor(actor), s.snap.ValidateOverride(o)); err != nil {
		return Change{}, err
	}
	var ch Change
	err := s.update(ctx, tenant, actor, func(m map[string]json.RawMessage) error {
		ch = Change{Bucket: o.Bucket, Old: storedOverride(m, o.Bucket), New: &o}
		m[o.Bucket] = json.RawMessage(fmt.Sprintf(`{"limit": %d, "scale_ms": %d}`, o.Limit, o.ScaleMS))
		return nil
	})
	if err != nil {
		return Change{}, fmt.Errorf("overridedb: set %q %s: %w", tenant, o.Bucket, err)
	}
	return ch, nil
}

// Delete removes one bucket's override for a tenant, or with bucket "" all
// of them, recording actor in the audit log. It wraps ErrNotFound when
// there is nothing to remove, and writes nothing then.
func (s *Store) Delete(ctx context.Context, tenant, bucket, actor string) ([]Change, error) {
	if err := errors.Join(limits.ValidateTenant(tenant), ValidateActor(actor)); err != nil {
		return nil, err
	}
	var changes []Change
	err := s.update(ctx, tenant, actor, func(m map[string]json.RawMessage) error {
		changes = changes[:0]
		if bucket != "" {
			if _, ok := m[bucket]; !ok {
				return fmt.Errorf("%w: tenant %q has no override for bucket %q", ErrNotFound, tenant, bucket)
			}
			changes = append(changes, Change{Bucket: bucket, Old: storedOverride(m, bucket)})
			delete(m, bucket)
			return nil
		}
		if len(m) == 0 {
			return fmt.Errorf("%w: tenant %q has no overrides", ErrNotFound, tenant)
		}
		for _, b := range sortedKeys(m) {
			changes = append(changes, Change{Bucket: b, Old: storedOverride(m, b)})
			delete(m, b)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("overridedb: delete %q: %w", tenant, err)
	}
	return changes, nil
}

func storedOverride(m map[string]json.RawMessage, bucket string) *limits.Override {
	raw, ok := m[bucket]
	if !ok {
		return nil
	}
	o, err := parseEntry(bucket, raw)
	if err != nil {
		// Shown as a zero override; the audit log keeps the raw value.
		return &limits.Override{Bucket: bucket}
	}
	return &o
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// update changes a tenant's row in one transaction: lock it (or find it
// absent), let change edit the entries, then write, or delete the row when
// no entry is left. The audit trigger records actor. A concurrent insert of
// the same new tenant (unique violation) or a serialisation failure is
// retried.
func (s *Store) update(ctx context.Context, tenant, actor string, change func(map[string]json.RawMessage) error) error {
	const attempts = 3
	var err error
	for range attempts {
		err = pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config('ratelimit_authz.actor', $1, true)", actor); err != nil {
				return fmt.Errorf("set the audit actor: %w", err)
			}
			var raw []byte
			err := tx.QueryRow(ctx, "SELECT limits::text FROM tenant_limits WHERE tenant = $1 FOR UPDATE", tenant).Scan(&raw)
			exists := err == nil
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("read: %w", schemaError(err))
			}
			m := map[string]json.RawMessage{}
			if exists {
				if err := json.Unmarshal(raw, &m); err != nil || m == nil {
					return fmt.Errorf("the stored value is not a JSON object (%.80s); fix it with SQL first", raw)
				}
			}
			if err := change(m); err != nil {
				return err
			}
			switch {
			case len(m) == 0 && exists:
				_, err = tx.Exec(ctx, "DELETE FROM tenant_limits WHERE tenant = $1", tenant)
			case len(m) == 0:
				return nil
			case exists:
				_, err = tx.Exec(ctx, "UPDATE tenant_limits SET limits = $2::jsonb WHERE tenant = $1", tenant, m)
			default:
				_, err = tx.Exec(ctx, "INSERT INTO tenant_limits (tenant, limits) VALUES ($1, $2::jsonb)", tenant, m)
			}
			if err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "40001" || pe.Code == "40P01") && ctx.Err() == nil {
			continue // unique_violation, serialization_failure, deadlock_detected
		}
		return err
	}
	return err
}

// AuditEntry is one row of the audit log: a tenant's whole value before
// and after one change.
type AuditEntry struct {
	ID     int64
	Tenant string
	Actor  string // claimed: the CLI's --actor, or sql:USER
	// DBUser and DBRole are the database's session_user and current_user
	// for the change, stamped by the database; "" for rows written before
	// schema version 3.
	DBUser, DBRole string
	At             time.Time
	Old, New       []byte // JSON; nil when the tenant had no row / the row was deleted
}

// BucketChange is one bucket's part of an audit entry, formatted: a rate
// like "200/1s", or "-" for no override.
type BucketChange struct {
	Bucket, Old, New string
}

// Changes lists the buckets an audit entry changed.
func (e AuditEntry) Changes() []BucketChange {
	decode := func(raw []byte) map[string]json.RawMessage {
		m := map[string]json.RawMessage{}
		json.Unmarshal(raw, &m) // nil or broken: no entries
		return m
	}
	old, cur := decode(e.Old), decode(e.New)
	show := func(m map[string]json.RawMessage, b string) string {
		raw, ok := m[b]
		if !ok {
			return "-"
		}
		o, err := parseEntry(b, raw)
		if err != nil {
			return string(raw)
		}
		return o.Rate()
	}
	var out []BucketChange
	all := sortedKeys(old)
	for _, b := range sortedKeys(cur) {
		if _, ok := old[b]; !ok {
			all = append(all, b)
		}
	}
	slices.Sort(all)
	for _, b := range all {
		o, n := show(old, b), show(cur, b)
		if o != n {
			out = append(out, BucketChange{b, o, n})
		}
	}
	return out
}

// Audit returns up to limit most recent audit entries of a tenant, oldest
// first.
func (s *Store) Audit(ctx context.Context, tenant string, limit int) ([]AuditEntry, error) {
	rows, err := s.conn.Query(ctx, `SELECT id, tenant, actor, coalesce(db_user, ''), coalesce(db_role, ''), at, old::text, new::text FROM (
		SELECT * FROM tenant_limits_audit WHERE tenant = $1 ORDER BY id DESC LIMIT $2) a ORDER BY id`, tenant, limit)
	if err != nil {
		return nil, fmt.Errorf("overridedb: audit %q: %w", tenant, schemaError(err))
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		var old, cur *string
		err := row.Scan(&e.ID, &e.Tenant, &e.Actor, &e.DBUser, &e.DBRole, &e.At, &old, &cur)
		if old != nil {
			e.Old = []byte(*old)
		}
		if cur != nil {
			e.New = []byte(*cur)
		}
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("overridedb: audit %q: %w", tenant, schemaError(err))
	}
	return entries, nil
}
