// Package cli is the shell shared by the benchmark commands (bench,
// bench/accuracy, cmd/ratelimit-bench): main's signals and exit status,
// and flag parsing whose mistakes are usage errors.
//
// It imports only the standard library: the bench runner copies it, with
// bench/accuracy, into the tree of an older commit to build the program
// there.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// UsageError is a command-line mistake: exit status 2. An empty Msg has
// already been printed.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Main runs run on the command line under a context that SIGINT and
// SIGTERM cancel, and exits: 0 on success, 2 on a UsageError, 1 on any
// other error, printed as "name: error" unless empty.
func Main(name string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(ExitCode(name, err, os.Stderr))
}

// ExitCode prints err to stderr as "name: error" unless it is nil or
// empty, and returns the exit status of a command that ended with it.
func ExitCode(name string, err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(stderr, name+":", msg)
	}
	var ue UsageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// Parse parses args into fs. --help prints the usage on stdout and
// returns done; a bad flag prints it on stderr and returns a UsageError,
// as does a positional argument.
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (done bool, err error) {
	fs.SetOutput(io.Discard)
	err = fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return true, nil
	case err != nil:
		fs.SetOutput(stderr)
		fs.Usage()
		return true, UsageError{err.Error()}
	case fs.NArg() > 0:
		return true, UsageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	return false, nil
}
