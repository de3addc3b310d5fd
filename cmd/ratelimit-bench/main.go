// Command ratelimit-bench is the load tool of the ratelimit-authz
// benchmarks (bench/, `make bench`): it drives the server's gRPC and HTTP
// calls with the example API's requests and prints throughput, latency
// percentiles and outcomes, and it serves the pieces a benchmark needs
// around the server (a no-op server, the floor every figure is compared
// with, and an upstream application for Envoy). --json writes a run's
// result in the one schema of internal/loadresult, which the runner reads.
// 'ratelimit-bench help' lists the commands.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
)

func main() { cli.Main("ratelimit-bench", run) }

// commands are the subcommands, in the order the usage lists them.
var commands = []struct {
	name, help string
	run        func(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error
}{
	{"check", "drive ext_authz Check over gRPC and report throughput and latency", runLoadCmd},
	{"rls", "drive ShouldRateLimit (Envoy's rate limit filter) over gRPC and report the same", runLoadCmd},
	{"gubernator", "drive gubernator's GetRateLimits with the rls load's keys and report the same", runLoadCmd},
	{"accesslog", "stream Envoy's access-log entries that charge a cost bucket after the response", runLoadCmd},
	{"http", "drive the example API over HTTP (through Envoy) and report the same", runLoadCmd},
	{"noop", "serve a no-op ext_authz and rate limit server that answers OK at once: the floor", runServerCmd},
	{"noop-grpc", "serve a no-op ext_authz and rate limit server on a default-configured grpc.NewServer(): the floor of any grpc-go server", runServerCmd},
	{"upstream", "serve a minimal HTTP application for Envoy to route to", runServerCmd},
	{"routes", `list the example API's routes and the "api" mix`, runRoutesCmd},
	{"rls-config", "print the descriptor file (envoyproxy/ratelimit format) the rls load matches", runRLSConfigCmd},
	{"rlqs", "act as Envoys' quota filters on StreamRateLimitQuotas streams and report the assignments", runRLQSCmd},
}

func usage() string {
	var b strings.Builder
	b.WriteString("ratelimit-bench: load and reference servers for the ratelimit-authz benchmarks.\n\nUsage:\n")
	for _, c := range commands {
		if c.name != "routes" { // the one command without flags
			c.name += " [flags]"
		}
		fmt.Fprintf(&b, "  ratelimit-bench %-18s %s\n", c.name, c.help)
	}
	b.WriteString("\nRun 'ratelimit-bench COMMAND --help' for a command's flags. make bench\n(bench/run.sh) runs every scenario and writes bench/results/REPORT.md.\n")
	return b.String()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return cli.UsageError{}
	}
	name, rest := args[0], args[1:]
	for _, c := range commands {
		if c.name == name {
			return c.run(ctx, name, rest, stdout, stderr)
		}
	}
	switch name {
	case "help", "-h", "--help", "-help":
		if len(rest) > 0 && rest[0] != "help" {
			return run(ctx, []string{rest[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage())
		return nil
	}
	fmt.Fprintf(stderr, "ratelimit-bench: unknown command %q\n\n%s", name, usage())
	return cli.UsageError{}
}

func newFlagSet(name, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet("ratelimit-bench "+name, flag.ContinueOnError) // the name cli's messages start with
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ratelimit-bench %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

// loadOptions are what a load command's flags set.
type loadOptions struct {
	cfg                    loadConfig
	targets, routes, json  string
	quiet                  bool
	connections, descripts int
	limit                  int64
	per                    time.Duration
	charge                 alsCharge
}

// loadMode is one load command: its help, its defaults ("": the gRPC
// port and the "api" mix), its own flags and the gRPC load it drives
// (nil: the example API over HTTP).
type loadMode struct {
	summary, target, routes string
	flags                   func(fs *flag.FlagSet, o *loadOptions)
	grpc                    func(o *loadOptions) (grpcLoad, error)
}

var loadModes = map[string]loadMode{
	"check": {summary: `Drive Envoy's ext_authz Check over gRPC with the example API's requests (routes,
tenants, channels, client IPs as Envoy would send them), then print requests/s,
latency percentiles and allowed/denied/errors. Runs are bounded by --duration
(plus --warmup) and, when set, by --requests.`,
		grpc: func(*loadOptions) (grpcLoad, error) { return checkLoad(), nil }},
	"http": {summary: `Drive the example API over HTTP/1.1 (keep-alive, one connection per request in
flight), normally through Envoy, then print requests/s, latency percentiles and
outcomes: 2xx allowed, 429 and 403 denied, anything else an error.`,
		target: "127.0.0.1:10000"},
	"rls": {summary: `Drive ShouldRateLimit over gRPC with the descriptors Envoy's rate limit filter
would send for the example API's requests (domain "bench"; --descriptors of:
remote_address; generic_key=<route> and tenant; path), then print requests/s,
latency percentiles and outcomes: OVER_LIMIT denied, any other answer allowed.`,
		flags: descriptorsFlag,
		grpc:  func(o *loadOptions) (grpcLoad, error) { return rlsLoad(o.descripts) }},
	"gubernator": {summary: `Drive gubernator's GetRateLimits (pb.gubernator.V1) over gRPC with one rate limit
per descriptor the rls load would send (named by the descriptor's first key,
keyed by its values, --limit per --per, token bucket), then print requests/s,
latency percentiles and outcomes: any OVER_LIMIT denied, else allowed.`,
		flags: func(fs *flag.FlagSet, o *loadOptions) {
			descriptorsFlag(fs, o)
			fs.Int64Var(&o.limit, "limit", 1, "hits each key may have per --per")
			fs.DurationVar(&o.per, "per", time.Second, "the window of --limit")
		},
		grpc: func(o *loadOptions) (grpcLoad, error) { return guberLoad(o.descripts, o.limit, o.per) }},
	"accesslog": {summary: `Stream Envoy's gRPC access log (StreamAccessLogs) to a server, one entry per
message and one stream per connection, as Envoy's workers do: each entry
carries the Check's charges metadata (--bucket → the request's tenant) and
the response header --cost-header reporting --cost, so the server charges
the bucket after the response. A sent entry counts as allowed; the run ends
once the server has answered every stream (it answers only at a stream's
end).`,
		routes: "activities", // a route whose requests carry a tenant to charge
		flags: func(fs *flag.FlagSet, o *loadOptions) {
			fs.StringVar(&o.charge.bucket, "bucket", "llm_tokens", "the cost `bucket` each entry charges (one charged from a response header)")
			fs.StringVar(&o.charge.header, "cost-header", "x-usage-total-tokens", "the response `header` that reports the cost")
			fs.Int64Var(&o.charge.cost, "cost", 100, "the cost each entry reports")
		},
		grpc: func(o *loadOptions) (grpcLoad, error) { return alsLoad(o.charge, o.cfg.mix) }},
}

func descriptorsFlag(fs *flag.FlagSet, o *loadOptions) {
	fs.IntVar(&o.descripts, "descriptors", 1, "descriptors per call, from 1 to 3 (see above)")
}

func runLoadCmd(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	mode := loadModes[name]
	fs := newFlagSet(name, mode.summary)
	o := loadOptions{cfg: loadConfig{seed: 1}}
	cfg, keys := &o.cfg, &o.cfg.keys
	fs.StringVar(&o.targets, "target", cmp.Or(mode.target, "127.0.0.1:9001"), "`addresses` to send to, comma-separated (several: requests are spread over them in turn)")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "requests in flight at most (workers)")
	fs.Float64Var(&cfg.rate, "rate", 0, "fixed rate in requests/s over all workers (open loop: a request that finds every worker busy counts its latency from when it was due); 0 = as fast as answers come")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time, after the warm-up")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "time sent but not measured, before --duration")
	fs.Int64Var(&cfg.requests, "requests", 0, "send at most this many requests, warm-up included (0 = bounded by time only)")
	fs.DurationVar(&cfg.timeout, "timeout", time.Second, "per-request deadline; a request past it is an error")
	fs.DurationVar(&cfg.window, "window", 0, "count allowed/denied per wall-clock window of this length (e.g. 1s), for accuracy runs; 0 = off")
	fs.StringVar(&o.routes, "routes", cmp.Or(mode.routes, "api"), `route mix: "api" (the example API's production-like shares; see 'ratelimit-bench routes') or names with weights, "activities=3,inbound"`)
	fs.StringVar(&keys.dist, "keys", keysZipf, "key popularity: uniform, zipf (skewed, see --zipf-s) or unique (every request a new key: memory runs)")
	fs.Float64Var(&keys.zipfS, "zipf-s", 1.1, "zipf exponent s > 1: key of rank k has weight 1/(k+1)^s")
	fs.Uint64Var(&keys.tenants, "tenants", 1000, "distinct tenants (x-tenant-id)")
	fs.Uint64Var(&keys.channels, "channels", 1000, "distinct channels ({channel} path parameter)")
	fs.Uint64Var(&keys.ips, "ips", 10000, "distinct client IPs (10.0.0.0/8)")
	fs.Uint64Var(&keys.accounts, "accounts", 1000, "distinct login accounts (email in the login body)")
	fs.StringVar(&keys.prefix, "key-prefix", "", "prefix for tenant, channel and account keys: separate key spaces for concurrent runs")
	fs.IntVar(&cfg.pool, "pool", 16384, "requests prepared before the run and reused in turn, so the tool spends its CPU on the transport (0 = prepare each; --keys unique always does)")
	if mode.flags != nil {
		mode.flags(fs, &o)
	}
	if mode.grpc != nil {
		fs.IntVar(&o.connections, "connections", 4, "gRPC connections (HTTP/2), at least one per target; requests are spread over them in turn")
	}
	fs.StringVar(&o.json, "json", "", "also write the results as JSON to this `file` (\"-\": stdout, instead of the text)")
	fs.BoolVar(&o.quiet, "quiet", false, "print nothing but errors (with --json FILE)")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	var err error
	if cfg.mix, err = parseMix(o.routes); err != nil {
		return cli.UsageError{Msg: "--routes: " + err.Error()}
	}
	if err := cfg.validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	var targets []string
	for t := range strings.SplitSeq(o.targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			targets = append(targets, t)
		}
	}
	if len(targets) == 0 {
		return cli.UsageError{Msg: "--target: no address"}
	}
	var c caller
	var load grpcLoad
	if mode.grpc == nil {
		c, err = newHTTPCaller(targets, cfg.concurrency)
	} else {
		if o.connections < 1 || o.connections > 1000 {
			return cli.UsageError{Msg: fmt.Sprintf("--connections %d: must be from 1 to 1000", o.connections)}
		}
		if load, err = mode.grpc(&o); err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
		c, err = dialLoad(targets, o.connections, load)
	}
	if err != nil {
		return err
	}
	defer c.close()
	if err := preflight(ctx, c, *cfg, targets); err != nil {
		return err
	}
	rec, err := runLoad(ctx, *cfg, c)
	if err != nil {
		return err
	}
	res := summarise(rec, *cfg)
	res.Mode, res.Targets = name, targets
	if mode.grpc != nil {
		res.Connections = max(o.connections, len(targets))
	}
	if load.mix != "" {
		res.Mix = load.mix + "; " + res.Mix
	}
	if o.json != "" {
		if err := writeJSON(o.json, &res, stdout); err != nil {
			return err
		}
	}
	if o.json != "-" && !o.quiet {
		printText(stdout, &res)
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
		return fmt.Errorf("%w by %s (%s)", errNoAnswers, strings.Join(targets, ","), first)
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

// serverSummaries are the help of the server commands.
var serverSummaries = map[string]string{
	"noop": `Serve a no-op ext_authz Check and a no-op ShouldRateLimit that answer OK at
once, behind the same gRPC and HTTP stack as ratelimit-authz (internal/server): the
floor of an ext_authz check or a rate limit call on this machine. /metrics
carries the process metrics.`,
	"noop-grpc": `Serve a no-op ext_authz Check that answers OK at once from one shared response,
on a plain grpc.NewServer() with no options and the generated service code: the
floor of a default-configured grpc-go ext_authz server. /healthz and /readyz on
--http-addr, Go's profiles on --pprof-addr, each on a listener of its own.`,
	"upstream": `Serve a minimal HTTP application: 200 and {"ok":true} for every request.`,
}

func runServerCmd(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, serverSummaries[name])
	var c serveConfig
	if name == "upstream" {
		fs.StringVar(&c.httpAddr, "addr", "127.0.0.1:8080", "listen `address`")
	} else {
		fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:9001", "gRPC listen `address`")
		httpHelp := "HTTP listen `address` (/metrics, /healthz, /readyz)"
		if name == "noop-grpc" {
			httpHelp = "HTTP listen `address` (/healthz, /readyz)"
		}
		fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:9090", httpHelp)
		fs.StringVar(&c.pprofAddr, "pprof-addr", "", "serve /debug/pprof on this `address` (empty: off)")
	}
	fs.DurationVar(&c.lifetime, "lifetime", time.Hour, "exit after this long even if nobody stops the server")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if c.lifetime <= 0 || c.lifetime > 24*time.Hour {
		return cli.UsageError{Msg: fmt.Sprintf("--lifetime %v: must be positive and at most 24h", c.lifetime)}
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	switch name {
	case "upstream":
		return serveUpstream(ctx, c.httpAddr, c.lifetime, log)
	case "noop-grpc":
		return serveNoopGRPC(ctx, c, log)
	}
	return serveNoop(ctx, c, log)
}

func runRLSConfigCmd(_ context.Context, _ string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rls-config", `Print the envoyproxy/ratelimit descriptor file (domain "bench") with one rule
for each descriptor 'ratelimit-bench rls' sends, each at --limit per --unit.`)
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
func runRoutesCmd(_ context.Context, _ string, _ []string, w, _ io.Writer) error {
	fmt.Fprintln(w, "route                  method  path                                              api mix  counts against")
	total := 0
	for _, r := range catalogue {
		total += r.weight
	}
	for _, r := range catalogue {
		method := "POST"
		if r.name == "unmatched" {
			method = "GET"
		}
		share := "-"
		if r.weight > 0 {
			share = fmt.Sprintf("%d%%", r.weight*100/total)
		}
		fmt.Fprintf(w, "%-22s %-7s %-49s %7s  %s\n", r.name, method, r.path, share, r.describe)
	}
	return nil
}
