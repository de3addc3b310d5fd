package overridedb

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change, embedded in the binary.
type Migration struct {
	Version int
	Name    string // file name without the .sql extension
	sql     string
}

// migrationLock is the advisory lock key that serialises migrations
// (an arbitrary constant: "rlaz" in ASCII).
const migrationLock = 0x726c617a

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("overridedb: list migrations: %w", err)
	}
	var ms []Migration
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".sql")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("overridedb: migration %s: the name must start with a version number and _", n)
		}
		b, err := migrationFiles.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("overridedb: read migration %s: %w", n, err)
		}
		ms = append(ms, Migration{Version: v, Name: base, sql: string(b)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("overridedb: migrations %s and %s share version %d", ms[i-1].Name, ms[i].Name, ms[i].Version)
		}
	}
	return ms, nil
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	Applied []Migration // applied now, in order
	Version int         // the schema version afterwards
	// Newer is set when the database has a version this binary does not
	// know (a newer release migrated it); nothing was applied.
	Newer bool
}

// Migrate applies the embedded migrations the database lacks, all in one
// transaction, under an advisory lock so that nodes or operators running it
// at once do not interfere. Running it again applies nothing.
func Migrate(ctx context.Context, conn *pgx.Conn) (MigrateResult, error) {
	var res MigrateResult
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ratelimit_authz_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create the migrations table: %w", err)
		}
		rows, err := tx.Query(ctx, "SELECT version FROM ratelimit_authz_migrations")
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return fmt.Errorf("read applied migrations: %w", err)
		}
		for _, v := range applied {
			res.Version = max(res.Version, int(v))
		}
		if len(ms) > 0 && res.Version > ms[len(ms)-1].Version {
			res.Newer = true
			return nil
		}
		for _, m := range ms {
			if slices.Contains(applied, int32(m.Version)) {
				continue
			}
			// Sent as is (simple protocol, no argument sanitising): a
			// migration is several statements with dollar-quoted bodies.
			if _, err := tx.Conn().PgConn().Exec(ctx, m.sql).ReadAll(); err != nil {
				return fmt.Errorf("apply %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO ratelimit_authz_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("record %s: %w", m.Name, err)
			}
			res.Applied = append(res.Applied, m)
			res.Version = max(res.Version, m.Version)
		}
		return nil
	})
	if err != nil {
		return MigrateResult{}, fmt.Errorf("overridedb: migrate: %w", err)
	}
	return res, nil
}

// ErrNoSchema is wrapped when the tables are missing: run
// `ratelimit-authz migrate`.
var ErrNoSchema = errors.New("the tenant_limits tables do not exist; run `ratelimit-authz migrate`")

// schemaError adds ErrNoSchema to an undefined-table error.
func schemaError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w (%v)", ErrNoSchema, err)
	}
	return err
}
