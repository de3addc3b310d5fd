package envoyconf

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// RLSPath is the shipped bootstrap for Envoy's own rate limit filter
// (envoy.filters.http.ratelimit) calling ratelimit-authz's
// ShouldRateLimit, relative to the repository root. Render renders it as
// it renders Path: the same four shipped addresses, the rate limit
// cluster's endpoint in place of ratelimit_authz's.
const RLSPath = "envoy/ratelimit-rls.yaml"

// ShippedRLSCluster is the rate limit service's cluster in RLSPath, named
// as envoyproxy/ratelimit's examples name it.
const ShippedRLSCluster = "ratelimit"

// RateLimitFilter is Envoy's rate limit filter as WithRateLimitFilter
// writes it.
type RateLimitFilter struct {
	// Domain is the filter's domain (RateLimitRequest.domain); a route may
	// name its own (RateLimitRoute.Domain). Required.
	Domain string
	// Cluster is the gRPC cluster of the rate limit service; it must be in
	// the bootstrap (ShippedRLSCluster, ShippedAuthzCluster, or one added
	// by WithAuthzCluster).
	Cluster string
	// Timeout bounds each call; a slower answer is an error and
	// FailureModeDeny decides. 0 leaves Envoy's default, 20 ms.
	Timeout time.Duration
	// FailureModeDeny: when the service fails or cannot be reached, answer
	// status_on_error (500) instead of letting the request through.
	FailureModeDeny bool
	// XRateLimitHeaders turns on enable_x_ratelimit_headers:
	// DRAFT_VERSION_03 (x-ratelimit-limit, -remaining, -reset).
	XRateLimitHeaders bool
	// RetryAfter turns on enable_retry_after_header (Retry-After on 429s).
	RetryAfter bool
	// RateLimits are the virtual host's rate_limits: the descriptors of
	// every route that has none of its own. Empty: the virtual host's are
	// left as they are.
	RateLimits []RateLimit
}

// RateLimit is one entry of a rate_limits list: one descriptor, whose
// entries are its actions' in order.
type RateLimit struct {
	Actions []Action `json:"actions"`
}

// Action is one rate limit action: exactly one field is set. Build it
// with RequestHeader, RemoteAddress, GenericKey or HeaderValueMatch.
type Action struct {
	RequestHeaders   *requestHeaders   `json:"request_headers,omitempty"`
	RemoteAddress    *struct{}         `json:"remote_address,omitempty"`
	GenericKey       *genericKey       `json:"generic_key,omitempty"`
	HeaderValueMatch *headerValueMatch `json:"header_value_match,omitempty"`
}

type requestHeaders struct {
	HeaderName    string `json:"header_name"`
	DescriptorKey string `json:"descriptor_key"`
}

type genericKey struct {
	DescriptorKey   string `json:"descriptor_key,omitempty"`
	DescriptorValue string `json:"descriptor_value"`
}

type headerValueMatch struct {
	DescriptorKey   string          `json:"descriptor_key,omitempty"`
	DescriptorValue string          `json:"descriptor_value"`
	Headers         []headerMatcher `json:"headers"`
}

type headerMatcher struct {
	Name        string `json:"name"`
	StringMatch struct {
		Exact string `json:"exact"`
	} `json:"string_match"`
}

// RequestHeader is the request_headers action: the entry (key, the
// header's value); a request without the header sends no descriptor.
func RequestHeader(header, key string) Action {
	return Action{RequestHeaders: &requestHeaders{HeaderName: header, DescriptorKey: key}}
}

// RemoteAddress is the remote_address action: ("remote_address", the
// client's address as the connection manager trusts it).
func RemoteAddress() Action { return Action{RemoteAddress: &struct{}{}} }

// GenericKey is the generic_key action: the fixed entry (key, value); an
// empty key is Envoy's "generic_key".
func GenericKey(key, value string) Action {
	return Action{GenericKey: &genericKey{DescriptorKey: key, DescriptorValue: value}}
}

// HeaderValueMatch is the header_value_match action: the entry (key,
// value) when the request's header equals exact; otherwise no
// descriptor. An empty key is Envoy's "header_match".
func HeaderValueMatch(key, value, header, exact string) Action {
	h := headerMatcher{Name: header}
	h.StringMatch.Exact = exact
	return Action{HeaderValueMatch: &headerValueMatch{DescriptorKey: key, DescriptorValue: value, Headers: []headerMatcher{h}}}
}

// headerName is what a header the actions read may be: lowercase, as
// Envoy matches them, and a token.
var headerName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,99}$`)

// text checks a value written into the bootstrap: valid UTF-8 without
// control characters, which Envoy's YAML would refuse or a reader misread.
func text(what, s string) error {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return fmt.Errorf("%s %q: want valid UTF-8 without control characters", what, s)
	}
	return nil
}

func (a Action) validate() error {
	n := 0
	if a.RequestHeaders != nil {
		n++
		if !headerName.MatchString(a.RequestHeaders.HeaderName) {
			return fmt.Errorf("request_headers: header %q: want a lowercase header name", a.RequestHeaders.HeaderName)
		}
		if a.RequestHeaders.DescriptorKey == "" {
			return errors.New("request_headers: empty descriptor key")
		}
		if err := text("request_headers: descriptor key", a.RequestHeaders.DescriptorKey); err != nil {
			return err
		}
	}
	if a.RemoteAddress != nil {
		n++
	}
	if a.GenericKey != nil {
		n++
		if a.GenericKey.DescriptorValue == "" { // Envoy refuses it
			return errors.New("generic_key: empty descriptor value")
		}
		if err := errors.Join(text("generic_key: descriptor key", a.GenericKey.DescriptorKey),
			text("generic_key: descriptor value", a.GenericKey.DescriptorValue)); err != nil {
			return err
		}
	}
	if a.HeaderValueMatch != nil {
		n++
		m := a.HeaderValueMatch
		if m.DescriptorValue == "" {
			return errors.New("header_value_match: empty descriptor value")
		}
		if err := errors.Join(text("header_value_match: descriptor key", m.DescriptorKey),
			text("header_value_match: descriptor value", m.DescriptorValue)); err != nil {
			return err
		}
		if len(m.Headers) == 0 {
			return errors.New("header_value_match: no header")
		}
		for _, h := range m.Headers {
			if !headerName.MatchString(h.Name) {
				return fmt.Errorf("header_value_match: header %q: want a lowercase header name", h.Name)
			}
			if err := text("header_value_match: header value", h.StringMatch.Exact); err != nil {
				return err
			}
		}
	}
	if n != 1 {
		return fmt.Errorf("an action sets %d kinds, want exactly one", n)
	}
	return nil
}

func validateRateLimits(rls []RateLimit) error {
	for i, rl := range rls {
		if len(rl.Actions) == 0 {
			return fmt.Errorf("rate_limits[%d]: no action", i)
		}
		for j, a := range rl.Actions {
			if err := a.validate(); err != nil {
				return fmt.Errorf("rate_limits[%d].actions[%d]: %w", i, j, err)
			}
		}
	}
	return nil
}

// The HTTP filters WithRateLimitFilter replaces, as the shipped bootstraps
// open them.
const (
	rateLimitFilter = "          - name: envoy.filters.http.ratelimit"
	// virtualHostDomains is the line the virtual host's rate_limits follow.
	virtualHostDomains = "              domains: [ \"*\" ]\n"
	// notFoundRoute opens the catch-all route WithRateLimitRoutes adds
	// routes ahead of.
	notFoundRoute = "              - name: not_found\n"
)

const (
	rateLimitType        = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
	rateLimitPerRouteTyp = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute"
	previousHostsType    = "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
)

// WithRateLimitFilter returns the rendered bootstrap cfg with Envoy's rate
// limit filter as f describes it, in place of the bootstrap's rate limit
// filter or, in the ext_authz bootstrap (Path), of its ext_authz filter:
// every route is then limited by ShouldRateLimit instead of Check. With
// f.RateLimits, the virtual host's rate_limits are f's.
//
// The filter keeps the shipped bootstraps' retries (a call to a node that
// has just died is retried on another; an answer never is). Everything f
// writes is JSON, which YAML reads as it is, so no name or value can
// change the document's structure.
func WithRateLimitFilter(cfg []byte, f RateLimitFilter) ([]byte, error) {
	if f.Domain == "" {
		return nil, errors.New("envoyconf: rate limit filter: empty domain")
	}
	if err := text("domain", f.Domain); err != nil {
		return nil, fmt.Errorf("envoyconf: rate limit filter: %w", err)
	}
	if !validName.MatchString(f.Cluster) {
		return nil, fmt.Errorf("envoyconf: rate limit filter: cluster name %q: want lowercase letters, digits and _, starting with a letter", f.Cluster)
	}
	s := string(cfg)
	if !hasCluster(s, f.Cluster) {
		return nil, fmt.Errorf("envoyconf: rate limit filter: no cluster %q in the bootstrap", f.Cluster)
	}
	if f.Timeout < 0 {
		return nil, fmt.Errorf("envoyconf: rate limit filter: negative timeout %v", f.Timeout)
	}
	if err := validateRateLimits(f.RateLimits); err != nil {
		return nil, fmt.Errorf("envoyconf: rate limit filter: %w", err)
	}
	header := rateLimitFilter
	if strings.Count(s, "\n"+header+"\n") == 0 {
		header = extAuthzFilter
	}
	start, end, err := block(s, header)
	if err != nil {
		return nil, err
	}
	tc, err := json.Marshal(filterConfig(f))
	if err != nil {
		return nil, fmt.Errorf("envoyconf: rate limit filter: %w", err)
	}
	s = s[:start] + rateLimitFilter + "\n            typed_config: " + string(tc) + "\n" + s[end:]
	if len(f.RateLimits) > 0 {
		if s, err = withVirtualHostRateLimits(s, f.RateLimits); err != nil {
			return nil, err
		}
	}
	return []byte(s), nil
}

func filterConfig(f RateLimitFilter) map[string]any {
	grpc := map[string]any{
		"envoy_grpc": map[string]any{"cluster_name": f.Cluster},
		"retry_policy": map[string]any{
			"retry_on":                          "connect-failure,refused-stream,reset,unavailable",
			"num_retries":                       2,
			"retry_back_off":                    map[string]any{"base_interval": "0.005s", "max_interval": "0.25s"},
			"retry_host_predicate":              []any{map[string]any{"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": map[string]any{"@type": previousHostsType}}},
			"host_selection_retry_max_attempts": 5,
		},
	}
	tc := map[string]any{
		"@type":              rateLimitType,
		"domain":             f.Domain,
		"rate_limit_service": map[string]any{"transport_api_version": "V3", "grpc_service": grpc},
		"failure_mode_deny":  f.FailureModeDeny,
	}
	if f.Timeout > 0 {
		tc["timeout"] = duration(f.Timeout)
	}
	if f.XRateLimitHeaders {
		tc["enable_x_ratelimit_headers"] = "DRAFT_VERSION_03"
	}
	if f.RetryAfter {
		tc["enable_retry_after_header"] = true
	}
	return tc
}

// duration writes d as protobuf JSON does: seconds with a fraction.
func duration(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// withVirtualHostRateLimits sets the rate_limits of the one virtual host:
// a line after its domains, replacing one written before.
func withVirtualHostRateLimits(s string, rls []RateLimit) (string, error) {
	b, err := json.Marshal(rls)
	if err != nil {
		return "", fmt.Errorf("envoyconf: rate_limits: %w", err)
	}
	const prefix = "              rate_limits: "
	if strings.Count(s, "\n"+prefix) == 1 {
		return replaceLine(s, prefix, prefix+string(b))
	}
	return replaceOnce(s, virtualHostDomains, virtualHostDomains+prefix+string(b)+"\n")
}

// RateLimitRoute is a route WithRateLimitRoutes adds: requests whose path
// starts with Prefix go to the app cluster, limited with the descriptors
// of RateLimits in Domain.
type RateLimitRoute struct {
	Name   string // the route's name: lowercase letters, digits and _
	Prefix string // a path prefix: "/" and at least one more character
	// Domain overrides the filter's domain for this route
	// (RateLimitPerRoute.domain); empty keeps the filter's.
	Domain     string
	RateLimits []RateLimit // at least one
}

// WithRateLimitRoutes returns the rendered bootstrap cfg with routes added
// ahead of its 404 catch-all (not_found), in order, each to the app
// cluster with its own rate_limits. The bootstrap needs a rate limit
// filter (RLSPath, or WithRateLimitFilter first) for the routes to be
// limited.
func WithRateLimitRoutes(cfg []byte, routes ...RateLimitRoute) ([]byte, error) {
	if len(routes) == 0 {
		return nil, errors.New("envoyconf: no route")
	}
	s := string(cfg)
	if n := strings.Count(s, "\n"+notFoundRoute); n != 1 {
		return nil, fmt.Errorf("%w: line %q occurs %d times", ErrPlaceholder, strings.TrimRight(notFoundRoute, "\n"), n)
	}
	var b strings.Builder
	for _, r := range routes {
		if !validName.MatchString(r.Name) {
			return nil, fmt.Errorf("envoyconf: route name %q: want lowercase letters, digits and _ (at most 60), starting with a letter", r.Name)
		}
		if strings.Contains(s, "\n              - name: "+r.Name+"\n") || strings.Contains(s, "\n              - name: "+quote(r.Name)+"\n") {
			return nil, fmt.Errorf("envoyconf: route %q is already in the bootstrap", r.Name)
		}
		if len(r.Prefix) < 2 || r.Prefix[0] != '/' || strings.ContainsAny(r.Prefix, "?#% \t\r\n") {
			return nil, fmt.Errorf("envoyconf: route %q: prefix %q: want a path such as /api", r.Name, r.Prefix)
		}
		if len(r.RateLimits) == 0 {
			return nil, fmt.Errorf("envoyconf: route %q: no rate_limits", r.Name)
		}
		if err := text("domain", r.Domain); err != nil {
			return nil, fmt.Errorf("envoyconf: route %q: %w", r.Name, err)
		}
		if err := validateRateLimits(r.RateLimits); err != nil {
			return nil, fmt.Errorf("envoyconf: route %q: %w", r.Name, err)
		}
		match, _ := json.Marshal(map[string]string{"prefix": r.Prefix})
		route, err := json.Marshal(map[string]any{"cluster": "app", "rate_limits": r.RateLimits})
		if err != nil {
			return nil, fmt.Errorf("envoyconf: route %q: %w", r.Name, err)
		}
		b.WriteString("              - name: " + quote(r.Name) + "\n")
		b.WriteString("                match: " + string(match) + "\n")
		b.WriteString("                route: " + string(route) + "\n")
		if r.Domain != "" {
			per, _ := json.Marshal(map[string]any{"envoy.filters.http.ratelimit": map[string]string{"@type": rateLimitPerRouteTyp, "domain": r.Domain}})
			b.WriteString("                typed_per_filter_config: " + string(per) + "\n")
		}
	}
	i := strings.Index(s, "\n"+notFoundRoute) + 1
	return []byte(s[:i] + b.String() + s[i:]), nil
}
