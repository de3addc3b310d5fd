package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// databaseFlags are the ways to give the Postgres URL, a secret: the
// environment (DATABASE_URL) or a file (DATABASE_URL_FILE, for mounted
// secrets); --database-url works but puts the password where ps and
// /proc/PID/cmdline show it, so nothing requires it.
type databaseFlags struct {
	url, file string
}

func (d *databaseFlags) addFlags(f *envFlags) {
	f.String(&d.url, "database-url", "DATABASE_URL", "", "Postgres connection `URL` (postgres://user:password@host:5432/db?sslmode=require); prefer the environment or --database-url-file: a flag shows the password to anyone who lists processes")
	f.String(&d.file, "database-url-file", "DATABASE_URL_FILE", "", "`file` holding the Postgres connection URL (e.g. a mounted secret); trailing whitespace is ignored")
}

// maxURLFileBytes bounds what is read from --database-url-file.
const maxURLFileBytes = 64 << 10

// resolve returns the URL, "" when none is given. The file's content
// never appears in an error.
func (d *databaseFlags) resolve() (string, error) {
	if d.file == "" {
		return d.url, nil
	}
	if d.url != "" {
		return "", errors.New("both a database URL and --database-url-file (DATABASE_URL_FILE) are set: give one")
	}
	f, err := os.Open(d.file)
	if err != nil {
		return "", fmt.Errorf("database URL file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxURLFileBytes+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("database URL file %s: %w", d.file, err)
	case len(b) > maxURLFileBytes:
		return "", fmt.Errorf("database URL file %s: more than %d bytes: not a URL", d.file, maxURLFileBytes)
	}
	url := strings.TrimSpace(string(b))
	if url == "" {
		return "", fmt.Errorf("database URL file %s is empty", d.file)
	}
	return url, nil
}

// parseDatabaseURL parses a Postgres URL for a connection of the named
// application whose statements the server itself ends after timeout
// (statement_timeout, unless the URL sets it): a hung or slow database
// costs a bounded wait even if the client has gone. The error never holds
// the URL (pgx's parse errors can show it, password and all).
func parseDatabaseURL(url, application string, timeout time.Duration) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, errors.New("the database URL cannot be parsed (postgres://user:password@host:port/database?sslmode=…)")
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = application // visible in pg_stat_activity
	}
	if _, set := cfg.RuntimeParams["statement_timeout"]; !set && timeout > 0 {
		cfg.RuntimeParams["statement_timeout"] = strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
	}
	return cfg, nil
}

// scrub replaces secret in msg (a belt to the braces of never formatting a
// URL into an error).
func scrub(msg, secret string) string {
	if secret == "" {
		return msg
	}
	return strings.ReplaceAll(msg, secret, "xxxxx")
}
