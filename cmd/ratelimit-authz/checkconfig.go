package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/cli"
	"github.com/ratelimit-authz/ratelimit-authz/internal/configfile"
	"github.com/ratelimit-authz/ratelimit-authz/internal/envoyconf"
	"github.com/ratelimit-authz/ratelimit-authz/internal/problem"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
)

func runCheckConfig(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var path, envoyPath, checkAddr, rlsDir string
	var rlsMerge, rlsDotfiles bool
	f := newEnvFlags("check-config", "Validate a configuration file: print each problem with its file:line:column,\n"+
		"exit 1 when there is any, 0 when the file is valid. A valid file that trusts\n"+
		"something a client can set (a header, x-forwarded-for) gets WARN lines on\n"+
		"stderr saying what to deploy; with --envoy they are checked against that bootstrap.\n"+
		"With --envoy, a gRPC service the bootstrap sends to the lean Check listener's\n"+
		"port (--check-addr, serve's default unless given) that it does not serve is a\n"+
		"problem too: it serves ext_authz Check, and ShouldRateLimit on a node serving\n"+
		"RLS (--rls-config-dir).\n"+
		"With --rls-config-dir it validates the envoyproxy/ratelimit configuration files\n"+
		"in that directory instead (and --config too when it is given).", getenv)
	f.String(&path, "config", "RATELIMIT_AUTHZ_CONFIG", defaultConfigPath, "configuration `file` to validate")
	f.String(&envoyPath, "envoy", "RATELIMIT_AUTHZ_CHECK_ENVOY", "", "Envoy bootstrap `file` in front of the server: check what it strips and sets before ext_authz")
	f.String(&checkAddr, "check-addr", "RATELIMIT_AUTHZ_CHECK_ADDR", defaultCheckAddr, "with --envoy: the servers' lean Check listener `address`, as serve reads it (only its port is compared, as Envoy names the hosts its own way): the access log or RLQS sent to a cluster on that port is a problem, and RLS unless --rls-config-dir says the node serves it, as the listener serves only ext_authz Check, ShouldRateLimit and health; off: the servers run without it")
	f.String(&rlsDir, "rls-config-dir", "RATELIMIT_AUTHZ_RLS_CONFIG_DIR", "", "`directory` of envoyproxy/ratelimit configuration files to validate: every regular file below it, as upstream's config_check -config_dir (Kubernetes ConfigMap internals, names starting with \"..\", are skipped)")
	f.Bool(&rlsMerge, "rls-merge-domains", "MERGE_DOMAIN_CONFIG", false, "with --rls-config-dir: a domain in several files is one domain, as upstream's MERGE_DOMAIN_CONFIG")
	f.Bool(&rlsDotfiles, "rls-ignore-dotfiles", "RUNTIME_IGNOREDOTFILES", false, "with --rls-config-dir: skip files and directories whose name starts with \".\", as upstream's RUNTIME_IGNOREDOTFILES")
	if done, err := cli.Parse(f.fs, args, stdout, stderr); done {
		return err
	}
	if err := errors.Join(f.errs...); err != nil {
		return exitError{code: 2, msg: "ratelimit-authz check-config: " + err.Error()}
	}
	checkPort, err := checkConfigPort(checkAddr, envoyPath)
	if err != nil {
		return err
	}
	explicit := f.set("config", "RATELIMIT_AUTHZ_CONFIG")
	if rlsDir != "" {
		if checkPort != 0 {
			b, err := os.ReadFile(envoyPath)
			var problems []string
			if err == nil {
				problems, err = leanProblems(b, checkPort, true)
			}
			if err := envoyProblems(envoyPath, problems, err, stderr); err != nil {
				return err
			}
		}
		return checkRLSConfig(rlsDir, rlsMerge, rlsDotfiles, path, explicit, stdout, stderr)
	}
	r, source, err := loadCheckedConfig(path, explicit, stderr)
	if err != nil {
		return err
	}
	var cms []envoyconf.ConnectionManager
	if envoyPath != "" {
		if cms, err = checkEnvoy(envoyPath, source, r, checkPort, stderr); err != nil {
			return err
		}
	}
	for _, w := range trustWarnings(r, envoyPath, cms) {
		fmt.Fprintf(stderr, "%s: WARN: %s\n", source, w)
	}
	fmt.Fprintf(stdout, "%s: OK (%s, %s)\n", source, plural(len(r.Buckets), "bucket"), plural(len(r.Routes), "route"))
	return nil
}

// checkConfigPort is the port of --check-addr that --envoy compares, 0
// when there is none to compare (no --envoy, or the listener off).
func checkConfigPort(checkAddr, envoyPath string) (int, error) {
	checkPort := 0
	if checkAddr != "off" && checkAddr != "" && envoyPath != "" { // only --envoy compares it
		_, p, err := net.SplitHostPort(checkAddr)
		if err == nil {
			checkPort, err = net.LookupPort("tcp", p) // a number or a service name, as serve listens on
		}
		if err != nil || checkPort < 1 || checkPort > 65535 {
			return 0, exitError{code: 2, msg: fmt.Sprintf("ratelimit-authz check-config: --check-addr %q: want host:port with a port in 1…65535", checkAddr)}
		}
	}
	return checkPort, nil
}

// loadCheckedConfig loads the configuration file to validate; its
// problems, when it has any, are written to stderr and the error is the
// exit of check-config.
func loadCheckedConfig(path string, explicit bool, stderr io.Writer) (*configfile.Rules, string, error) {
	r, source, err := configfile.File{Path: path, Explicit: explicit}.Load()
	if err != nil {
		if ps, ok := problem.As(err); ok {
			for _, p := range ps {
				fmt.Fprintln(stderr, p)
			}
			return nil, source, exitError{code: 1, msg: fmt.Sprintf("%s: %d problem(s)", source, len(ps))}
		}
		return nil, source, exitError{code: 1, msg: "ratelimit-authz check-config: " + err.Error()}
	}
	return r, source, nil
}

// checkEnvoy checks the Envoy bootstrap at envoyPath against the rules
// loaded from source: it warns on stderr when the bootstrap runs no
// ext_authz filter, and returns its connection managers, or the exit of
// check-config when it cannot be read or has problems.
func checkEnvoy(envoyPath, source string, r *configfile.Rules, checkPort int, stderr io.Writer) ([]envoyconf.ConnectionManager, error) {
	var cms []envoyconf.ConnectionManager
	b, err := os.ReadFile(envoyPath)
	if err == nil {
		cms, err = envoyconf.Inspect(b)
	}
	if err == nil && !slices.ContainsFunc(cms, func(c envoyconf.ConnectionManager) bool { return c.ExtAuthz }) {
		fmt.Fprintf(stderr, "%s: WARN: %s runs no ext_authz filter: %s\n", source, envoyPath, unchecked(b, r))
	}
	var problems []string
	if err == nil && checkPort != 0 {
		problems, err = leanProblems(b, checkPort, false)
	}
	problems = append(problems, uncheckedRoutes(r, cms)...)
	if err := envoyProblems(envoyPath, problems, err, stderr); err != nil {
		return nil, err
	}
	return cms, nil
}

// checkRLSConfig validates a directory of envoyproxy/ratelimit files and,
// when one was asked for, the ext_authz configuration beside it: an
// overridable rule's name is a bucket name in tenant overrides, so it
// must not be one of the ext_authz buckets too.
func checkRLSConfig(dir string, merge, dotfiles bool, path string, withConfig bool, stdout, stderr io.Writer) error {
	cfg, err := rlsconfig.LoadDir(dir, dotfiles, rlsconfig.Options{MergeDomains: merge})
	var problems problem.List
	if err != nil {
		ps, ok := problem.As(err)
		if !ok {
			return exitError{code: 1, msg: "ratelimit-authz check-config: " + err.Error()}
		}
		problems = append(problems, ps...)
	}
	var r *configfile.Rules
	if withConfig {
		r, err = configfile.LoadFile(path)
		if ps, ok := problem.As(err); ok {
			problems = append(problems, ps...)
		} else if err != nil {
			return exitError{code: 1, msg: "ratelimit-authz check-config: " + err.Error()}
		}
	}
	if cfg != nil && r != nil {
		for _, rule := range cfg.Rules() {
			if rule.Overridable && r.BucketIndex(rule.Name) >= 0 {
				problems = append(problems, problem.Problem{File: rule.File, Line: rule.Line, Column: rule.Column,
					Msg: fmt.Sprintf("overridable rule %s is also a bucket of %s: tenant overrides would apply to both; rename one", rule.Name, path)})
			}
		}
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		return exitError{code: 1, msg: fmt.Sprintf("%s: %d problem(s)", dir, len(problems))}
	}
	if r != nil {
		fmt.Fprintf(stdout, "%s: OK (%s, %s)\n", path, plural(len(r.Buckets), "bucket"), plural(len(r.Routes), "route"))
	}
	fmt.Fprintf(stdout, "%s: OK (%s, %s)\n", dir, plural(len(cfg.Domains()), "domain"), plural(len(cfg.Rules()), "rule"))
	return nil
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// envoyProblems is the exit of check-config for the bootstrap at path:
// err reading it, or its problems, each written to stderr; nil when
// there is neither.
func envoyProblems(path string, problems []string, err error, stderr io.Writer) error {
	if err != nil {
		return exitError{code: 1, msg: fmt.Sprintf("ratelimit-authz check-config: --envoy %s: %v", path, err)}
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "%s: %s\n", path, p)
	}
	if len(problems) > 0 {
		return exitError{code: 1, msg: fmt.Sprintf("%s: %d problem(s)", path, len(problems))}
	}
	return nil
}

// unchecked says what a bootstrap without ext_authz still limits: the
// quota section's buckets through its rate_limit_quota filter, the RLS
// rules through its rate limit filter, or nothing.
func unchecked(bootstrap []byte, r *configfile.Rules) string {
	calls, _, _ := envoyconf.GRPCCalls(bootstrap)
	switch {
	case r.Quota != nil && slices.ContainsFunc(calls, envoyconf.GRPCCall.Quota):
		return "its route rules are never checked; only the quota section's buckets are limited, through the rate_limit_quota filter"
	case slices.ContainsFunc(calls, envoyconf.GRPCCall.RateLimit):
		return "its route rules are never checked; only the RLS rules (--rls-config-dir) are limited, through the rate limit filter"
	}
	return "nothing is limited"
}

// leanProblems lists the gRPC calls of a bootstrap that go to a cluster
// with an endpoint on checkPort, the lean Check listener's port, and that
// it does not serve: it serves ext_authz Check and health, and
// ShouldRateLimit when the node serves RLS (rls); any other call (failed
// logins over the access log, RLQS) fails there every time. Ports are
// what can be compared: the bootstrap names hosts as Envoy reaches them
// (a Service, a pod IP), the server the addresses it binds.
func leanProblems(bootstrap []byte, checkPort int, rls bool) ([]string, error) {
	calls, ports, err := envoyconf.GRPCCalls(bootstrap)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range calls {
		if c.Lean(rls) || !slices.Contains(ports[c.Cluster], checkPort) {
			continue
		}
		what := c.Config
		if what == "" {
			what = "a gRPC service"
		}
		if c.RateLimit() {
			out = append(out, fmt.Sprintf("%s sends to cluster %s on port %d, the lean Check listener (--check-addr), which serves ShouldRateLimit only on a node serving RLS: check with the node's --rls-config-dir, or point it at a cluster on the gRPC port (--grpc-addr)", what, c.Cluster, checkPort))
			continue
		}
		out = append(out, fmt.Sprintf("%s sends to cluster %s on port %d, the lean Check listener (--check-addr), which serves only ext_authz Check, ShouldRateLimit and health: point it at a cluster on the gRPC port (--grpc-addr)", what, c.Cluster, checkPort))
	}
	return out, nil
}

// uncheckedRoutes lists the route rules with buckets whose requests the
// bootstrap sends to an upstream without the check: a route of Envoy's
// that matches the rule's path (its parameters a segment each) with
// ext_authz off, in a connection manager that runs it. A route Envoy
// answers itself (a 404 catch-all) is listed too: the rule's requests
// never get through, so the two disagree. A bootstrap whose routes come
// from RDS is not looked at.
func uncheckedRoutes(r *configfile.Rules, cms []envoyconf.ConnectionManager) []string {
	var out []string
	for _, rt := range r.Routes {
		if len(rt.Buckets) == 0 {
			continue
		}
		path := templateParam.ReplaceAllString(rt.Path, "x")
		name := rt.Path
		if rt.Name != "" {
			name = rt.Name + " (" + rt.Path + ")"
		}
		for _, c := range cms {
			if !c.ExtAuthz {
				continue
			}
			for _, er := range c.RoutesFor(path) {
				switch {
				case er.Checked:
				case er.Direct:
					out = append(out, fmt.Sprintf("route %s, line %d, is limited, but listener %q sends %s to route %s of virtual host %s, which Envoy answers itself without the check: its requests never reach the upstream; route the path to it with ext_authz on, or remove the rule", name, rt.Line, c.Listener, path, er.Name, er.VirtualHost))
				default:
					out = append(out, fmt.Sprintf("route %s, line %d, is limited, but listener %q sends %s to route %s of virtual host %s with ext_authz off: those requests reach the upstream unlimited; turn the check on for that route", name, rt.Line, c.Listener, path, er.Name, er.VirtualHost))
				}
			}
		}
	}
	return out
}

// templateParam is a parameter of a route rule's path template.
var templateParam = regexp.MustCompile(`\{[^}/]*\}`)

// trustWarnings lists what a valid configuration trusts that a client can
// set, unless the Envoy bootstrap (when given) makes it safe.
func trustWarnings(r *configfile.Rules, envoyPath string, cms []envoyconf.ConnectionManager) []string {
	if envoyPath == "" {
		return r.TrustWarnings()
	}
	var out []string
	warn := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	// Every connection manager running ext_authz must protect the check.
	var checked []envoyconf.ConnectionManager
	for _, c := range cms {
		if c.ExtAuthz {
			checked = append(checked, c)
		}
	}
	for _, h := range r.TrustedHeaders() {
		for _, c := range checked {
			if !c.Clears(h.Name) {
				warn("%s, and listener %q of %s does not remove or overwrite it before ext_authz; %s", h.Risk(), c.Listener, envoyPath, h.Fix())
			}
		}
	}
	for _, c := range checked {
		if c.XFFNumTrustedHops != r.Keys.TrustedHops {
			warn("keys.trusted_hops is %d but listener %q of %s has xff_num_trusted_hops %d: the server and Envoy pick different client addresses; make them equal", r.Keys.TrustedHops, c.Listener, envoyPath, c.XFFNumTrustedHops)
		}
		if !r.Keys.UseExternalAddressHeader {
			continue
		}
		if !c.UseRemoteAddress {
			warn("keys.use_external_address_header is on but listener %q of %s lacks use_remote_address: true, so Envoy does not set x-envoy-external-address and a client's copy is the client IP; set use_remote_address: true at the edge, or turn the key off", c.Listener, envoyPath)
		}
		if len(c.InternalCIDRs) > 0 {
			warn("keys.use_external_address_header is on and listener %q of %s marks %s internal: Envoy neither sets nor strips x-envoy-external-address for those clients, so they choose their IP; leave internal_address_config empty at the edge", c.Listener, envoyPath, strings.Join(c.InternalCIDRs, ", "))
		}
	}
	out = append(out, accessLogWarnings(r, envoyPath, checked)...)
	return append(out, r.SettingWarnings()...)
}

// accessLogWarnings lists what the access logs of the connection
// managers checked drop of what the rules charge or release from them.
func accessLogWarnings(r *configfile.Rules, envoyPath string, checked []envoyconf.ConnectionManager) []string {
	var out []string
	warn := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	// A cost charged from a response header or trailer is read from the
	// access-log entry: Envoy sends only the ones it is told to log.
	for _, b := range r.Buckets {
		var logged func(envoyconf.ConnectionManager) []string
		field := ""
		switch b.Cost.Source {
		case configfile.CostResponseHeader:
			logged, field = func(c envoyconf.ConnectionManager) []string { return c.LoggedResponseHeaders }, "additional_response_headers_to_log"
		case configfile.CostResponseTrailer:
			logged, field = func(c envoyconf.ConnectionManager) []string { return c.LoggedResponseTrailers }, "additional_response_trailers_to_log"
		default:
			continue
		}
		for _, c := range checked {
			if !slices.Contains(logged(c), b.Cost.Header) {
				warn("bucket %s charges %s, but the gRPC access log of listener %q of %s does not log it: every response charges the cost's missing (%d); add %s to the access log's %s", b.Name, b.Cost, c.Listener, envoyPath, b.Cost.Missing, b.Cost.Header, field)
			}
		}
	}

	// What a check records for the access log (a concurrency bucket's
	// leases, a response-charged cost, a failure to count) is read from
	// each request's entry: an access log that drops the entry drops the
	// release or the charge.
	for i, b := range r.Buckets {
		if !routed(r, i) {
			continue
		}
		var key, what, loss string
		switch {
		case b.Count == configfile.CountConcurrency:
			key, what = "leases", "counts requests in flight"
			loss = fmt.Sprintf("each request holds its slot until lease_ttl (%s), so the bucket admits about limit requests per lease_ttl", b.LeaseTTL)
		case b.Cost.AfterResponse():
			key, what = b.Cost.Metadata(), fmt.Sprintf("is charged %s from the access log", b.Cost)
			loss = "its charges are lost and the budget is never spent (every request admitted)"
			if key == "failures" {
				what, loss = "counts failures from the access log", "its failures are never counted (no lockout)"
			}
		default:
			continue
		}
		for _, c := range checked {
			switch {
			case !c.GRPCAccessLog:
				warn("bucket %s %s, but listener %q of %s has no gRPC access log: %s; add the access log of envoy/ratelimit-authz.yaml (to the server's gRPC port)", b.Name, what, c.Listener, envoyPath, loss)
			case !c.Logs(key):
				warn("bucket %s %s, but the gRPC access log of listener %q of %s may drop the entries that carry it: for each entry dropped, %s; let the log's filter pass them (an or_filter with a metadata_filter on envoy.filters.http.ext_authz, whatever the ext_authz filter is named, path [{key: %s}], present_match: true, as envoy/ratelimit-authz.yaml)", b.Name, what, c.Listener, envoyPath, loss, key)
			}
		}
	}
	return out
}

// routed reports whether a route spends bucket b.
func routed(r *configfile.Rules, b int) bool {
	for _, rt := range r.Routes {
		if slices.Contains(rt.Buckets, b) {
			return true
		}
	}
	return false
}
