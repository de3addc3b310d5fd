package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
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
	fs := flag.NewFlagSet("ratelimit-authz "+name, flag.ContinueOnError) // the name cli's messages start with
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: ratelimit-authz %s [flags]\n\n%s\n\nFlags:\n", name, summary)
		fs.PrintDefaults()
	}
	return &envFlags{fs: fs, getenv: getenv}
}

func (e *envFlags) String(p *string, name, env, def, help string) {
	fromEnv := false
	if v := e.getenv(env); v != "" {
		def, fromEnv = v, true
	}
	e.fs.StringVar(p, name, def, fmt.Sprintf("%s (env %s)", help, env))
	if fromEnv {
		// --help and usage errors print the defaults, on a terminal or into
		// a container's log: never a password taken from the environment.
		e.fs.Lookup(name).DefValue = redactPasswords(def)
	}
}

// dsnPassword is a password in a keyword/value connection string
// (host=… password=…), quoted or not.
var dsnPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// urlStart is a comma that begins another URL in a list of them.
var urlStart = regexp.MustCompile(`,\s*[a-zA-Z][a-zA-Z0-9+.-]*://`)

// redactPasswords hides the passwords of a value that may hold URLs (one
// or several, comma-separated, as NATS takes them; a comma inside a
// password stays in its URL) or a keyword/value connection string;
// anything else is returned as is.
func redactPasswords(v string) string {
	v = dsnPassword.ReplaceAllString(v, "${1}xxxxx")
	var out strings.Builder
	start := 0
	for _, loc := range append(urlStart.FindAllStringIndex(v, -1), []int{len(v), len(v)}) {
		part := v[start:loc[0]]
		if u, err := url.Parse(strings.TrimSpace(part)); err == nil && u.User != nil {
			if _, ok := u.User.Password(); ok {
				part = u.Redacted()
			}
		}
		if start > 0 {
			out.WriteByte(',')
		}
		out.WriteString(part)
		start = loc[0] + 1
	}
	return out.String()
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

func (e *envFlags) Int(p *int, name, env string, def int, help string) {
	if v := e.getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s=%q: not an integer", env, v))
		} else {
			def = n
		}
	}
	e.fs.IntVar(p, name, def, fmt.Sprintf("%s (env %s)", help, env))
}

// List defines a comma-separated list; an empty value leaves it nil.
func (e *envFlags) List(p *[]string, name, env, help string) {
	v := (*listValue)(p)
	v.Set(e.getenv(env))
	e.fs.Var(v, name, fmt.Sprintf("%s (env %s)", help, env))
}

// listValue is a flag.Value of comma-separated items, spaces around each
// trimmed, empty items dropped.
type listValue []string

func (l *listValue) String() string { return strings.Join(*l, ",") }

func (l *listValue) Set(s string) error {
	*l = nil
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*l = append(*l, item)
		}
	}
	return nil
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

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log level %q: use debug, info, warn or error", s)
	}
	return l, nil
}

// maxSecretFileBytes bounds a secret file: a secret is a token or a
// password, and a path to something else (a device, a log) must not be
// read without end.
const maxSecretFileBytes = 64 << 10

// secretFromEnv returns the secret in the environment variable env, or
// read from the file that env+"_FILE" names (a mounted Kubernetes or
// Docker secret), and which of the two it came from, for a log line that
// must never carry the value. Neither set: "", "". Both set is an error:
// which one wins would be a guess.
func secretFromEnv(getenv func(string) string, env string) (secret, source string, err error) {
	fileEnv := env + "_FILE"
	v, path := getenv(env), getenv(fileEnv)
	switch {
	case v != "" && path != "":
		return "", "", fmt.Errorf("%s and %s are both set: set one", env, fileEnv)
	case v != "":
		return v, env, nil
	case path == "":
		return "", "", nil
	}
	if secret, err = readSecretFile(path); err != nil {
		return "", "", fmt.Errorf("%s: %w", fileEnv, err)
	}
	return secret, fileEnv + " " + path, nil
}

// readSecretFile is parseSecret of the file at path, of which it reads at
// most maxSecretFileBytes+1 bytes.
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	s, err := parseSecret(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// parseSecret is a secret file's content without its trailing line ends
// (echo and editors add one; no secret ends in one). An empty secret is an
// error: the file was meant to set one.
func parseSecret(b []byte) (string, error) {
	if len(b) > maxSecretFileBytes {
		return "", fmt.Errorf("larger than %d bytes: not a secret", maxSecretFileBytes)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", errors.New("empty")
	}
	return s, nil
}
