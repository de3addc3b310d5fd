package overridedb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Channel is the NOTIFY channel the tables' statement triggers signal on.
const Channel = "ratelimit_authz_tenant_limits"

// Listen subscribes conn to Channel. A reader listens before its first
// Read, so that no change falls between the two.
func Listen(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return fmt.Errorf("overridedb: listen: %w", err)
	}
	return nil
}

// Sink receives the rows one Read finds, in this order: the tenant rows,
// then (incremental only) the deleted tenants, then the key owners, then
// (incremental only) the deleted key owners.
type Sink interface {
	// Tenant is a row of tenant_limits; limits is its value as text (see
	// ParseLimits), valid only during the call.
	Tenant(tenant string, limits []byte)
	TenantDeleted(tenant string)
	// Owner is a row of tenant_key_owners.
	Owner(keyName, key, tenant string)
	OwnerDeleted(keyName, key string)
}

// Read reads the overrides and key owners in one repeatable-read, read-only
// snapshot and hands every row to s. With since "" it reads every row; else
// since is the watermark a previous Read returned, and it reads the rows
// and deletions of the transactions not yet finished when that Read's
// snapshot was taken: a late commit is never missed. It returns the
// watermark for the next Read (pg_snapshot_xmin of this snapshot, an xid8
// as text). Values are read as text and decoded by the caller, so a broken
// value fails its row, not the query. Missing tables wrap ErrNoSchema.
func Read(ctx context.Context, conn *pgx.Conn, since string, s Sink) (watermark string, err error) {
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// Every transaction below xmin had finished when this snapshot was
		// taken; the next read starts from there.
		if err := tx.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text").Scan(&watermark); err != nil {
			return err
		}
		if err := readTenants(ctx, tx, since, s); err != nil {
			return err
		}
		return readOwners(ctx, tx, since, s)
	})
	if err != nil {
		return "", fmt.Errorf("overridedb: read: %w", schemaError(err))
	}
	return watermark, nil
}

// readTenants hands s the rows of tenant_limits, then the deleted tenants:
// with since "" every row and no deletions, else those from since on.
func readTenants(ctx context.Context, tx pgx.Tx, since string, s Sink) error {
	full := since == ""
	rows, err := querySince(ctx, tx, "SELECT tenant, limits::text FROM tenant_limits", since)
	if err != nil {
		return err
	}
	var (
		tenant string
		raw    pgtype.DriverBytes // the driver's buffer: valid for this row only
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &raw}, func() error {
		s.Tenant(tenant, raw)
		return nil
	})
	if err != nil || full {
		return err
	}
	rows, err = querySince(ctx, tx, "SELECT tenant FROM tenant_limits_deletions", since)
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, []any{&tenant}, func() error {
		s.TenantDeleted(tenant)
		return nil
	})
	return err
}

// readOwners hands s the rows of tenant_key_owners, then the deleted key
// owners: with since "" every row and no deletions, else those from since
// on.
func readOwners(ctx context.Context, tx pgx.Tx, since string, s Sink) error {
	full := since == ""
	rows, err := querySince(ctx, tx, "SELECT key_name, key_value, tenant FROM tenant_key_owners", since)
	if err != nil {
		return err
	}
	var keyName, key, tenant string
	_, err = pgx.ForEachRow(rows, []any{&keyName, &key, &tenant}, func() error {
		s.Owner(keyName, key, tenant)
		return nil
	})
	if err != nil || full {
		return err
	}
	rows, err = querySince(ctx, tx, "SELECT key_name, key_value FROM tenant_key_owners_deletions", since)
	if err != nil {
		return err
	}
	_, err = pgx.ForEachRow(rows, []any{&keyName, &key}, func() error {
		s.OwnerDeleted(keyName, key)
		return nil
	})
	return err
}

// querySince runs query, a SELECT of one table: every row with since "",
// else the rows written by transactions from since on (their xid).
func querySince(ctx context.Context, tx pgx.Tx, query, since string) (pgx.Rows, error) {
	if since == "" {
		return tx.Query(ctx, query)
	}
	return tx.Query(ctx, query+" WHERE xid >= $1::xid8", since)
}
