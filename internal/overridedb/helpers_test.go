package overridedb_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

// env is a migrated throwaway database, a connection to it and the
// shipped configuration.
type env struct {
	*testpg.DB
	rules *configfile.Rules
}

func setup(t *testing.T) *env {
	t.Helper()
	r, err := configfile.Parse(config.Default(), config.Name)
	if err != nil {
		t.Fatal(err)
	}
	return &env{DB: testpg.StartDB(t, migrate), rules: r}
}

func migrate(ctx context.Context, conn *pgx.Conn) error {
	_, err := overridedb.Migrate(ctx, conn)
	return err
}
