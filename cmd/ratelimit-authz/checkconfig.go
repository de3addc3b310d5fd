package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
)

func runCheckConfig(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var path string
	f := newEnvFlags("check-config", "Validate a configuration file: print each problem with its file:line:column,\nexit 1 when there is any, 0 when the file is valid.", getenv)
	f.String(&path, "config", "RATELIMIT_AUTHZ_CONFIG", defaultConfigPath, "configuration `file` to validate")
	if done, err := parseFlags(f.fs, args, stdout, stderr); done {
		return err
	}
	r, source, err := loadRules(path, f.set("config", "RATELIMIT_AUTHZ_CONFIG"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		if ps, ok := rules.AsProblems(err); ok {
			for _, p := range ps {
				fmt.Fprintln(stderr, p)
			}
			return exitError{code: 1, msg: fmt.Sprintf("%s: %d problem(s)", source, len(ps))}
		}
		return exitError{code: 1, msg: "ratelimit-authz check-config: " + err.Error()}
	}
	fmt.Fprintf(stdout, "%s: OK (%d buckets, %d routes)\n", source, len(r.Buckets), len(r.Routes))
	return nil
}
