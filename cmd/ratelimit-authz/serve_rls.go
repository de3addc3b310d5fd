package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/node"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rls"
	"github.com/ratelimit-authz/ratelimit-authz/internal/rlsconfig"
	"github.com/ratelimit-authz/ratelimit-authz/internal/server"
)

// rlsConfig is the serve flags of the RLS service: Envoy's ratelimit
// filter (ShouldRateLimit) over envoyproxy/ratelimit configuration files.
type rlsConfig struct {
	configDir                 string
	root, subdir, appdir      string
	watchRoot, ignoreDotfiles bool
	mergeDomains              bool
	algorithm                 string
	shadow, headers           bool
	limitHeader               string
	remainingHeader           string
	resetHeader               string
	onOverflow                string
	enabled                   bool // a configuration directory or layout is set
	// upstream holds what upstreamEnv found of envoyproxy/ratelimit's
	// environment: warnings to log at start, errors of usage.
	upstream upstreamSettings
}

// upstreamDefaultRoot is envoyproxy/ratelimit's RUNTIME_ROOT default.
const upstreamDefaultRoot = "/srv/runtime_data/current"

func (c *rlsConfig) addFlags(f *envFlags) {
	f.String(&c.configDir, "rls-config-dir", "RATELIMIT_AUTHZ_RLS_CONFIG_DIR", "", "`directory` of envoyproxy/ratelimit configuration files (every file below it, one domain each): serves Envoy's ratelimit filter (ShouldRateLimit) on the gRPC port; or the runtime layout below")
	f.String(&c.root, "rls-runtime-root", "RATELIMIT_AUTHZ_RLS_RUNTIME_ROOT", "", "runtime root `directory` (serves ShouldRateLimit like --rls-config-dir); "+upstreamDefaultRoot+" when only the subdirectory is set"+alsoUpstream("RUNTIME_ROOT"))
	f.String(&c.subdir, "rls-runtime-subdirectory", "RATELIMIT_AUTHZ_RLS_RUNTIME_SUBDIRECTORY", "", "runtime `subdirectory` below the root (serves ShouldRateLimit); empty with --rls-runtime-watch-root: no configuration, as upstream"+alsoUpstream("RUNTIME_SUBDIRECTORY"))
	f.String(&c.appdir, "rls-runtime-appdirectory", "RATELIMIT_AUTHZ_RLS_RUNTIME_APPDIRECTORY", "config", "`name` of the directory of configuration files below the subdirectory"+alsoUpstream("RUNTIME_APPDIRECTORY"))
	f.Bool(&c.watchRoot, "rls-runtime-watch-root", "RATELIMIT_AUTHZ_RLS_RUNTIME_WATCH_ROOT", true, "read ROOT/SUBDIRECTORY, keeping the files under APPDIRECTORY; false: every file below ROOT/SUBDIRECTORY/APPDIRECTORY"+alsoUpstream("RUNTIME_WATCH_ROOT"))
	f.Bool(&c.ignoreDotfiles, "rls-ignore-dotfiles", "RATELIMIT_AUTHZ_RLS_IGNORE_DOTFILES", false, "skip files and directories whose name starts with '.' (names starting with '..', a ConfigMap's internals, are always skipped)"+alsoUpstream("RUNTIME_IGNOREDOTFILES"))
	f.Bool(&c.mergeDomains, "rls-merge-domains", "RATELIMIT_AUTHZ_RLS_MERGE_DOMAINS", false, "a domain in several files is one domain"+alsoUpstream("MERGE_DOMAIN_CONFIG"))
	f.String(&c.algorithm, "rls-default-algorithm", "RATELIMIT_AUTHZ_RLS_DEFAULT_ALGORITHM", "fixed", "`algorithm` of rules without rate_limit.algorithm: fixed (upstream's) or sliding")
	f.Bool(&c.shadow, "rls-shadow-mode", "RATELIMIT_AUTHZ_RLS_SHADOW_MODE", false, "answer every ShouldRateLimit OK; the statuses still say which descriptors are over"+alsoUpstream("SHADOW_MODE"))
	f.Bool(&c.headers, "rls-response-headers", "RATELIMIT_AUTHZ_RLS_RESPONSE_HEADERS", false, "add the limit, remaining and reset headers to responses"+alsoUpstream("LIMIT_RESPONSE_HEADERS_ENABLED"))
	f.String(&c.limitHeader, "rls-limit-header", "RATELIMIT_AUTHZ_RLS_LIMIT_HEADER", rls.DefaultLimitHeader, "`name` of the limit header"+alsoUpstream("LIMIT_LIMIT_HEADER"))
	f.String(&c.remainingHeader, "rls-remaining-header", "RATELIMIT_AUTHZ_RLS_REMAINING_HEADER", rls.DefaultRemainingHeader, "`name` of the remaining header"+alsoUpstream("LIMIT_REMAINING_HEADER"))
	f.String(&c.resetHeader, "rls-reset-header", "RATELIMIT_AUTHZ_RLS_RESET_HEADER", rls.DefaultResetHeader, "`name` of the reset header (seconds)"+alsoUpstream("LIMIT_RESET_HEADER"))
	f.String(&c.onOverflow, "rls-on-overflow", "RATELIMIT_AUTHZ_RLS_ON_OVERFLOW", "allow", "a new key the counter cannot track (at counter.max_keys): allow (OK, uncounted) or deny (OVER_LIMIT)")
	// The flags serve.go defines that envoyproxy/ratelimit's names set too.
	for name, theirs := range map[string]string{"log-level": "LOG_LEVEL", "log-format": "LOG_FORMAT", "grpc-addr": "GRPC_HOST and GRPC_PORT", "http-addr": "USE_PROMETHEUS and PROMETHEUS_ADDR"} {
		if fl := f.fs.Lookup(name); fl != nil {
			fl.Usage += alsoUpstream(theirs)
		}
	}
}

// alsoUpstream is the help text naming the envoyproxy/ratelimit variable
// that sets a flag too.
func alsoUpstream(env string) string {
	return "; envoyproxy/ratelimit's " + env + " too (ours wins)"
}

// resolve checks the flags and decides whether RLS is on; tls is the gRPC
// port's. Its errors are usage errors.
func (c *rlsConfig) resolve(f *envFlags, tls server.TLS) error {
	if err := errors.Join(c.upstream.errs...); err != nil {
		return err
	}
	if c.upstream.wantTLS && (tls.CertFile == "" || tls.KeyFile == "") {
		return errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (or --grpc-tls-cert and --grpc-tls-key): the port would be plaintext")
	}
	runtime := f.set("rls-runtime-root", "RATELIMIT_AUTHZ_RLS_RUNTIME_ROOT") || f.set("rls-runtime-subdirectory", "RATELIMIT_AUTHZ_RLS_RUNTIME_SUBDIRECTORY")
	if c.configDir != "" && runtime {
		return errors.New("--rls-config-dir and the runtime layout (--rls-runtime-root, --rls-runtime-subdirectory, RUNTIME_ROOT, RUNTIME_SUBDIRECTORY) exclude each other: set one")
	}
	c.enabled = c.configDir != "" || runtime
	if c.root == "" {
		c.root = upstreamDefaultRoot
	}
	switch c.algorithm {
	case "fixed", "sliding":
	default:
		return fmt.Errorf("--rls-default-algorithm %q: use fixed or sliding", c.algorithm)
	}
	switch c.onOverflow {
	case "allow", "deny":
	default:
		return fmt.Errorf("--rls-on-overflow %q: use allow or deny", c.onOverflow)
	}
	if c.appdir == "" || strings.ContainsAny(c.appdir, `/\`) || c.appdir == "." || c.appdir == ".." {
		return fmt.Errorf("--rls-runtime-appdirectory %q: want a directory name", c.appdir)
	}
	if _, err := c.settings(); err != nil {
		return err
	}
	return nil
}

func (c *rlsConfig) settings() (rls.Settings, error) {
	s := rls.Settings{
		ShadowMode: c.shadow, ResponseHeaders: c.headers,
		LimitHeader: c.limitHeader, RemainingHeader: c.remainingHeader, ResetHeader: c.resetHeader,
		DenyOverflow: c.onOverflow == "deny",
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("--rls-limit-header, --rls-remaining-header, --rls-reset-header: %w", err)
	}
	return s, nil
}

// nodeRLS is the node's RLS configuration; nil when RLS is off.
func (c *rlsConfig) nodeRLS() *node.RLS {
	if !c.enabled {
		return nil
	}
	settings, _ := c.settings() // checked by resolve
	opts := rlsconfig.Options{MergeDomains: c.mergeDomains}
	if c.algorithm == "sliding" {
		opts.DefaultAlgorithm = counter.Sliding
	}
	l := rlsconfig.Layout{Root: c.root, Subdirectory: c.subdir, AppDirectory: c.appdir, WatchRoot: c.watchRoot, IgnoreDotfiles: c.ignoreDotfiles}
	if c.configDir != "" {
		// every file below the directory, as RUNTIME_WATCH_ROOT=false reads
		// ROOT/SUBDIRECTORY/APPDIRECTORY
		l = rlsconfig.Layout{Root: c.configDir, AppDirectory: ".", IgnoreDotfiles: c.ignoreDotfiles}
	}
	return &node.RLS{Layout: l, Options: opts, Settings: settings}
}

// warn logs what was found of envoyproxy/ratelimit's environment that this
// server does not honour.
func (c *rlsConfig) warn(log *slog.Logger) {
	for _, w := range c.upstream.warnings {
		log.Warn(w)
	}
}

// upstreamSettings is what upstreamEnv made of envoyproxy/ratelimit's
// environment variables.
type upstreamSettings struct {
	alias    map[string]string // our variable → the value its upstream name gives it
	warnings []string
	errs     []error
	wantTLS  bool // GRPC_SERVER_USE_TLS=true
}

// upstreamAliases are envoyproxy/ratelimit's variables read as aliases of
// ours as they are (a boolean is checked here, so that an error names the
// variable the user set).
var upstreamAliases = []struct {
	theirs, ours string
	boolean      bool
}{
	{"RUNTIME_ROOT", "RATELIMIT_AUTHZ_RLS_RUNTIME_ROOT", false},
	{"RUNTIME_SUBDIRECTORY", "RATELIMIT_AUTHZ_RLS_RUNTIME_SUBDIRECTORY", false},
	{"RUNTIME_APPDIRECTORY", "RATELIMIT_AUTHZ_RLS_RUNTIME_APPDIRECTORY", false},
	{"RUNTIME_WATCH_ROOT", "RATELIMIT_AUTHZ_RLS_RUNTIME_WATCH_ROOT", true},
	{"RUNTIME_IGNOREDOTFILES", "RATELIMIT_AUTHZ_RLS_IGNORE_DOTFILES", true},
	{"MERGE_DOMAIN_CONFIG", "RATELIMIT_AUTHZ_RLS_MERGE_DOMAINS", true},
	{"SHADOW_MODE", "RATELIMIT_AUTHZ_RLS_SHADOW_MODE", true},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "RATELIMIT_AUTHZ_RLS_RESPONSE_HEADERS", true},
	{"LIMIT_LIMIT_HEADER", "RATELIMIT_AUTHZ_RLS_LIMIT_HEADER", false},
	{"LIMIT_REMAINING_HEADER", "RATELIMIT_AUTHZ_RLS_REMAINING_HEADER", false},
	{"LIMIT_RESET_HEADER", "RATELIMIT_AUTHZ_RLS_RESET_HEADER", false},
}

// Reasons upstream settings have no effect here.
const (
	noEffectCounts  = "has no effect: counts are in memory, shared over NATS"
	noEffectStats   = "has no effect: metrics are Prometheus's, on --http-addr /metrics"
	noEffectTracing = "has no effect: ratelimit-authz does not export traces"
)

// upstreamNoEffect are envoyproxy/ratelimit's settings this server accepts
// and ignores, each with why.
var upstreamNoEffect = []struct{ name, why string }{
	{"BACKEND_TYPE", noEffectCounts}, {"CACHE_KEY_PREFIX", noEffectCounts}, {"EXPIRATION_JITTER_MAX_SECONDS", noEffectCounts},
	{"LOCAL_CACHE_SIZE_IN_BYTES", noEffectCounts}, {"NEAR_LIMIT_RATIO", noEffectStats},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "has no effect: a hit over the limit is never counted here"},
	{"REDIS_SOCKET_TYPE", noEffectCounts}, {"REDIS_TYPE", noEffectCounts}, {"REDIS_URL", noEffectCounts}, {"REDIS_POOL_SIZE", noEffectCounts},
	{"REDIS_AUTH", noEffectCounts}, {"REDIS_TLS", noEffectCounts}, {"REDIS_TLS_CLIENT_CERT", noEffectCounts}, {"REDIS_TLS_CLIENT_KEY", noEffectCounts},
	{"REDIS_TLS_CACERT", noEffectCounts}, {"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", noEffectCounts}, {"REDIS_PIPELINE_WINDOW", noEffectCounts},
	{"REDIS_PIPELINE_LIMIT", noEffectCounts}, {"REDIS_PERSECOND", noEffectCounts}, {"REDIS_PERSECOND_SOCKET_TYPE", noEffectCounts},
	{"REDIS_PERSECOND_TYPE", noEffectCounts}, {"REDIS_PERSECOND_URL", noEffectCounts}, {"REDIS_PERSECOND_POOL_SIZE", noEffectCounts},
	{"REDIS_PERSECOND_AUTH", noEffectCounts}, {"REDIS_PERSECOND_TLS", noEffectCounts}, {"REDIS_PERSECOND_PIPELINE_WINDOW", noEffectCounts},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", noEffectCounts}, {"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", noEffectCounts},
	{"REDIS_TIMEOUT", noEffectCounts}, {"REDIS_SENTINEL_AUTH", noEffectCounts}, {"REDIS_CLUSTER_PIPELINE_PARALLELISM", noEffectCounts},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", noEffectCounts},
	{"MEMCACHE_HOST_PORT", noEffectCounts}, {"MEMCACHE_MAX_IDLE_CONNS", noEffectCounts}, {"MEMCACHE_SRV", noEffectCounts},
	{"MEMCACHE_SRV_REFRESH", noEffectCounts}, {"MEMCACHE_TLS", noEffectCounts}, {"MEMCACHE_TLS_CLIENT_CERT", noEffectCounts},
	{"MEMCACHE_TLS_CLIENT_KEY", noEffectCounts}, {"MEMCACHE_TLS_CACERT", noEffectCounts}, {"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", noEffectCounts},
	{"USE_STATSD", noEffectStats}, {"STATSD_HOST", noEffectStats}, {"STATSD_PORT", noEffectStats}, {"USE_DOG_STATSD", noEffectStats},
	{"USE_DOG_STATSD_MOGRIFIERS", noEffectStats}, {"EXTRA_TAGS", noEffectStats}, {"STATS_FLUSH_INTERVAL", noEffectStats},
	{"DISABLE_STATS", noEffectStats}, {"PROMETHEUS_MAPPER_YAML", noEffectStats}, {"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", noEffectStats},
	{"TRACING_ENABLED", noEffectTracing}, {"TRACING_SERVICE_NAME", noEffectTracing}, {"TRACING_SERVICE_NAMESPACE", noEffectTracing},
	{"TRACING_SERVICE_INSTANCE_ID", noEffectTracing}, {"TRACING_EXPORTER_PROTOCOL", noEffectTracing}, {"TRACING_SAMPLING_RATE", noEffectTracing},
	{"HOST", "has no effect: there is no /json endpoint; health and metrics are on --http-addr"},
	{"PORT", "has no effect: there is no /json endpoint; health and metrics are on --http-addr"},
	{"DEBUG_HOST", "has no effect: profiles are on --pprof-addr"}, {"DEBUG_PORT", "has no effect: profiles are on --pprof-addr"},
	{"GRPC_MAX_CONNECTION_AGE", "has no effect: idle connections close after 5 min, none by age"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "has no effect: idle connections close after 5 min, none by age"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "has no effect: a configuration that does not load stops the start"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "has no effect: the node is healthy once its configuration has loaded"},
	{"RESPONSE_DYNAMIC_METADATA", "has no effect: responses carry no dynamic metadata"},
}

// upstreamTLS maps GRPC_SERVER_USE_TLS=true's files onto ours.
var upstreamTLS = []struct{ theirs, ours string }{
	{"GRPC_SERVER_TLS_CERT", "RATELIMIT_AUTHZ_GRPC_TLS_CERT"},
	{"GRPC_SERVER_TLS_KEY", "RATELIMIT_AUTHZ_GRPC_TLS_KEY"},
	{"GRPC_CLIENT_TLS_CACERT", "RATELIMIT_AUTHZ_GRPC_TLS_CLIENT_CA"},
	{"GRPC_CLIENT_TLS_SAN", "RATELIMIT_AUTHZ_GRPC_TLS_ALLOWED_CLIENTS"},
}

// upstreamEnv reads envoyproxy/ratelimit's environment variables, so that
// a deployment of it can switch over unchanged: the returned getenv gives
// each of our variables the value of its upstream alias when ours is not
// set (ours wins). Settings that have no effect here make a warning each;
// an invalid value, or a setting that cannot be honoured safely (a unix
// socket, xDS configuration, quota mode), is an error naming it.
func upstreamEnv(getenv func(string) string) (func(string) string, upstreamSettings) {
	r := &upstreamReader{getenv: getenv, u: upstreamSettings{alias: map[string]string{}}}
	r.aliases()
	r.logging()
	r.listeners()
	r.tls()
	r.unsupported()
	u := r.u
	return func(k string) string {
		if v, ok := u.alias[k]; ok {
			return v
		}
		return getenv(k)
	}, u
}

// upstreamReader collects upstreamSettings from envoyproxy/ratelimit's
// variables in getenv.
type upstreamReader struct {
	getenv func(string) string
	u      upstreamSettings
}

// give makes v, the value of upstream's theirs, the value of our ours,
// unless ours is set: then theirs is ignored with a warning.
func (r *upstreamReader) give(theirs, ours, v string) {
	if r.getenv(ours) != "" {
		r.u.warnings = append(r.u.warnings, fmt.Sprintf("%s is ignored: %s is set, and wins", theirs, ours))
		return
	}
	r.u.alias[ours] = v
}

// boolean is the boolean variable name and whether it is set to one; a
// value that is not a boolean is an error.
func (r *upstreamReader) boolean(name string) (bool, bool) {
	v := r.getenv(name)
	if v == "" {
		return false, false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.u.errs = append(r.u.errs, fmt.Errorf("%s=%q: not a boolean (true or false)", name, v))
		return false, false
	}
	return b, true
}

// aliases reads the variables of upstreamAliases.
func (r *upstreamReader) aliases() {
	for _, a := range upstreamAliases {
		v := r.getenv(a.theirs)
		if v == "" {
			continue
		}
		if a.boolean {
			if _, ok := r.boolean(a.theirs); !ok {
				continue
			}
		}
		r.give(a.theirs, a.ours, v)
	}
}

// logging reads LOG_LEVEL and LOG_FORMAT.
func (r *upstreamReader) logging() {
	if v := r.getenv("LOG_LEVEL"); v != "" {
		// logrus's levels, in any case
		switch l := strings.ToLower(v); l {
		case "trace", "debug":
			r.give("LOG_LEVEL", "RATELIMIT_AUTHZ_LOG_LEVEL", "debug")
		case "info", "warn", "error":
			r.give("LOG_LEVEL", "RATELIMIT_AUTHZ_LOG_LEVEL", l)
		case "warning":
			r.give("LOG_LEVEL", "RATELIMIT_AUTHZ_LOG_LEVEL", "warn")
		case "fatal", "panic":
			r.give("LOG_LEVEL", "RATELIMIT_AUTHZ_LOG_LEVEL", "error")
		default:
			r.u.errs = append(r.u.errs, fmt.Errorf("LOG_LEVEL=%q: use trace, debug, info, warn, error, fatal or panic", v))
		}
	}
	if v := r.getenv("LOG_FORMAT"); v != "" {
		// upstream: json is JSON, anything else text
		f := "text"
		if strings.EqualFold(v, "json") {
			f = "json"
		}
		r.give("LOG_FORMAT", "RATELIMIT_AUTHZ_LOG_FORMAT", f)
	}
}

// listeners reads the gRPC address (GRPC_HOST, GRPC_PORT) and the
// metrics' (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH).
func (r *upstreamReader) listeners() {
	if host, port := r.getenv("GRPC_HOST"), r.getenv("GRPC_PORT"); host != "" || port != "" {
		// upstream's defaults: 0.0.0.0, 8081
		if host == "" {
			host = "0.0.0.0"
		}
		if port == "" {
			port = "8081"
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil {
			r.u.errs = append(r.u.errs, fmt.Errorf("GRPC_PORT=%q: not a port (0 to 65535)", port))
		} else {
			r.give("GRPC_HOST and GRPC_PORT", "RATELIMIT_AUTHZ_GRPC_ADDR", net.JoinHostPort(host, strconv.FormatUint(n, 10)))
		}
	}
	if on, ok := r.boolean("USE_PROMETHEUS"); ok && on {
		addr := r.getenv("PROMETHEUS_ADDR")
		if addr == "" {
			addr = ":9090" // upstream's default
		}
		r.give("USE_PROMETHEUS and PROMETHEUS_ADDR", "RATELIMIT_AUTHZ_HTTP_ADDR", addr)
	} else if r.getenv("PROMETHEUS_ADDR") != "" {
		r.u.warnings = append(r.u.warnings, "PROMETHEUS_ADDR has no effect without USE_PROMETHEUS=true (as upstream); metrics are on --http-addr")
	}
	if p := r.getenv("PROMETHEUS_PATH"); p != "" && p != "/metrics" {
		r.u.warnings = append(r.u.warnings, "PROMETHEUS_PATH has no effect: metrics are served on /metrics")
	}
}

// tls reads GRPC_SERVER_USE_TLS and the files of upstreamTLS, which
// have no effect without it.
func (r *upstreamReader) tls() {
	if on, _ := r.boolean("GRPC_SERVER_USE_TLS"); on {
		r.u.wantTLS = true
		for _, a := range upstreamTLS {
			if v := r.getenv(a.theirs); v != "" {
				r.give(a.theirs, a.ours, v)
			}
		}
	} else {
		for _, a := range upstreamTLS {
			if r.getenv(a.theirs) != "" {
				r.u.warnings = append(r.u.warnings, a.theirs+" has no effect without GRPC_SERVER_USE_TLS=true (as upstream)")
			}
		}
	}
}

// unsupported reads the settings that are refused (a unix socket, xDS
// configuration, quota mode) and those of upstreamNoEffect.
func (r *upstreamReader) unsupported() {
	if r.getenv("GRPC_UDS") != "" {
		r.u.errs = append(r.u.errs, errors.New("GRPC_UDS: a unix socket is not served; listen on --grpc-addr (GRPC_HOST, GRPC_PORT)"))
	}
	if v := r.getenv("CONFIG_TYPE"); v != "" && !strings.EqualFold(v, "FILE") {
		r.u.errs = append(r.u.errs, fmt.Errorf("CONFIG_TYPE=%q: only FILE is served (the runtime directory layout); xDS configuration is not", v))
	}
	if on, _ := r.boolean("QUOTA_MODE"); on {
		r.u.errs = append(r.u.errs, errors.New("QUOTA_MODE=true: quota mode is not supported (over-limit quota descriptors would fail requests here)"))
	}
	for _, s := range upstreamNoEffect {
		if r.getenv(s.name) != "" {
			r.u.warnings = append(r.u.warnings, s.name+" "+s.why)
		}
	}
}
