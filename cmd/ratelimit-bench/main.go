// Command ratelimit-bench is the load tool of the ratelimit-authz
// benchmarks (bench/, `make bench`). It drives Envoy's ext_authz Check over
// gRPC, Envoy's rate limit service call ShouldRateLimit over gRPC, or the
// example API over HTTP through Envoy, with the example API's
// requests, and prints throughput, latency percentiles and outcomes. It
// also serves the pieces a benchmark needs around the server: a no-op
// ext_authz and rate limit server (the floor every figure is compared with)
// and a minimal upstream application for Envoy. --json writes a run's result in
// the one schema of internal/loadresult, which the runner reads.
//
//	ratelimit-bench check [flags]     load Check over gRPC
//	ratelimit-bench rls [flags]       load ShouldRateLimit over gRPC
//	ratelimit-bench gubernator [flags] load gubernator's GetRateLimits over gRPC
//	ratelimit-bench accesslog [flags] stream access-log entries that charge a cost bucket
//	ratelimit-bench http [flags]      load the example API over HTTP (through Envoy)
//	ratelimit-bench noop [flags]      serve a no-op ext_authz and rate limit server
//	ratelimit-bench noop-grpc [flags] serve a no-op ext_authz and rate limit server on a default grpc.NewServer()
//	ratelimit-bench upstream [flags]  serve a minimal HTTP application
//	ratelimit-bench rls-config        print the descriptor file the rls load matches
//	ratelimit-bench routes            list the example API's routes
//	ratelimit-bench rlqs [flags]      act as Envoys' quota filters (RLQS streams)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/loadresult"
)

func main() { cli.Main("ratelimit-bench", run) }

const usage = `ratelimit-bench: load and reference servers for the ratelimit-authz benchmarks.

Usage:
  ratelimit-bench check [flags]     drive ext_authz Check over gRPC and report throughput and latency
  ratelimit-bench rls [flags]       drive ShouldRateLimit (Envoy's rate limit filter) over gRPC and report the same
  ratelimit-bench gubernator [flags] drive gubernator's GetRateLimits with the rls load's keys and report the same
  ratelimit-bench accesslog [flags] stream Envoy's access-log entries that charge a cost bucket after the response
  ratelimit-bench http [flags]      drive the example API over HTTP (through Envoy) and report the same
  ratelimit-bench noop [flags]      serve a no-op ext_authz and rate limit server that answers OK at once: the floor
  ratelimit-bench noop-grpc [flags] serve a no-op ext_authz and rate limit server on a default-configured grpc.NewServer(): the floor of any grpc-go server
  ratelimit-bench upstream [flags]  serve a minimal HTTP application for Envoy to route to
  ratelimit-bench routes            list the example API's routes and the "api" mix
  ratelimit-bench rls-config [flags] print the descriptor file (envoyproxy/ratelimit format) the rls load matches
  ratelimit-bench rlqs [flags]      act as Envoys' quota filters on StreamRateLimitQuotas streams and report the assignments

Run 'ratelimit-bench COMMAND --help' for a command's flags. make bench
(bench/run.sh) runs every scenario and writes bench/results/REPORT.md.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.UsageError{}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "check", "http", "rls", "gubernator", "accesslog":
		return runLoadCmd(ctx, cmd, rest, stdout, stderr)
	case "noop", "noop-grpc":
		return runServerCmd(ctx, cmd, rest, stdout, stderr)
	case "upstream":
		return runUpstreamCmd(ctx, rest, stdout, stderr)
	case "routes":
		printRoutes(stdout)
		return nil
	case "rls-config":
		return runRLSConfigCmd(rest, stdout, stderr)
	case "rlqs":
		return runRLQSCmd(ctx, rest, stdout, stderr)
	case "help", "-h", "--help", "-help":
		if len(rest) > 0 && rest[0] != "help" {
			return run(ctx, []string{rest[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "ratelimit-bench: unknown command %q\n\n%s", cmd, usage)
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

func runLoadCmd(ctx context.Context, mode string, args []string, stdout, stderr io.Writer) error {
	summary := `Drive Envoy's ext_authz Check over gRPC with the example API's requests (routes,
tenants, channels, client IPs as Envoy would send them), then print requests/s,
latency percentiles and allowed/denied/errors. Runs are bounded by --duration
(plus --warmup) and, when set, by --requests.`
	defTarget := "127.0.0.1:9001"
	if mode == "http" {
		summary = `Drive the example API over HTTP/1.1 (keep-alive, one connection per request in
flight), normally through Envoy, then print requests/s, latency percentiles and
outcomes: 2xx allowed, 429 and 403 denied, anything else an error.`
		defTarget = "127.0.0.1:10000"
	}
	if mode == "rls" {
		summary = `Drive ShouldRateLimit over gRPC with the descriptors Envoy's rate limit filter
would send for the example API's requests (domain "bench"; --descriptors of:
remote_address; generic_key=<route> and tenant; path), then print requests/s,
latency percentiles and outcomes: OVER_LIMIT denied, any other answer allowed.`
	}
	if mode == "gubernator" {
		summary = `Drive gubernator's GetRateLimits (pb.gubernator.V1) over gRPC with one rate limit
per descriptor the rls load would send (named by the descriptor's first key,
keyed by its values, --limit per --per, token bucket), then print requests/s,
latency percentiles and outcomes: any OVER_LIMIT denied, else allowed.`
	}
	if mode == "accesslog" {
		summary = `Stream Envoy's gRPC access log (StreamAccessLogs) to a server, one entry per
message and one stream per connection, as Envoy's workers do: each entry
carries the Check's charges metadata (--bucket → the request's tenant) and
the response header --cost-header reporting --cost, so the server charges
the bucket after the response. A sent entry counts as allowed; the run ends
once the server has answered every stream (it answers only at a stream's
end).`
	}
	fs := newFlagSet(mode, summary)
	var (
		charge      alsCharge
		cfg         loadConfig
		targets     string
		mixSpec     string
		conns       int
		jsonOut     string
		descriptors int
		guberLimit  int64
		guberPer    time.Duration
		quiet       bool
		populations struct{ tenants, channels, ips, accounts uint64 }
	)
	fs.StringVar(&targets, "target", defTarget, "`addresses` to send to, comma-separated (several: requests are spread over them in turn)")
	fs.IntVar(&cfg.concurrency, "concurrency", 16, "requests in flight at most (workers)")
	fs.Float64Var(&cfg.rate, "rate", 0, "fixed rate in requests/s over all workers (open loop: a request that finds every worker busy counts its latency from when it was due); 0 = as fast as answers come")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured time, after the warm-up")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "time sent but not measured, before --duration")
	fs.Int64Var(&cfg.requests, "requests", 0, "send at most this many requests, warm-up included (0 = bounded by time only)")
	fs.DurationVar(&cfg.timeout, "timeout", time.Second, "per-request deadline; a request past it is an error")
	fs.DurationVar(&cfg.window, "window", 0, "count allowed/denied per wall-clock window of this length (e.g. 1s), for accuracy runs; 0 = off")
	defMix := "api"
	if mode == "accesslog" {
		defMix = "activities" // a route whose requests carry a tenant to charge
	}
	fs.StringVar(&mixSpec, "routes", defMix, `route mix: "api" (the example API's production-like shares; see 'ratelimit-bench routes') or names with weights, "activities=3,inbound"`)
	fs.StringVar(&cfg.keys.dist, "keys", keysZipf, "key popularity: uniform, zipf (skewed, see --zipf-s) or unique (every request a new key: memory runs)")
	fs.Float64Var(&cfg.keys.zipfS, "zipf-s", 1.1, "zipf exponent s > 1: key of rank k has weight 1/(k+1)^s")
	fs.Uint64Var(&populations.tenants, "tenants", 1000, "distinct tenants (x-tenant-id)")
	fs.Uint64Var(&populations.channels, "channels", 1000, "distinct channels ({channel} path parameter)")
	fs.Uint64Var(&populations.ips, "ips", 10000, "distinct client IPs (10.0.0.0/8)")
	fs.Uint64Var(&populations.accounts, "accounts", 1000, "distinct login accounts (email in the login body)")
	fs.StringVar(&cfg.keys.prefix, "key-prefix", "", "prefix for tenant, channel and account keys: separate key spaces for concurrent runs")
	fs.Uint64Var(&cfg.seed, "seed", 1, "random seed: the same seed gives the same requests")
	fs.IntVar(&cfg.pool, "pool", 16384, "requests prepared before the run and reused in turn, so the tool spends its CPU on the transport (0 = prepare each; --keys unique always does)")
	grpcMode := mode == "check" || mode == "rls" || mode == "gubernator" || mode == "accesslog"
	if mode == "accesslog" {
		fs.StringVar(&charge.bucket, "bucket", "llm_tokens", "the cost `bucket` each entry charges (one charged from a response header)")
		fs.StringVar(&charge.header, "cost-header", "x-usage-total-tokens", "the response `header` that reports the cost")
		fs.Int64Var(&charge.cost, "cost", 100, "the cost each entry reports")
	}
	if mode == "rls" || mode == "gubernator" {
		fs.IntVar(&descriptors, "descriptors", 1, "descriptors per call, from 1 to 3 (see above)")
	}
	if mode == "gubernator" {
		fs.Int64Var(&guberLimit, "limit", 1, "hits each key may have per --per")
		fs.DurationVar(&guberPer, "per", time.Second, "the window of --limit")
	}
	if grpcMode {
		fs.IntVar(&conns, "connections", 4, "gRPC connections (HTTP/2), at least one per target; requests are spread over them in turn")
	}
	fs.StringVar(&jsonOut, "json", "", "also write the results as JSON to this `file` (\"-\": stdout, instead of the text)")
	fs.BoolVar(&quiet, "quiet", false, "print nothing but errors (with --json FILE)")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	cfg.keys.tenants, cfg.keys.channels, cfg.keys.ips, cfg.keys.accounts = populations.tenants, populations.channels, populations.ips, populations.accounts
	m, err := parseMix(mixSpec)
	if err != nil {
		return cli.UsageError{Msg: "--routes: " + err.Error()}
	}
	cfg.mix = m
	if err := cfg.validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	var list []string
	for t := range strings.SplitSeq(targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			list = append(list, t)
		}
	}
	if len(list) == 0 {
		return cli.UsageError{Msg: "--target: no address"}
	}
	if grpcMode && (conns < 1 || conns > 1000) {
		return cli.UsageError{Msg: fmt.Sprintf("--connections %d: must be from 1 to 1000", conns)}
	}

	var c caller
	switch mode {
	case "check":
		c, err = newGRPCCaller(list, conns)
	case "rls":
		c, err = newRLSCaller(list, conns, descriptors)
		if err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	case "gubernator":
		c, err = newGuberCaller(list, conns, descriptors, guberLimit, guberPer)
		if err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	case "accesslog":
		c, err = newALSCaller(list, conns, charge)
		if err != nil {
			return cli.UsageError{Msg: err.Error()}
		}
	default:
		c, err = newHTTPCaller(list, cfg.concurrency)
	}
	if err != nil {
		return err
	}
	defer c.close()
	if err := preflight(ctx, c, cfg, list); err != nil {
		return err
	}
	rec, err := runLoad(ctx, cfg, c)
	if err != nil {
		return err
	}
	res := summarise(rec, cfg)
	res.Mode, res.Targets = mode, list
	if grpcMode {
		res.Connections = max(conns, len(list))
	}
	if mode == "rls" || mode == "gubernator" {
		res.Mix = describeRLS(descriptors) + "; " + res.Mix
	}
	if jsonOut != "" {
		if err := writeJSON(jsonOut, &res, stdout); err != nil {
			return err
		}
	}
	if jsonOut != "-" && !quiet {
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
		return fmt.Errorf("%w by %s (%s)", errNoAnswers, strings.Join(list, ","), first)
	}
	return nil
}

// preflight sends one request to each target with a short deadline, so
// that a server that is down is a clear error, not a run of failures. The
// probe is the "unmatched" request (GET /static/app.js): no route rule
// matches it, so it counts against no key and takes none of the run's.
func preflight(ctx context.Context, c caller, cfg loadConfig, targets []string) error {
	probe, err := parseMix("unmatched")
	if err != nil {
		return err
	}
	for i := range targets {
		g := newGenerator(probe, cfg.keys, cfg.seed, -2, new(atomic.Uint64))
		p, err := c.prepare(g.next(), 0)
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

func writeJSON(path string, res *loadresult.Result, stdout io.Writer) error {
	b, err := res.Marshal()
	if err != nil {
		return err
	}
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func runServerCmd(ctx context.Context, mode string, args []string, stdout, stderr io.Writer) error {
	summary := `Serve a no-op ext_authz Check and a no-op ShouldRateLimit that answer OK at
once, behind the same gRPC and HTTP stack as ratelimit-authz (internal/server): the
floor of an ext_authz check or a rate limit call on this machine. /metrics
carries the process metrics.`
	if mode == "noop-grpc" {
		summary = `Serve a no-op ext_authz Check that answers OK at once from one shared response,
on a plain grpc.NewServer() with no options and the generated service code: the
floor of a default-configured grpc-go ext_authz server. /healthz and /readyz on
--http-addr, Go's profiles on --pprof-addr, each on a listener of its own.`
	}
	fs := newFlagSet(mode, summary)
	var c serveConfig
	fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:9001", "gRPC listen `address`")
	httpHelp := "HTTP listen `address` (/metrics, /healthz, /readyz)"
	if mode == "noop-grpc" {
		httpHelp = "HTTP listen `address` (/healthz, /readyz)"
	}
	fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:9090", httpHelp)
	fs.StringVar(&c.pprofAddr, "pprof-addr", "", "serve /debug/pprof on this `address` (empty: off)")
	fs.DurationVar(&c.lifetime, "lifetime", time.Hour, "exit after this long even if nobody stops the server")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if err := c.validate(); err != nil {
		return cli.UsageError{Msg: err.Error()}
	}
	log := newLogger(stderr)
	if mode == "noop-grpc" {
		return serveNoopGRPC(ctx, c, log)
	}
	return serveNoop(ctx, c, log)
}

func runUpstreamCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("upstream", "Serve a minimal HTTP application: 200 and {\"ok\":true} for every request.")
	addr := fs.String("addr", "127.0.0.1:8080", "listen `address`")
	lifetime := fs.Duration("lifetime", time.Hour, "exit after this long even if nobody stops the server")
	if done, err := cli.Parse(fs, args, stdout, stderr); done {
		return err
	}
	if *lifetime <= 0 || *lifetime > 24*time.Hour {
		return cli.UsageError{Msg: fmt.Sprintf("--lifetime %v: must be positive and at most 24h", *lifetime)}
	}
	return serveUpstream(ctx, *addr, *lifetime, newLogger(stderr))
}

func runRLSConfigCmd(args []string, stdout, stderr io.Writer) error {
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

func printRoutes(w io.Writer) {
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
}
