package envoyconf

import (
	"fmt"
	"testing"
)

// routeNames is what RoutesFor(path) gives, as "vhost/name[flags]".
// wantRoutes checks the routes each path reaches, in order, with their
// flags: c checked, d direct response, ? conditional.
func wantRoutes(t *testing.T, c ConnectionManager, want map[string]string) {
	t.Helper()
	for path, w := range want {
		if got := routeNames(c, path); got != w {
			t.Errorf("%s: %s, want %s", path, got, w)
		}
	}
}

func routeNames(c ConnectionManager, path string) string {
	var s []string
	for _, r := range c.RoutesFor(path) {
		f := ""
		if r.Checked {
			f += "c"
		}
		if r.Direct {
			f += "d"
		}
		if r.Conditional {
			f += "?"
		}
		s = append(s, fmt.Sprintf("%s/%s[%s]", r.VirtualHost, r.Name, f))
	}
	return fmt.Sprint(s)
}

// The shipped bootstrap checks every path of its API and answers the
// rest itself, unchecked.
func TestRoutesShipped(t *testing.T) {
	cms, err := Inspect(shipped(t))
	if err != nil {
		t.Fatal(err)
	}
	wantRoutes(t, cms[0], map[string]string{
		"/api/activities":                         "[app/activities[c]]",
		"/api/inbound/ch1":                        "[app/inbound[c]]",
		"/api/inbound/ch1/status":                 "[app/inbound_status[c]]",
		"/api/converger/channels/c/token/refresh": "[app/channel_token_refresh[c]]",
		"/admin/login":                            "[app/admin_login[c]]",
		"/api/llm/x":                              "[app/not_found[d]]",
		"/api/inbound/a/b":                        "[app/not_found[d]]",
		"/api/activities/x":                       "[app/not_found[d]]",
	})
}

// Path matchers as Envoy reads them, conditional routes, and where the
// filter is turned off or on again: per route, per virtual host, by
// default.
func TestRoutesFor(t *testing.T) {
	const doc = `
static_resources:
  listeners:
  - name: l
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          route_config:
            virtual_hosts:
            - name: a
              domains: ["a"]
              routes:
              - name: beta
                match: {prefix: /api/, headers: [{name: x-beta, present_match: true}]}
                route: {cluster: app}
                typed_per_filter_config: {authz: {disabled: true}}
              - name: exact
                match: {path: /api/Exact, case_sensitive: false}
                route: {cluster: app}
              - name: sep
                match: {path_separated_prefix: /api/sep}
                route: {cluster: app}
              - name: re
                match: {safe_regex: {regex: "/api/v[0-9]+/.*"}}
                route: {cluster: app}
              - name: rest
                match: {prefix: /}
                route: {cluster: app}
                typed_per_filter_config:
                  authz: {"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute, disabled: true}
            - name: b
              domains: ["*"]
              typed_per_filter_config:
                authz: {"@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}
              routes:
              - name: on_again
                match: {path_match_policy: {typed_config: {path_template: "/api/{x}/on"}}}
                route: {cluster: app}
                typed_per_filter_config:
                  authz: {"@type": type.googleapis.com/envoy.config.route.v3.FilterConfig}
              - match: {prefix: /api}
                route: {cluster: app}
          http_filters:
          - name: authz
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz}
          - name: envoy.filters.http.router
`
	cms, err := Inspect([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	wantRoutes(t, cms[0], map[string]string{
		"/api/exact":    "[a/beta[?] a/exact[c] b/prefix /api[]]",
		"/api/sep":      "[a/beta[?] a/sep[c] b/prefix /api[]]",
		"/api/sepx":     "[a/beta[?] a/rest[] b/prefix /api[]]",
		"/api/v2/users": "[a/beta[?] a/re[c] b/prefix /api[]]",
		"/api/k/on":     "[a/beta[?] a/rest[] b/on_again[c]]",
		"/other":        "[a/rest[]]",
	})
}

func TestTemplateRegexp(t *testing.T) {
	for tmpl, cases := range map[string]map[string]bool{
		"/api/{channel}":  {"/api/a": true, "/api/a/b": false, "/api/": false},
		"/api/{rest=**}":  {"/api/a/b/c": true},
		"/v1/*/x":         {"/v1/a/x": true, "/v1/a/b/x": false},
		"/files/**":       {"/files/a/b": true},
		"/{a}/{b=*}.txt":  {"/x/y.txt": true, "/x/y/z.txt": false},
		"/unclosed/{name": {"/unclosed/{name": false},
	} {
		m := pathMatch(map[string]any{"path_match_policy": map[string]any{"typed_config": map[string]any{"path_template": tmpl}}})
		for path, want := range cases {
			if got := m(path); got != want {
				t.Errorf("template %s, path %s: %v, want %v", tmpl, path, got, want)
			}
		}
	}
}
