// Command ratelimit-demo shows ratelimit-authz at work in one command, for
// a newcomer: it starts one ratelimit-authz node with the shipped
// configuration (in memory: no Postgres, no NATS), the pinned Envoy with
// the shipped bootstrap, and a small application behind it, all on free
// 127.0.0.1 ports; fires a burst at every shipped bucket through Envoy;
// prints per bucket what was allowed, what got 429 and what reached the
// application; and stops everything by PID.
//
//	ratelimit-demo [flags]
//
// `make demo` builds the server and runs it. Exit status 0 when every
// burst behaved as the shipped configuration says, 1 otherwise (the log
// folder is kept and its path printed), 2 for a usage error, 130 when
// interrupted (everything is stopped first).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// usageError is a bad command line; the message is already printed.
type usageError struct{ error }

// errInterrupted is returned after Ctrl-C (SIGINT) or SIGTERM.
var errInterrupted = errors.New("interrupted; everything started was stopped")

func exitCode(err error, stderr io.Writer) int {
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		return 2
	case errors.Is(err, errInterrupted):
		fmt.Fprintln(stderr, "ratelimit-demo:", err)
		return 130
	default:
		fmt.Fprintln(stderr, "ratelimit-demo:", err)
		return 1
	}
}

// options are the command line.
type options struct {
	serverBin   string
	envoyBin    string
	config      string
	envoyConfig string
	logDir      string
	keepLogs    bool
	timeout     time.Duration
	// stay keeps the stack up after the bursts until Ctrl-C, printing
	// what to try against it.
	stay bool
}

const summary = `Starts one ratelimit-authz node (in memory: no Postgres, no NATS), the
pinned Envoy and a small application behind it, all on free 127.0.0.1
ports; fires a burst at every bucket of the shipped configuration through
Envoy; prints per bucket what was allowed (2xx), what got 429, what reached
the application, the Retry-After and RateLimit-Policy seen, and who was
limited as the live view saw it; stops everything (with --stay, at
Ctrl-C, after printing what to try). Takes 10-30 seconds; Ctrl-C stops
everything too.

Process logs go to a fresh folder, removed after a successful run unless
--keep-logs; kept, with its path printed, when something fails.`

func parseOptions(args []string, stdout, stderr io.Writer) (options, bool, error) {
	var o options
	fs := flag.NewFlagSet("ratelimit-demo", flag.ContinueOnError)
	fs.StringVar(&o.serverBin, "server-bin", "", "ratelimit-authz `binary` to run (default: go build ./cmd/ratelimit-authz into the log folder)")
	fs.StringVar(&o.envoyBin, "envoy", "", "envoy `binary` to run (default: the pinned one, installed by scripts/install-envoy.sh into .tools/)")
	fs.StringVar(&o.config, "config", "", "server configuration `file` (default: config/ratelimit.yaml of the repository); the bursts expect its shipped buckets and routes")
	fs.StringVar(&o.envoyConfig, "envoy-config", "", "Envoy bootstrap `file` whose addresses are rewritten (default: envoy/ratelimit-authz.yaml of the repository)")
	fs.StringVar(&o.logDir, "log-dir", "", "parent `folder` of the log folder (default: the system's temporary folder)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the log folder after a successful run too")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "stop everything and fail after this `duration` (with --stay: the start and the bursts)")
	fs.BoolVar(&o.stay, "stay", false, "after the bursts, keep the stack up until Ctrl-C and print what to try against it (curl through Envoy, the live view, top, the metrics)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ratelimit-demo [flags]\n\n%s\n\nFlags:\n", summary)
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard)
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return o, true, nil
	case err != nil:
		fmt.Fprintf(stderr, "ratelimit-demo: %v\n", err)
		fs.SetOutput(stderr)
		fs.Usage()
		return o, true, usageError{err}
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "ratelimit-demo: unexpected argument %q (see --help)\n", fs.Arg(0))
		return o, true, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	case o.timeout <= 0:
		fmt.Fprintln(stderr, "ratelimit-demo: --timeout must be positive")
		return o, true, usageError{errors.New("bad --timeout")}
	}
	return o, false, nil
}

// run is the whole program: args without the program name, env as
// os.Environ, the output streams.
func run(ctx context.Context, args, env []string, stdout, stderr io.Writer) error {
	o, done, err := parseOptions(args, stdout, stderr)
	if done {
		return err
	}
	out := newPrinter(stdout, isTerminal(stdout, env))

	errTimeout := fmt.Errorf("the demo took longer than --timeout %v", o.timeout)
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, errTimeout)
	defer cancel()

	d, err := newDemo(o, env, out)
	if err != nil {
		return err
	}
	err = d.run(ctx)
	if err == nil && o.stay {
		err = d.stayUp(parent)
	}
	if stopErr := d.stop(); stopErr != nil && err == nil {
		err = stopErr
	}
	switch {
	case err == nil:
	case errors.Is(context.Cause(ctx), errTimeout):
		err = fmt.Errorf("%w (%v)", errTimeout, err)
	case ctx.Err() != nil, parent.Err() != nil:
		err = errInterrupted // the signal ended the parent context
	}
	return d.finishLogs(err)
}

// isTerminal reports whether w is a character device (a terminal) and TERM
// is not "dumb": then the progress line is redrawn in place.
func isTerminal(w io.Writer, env []string) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	for _, kv := range env {
		if kv == "TERM=dumb" {
			return false
		}
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// childEnv is env without the server's own settings
// (RATELIMIT_AUTHZ_*, RATE_LIMIT_*), so a NATS URL or database of the
// caller's shell cannot turn the demo's single in-memory node into
// something else.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, "RATELIMIT_AUTHZ_") || strings.HasPrefix(kv, "RATE_LIMIT_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
