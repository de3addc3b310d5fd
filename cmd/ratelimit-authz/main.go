// Command ratelimit-authz is an Envoy external-authorization (ext_authz)
// gRPC server that rate-limits HTTP requests in memory.
//
//	ratelimit-authz serve [flags]          serve Check (and ShouldRateLimit) on gRPC, metrics on HTTP
//	ratelimit-authz check-config [flags]   validate a configuration file
//	ratelimit-authz limits COMMAND …       per-tenant limit overrides in Postgres
//	ratelimit-authz migrate [flags]        create or upgrade the Postgres schema
//	ratelimit-authz probe [flags]          GET /readyz once: exit 0 on 200 (health checks)
//	ratelimit-authz top [flags]            the top keys per bucket from a node's admin listener
//	ratelimit-authz version                print the version
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &cli.UsageError{}) { // printed by cli when it found it
			os.Exit(2)
		}
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "ratelimit-authz:", err)
		os.Exit(1)
	}
}

// exitError carries a specific exit status: 2 for usage errors, 1 for a
// configuration with problems (already printed). A mistake cli.Parse
// finds is a cli.UsageError: exit status 2, already printed.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return fmt.Sprintf("exit %d: %s", e.code, e.msg) }

const usage = `ratelimit-authz: rate-limit HTTP traffic at Envoy's ext_authz filter.

Usage:
  ratelimit-authz serve [flags]          serve ext_authz Check and, with an RLS configuration, ShouldRateLimit (gRPC), and metrics (HTTP)
  ratelimit-authz check-config [flags]   validate a configuration file; exit 1 on problems
  ratelimit-authz limits COMMAND …       per-tenant overrides in Postgres: set, get, list, delete, audit, owner
  ratelimit-authz migrate [flags]        create or upgrade the Postgres schema of the overrides
  ratelimit-authz probe [flags]          GET a node's /readyz once: exit 0 on 200, 1 otherwise (health checks)
  ratelimit-authz top [flags]            who is being limited: the top keys per bucket from a node's admin listener
  ratelimit-authz version                print the version
  ratelimit-authz help [command]         show help

Run 'ratelimit-authz COMMAND --help' for a command's flags. Every flag can
also be set by the environment variable shown in its help.
`

// run is the whole program, testable: args without the program name,
// getenv for the environment, and the output streams.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitError{code: 2}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "serve":
		return runServe(ctx, rest, getenv, stdout, stderr, nil)
	case "check-config":
		return runCheckConfig(rest, getenv, stdout, stderr)
	case "limits":
		return runLimits(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return runMigrate(ctx, rest, getenv, stdout, stderr)
	case "probe":
		return runProbe(ctx, rest, getenv, stdout, stderr)
	case "top":
		return runTop(ctx, rest, getenv, stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "ratelimit-authz", version)
		return nil
	case "help", "-h", "--help", "-help":
		if len(rest) > 0 && rest[0] != "help" {
			return run(ctx, []string{rest[0], "--help"}, getenv, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprintf(stderr, "ratelimit-authz: unknown command %q\n\n%s", cmd, usage)
		return exitError{code: 2}
	}
}
