package overridedb

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
)

// Owner is one row of tenant_key_owners: the tenant whose overrides apply
// to a key of buckets keyed by KeyName.
type Owner struct {
	KeyName   string // see limits.OwnerKeyName
	Key       string
	Tenant    string
	UpdatedAt time.Time
}

// SetOwner records tenant as the owner of key under keyName, recording
// actor in the audit log, and returns the previous owner ("" for none).
// Validation errors wrap limits.ErrInvalid and write nothing.
func (s *Store) SetOwner(ctx context.Context, keyName, key, tenant, actor string) (old string, err error) {
	if err := errors.Join(s.snap.CheckOwnerKeyName(keyName), limits.ValidateKeyValue(key), limits.ValidateTenant(tenant), ValidateActor(actor)); err != nil {
		return "", err
	}
	err = s.inTx(ctx, actor, func(tx pgx.Tx) error {
		var prev *string
		err := tx.QueryRow(ctx, "SELECT tenant FROM tenant_key_owners WHERE key_name = $1 AND key_value = $2 FOR UPDATE", keyName, key).Scan(&prev)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			_, err = tx.Exec(ctx, "INSERT INTO tenant_key_owners (key_name, key_value, tenant) VALUES ($1, $2, $3)", keyName, key, tenant)
		case err != nil:
			return fmt.Errorf("read: %w", schemaError(err))
		default:
			old = *prev
			if old == tenant {
				return nil
			}
			_, err = tx.Exec(ctx, "UPDATE tenant_key_owners SET tenant = $3 WHERE key_name = $1 AND key_value = $2", keyName, key, tenant)
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("overridedb: set the owner of %s %q: %w", keyName, key, err)
	}
	return old, nil
}

// DeleteOwner removes the owner of key under keyName, recording actor in
// the audit log, and returns who it was. It wraps ErrNotFound when the key
// has no owner.
func (s *Store) DeleteOwner(ctx context.Context, keyName, key, actor string) (old string, err error) {
	if err := errors.Join(limits.ValidateKeyName(keyName), limits.ValidateKeyValue(key), ValidateActor(actor)); err != nil {
		return "", err
	}
	err = s.inTx(ctx, actor, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, "DELETE FROM tenant_key_owners WHERE key_name = $1 AND key_value = $2 RETURNING tenant", keyName, key).Scan(&old)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s %q has no owner", ErrNotFound, keyName, key)
		}
		return schemaError(err)
	})
	if err != nil {
		return "", fmt.Errorf("overridedb: delete the owner of %s %q: %w", keyName, key, err)
	}
	return old, nil
}

// inTx runs fn in a transaction whose audit rows name actor; a
// serialisation failure or a concurrent insert of the same key is retried.
func (s *Store) inTx(ctx context.Context, actor string, fn func(pgx.Tx) error) error {
	var err error
	for range 3 {
		err = pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config('ratelimit_authz.actor', $1, true)", actor); err != nil {
				return fmt.Errorf("set the audit actor: %w", schemaError(err))
			}
			return fn(tx)
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "23505" || pe.Code == "40001" || pe.Code == "40P01") && ctx.Err() == nil {
			continue
		}
		return err
	}
	return err
}

// Owners calls fn for every key owner, of tenant only unless tenant is "",
// ordered by key name and key, streaming.
func (s *Store) Owners(ctx context.Context, tenant string, fn func(Owner) error) error {
	rows, err := s.conn.Query(ctx, `SELECT key_name, key_value, tenant, updated_at FROM tenant_key_owners
		WHERE $1 = '' OR tenant = $1 ORDER BY key_name, key_value`, tenant)
	if err != nil {
		return fmt.Errorf("overridedb: list owners: %w", schemaError(err))
	}
	defer rows.Close()
	var o Owner
	for rows.Next() {
		if err := rows.Scan(&o.KeyName, &o.Key, &o.Tenant, &o.UpdatedAt); err != nil {
			return fmt.Errorf("overridedb: list owners: %w", err)
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("overridedb: list owners: %w", schemaError(err))
	}
	return nil
}

// OwnerAuditEntry is one change of a key's owner.
type OwnerAuditEntry struct {
	ID             int64
	KeyName, Key   string
	Actor          string // claimed
	DBUser, DBRole string // stamped by the database
	At             time.Time
	Old, New       string // "" for no owner
}

// OwnerAudit returns up to limit most recent changes of the owner of key
// under keyName, oldest first.
func (s *Store) OwnerAudit(ctx context.Context, keyName, key string, limit int) ([]OwnerAuditEntry, error) {
	rows, err := s.conn.Query(ctx, `SELECT id, key_name, key_value, actor, coalesce(db_user, ''), coalesce(db_role, ''), at,
		coalesce(old_tenant, ''), coalesce(new_tenant, '') FROM (
		SELECT * FROM tenant_key_owners_audit WHERE key_name = $1 AND key_value = $2 ORDER BY id DESC LIMIT $3) a ORDER BY id`,
		keyName, key, limit)
	if err != nil {
		return nil, fmt.Errorf("overridedb: owner audit %s %q: %w", keyName, key, schemaError(err))
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (OwnerAuditEntry, error) {
		var e OwnerAuditEntry
		err := row.Scan(&e.ID, &e.KeyName, &e.Key, &e.Actor, &e.DBUser, &e.DBRole, &e.At, &e.Old, &e.New)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("overridedb: owner audit %s %q: %w", keyName, key, schemaError(err))
	}
	return entries, nil
}
