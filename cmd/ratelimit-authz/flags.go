package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/config"
	"github.com/ratelimit-authz/ratelimit-authz/pkg/rules"
)

const defaultConfigPath = "config/ratelimit.yaml"

// envFlags defines flags whose defaults come from environment variables,
// read once here and nowhere else.
type envFlags struct {
	fs     *flag.FlagSet
	getenv func(string) string
	errs   []error
}

func newEnvFlags(name, summary string, getenv func(string) string) *envFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ratelimit-authz %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return &envFlags{fs: fs, getenv: getenv}
}

func (e *envFlags) String(p *string, name, env, def, help string) {
	if v := e.getenv(env); v != "" {
		def = v
	}
	e.fs.StringVar(p, name, def, fmt.Sprintf("%s (env %s)", help, env))
}

func (e *envFlags) Duration(p *time.Duration, name, env string, def time.Duration, help string) {
	if v := e.getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s=%q: not a duration (like 5s)", env, v))
		} else {
			def = d
		}
	}
	e.fs.DurationVar(p, name, def, fmt.Sprintf("%s (env %s)", help, env))
}

func (e *envFlags) Bool(p *bool, name, env string, def bool, help string) {
	if v := e.getenv(env); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s=%q: not a boolean (true or false)", env, v))
		} else {
			def = b
		}
	}
	e.fs.BoolVar(p, name, def, fmt.Sprintf("%s (env %s)", help, env))
}

// set reports whether a flag was given on the command line or by its
// environment variable.
func (e *envFlags) set(name, env string) bool {
	found := e.getenv(env) != ""
	e.fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}

// loadRules reads the configuration. When no file was asked for and the
// default path does not exist, the configuration shipped in the binary is
// used, so the binary runs anywhere.
func loadRules(path string, explicit bool, log *slog.Logger) (*rules.Rules, string, error) {
	if !explicit {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			log.Info("no configuration file; using the shipped default", "path", path)
			r, err := rules.Parse(config.Default(), config.Name)
			return r, config.Name, err
		}
	}
	r, err := rules.LoadFile(path)
	return r, path, err
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log level %q: use debug, info, warn or error", s)
	}
	return l, nil
}
