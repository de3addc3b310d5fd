package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/limits"
	"github.com/ratelimit-authz/ratelimit-authz/internal/overridedb"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/snapshot"
)

const limitsUsage = `Usage: ratelimit-authz limits COMMAND [flags] ARGS

Per-tenant limit overrides, kept in Postgres. Every node applies a change
within a second, whether made here or with plain SQL.

Commands:
  set TENANT BUCKET LIMIT/WINDOW --actor NAME   override one bucket (e.g. 200/1s, 10/1m; windows 1s, 1m, 1h, 1d)
  get TENANT                                   show a tenant's overrides and the configured limits
  list                                         show every override
  delete TENANT [BUCKET] --actor NAME          remove one bucket's override, or all of the tenant's
  audit TENANT                                 show the tenant's change history
  owner set KEY_NAME KEY TENANT --actor NAME   the TENANT's overrides apply to buckets keyed by KEY (e.g. channel ch-123)
  owner delete KEY_NAME KEY --actor NAME       KEY has no owner again: the configured limits apply
  owner list [--tenant TENANT]                 show every key owner (or a tenant's keys)
  owner audit KEY_NAME KEY                     show the history of KEY's owner

A bucket keyed by tenant takes the override of its tenant; a bucket keyed by
a path parameter or a header (inbound: path:channel) takes the override of
the tenant recorded as the key's owner (KEY_NAME channel, or header:NAME),
never of a tenant a request claims. A key without an owner gets the
configured limit.

Every command reads the database URL from DATABASE_URL, or from the file
named by --database-url-file (env DATABASE_URL_FILE); --database-url works
too but shows the password to anyone who can list processes. Every command
also takes --config (env RATELIMIT_AUTHZ_CONFIG: which buckets accept
overrides), --rls-config-dir (env RATELIMIT_AUTHZ_RLS_CONFIG_DIR: the
envoyproxy/ratelimit rules whose overridable ones accept overrides by
name, when the server serves them) and --timeout. Run 'ratelimit-authz limits COMMAND --help' for
its flags.

Exit status: 0 done; 2 invalid input (nothing written); 1 anything else,
such as a database error or nothing to delete.
`

func runLimits(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ratelimit-authz limits", limitsUsage, map[string]subcommand{
		"set": limitsSet, "get": limitsGet, "list": limitsList, "delete": limitsDelete,
		"audit": limitsAudit, "owner": limitsOwner,
	}, args, getenv, stdout, stderr)
}

// subcommand is one command of a group such as limits.
type subcommand func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// dispatch runs the command args[0] of group with the rest of args; help
// prints usage, and no command or an unknown one is a usage error (exit 2).
func dispatch(ctx context.Context, group, usage string, cmds map[string]subcommand, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{code: 2}
	}
	cmd := args[0]
	if run, ok := cmds[cmd]; ok {
		return run(ctx, args[1:], getenv, stdout, stderr)
	}
	switch cmd {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n\n%s", group, cmd, usage)
	return exitError{code: 2}
}

// dbCommand holds what every database command shares: flags, then the
// configuration and a connection.
type dbCommand struct {
	name        string // "limits set"
	f           *envFlags
	db          databaseFlags
	databaseURL string // resolved by parse
	secret      string // the URL's password, scrubbed from every message
	configPath  string
	// rlsDir, rlsDotfiles and rlsMerge read envoyproxy/ratelimit rules, as
	// check-config's flags of the same names.
	rlsDir                string
	rlsDotfiles, rlsMerge bool
	timeout               time.Duration
	actor                 string // only for commands that change something
	limit                 int    // audit only
}

func newDBCommand(name, argsUsage, summary string, getenv func(string) string, defTimeout time.Duration, withConfig bool) *dbCommand {
	c := &dbCommand{name: name, f: newEnvFlags(name, summary, getenv)}
	c.f.fs.Usage = func() {
		fmt.Fprintf(c.f.fs.Output(), "Usage: ratelimit-authz %s [flags]%s\n\n%s\n\nFlags:\n", name, argsUsage, summary)
		c.f.fs.PrintDefaults()
	}
	c.db.addFlags(c.f)
	if withConfig {
		c.f.String(&c.configPath, "config", "RATELIMIT_AUTHZ_CONFIG", defaultConfigPath, "configuration `file` naming the overridable buckets; when the default path is missing, the shipped configuration is used")
		c.f.String(&c.rlsDir, "rls-config-dir", "RATELIMIT_AUTHZ_RLS_CONFIG_DIR", "", "`directory` of envoyproxy/ratelimit configuration files: their overridable rules (rate_limit.overridable, by rate_limit.name) accept overrides too")
		c.f.Bool(&c.rlsMerge, "rls-merge-domains", "RATELIMIT_AUTHZ_RLS_MERGE_DOMAINS", false, "with --rls-config-dir: a domain in several files is one domain, as the server's flag")
		c.f.Bool(&c.rlsDotfiles, "rls-ignore-dotfiles", "RATELIMIT_AUTHZ_RLS_IGNORE_DOTFILES", false, "with --rls-config-dir: skip files and directories whose name starts with \".\", as the server's flag")
	}
	c.f.fs.DurationVar(&c.timeout, "timeout", defTimeout, "give up after this long")
	return c
}

// parse parses flags given before, between or after the positional
// arguments, and checks their number. done means the command is over
// (help printed, or a usage error in err).
func (c *dbCommand) parse(args []string, minArgs, maxArgs int, stdout, stderr io.Writer) (pos []string, done bool, err error) {
	if pos, done, err = cli.ParseArgs(c.f.fs, args, stdout, stderr); done {
		return nil, true, err
	}
	if err := errors.Join(c.f.errs...); err != nil {
		return nil, true, c.usageError(stderr, "%v", err)
	}
	switch {
	case len(pos) < minArgs:
		return nil, true, c.usageError(stderr, "missing arguments")
	case len(pos) > maxArgs:
		return nil, true, c.usageError(stderr, "unexpected argument %q", pos[maxArgs])
	case c.timeout <= 0:
		return nil, true, c.usageError(stderr, "--timeout must be positive")
	}
	url, err := c.db.resolve()
	switch {
	case err != nil:
		return nil, true, c.usageError(stderr, "%v", err)
	case url == "":
		return nil, true, c.usageError(stderr, "no database: set DATABASE_URL, DATABASE_URL_FILE (--database-url-file) or --database-url")
	}
	c.databaseURL = url
	return pos, false, nil
}

func (c *dbCommand) usageError(stderr io.Writer, format string, args ...any) error {
	return cli.Usage(c.f.fs, stderr, fmt.Sprintf(format, args...))
}

// invalid is the exit for input that fails validation: status 2, nothing
// written.
func (c *dbCommand) invalid(err error) error {
	return exitError{code: 2, msg: fmt.Sprintf("ratelimit-authz %s: %s", c.name, strings.TrimPrefix(err.Error(), limits.ErrInvalid.Error()+": "))}
}

func (c *dbCommand) failed(err error) error {
	if errors.Is(err, limits.ErrInvalid) {
		return c.invalid(err)
	}
	return exitError{code: 1, msg: scrub(fmt.Sprintf("ratelimit-authz %s: %v", c.name, err), c.secret)}
}

// parseRules is parse, then rules: what every command that reads the
// configuration starts with. done means: return err.
func (c *dbCommand) parseRules(args []string, minArgs, maxArgs int, stdout, stderr io.Writer) (pos []string, snap *snapshot.Snapshot, done bool, err error) {
	if pos, done, err = c.parse(args, minArgs, maxArgs, stdout, stderr); done {
		return nil, nil, true, err
	}
	if snap, err = c.rules(); err != nil {
		return nil, nil, true, err
	}
	return pos, snap, false, nil
}

// rules compiles the configuration whose buckets accept overrides: those
// of --config, and the overridable rules of --rls-config-dir when it is
// given (filed under their names, as the server files them).
func (c *dbCommand) rules() (*snapshot.Snapshot, error) {
	r, source, err := configfile.File{Path: c.configPath, Explicit: c.f.set("config", "RATELIMIT_AUTHZ_CONFIG")}.Load()
	if err != nil {
		if ps, ok := problem.As(err); ok {
			return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: configuration %s has %d problem(s):\n%v", c.name, source, len(ps), ps)}
		}
		return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: %v", c.name, err)}
	}
	if c.rlsDir == "" {
		return c.compile(snapshot.Sources{Rules: r})
	}
	cfg, err := rlsconfig.LoadDir(c.rlsDir, c.rlsDotfiles, rlsconfig.Options{MergeDomains: c.rlsMerge})
	if err != nil {
		if ps, ok := problem.As(err); ok {
			return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: the RLS configuration in %s has %d problem(s):\n%v", c.name, c.rlsDir, len(ps), ps)}
		}
		return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: %v", c.name, err)}
	}
	for _, rule := range cfg.Rules() {
		if rule.Overridable && r.BucketIndex(rule.Name) >= 0 {
			return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: the RLS rule name %q is also a bucket of %s: the server refuses this configuration", c.name, rule.Name, source)}
		}
	}
	return c.compile(snapshot.Sources{Rules: r, RLS: cfg})
}

// compile is src as the server compiles it.
func (c *dbCommand) compile(src snapshot.Sources) (*snapshot.Snapshot, error) {
	snap, err := snapshot.Compile(src)
	if err != nil {
		return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: %v", c.name, err)}
	}
	return snap, nil
}

// connect opens the database; the caller closes it.
func (c *dbCommand) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := parseDatabaseURL(c.databaseURL, "ratelimit-authz "+c.name, c.timeout)
	if err != nil {
		return nil, exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: %v", c.name, err)}
	}
	c.secret = cfg.Password
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, c.failed(fmt.Errorf("connect to the database: %w", err))
	}
	return conn, nil
}

func closeDB(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn.Close(ctx)
}

// withConn runs fn on a fresh connection, within the command's timeout,
// and closes the connection afterwards.
func (c *dbCommand) withConn(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeDB(conn)
	return fn(ctx, conn)
}

// withStore runs fn with a Store on a fresh connection (see withConn).
func (c *dbCommand) withStore(ctx context.Context, snap *snapshot.Snapshot, fn func(context.Context, *overridedb.Store) error) error {
	return c.withConn(ctx, func(ctx context.Context, conn *pgx.Conn) error {
		s, err := overridedb.NewStore(conn, snap)
		if err != nil {
			return c.failed(err)
		}
		return fn(ctx, s)
	})
}

// configured describes a bucket's limit without an override.
func configured(snap *snapshot.Snapshot, bucket string) string {
	b, ok := snap.OverrideTarget(bucket)
	if !ok {
		return "(not in the configuration)"
	}
	if !b.HasLimit {
		return "(set per route)"
	}
	return rate(b.Limit)
}

func rate(l counter.Limit) string { return limits.FormatRate(l.Limit, l.ScaleMS) }

func limitsSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits set", " TENANT BUCKET LIMIT/WINDOW --actor NAME",
		"Override one bucket's limit for a tenant, e.g. 'limits set acme activity_create 200/1s --actor alice'.\n"+
			"LIMIT is requests per WINDOW: 1s, 1m, 1h or 1d. Only buckets with overridable: true\n"+
			"in the configuration accept overrides. The change and its audit record are written in\n"+
			"one transaction; every node applies it within a second.", getenv, 10*time.Second, true)
	c.f.fs.StringVar(&c.actor, "actor", "", "who makes the change, for the audit log (required)")
	pos, snap, done, err := c.parseRules(args, 3, 3, stdout, stderr)
	if done {
		return err
	}
	tenant, bucket := pos[0], pos[1]
	// Everything is checked before the database is touched.
	limit, scaleMS, rateErr := limits.ParseRate(pos[2])
	o := limits.Override{Bucket: bucket, Limit: limit, ScaleMS: scaleMS}
	b, bucketErr := snap.OverrideBucket(bucket)
	if err := errors.Join(limits.ValidateTenant(tenant), bucketErr, rateErr, overridedb.ValidateActor(c.actor)); err != nil {
		return c.invalid(err)
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		ch, err := s.Set(ctx, tenant, o, c.actor)
		if err != nil {
			return c.failed(err)
		}
		was := "the configured " + configured(snap, bucket)
		if ch.Old != nil {
			was = ch.Old.Rate()
		}
		fmt.Fprintf(stdout, "%s %s: %s (was %s)\n", tenant, bucket, o.Rate(), was)
		if name, ok := limits.OwnerKeyName(b.Key); ok {
			fmt.Fprintf(stdout, "%s is keyed by %s: this applies to the keys %s owns ('limits owner set %s KEY %s')\n", bucket, name, tenant, name, tenant)
		}
		return nil
	})
}

func limitsDelete(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits delete", " TENANT [BUCKET] --actor NAME",
		"Remove a tenant's override of BUCKET, or without BUCKET all of its overrides; the\n"+
			"configured limits apply again. Exit 1 when there is nothing to remove.", getenv, 10*time.Second, true)
	c.f.fs.StringVar(&c.actor, "actor", "", "who makes the change, for the audit log (required)")
	pos, snap, done, err := c.parseRules(args, 1, 2, stdout, stderr)
	if done {
		return err
	}
	tenant, bucket := pos[0], ""
	if len(pos) > 1 {
		// Any name may be removed, overridable or not: cleaning up a row
		// written with SQL is a reason to delete.
		bucket = pos[1]
	}
	if err := errors.Join(limits.ValidateTenant(tenant), overridedb.ValidateActor(c.actor)); err != nil {
		return c.invalid(err)
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		changes, err := s.Delete(ctx, tenant, bucket, c.actor)
		switch {
		case errors.Is(err, overridedb.ErrNotFound) && bucket != "":
			return exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: tenant %q has no override for bucket %q; nothing deleted", c.name, tenant, bucket)}
		case errors.Is(err, overridedb.ErrNotFound):
			return exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: tenant %q has no overrides; nothing deleted", c.name, tenant)}
		case err != nil:
			return c.failed(err)
		}
		for _, ch := range changes {
			fmt.Fprintf(stdout, "%s %s: override %s deleted; the configured %s applies\n", tenant, ch.Bucket, ch.Old.Rate(), configured(snap, ch.Bucket))
		}
		return nil
	})
}

func limitsGet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits get", " TENANT", "Show a tenant's overrides next to the configured limits.", getenv, 10*time.Second, true)
	pos, snap, done, err := c.parseRules(args, 1, 1, stdout, stderr)
	if done {
		return err
	}
	if err := limits.ValidateTenant(pos[0]); err != nil {
		return c.invalid(err)
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		t, ok, err := s.Get(ctx, pos[0])
		if err != nil {
			return c.failed(err)
		}
		if !ok {
			fmt.Fprintf(stdout, "%s: no overrides; the configured limits apply\n", pos[0])
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BUCKET\tOVERRIDE\tCONFIGURED\tNOTE")
		for _, o := range t.Overrides {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", o.Bucket, o.Rate(), configured(snap, o.Bucket), note(snap, o.Bucket))
		}
		tw.Flush()
		for _, p := range t.Problems {
			fmt.Fprintf(stdout, "skipped by the server: %s\n", printable(p))
		}
		fmt.Fprintf(stdout, "updated %s\n", t.UpdatedAt.UTC().Format(time.RFC3339))
		return nil
	})
}

// note flags an override the server ignores under this configuration.
func note(snap *snapshot.Snapshot, bucket string) string {
	if _, err := snap.OverrideBucket(bucket); err != nil {
		return "ignored: not overridable in this configuration"
	}
	return ""
}

func limitsList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits list", "", "Show every tenant override, by tenant.", getenv, time.Minute, true)
	_, snap, done, err := c.parseRules(args, 0, 0, stdout, stderr)
	if done {
		return err
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		return c.table(stdout, "TENANT\tBUCKET\tOVERRIDE\tCONFIGURED\tUPDATED\tNOTE", "override", func(tw io.Writer) (n int, err error) {
			err = s.List(ctx, func(t overridedb.Tenant) error {
				updated := t.UpdatedAt.UTC().Format(time.RFC3339)
				for _, o := range t.Overrides {
					n++
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", printable(t.Tenant), o.Bucket, o.Rate(), configured(snap, o.Bucket), updated, note(snap, o.Bucket))
				}
				for _, p := range t.Problems {
					fmt.Fprintf(tw, "%s\t-\t-\t-\t%s\tskipped by the server: %s\n", printable(t.Tenant), updated, printable(p))
				}
				return nil
			})
			return n, err
		})
	})
}

func limitsAudit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	help := "Show who changed a tenant's overrides and when, oldest first: the actor claimed\n(the CLI's --actor, or sql:USER for plain SQL) and the database user that made the\nchange (USER, or USER as ROLE after SET ROLE), recorded by the database itself.\nControl characters are shown escaped (\\x1b), never sent to the terminal."
	return runAudit(ctx, "limits audit", " TENANT", help, 1, args, getenv, stdout, stderr, func(ctx context.Context, c *dbCommand, s *overridedb.Store, pos []string) error {
		entries, err := s.Audit(ctx, pos[0], c.limit)
		if err != nil {
			return c.failed(err)
		}
		if len(entries) == 0 {
			fmt.Fprintf(stdout, "%s: no changes recorded\n", printable(pos[0]))
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tACTOR\tDB USER\tBUCKET\tOLD\tNEW")
		for _, e := range entries {
			at := e.At.UTC().Format(time.RFC3339)
			actor, user := printable(e.Actor), dbUser(e.DBUser, e.DBRole)
			changes := e.Changes()
			if len(changes) == 0 { // e.g. a value rewritten with the same limits
				fmt.Fprintf(tw, "%s\t%s\t%s\t-\t-\t-\n", at, actor, user)
			}
			for _, ch := range changes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", at, actor, user, printable(ch.Bucket), printable(ch.Old), printable(ch.New))
			}
		}
		return tw.Flush()
	})
}

// table prints a tab-aligned table: the header line, the rows fill writes
// (it returns how many items it listed), then "N noun(s)". An error of fill
// is a database failure; the rows written before it are still shown.
func (c *dbCommand) table(stdout io.Writer, header, noun string, fill func(tw io.Writer) (int, error)) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	n, err := fill(tw)
	tw.Flush()
	if err != nil {
		return c.failed(err)
	}
	fmt.Fprintf(stdout, "%d %s(s)\n", n, noun)
	return nil
}

// runAudit is the frame of an audit subcommand: nargs arguments and
// --limit, then show, with the store, prints the entries.
func runAudit(ctx context.Context, name, argsUsage, help string, nargs int, args []string, getenv func(string) string, stdout, stderr io.Writer,
	show func(ctx context.Context, c *dbCommand, s *overridedb.Store, pos []string) error) error {
	c := newDBCommand(name, argsUsage, help, getenv, 10*time.Second, true)
	c.f.fs.IntVar(&c.limit, "limit", 100, "show at most the `n` most recent changes")
	pos, done, err := c.parse(args, nargs, nargs, stdout, stderr)
	if done {
		return err
	}
	if c.limit < 1 {
		return c.usageError(stderr, "--limit must be at least 1")
	}
	snap, err := c.rules()
	if err != nil {
		return err
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error { return show(ctx, c, s, pos) })
}

// printable escapes what a terminal could act on in text read from the
// database (an actor set with plain SQL can hold anything): control and
// other non-printing characters, invalid UTF-8 and the backslash, as Go
// escapes (\x1b, \n, \u202e, \\). So no stored value can forge lines, move
// the cursor or recolour the operator's terminal.
func printable(s string) string {
	clean := true
	for _, r := range s {
		if r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1] // Quote also escapes ", which is harmless
}

// dbUser shows who the database says made a change: USER, or USER as ROLE
// after SET ROLE; "?" for rows written before the database recorded it.
func dbUser(user, role string) string {
	switch {
	case user == "":
		return "?"
	case role != "" && role != user:
		return printable(user) + " as " + printable(role)
	}
	return printable(user)
}

const ownerUsage = `Usage: ratelimit-authz limits owner COMMAND [flags] ARGS

Key owners: which tenant's overrides apply to a key of a bucket that is not
keyed by tenant (inbound and token_generate are keyed by path:channel, so
KEY_NAME is channel). A key without an owner gets the configured limit.

Commands:
  set KEY_NAME KEY TENANT --actor NAME   record TENANT as KEY's owner
  delete KEY_NAME KEY --actor NAME       remove KEY's owner
  list [--tenant TENANT]                 show every owner, or TENANT's keys
  audit KEY_NAME KEY                     show the history of KEY's owner

KEY is the key exactly as requests carry it: the raw path segment (for
/api/inbound/ch-123, ch-123) or the header value.
`

func limitsOwner(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "ratelimit-authz limits owner", ownerUsage, map[string]subcommand{
		"set": ownerSet, "delete": ownerDelete, "list": ownerList, "audit": ownerAudit,
	}, args, getenv, stdout, stderr)
}

func ownerSet(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits owner set", " KEY_NAME KEY TENANT --actor NAME",
		"Record TENANT as the owner of KEY, e.g. 'limits owner set channel ch-123 bigco --actor alice':\n"+
			"buckets keyed by KEY_NAME (inbound, token_generate: channel) then take TENANT's overrides\n"+
			"for that key. Every node applies it within a second.", getenv, 10*time.Second, true)
	c.f.fs.StringVar(&c.actor, "actor", "", "who makes the change, for the audit log (required)")
	pos, snap, done, err := c.parseRules(args, 3, 3, stdout, stderr)
	if done {
		return err
	}
	name, key, tenant := pos[0], pos[1], pos[2]
	if err := errors.Join(snap.CheckOwnerKeyName(name), limits.ValidateKeyValue(key), limits.ValidateTenant(tenant), overridedb.ValidateActor(c.actor)); err != nil {
		return c.invalid(err)
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		old, err := s.SetOwner(ctx, name, key, tenant, c.actor)
		if err != nil {
			return c.failed(err)
		}
		was := "no owner"
		if old != "" {
			was = printable(old)
		}
		fmt.Fprintf(stdout, "%s %s: owned by %s (was %s)\n", name, printable(key), printable(tenant), was)
		return nil
	})
}

func ownerDelete(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits owner delete", " KEY_NAME KEY --actor NAME",
		"Remove KEY's owner: its buckets get the configured limits. Exit 1 when it has none.", getenv, 10*time.Second, true)
	c.f.fs.StringVar(&c.actor, "actor", "", "who makes the change, for the audit log (required)")
	pos, snap, done, err := c.parseRules(args, 2, 2, stdout, stderr)
	if done {
		return err
	}
	name, key := pos[0], pos[1]
	// Any well-formed name: cleaning up a row written with SQL is a reason
	// to delete.
	if err := errors.Join(limits.ValidateKeyName(name), limits.ValidateKeyValue(key), overridedb.ValidateActor(c.actor)); err != nil {
		return c.invalid(err)
	}
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		old, err := s.DeleteOwner(ctx, name, key, c.actor)
		switch {
		case errors.Is(err, overridedb.ErrNotFound):
			return exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz %s: %s %s has no owner; nothing deleted", c.name, name, printable(key))}
		case err != nil:
			return c.failed(err)
		}
		fmt.Fprintf(stdout, "%s %s: owner %s removed; the configured limits apply\n", name, printable(key), printable(old))
		return nil
	})
}

func ownerList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c := newDBCommand("limits owner list", "", "Show every key owner, by key name and key, or with --tenant only that tenant's keys.", getenv, time.Minute, true)
	var tenant string
	c.f.fs.StringVar(&tenant, "tenant", "", "show only the keys of this `tenant`")
	_, snap, done, err := c.parseRules(args, 0, 0, stdout, stderr)
	if done {
		return err
	}
	if tenant != "" {
		if err := limits.ValidateTenant(tenant); err != nil {
			return c.invalid(err)
		}
	}
	used := snap.OwnerKeyNames()
	return c.withStore(ctx, snap, func(ctx context.Context, s *overridedb.Store) error {
		return c.table(stdout, "KEY_NAME\tKEY\tTENANT\tUPDATED\tNOTE", "owner", func(tw io.Writer) (n int, err error) {
			err = s.Owners(ctx, tenant, func(o overridedb.Owner) error {
				n++
				note := ""
				if !slices.Contains(used, o.KeyName) {
					note = "ignored: no overridable bucket of this configuration is keyed by it"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(o.KeyName), printable(o.Key), printable(o.Tenant), o.UpdatedAt.UTC().Format(time.RFC3339), note)
				return nil
			})
			return n, err
		})
	})
}

func ownerAudit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	help := "Show who changed KEY's owner and when, oldest first (see 'limits audit --help')."
	return runAudit(ctx, "limits owner audit", " KEY_NAME KEY", help, 2, args, getenv, stdout, stderr, func(ctx context.Context, c *dbCommand, s *overridedb.Store, pos []string) error {
		entries, err := s.OwnerAudit(ctx, pos[0], pos[1], c.limit)
		if err != nil {
			return c.failed(err)
		}
		if len(entries) == 0 {
			fmt.Fprintf(stdout, "%s %s: no changes recorded\n", printable(pos[0]), printable(pos[1]))
			return nil
		}
		show := func(t string) string {
			if t == "" {
				return "-"
			}
			return printable(t)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TIME\tACTOR\tDB USER\tOLD OWNER\tNEW OWNER")
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format(time.RFC3339), printable(e.Actor), dbUser(e.DBUser, e.DBRole), show(e.Old), show(e.New))
		}
		return tw.Flush()
	})
}
