// Package cli is the command-line shell the commands share: flag parsing
// whose mistakes are usage errors (every command: ratelimit-authz,
// cmd/ratelimit-bench, bench), and the benchmark commands' main with its
// signals and exit status.
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
	"time"
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

// Parse parses args into fs, which takes no positional argument. --help
// prints the usage on stdout and returns done; a mistake (a bad flag, a
// positional argument) is printed on stderr as "NAME: mistake", NAME being
// fs.Name(), a bad flag followed by the usage, and returned as an empty
// UsageError (already printed).
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (done bool, err error) {
	if done, err := parse(fs, args, stdout, stderr); done {
		return true, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return true, UsageError{}
	}
	return false, nil
}

// ParseArgs is Parse for a command that takes positional arguments: they
// may stand before, between or after the flags, and every argument after
// "--" is one. It returns them in order.
func ParseArgs(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (pos []string, done bool, err error) {
	for {
		if done, err := parse(fs, args, stdout, stderr); done {
			return nil, true, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, false, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), false, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// parse parses flags up to the first positional argument: --help and a
// bad flag end the command, as Parse says.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (done bool, err error) {
	fs.SetOutput(io.Discard)
	err = fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return true, nil
	case err != nil:
		return true, Usage(fs, stderr, err.Error())
	}
	return false, nil
}

// Usage prints "NAME: msg" and fs's usage on stderr, and returns the
// UsageError of a mistake already printed.
func Usage(fs *flag.FlagSet, stderr io.Writer, msg string) error {
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), msg)
	fs.SetOutput(stderr)
	fs.Usage()
	return UsageError{}
}

// Sleep waits d, or until ctx ends (a signal to a command run by Main);
// it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
