// Command ratelimit-bench is the load tool of the ratelimit-authz
// benchmarks (bench/, `make bench`, docs/performance.md): it drives the
// server's gRPC and HTTP calls with the example API's requests, and serves
// what a benchmark needs around the server (the no-op floor servers, an
// upstream application for Envoy). --json writes a run's result in the one
// schema of internal/loadresult, which the runner reads.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

func main() { cli.Main("ratelimit-bench", run) }

type command struct {
	name, help string // help is also the summary of the command's --help
	run        func(ctx context.Context, c command, args []string, stdout, stderr io.Writer) error
}

// commands are the subcommands, in the order the usage lists them.
var commands = []command{
	{"check", "drive ext_authz Check over gRPC with the example API's requests as Envoy sends them; any status but OK is a denial", runLoadCmd},
	{"rls", `drive ShouldRateLimit (domain "bench"; --descriptors: remote_address, generic_key+tenant, path); OVER_LIMIT is a denial`, runLoadCmd},
	{"gubernator", "drive gubernator's GetRateLimits with the rls load's keys, --limit per --per each; any OVER_LIMIT is a denial", runLoadCmd},
	{"accesslog", "stream Envoy's access-log entries, one per message and one stream per connection, each charging --cost to the tenant's --bucket; a sent entry counts as allowed, and the run ends once the server has answered every stream", runLoadCmd},
	{"http", "drive the example API over keep-alive HTTP/1.1 (through Envoy): 2xx allowed, 429 and 403 denied, the rest errors", runLoadCmd},
	{"noop", "serve a no-op ext_authz and rate limit server on this tree's gRPC and HTTP stack (internal/server): the floor", runServerCmd},
	{"noop-grpc", "serve the no-op on a default grpc.NewServer() and generated code: the floor of any grpc-go server", runServerCmd},
	{"upstream", `serve a minimal HTTP application (200 {"ok":true}) for Envoy to route to`, runServerCmd},
	{"routes", `list the example API's routes and the "api" mix`, runRoutesCmd},
	{"rls-config", "print the descriptor file (envoyproxy/ratelimit format, every rule at --limit per --unit) the rls load matches", runRLSConfigCmd},
	{"rlqs", "act as Envoys' quota filters on StreamRateLimitQuotas streams and report the assignments", runRLQSCmd},
}

func usage() string {
	var b strings.Builder
	b.WriteString("ratelimit-bench: load and reference servers for the ratelimit-authz benchmarks.\n\nUsage: ratelimit-bench COMMAND [flags]\n\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-11s %s\n", c.name, c.help)
	}
	return b.String() + "\n'ratelimit-bench help COMMAND' lists a command's flags.\n"
}

func findCommand(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return cli.UsageError{}
	}
	if c, ok := findCommand(args[0]); ok {
		return c.run(ctx, c, args[1:], stdout, stderr)
	}
	name := args[0]
	switch name {
	case "help", "-h", "--help", "-help":
		if len(args) == 1 || slices.Contains([]string{"help", "-h", "--help", "-help"}, args[1]) {
			fmt.Fprint(stdout, usage())
			return nil
		}
		if c, ok := findCommand(args[1]); ok {
			return c.run(ctx, c, []string{"--help"}, stdout, stderr)
		}
		name = args[1]
	}
	fmt.Fprintf(stderr, "ratelimit-bench: unknown command %q\n\n%s", name, usage())
	return cli.UsageError{}
}

func newFlagSet(c command) *flag.FlagSet {
	fs := flag.NewFlagSet("ratelimit-bench "+c.name, flag.ContinueOnError) // the name cli's messages start with
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ratelimit-bench %s [flags]: %s.\n\nFlags:\n", c.name, c.help)
		fs.PrintDefaults()
	}
	return fs
}

func runLoadCmd(ctx context.Context, cmd command, args []string, stdout, stderr io.Writer) error {
	l := loadCmd{name: cmd.name, cfg: loadConfig{seed: 1}}
	fs := l.flags(cmd)
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if err := l.resolve(); err != nil {
		return err
	}
	load, err := l.load()
	if err != nil {
		return err
	}
	c, err := l.dial(load)
	if err != nil {
		return err
	}
	defer c.close()
	if err := preflight(ctx, c, l.cfg, l.to); err != nil {
		return err
	}
	rec, err := runLoad(ctx, l.cfg, c)
	if err != nil {
		return err
	}
	res := summarise(rec, l.cfg)
	res.Mode, res.Targets = l.name, l.to
	if l.name != "http" {
		res.Connections = max(l.connections, len(l.to))
	}
	if load.mix != "" {
		res.Mix = load.mix + "; " + res.Mix
	}
	return l.report(ctx, &res, stdout)
}

// loadCmd is what the flags of a load command (check, rls, gubernator,
// accesslog, http) set.
type loadCmd struct {
	name        string
	cfg         loadConfig
	targets     string   // --target as given
	to          []string // its addresses, set by resolve
	routes      string
	descriptors int
	limit       int64
	per         time.Duration
	charge      alsCharge
	connections int
	jsonPath    string
	quiet       bool
}

// flags is the flag set of command cmd, each flag setting its field of l.
func (l *loadCmd) flags(cmd command) *flag.FlagSet {
	name, fs := l.name, newFlagSet(cmd)
	cfg, keys := &l.cfg, &l.cfg.keys
	target, routes := "127.0.0.1:9001", "api"
	if name == "http" {
		target = "127.0.0.1:10000"
	} else if name == "accesslog" {
		routes = "activities" // a route whose requests carry a tenant to charge
	}
	fs.StringVar(&l.targets, "target", target, "`addresses` to send to, comma-separated (several: requests are spread over them in turn)")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "requests in flight at most (workers)")
	fs.Float64Var(&cfg.rate, "rate", 0, "fixed rate in requests/s over all workers (open loop: a request that finds every worker busy counts its latency from when it was due); 0 = as fast as answers come")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time, after the warm-up")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "time sent but not measured, before --duration")
	fs.Int64Var(&cfg.requests, "requests", 0, "send at most this many requests, warm-up included (0 = bounded by time only)")
	fs.DurationVar(&cfg.timeout, "timeout", time.Second, "per-request deadline; a request past it is an error")
	fs.StringVar(&l.routes, "routes", routes, `route mix: "api" (the example API's production-like shares; see 'ratelimit-bench routes') or names with weights, "activities=3,inbound"`)
	fs.StringVar(&keys.dist, "keys", keysZipf, "key popularity: uniform, zipf (skewed, see --zipf-s) or unique (every request a new key: memory runs)")
	fs.Float64Var(&keys.zipfS, "zipf-s", 1.1, "zipf exponent s > 1: key of rank k has weight 1/(k+1)^s")
	fs.Uint64Var(&keys.tenants, "tenants", 1000, "distinct tenants (x-tenant-id)")
	fs.Uint64Var(&keys.channels, "channels", 1000, "distinct channels ({channel} path parameter)")
	fs.Uint64Var(&keys.ips, "ips", 10000, "distinct client IPs (10.0.0.0/8)")
	fs.Uint64Var(&keys.accounts, "accounts", 1000, "distinct login accounts (email in the login body)")
	fs.StringVar(&keys.prefix, "key-prefix", "", "prefix for tenant, channel and account keys: separate key spaces for concurrent runs")
	fs.IntVar(&cfg.pool, "pool", 16384, "requests prepared before the run and reused in turn, so the tool spends its CPU on the transport (0 = prepare each; --keys unique always does)")
	if name == "rls" || name == "gubernator" {
		fs.IntVar(&l.descriptors, "descriptors", 1, "descriptors per call, from 1 to 3: remote_address, then generic_key+tenant, then path")
	}
	if name == "gubernator" {
		fs.Int64Var(&l.limit, "limit", 1, "hits each key may have per --per (token bucket)")
		fs.DurationVar(&l.per, "per", time.Second, "the window of --limit")
	}
	if name == "accesslog" {
		fs.StringVar(&l.charge.bucket, "bucket", "llm_tokens", "the cost `bucket` each entry charges (one charged from a response header)")
		fs.StringVar(&l.charge.header, "cost-header", "x-usage-total-tokens", "the response `header` that reports the cost")
		fs.Int64Var(&l.charge.cost, "cost", 100, "the cost each entry reports")
	}
	if name != "http" {
		fs.IntVar(&l.connections, "connections", 4, "gRPC connections (HTTP/2), at least one per target; requests are spread over them in turn")
	}
	fs.StringVar(&l.jsonPath, "json", "", "also write the results as JSON to this `file` (\"-\": stdout, instead of the text)")
	fs.BoolVar(&l.quiet, "quiet", false, "print nothing but errors (with --json FILE)")
	return fs
}

// resolve checks the parsed flags and sets the route mix and the target
// addresses from them.
func (l *loadCmd) resolve() error {
	var err error
	if l.cfg.mix, err = parseMix(l.routes); err != nil {
		return cli.UsageError{Msg: "--routes: " + err.Error()}
	}
	if err := l.cfg.validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	for t := range strings.SplitSeq(l.targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			l.to = append(l.to, t)
		}
	}
	if len(l.to) == 0 {
		return cli.UsageError{Msg: "--target: no address"}
	}
	if l.name != "http" && (l.connections < 1 || l.connections > 1000) {
		return cli.UsageError{Msg: fmt.Sprintf("--connections %d: must be from 1 to 1000", l.connections)}
	}
	return nil
}

// load is the gRPC call the command sends; the zero grpcLoad for http.
func (l *loadCmd) load() (grpcLoad, error) {
	var load grpcLoad
	var err error
	switch l.name {
	case "check":
		load = checkLoad()
	case "rls":
		load, err = rlsLoad(l.descriptors)
	case "gubernator":
		load, err = guberLoad(l.descriptors, l.limit, l.per)
	case "accesslog":
		load, err = alsLoad(l.charge, l.cfg.mix)
	case "http":
	default:
		return grpcLoad{}, fmt.Errorf("command %s has no load", l.name)
	}
	if err != nil {
		return grpcLoad{}, cli.UsageError{Msg: err.Error()}
	}
	return load, nil
}

// dial is the caller that sends load, or HTTP requests for http, to the
// targets.
func (l *loadCmd) dial(load grpcLoad) (caller, error) {
	if l.name == "http" {
		return newHTTPCaller(l.to, l.cfg.concurrency)
	}
	return dialLoad(l.to, l.connections, load)
}

// report writes the result res as --json and --quiet ask, and is the
// command's error: an interrupted run, or one no request was answered in.
func (l *loadCmd) report(ctx context.Context, res *loadresult.Result, stdout io.Writer) error {
	if l.jsonPath != "" {
		if err := writeJSON(l.jsonPath, res, stdout); err != nil {
			return err
		}
	}
	if l.jsonPath != "-" && !l.quiet {
		printText(stdout, res)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if res.Allowed+res.Denied == 0 {
		first := "no requests were sent"
		for k := range res.ErrorKinds {
			first = k
			break
		}
		return fmt.Errorf("no request was answered by %s (%s): the target is down or not what the tool expects", strings.Join(l.to, ","), first)
	}
	return nil
}

// preflight sends one request to each target with a short deadline, so
// that a server that is down is a clear error, not a run of failures. The
// probe is the "unmatched" request (GET /static/app.js): no route rule
// matches it, so it counts against no key and takes none of the run's.
func preflight(ctx context.Context, c caller, cfg loadConfig, targets []string) error {
	probe, _ := parseMix("unmatched") // a catalogue route: parses
	for i := range targets {
		p, err := c.prepare(newGenerator(probe, cfg.keys, cfg.seed, -2, new(atomic.Uint64)).next(), 0)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		o := c.call(cctx, uint64(i), p)
		cancel()
		if o.code == -1 { // no answer at all; an HTTP error status is an answer
			return fmt.Errorf("%s does not answer: %s", targets[i], o.err)
		}
	}
	return nil
}

// writeJSON writes v as indented JSON and a newline to path ("-":
// stdout).
func writeJSON(path string, v any, stdout io.Writer) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if b = append(b, '\n'); path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func runServerCmd(ctx context.Context, cmd command, args []string, stdout, stderr io.Writer) error {
	name := cmd.name
	fs := newFlagSet(cmd)
	var c serveConfig
	if name == "upstream" {
		fs.StringVar(&c.httpAddr, "addr", "127.0.0.1:8080", "listen `address`")
	} else {
		fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:9001", "gRPC listen `address`")
		fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:9090", "HTTP listen `address` (/healthz, /readyz; noop: also /metrics)")
		fs.StringVar(&c.pprofAddr, "pprof-addr", "", "serve /debug/pprof on this `address` (empty: off)")
	}
	fs.DurationVar(&c.lifetime, "lifetime", time.Hour, "exit after this long even if nobody stops the server")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if c.lifetime <= 0 || c.lifetime > 24*time.Hour {
		return cli.UsageError{Msg: fmt.Sprintf("--lifetime %v: must be positive and at most 24h", c.lifetime)}
	}
	ctx, cancel := context.WithTimeout(ctx, c.lifetime)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	switch name {
	case "upstream":
		return serveUpstream(ctx, c.httpAddr, log)
	case "noop-grpc":
		return serveNoopGRPC(ctx, c, log)
	}
	return serveNoop(ctx, c, log)
}

func runRLSConfigCmd(_ context.Context, cmd command, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(cmd)
	limit := fs.Uint64("limit", 2_000_000_000, "requests_per_unit of every rule (0 blocks everything)")
	unit := fs.String("unit", "second", "unit of every rule: second, minute, hour or day")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if *limit > 1<<32-1 {
		return cli.UsageError{Msg: fmt.Sprintf("--limit %d: must fit in 32 bits", *limit)}
	}
	switch *unit {
	case "second", "minute", "hour", "day":
	default:
		return cli.UsageError{Msg: fmt.Sprintf("--unit %q: want second, minute, hour or day", *unit)}
	}
	_, err := io.WriteString(stdout, rlsBenchConfig(uint32(*limit), *unit))
	return err
}

// runRoutesCmd lists the example API's routes; it takes no flags.
func runRoutesCmd(_ context.Context, _ command, _ []string, w, _ io.Writer) error {
	total := 0
	for _, r := range catalogue {
		total += r.weight
	}
	fmt.Fprintf(w, "%-22s %-7s %-49s %7s  %s\n", "route", "method", "path", "api mix", "counts against")
	for _, r := range catalogue {
		method, share := "POST", "-"
		if r.name == "unmatched" {
			method = "GET"
		}
		if r.weight > 0 {
			share = fmt.Sprintf("%d%%", r.weight*100/total)
		}
		fmt.Fprintf(w, "%-22s %-7s %-49s %7s  %s\n", r.name, method, r.path, share, r.describe)
	}
	return nil
}
