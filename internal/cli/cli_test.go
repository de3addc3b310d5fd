package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"
)

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		out  string
	}{
		{nil, 0, ""},
		{errors.New("boom"), 1, "x: boom\n"},
		{UsageError{Msg: "--n: from 1 to 2"}, 2, "x: --n: from 1 to 2\n"},
		{fmt.Errorf("wrapped: %w", UsageError{}), 2, "x: wrapped: \n"},
		{UsageError{}, 2, ""}, // already printed
	} {
		var stderr bytes.Buffer
		if code := ExitCode("x", tc.err, &stderr); code != tc.code || stderr.String() != tc.out {
			t.Errorf("ExitCode(%v) = %d, %q; want %d, %q", tc.err, code, stderr.String(), tc.code, tc.out)
		}
	}
}

func TestParse(t *testing.T) {
	newFS := func() (*flag.FlagSet, *int) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "Usage: x") }
		return fs, fs.Int("n", 1, "a number")
	}
	for _, tc := range []struct {
		args           []string
		done, usage    bool
		stdout, stderr string
	}{
		{args: []string{"--n", "3"}},
		{args: []string{"--help"}, done: true, stdout: "Usage: x\n"},
		{args: []string{"--m"}, done: true, usage: true, stderr: "x: flag provided but not defined: -m\nUsage: x\n"},
		{args: []string{"--n", "3", "more"}, done: true, usage: true, stderr: "x: unexpected argument \"more\"\n"},
	} {
		fs, n := newFS()
		var stdout, stderr bytes.Buffer
		done, err := Parse(fs, tc.args, &stdout, &stderr)
		var ue UsageError
		if done != tc.done || (err != nil) != tc.usage || (err != nil && !errors.As(err, &ue)) ||
			stdout.String() != tc.stdout || stderr.String() != tc.stderr {
			t.Errorf("Parse(%q) = %v, %v, stdout %q, stderr %q", tc.args, done, err, stdout.String(), stderr.String())
		}
		if !done && *n != 3 {
			t.Errorf("Parse(%q): n = %d", tc.args, *n)
		}
	}
}

// ParseArgs takes positional arguments wherever they stand; after "--"
// every argument is one.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		pos    []string
		n      int
		done   bool
		stderr string
	}{
		{args: []string{"a", "--n", "3", "b"}, pos: []string{"a", "b"}, n: 3},
		{args: []string{"--n", "3", "--", "--n", "c"}, pos: []string{"--n", "c"}, n: 3},
		{args: []string{"a", "--m"}, done: true, stderr: "x: flag provided but not defined: -m\nUsage: x\n"},
		{args: []string{"a", "-h"}, done: true},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.Usage = func() { fmt.Fprintln(fs.Output(), "Usage: x") }
		n := fs.Int("n", 1, "a number")
		var stdout, stderr bytes.Buffer
		pos, done, err := ParseArgs(fs, tc.args, &stdout, &stderr)
		var ue UsageError
		if done != tc.done || (err != nil) != (tc.stderr != "") || (err != nil && !errors.As(err, &ue)) || stderr.String() != tc.stderr ||
			fmt.Sprint(pos) != fmt.Sprint(tc.pos) || !done && *n != tc.n {
			t.Errorf("ParseArgs(%q) = %q, %v, %v, n %d, stderr %q", tc.args, pos, done, err, *n, stderr.String())
		}
	}
}

func TestSleep(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) || !Sleep(context.Background(), 0) {
		t.Error("Sleep did not report that d passed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Error("Sleep reported that d passed after ctx ended")
	}
}
