package envoyconf

import (
	"regexp"
	"strings"
)

// Route is one route of a connection manager's static route_config, as
// far as whether a request reaching it passes ext_authz.
type Route struct {
	// VirtualHost and Name say which route it is (Name: the route's name,
	// or its match as written).
	VirtualHost, Name string
	// Checked: the ext_authz filter runs for it (in the chain, and not
	// disabled for the route, its virtual host or by default).
	Checked bool
	// Direct: Envoy answers it itself (direct_response, redirect):
	// nothing reaches an upstream.
	Direct bool
	// Conditional: it matches only some requests for its paths (headers,
	// query parameters, a runtime fraction, …): the others go on to the
	// routes after it.
	Conditional bool

	match func(path string) bool // nil: a path matcher this package cannot read
}

// RoutesFor returns, in each virtual host, the routes a request for path
// may reach: the conditional ones that match it, up to and including the
// first unconditional one. A route whose matcher this package cannot read
// is passed over. Routes come from a static route_config only (none with
// RDS).
func (c ConnectionManager) RoutesFor(path string) []Route {
	var out []Route
	for i, r := range c.Routes {
		if r.match == nil || !r.match(path) {
			continue
		}
		if i > 0 && len(out) > 0 && out[len(out)-1].VirtualHost == r.VirtualHost && !out[len(out)-1].Conditional {
			continue // this virtual host's first unconditional match is taken
		}
		out = append(out, r)
	}
	return out
}

// pathMatchers are the keys of a route's match that select by path; any
// other key makes a route conditional.
var pathMatchers = map[string]bool{"prefix": true, "path": true, "safe_regex": true, "path_separated_prefix": true, "path_match_policy": true, "case_sensitive": true}

// routes reads the virtual hosts of tc's static route_config; filter is
// the name the ext_authz filter has in the chain ("" when there is
// none), on by default unless off.
func routes(tc any, filter string, off bool) []Route {
	var out []Route
	for _, vh := range list(get(tc, "route_config", "virtual_hosts")) {
		vname, _ := get(vh, "name").(string)
		vhChecked := enabled(get(vh, "typed_per_filter_config", filter), !off)
		for _, r := range list(get(vh, "routes")) {
			m := get(r, "match")
			rt := Route{VirtualHost: vname, match: pathMatch(m)}
			rt.Name, _ = get(r, "name").(string)
			if rt.Name == "" {
				rt.Name = matchText(m)
			}
			rt.Checked = filter != "" && enabled(get(r, "typed_per_filter_config", filter), vhChecked)
			rt.Direct = get(r, "direct_response") != nil || get(r, "redirect") != nil
			if mm, ok := m.(map[string]any); ok {
				for k := range mm {
					rt.Conditional = rt.Conditional || !pathMatchers[k]
				}
			}
			out = append(out, rt)
		}
	}
	return out
}

// enabled is whether a per-route (or per-virtual-host) config of the
// ext_authz filter leaves it on, def when there is none: an
// ExtAuthzPerRoute or FilterConfig with disabled: true turns it off, a
// FilterConfig with disabled: false on.
func enabled(cfg any, def bool) bool {
	if cfg == nil {
		return def
	}
	d, set := get(cfg, "disabled").(bool)
	if !set {
		if isType(cfg, "envoy.config.route.v3.FilterConfig") {
			return true
		}
		return def
	}
	return !d
}

// pathMatch returns what a route's match selects of a path, nil when it
// cannot be read.
func pathMatch(m any) func(string) bool {
	cs, set := get(m, "case_sensitive").(bool)
	fold := set && !cs
	norm := func(s string) string {
		if fold {
			return strings.ToLower(s)
		}
		return s
	}
	if p, ok := get(m, "path").(string); ok {
		return func(s string) bool { return norm(s) == norm(p) }
	}
	if p, ok := get(m, "prefix").(string); ok {
		return func(s string) bool { return strings.HasPrefix(norm(s), norm(p)) }
	}
	if p, ok := get(m, "path_separated_prefix").(string); ok {
		return func(s string) bool {
			s = norm(s)
			return s == norm(p) || strings.HasPrefix(s, norm(p)+"/")
		}
	}
	if re, ok := get(m, "safe_regex", "regex").(string); ok {
		x, err := regexp.Compile(`^(?:` + re + `)$`)
		if err != nil {
			return nil
		}
		return func(s string) bool { return x.MatchString(s) }
	}
	if t, ok := get(m, "path_match_policy", "typed_config", "path_template").(string); ok {
		x, err := regexp.Compile(templateRegexp(t))
		if err != nil {
			return nil
		}
		return func(s string) bool { return x.MatchString(s) }
	}
	return nil
}

// templateRegexp is Envoy's URI template as a regular expression: a
// variable {name} or {name=*} and * match one path segment, {name=**}
// and ** any number.
func templateRegexp(t string) string {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(t); {
		switch {
		case t[i] == '{':
			end := strings.IndexByte(t[i:], '}')
			if end < 0 {
				return "$^" // malformed: matches nothing
			}
			if strings.Contains(t[i:i+end], "**") {
				b.WriteString(".*")
			} else {
				b.WriteString("[^/]+")
			}
			i += end + 1
		case strings.HasPrefix(t[i:], "**"):
			b.WriteString(".*")
			i += 2
		case t[i] == '*':
			b.WriteString("[^/]+")
			i++
		default:
			b.WriteString(regexp.QuoteMeta(t[i : i+1]))
			i++
		}
	}
	b.WriteString("$")
	return b.String()
}

// matchText is a route's match as written, for a route without a name.
func matchText(m any) string {
	for _, k := range []string{"path", "prefix", "path_separated_prefix"} {
		if p, ok := get(m, k).(string); ok {
			return k + " " + p
		}
	}
	if re, ok := get(m, "safe_regex", "regex").(string); ok {
		return "safe_regex " + re
	}
	if t, ok := get(m, "path_match_policy", "typed_config", "path_template").(string); ok {
		return "path_template " + t
	}
	return "a route"
}
