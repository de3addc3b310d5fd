package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
)

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("migrate", "",
		"Create or upgrade the tenant-overrides schema (tables, checks, audit and NOTIFY\n"+
			"triggers) in the database. Safe to run again and from several places at once:\n"+
			"it applies only what is missing, in one transaction.", getenv, time.Minute, false)
	if _, done, err := c.parse(args, 0, 0, stdout, stderr); done {
		return err
	}
	return c.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		res, err := overridedb.Migrate(ctx, conn)
		if err != nil {
			return c.failed(err)
		}
		switch {
		case res.Newer:
			fmt.Fprintf(stderr, "ratelimit-authz migrate: the database is at schema version %d, newer than this binary knows; nothing applied\n", res.Version)
		case len(res.Applied) == 0:
			fmt.Fprintf(stdout, "schema up to date (version %d)\n", res.Version)
		default:
			for _, m := range res.Applied {
				fmt.Fprintf(stdout, "applied %s\n", m.Name)
			}
			fmt.Fprintf(stdout, "schema at version %d\n", res.Version)
		}
		return nil
	})
}
