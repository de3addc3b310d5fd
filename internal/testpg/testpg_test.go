package testpg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testpg"
)

func TestStartStopRestart(t *testing.T) {
	pg := testpg.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	query := func(url string) (string, error) {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return "", err
		}
		defer conn.Close(ctx)
		var v string
		err = conn.QueryRow(ctx, "SELECT current_database()").Scan(&v)
		return v, err
	}
	if db, err := query(pg.URL()); err != nil || db != "postgres" {
		t.Fatalf("query: %q %v", db, err)
	}
	url := pg.CreateDatabase(t, "other")
	if db, err := query(url); err != nil || db != "other" {
		t.Fatalf("new database: %q %v", db, err)
	}
	var db string
	if err := testpg.Connect(t, url).QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "other" {
		t.Fatalf("Connect: %q %v", db, err)
	}

	pg.Stop(t)
	if _, err := query(pg.URL()); err == nil {
		t.Fatal("connected to a stopped server")
	}
	pg.Start(t)
	// Same port, same data.
	if db, err := query(url); err != nil || db != "other" {
		t.Fatalf("after restart: %q %v", db, err)
	}
}
