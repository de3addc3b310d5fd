package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
)

// shippedRLS is envoy/ratelimit-rls.yaml from the repository.
func shippedRLS(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", RLSPath))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rlsBootstrap is the part of a bootstrap with the rate limit filter the
// tests look at.
type rlsBootstrap struct {
	StaticResources struct {
		Listeners []struct {
			FilterChains []struct {
				Filters []struct {
					TypedConfig rlsHCM `yaml:"typed_config"`
				}
			} `yaml:"filter_chains"`
		}
	} `yaml:"static_resources"`
}

// rlsHCM is the part of the connection manager the tests look at.
type rlsHCM struct {
	RouteConfig struct {
		VirtualHosts []struct {
			RateLimits []rateLimitYAML `yaml:"rate_limits"`
			Routes     []rlsRoute
		} `yaml:"virtual_hosts"`
	} `yaml:"route_config"`
	HTTPFilters []struct {
		Name        string
		TypedConfig rlsFilter `yaml:"typed_config"`
	} `yaml:"http_filters"`
}

type rlsRoute struct {
	Name  string
	Match struct{ Prefix string }
	Route struct {
		Cluster    string
		RateLimits []rateLimitYAML `yaml:"rate_limits"`
	}
	TypedPerFilterConfig map[string]struct {
		Domain     string
		RateLimits []rateLimitYAML `yaml:"rate_limits"`
	} `yaml:"typed_per_filter_config"`
}

type rlsFilter struct {
	Type             string `yaml:"@type"`
	Domain           string
	Timeout          string
	FailureModeDeny  bool   `yaml:"failure_mode_deny"`
	XRateLimit       string `yaml:"enable_x_ratelimit_headers"`
	RetryAfter       bool   `yaml:"enable_retry_after_header"`
	RateLimitService struct {
		TransportAPIVersion string `yaml:"transport_api_version"`
		GRPCService         struct {
			EnvoyGRPC struct {
				ClusterName string `yaml:"cluster_name"`
			} `yaml:"envoy_grpc"`
			RetryPolicy struct {
				NumRetries int `yaml:"num_retries"`
			} `yaml:"retry_policy"`
		} `yaml:"grpc_service"`
	} `yaml:"rate_limit_service"`
}

type rateLimitYAML struct {
	Actions []map[string]map[string]any
}

func parseRLS(t testing.TB, b []byte) *rlsBootstrap {
	t.Helper()
	var bs rlsBootstrap
	if err := yaml.Unmarshal(b, &bs); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, b)
	}
	if len(bs.StaticResources.Listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(bs.StaticResources.Listeners))
	}
	return &bs
}

// hcm is the rendering's one connection manager.
func (bs *rlsBootstrap) hcm() *rlsHCM {
	return &bs.StaticResources.Listeners[0].FilterChains[0].Filters[0].TypedConfig
}

func (bs *rlsBootstrap) filterNames() []string {
	var out []string
	for _, f := range bs.hcm().HTTPFilters {
		out = append(out, f.Name)
	}
	return out
}

// allActions is one descriptor of each action kind WithRateLimitFilter
// and WithRateLimitRoutes write.
var allActions = []RateLimit{
	{Actions: []Action{RemoteAddress()}},
	{Actions: []Action{GenericKey("", "default"), RequestHeader("x-user", "user")}},
	{Actions: []Action{HeaderValueMatch("message_type", "marketing", "x-message-type", "marketing"), GenericKey("key_1", "value_1")}},
}

// The rendered RLS bootstrap with three nodes: the rate limit cluster gets
// one endpoint each, and Envoy loads it.
func TestRenderRLS(t *testing.T) {
	a := Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", App: "127.0.0.1:43000",
		Authz: []string{"127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"}}
	out, err := Render(shippedRLS(t), a)
	if err != nil {
		t.Fatal(err)
	}
	bs := parse(t, out)
	if got := bs.endpoints(ShippedRLSCluster); strings.Join(got, " ") != strings.Join(a.Authz, " ") {
		t.Errorf("%s endpoints %v, want %v", ShippedRLSCluster, got, a.Authz)
	}
	rls := parseRLS(t, out)
	if got := rls.filterNames(); !slices.Equal(got, []string{"envoy.filters.http.ratelimit", "envoy.filters.http.router"}) {
		t.Errorf("filters %v", got)
	}
	f := rls.hcm().HTTPFilters[0].TypedConfig
	if f.RateLimitService.GRPCService.EnvoyGRPC.ClusterName != ShippedRLSCluster || f.RateLimitService.TransportAPIVersion != "V3" ||
		f.XRateLimit != "DRAFT_VERSION_03" || !f.RetryAfter || f.FailureModeDeny {
		t.Errorf("shipped filter: %+v", f)
	}
	// Every route but the catch-all is limited; the README examples' domains.
	domains := map[string]string{}
	for _, r := range rls.hcm().RouteConfig.VirtualHosts[0].Routes {
		if r.Name == "not_found" {
			continue
		}
		if len(r.Route.RateLimits) == 0 && len(r.TypedPerFilterConfig["envoy.filters.http.ratelimit"].RateLimits) == 0 {
			t.Errorf("route %s has no rate_limits", r.Name)
		}
		domains[r.Name] = r.TypedPerFilterConfig["envoy.filters.http.ratelimit"].Domain
	}
	want := map[string]string{"example1": "mongo_cps", "example2": "messaging", "example3": "", "example4": "example4",
		"example5": "internal", "example6": "example6", "example7": "example7", "llm": "llm", "inflight": "inflight"}
	for name, d := range want {
		if got, ok := domains[name]; !ok || got != d {
			t.Errorf("route %s: domain %q (present %v), want %q", name, got, ok, d)
		}
	}
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, binaries.InstalledEnvoy(t), dst)
}

// On the ext_authz bootstrap the rate limit filter takes the place of
// ext_authz, with the virtual host's descriptors; Envoy loads the result.
func TestWithRateLimitFilterReplacesExtAuthz(t *testing.T) {
	out, err := Render(shipped(t), Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", App: "127.0.0.1:43000", Authz: []string{"127.0.0.1:40001"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err = WithRateLimitFilter(out, RateLimitFilter{Domain: "edge", Cluster: ShippedAuthzCluster, Timeout: 250 * time.Millisecond,
		FailureModeDeny: true, XRateLimitHeaders: true, RetryAfter: true, RateLimits: allActions})
	if err != nil {
		t.Fatal(err)
	}
	bs := parseRLS(t, out)
	if got := bs.filterNames(); !slices.Equal(got, []string{"envoy.filters.http.ratelimit", "envoy.filters.http.router"}) {
		t.Errorf("filters %v, want the rate limit filter instead of ext_authz", got)
	}
	f := bs.hcm().HTTPFilters[0].TypedConfig
	if f.Domain != "edge" || f.Timeout != "0.25s" || !f.FailureModeDeny || f.XRateLimit != "DRAFT_VERSION_03" || !f.RetryAfter ||
		f.RateLimitService.GRPCService.EnvoyGRPC.ClusterName != ShippedAuthzCluster || f.RateLimitService.GRPCService.RetryPolicy.NumRetries != 2 {
		t.Errorf("filter: %+v", f)
	}
	vh := bs.hcm().RouteConfig.VirtualHosts[0]
	if len(vh.RateLimits) != 3 {
		t.Fatalf("virtual host rate_limits %+v, want 3", vh.RateLimits)
	}
	if _, ok := vh.RateLimits[0].Actions[0]["remote_address"]; !ok {
		t.Errorf("first descriptor %+v, want remote_address", vh.RateLimits[0])
	}
	if got := vh.RateLimits[1].Actions[1]["request_headers"]; got["header_name"] != "x-user" || got["descriptor_key"] != "user" {
		t.Errorf("request_headers %+v", got)
	}
	if got := vh.RateLimits[2].Actions[0]["header_value_match"]; got["descriptor_key"] != "message_type" || got["descriptor_value"] != "marketing" {
		t.Errorf("header_value_match %+v", got)
	}
	// Applied again, it replaces the filter and the descriptors it wrote.
	again, err := WithRateLimitFilter(out, RateLimitFilter{Domain: "other", Cluster: ShippedAuthzCluster, RateLimits: allActions[:1]})
	if err != nil {
		t.Fatal(err)
	}
	bs = parseRLS(t, again)
	if f := bs.hcm().HTTPFilters[0].TypedConfig; f.Domain != "other" || f.Timeout != "" || f.FailureModeDeny || f.XRateLimit != "" || f.RetryAfter {
		t.Errorf("filter after a second WithRateLimitFilter: %+v", f)
	}
	if n := len(bs.hcm().RouteConfig.VirtualHosts[0].RateLimits); n != 1 {
		t.Errorf("%d virtual host descriptors after a second WithRateLimitFilter, want 1", n)
	}
	envoy := binaries.InstalledEnvoy(t)
	for i, b := range [][]byte{out, again} {
		dst := filepath.Join(t.TempDir(), "envoy.yaml")
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rendering %d", i+1)
		validate(t, envoy, dst)
	}
}

// Routes added to the RLS bootstrap come before the catch-all, with their
// own descriptors and domain, and Envoy loads them; a changed filter
// replaces the shipped one.
func TestWithRateLimitRoutes(t *testing.T) {
	out, err := Render(shippedRLS(t), Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", App: "127.0.0.1:43000", Authz: []string{"127.0.0.1:40001"}})
	if err != nil {
		t.Fatal(err)
	}
	out, err = WithRateLimitRoutes(out,
		RateLimitRoute{Name: "hourly", Prefix: "/hourly", Domain: "rls_e2e", RateLimits: []RateLimit{{Actions: []Action{GenericKey("", "hourly")}}}},
		RateLimitRoute{Name: "all", Prefix: "/all", RateLimits: allActions})
	if err != nil {
		t.Fatal(err)
	}
	out, err = WithRateLimitFilter(out, RateLimitFilter{Domain: "edge_proxy_per_ip", Cluster: ShippedRLSCluster, Timeout: time.Second, FailureModeDeny: true})
	if err != nil {
		t.Fatal(err)
	}
	bs := parseRLS(t, out)
	var names []string
	for _, r := range bs.hcm().RouteConfig.VirtualHosts[0].Routes {
		names = append(names, r.Name)
	}
	if n := len(names); n < 3 || names[n-3] != "hourly" || names[n-2] != "all" || names[n-1] != "not_found" {
		t.Fatalf("routes %v, want hourly and all before not_found", names)
	}
	r := bs.hcm().RouteConfig.VirtualHosts[0].Routes[len(names)-3]
	if r.Match.Prefix != "/hourly" || r.Route.Cluster != "app" || r.TypedPerFilterConfig["envoy.filters.http.ratelimit"].Domain != "rls_e2e" ||
		len(r.Route.RateLimits) != 1 || r.Route.RateLimits[0].Actions[0]["generic_key"]["descriptor_value"] != "hourly" {
		t.Errorf("route hourly: %+v", r)
	}
	if got := bs.filterNames(); !slices.Equal(got, []string{"envoy.filters.http.ratelimit", "envoy.filters.http.router"}) {
		t.Errorf("filters %v", got)
	}
	if f := bs.hcm().HTTPFilters[0].TypedConfig; !f.FailureModeDeny || f.Timeout != "1s" {
		t.Errorf("filter %+v, want failure_mode_deny and timeout 1s", f)
	}
	if _, err := WithRateLimitRoutes(out, RateLimitRoute{Name: "hourly", Prefix: "/x", RateLimits: allActions}); err == nil {
		t.Error("a route name twice accepted")
	}
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, binaries.InstalledEnvoy(t), dst)
}

func TestRateLimitOptionErrors(t *testing.T) {
	rls := shippedRLS(t)
	good := RateLimitFilter{Domain: "d", Cluster: ShippedRLSCluster}
	for name, f := range map[string]RateLimitFilter{
		"empty domain":     {Cluster: ShippedRLSCluster},
		"no cluster":       {Domain: "d"},
		"unknown cluster":  {Domain: "d", Cluster: "elsewhere"},
		"bad cluster name": {Domain: "d", Cluster: "a: b"},
		"negative timeout": {Domain: "d", Cluster: ShippedRLSCluster, Timeout: -time.Second},
		"empty descriptor": {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{}}},
		"no action kind":   {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{{}}}}},
		"two action kinds": {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{{RemoteAddress: &struct{}{}, GenericKey: &genericKey{DescriptorValue: "v"}}}}}},
		"empty generic":    {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{GenericKey("k", "")}}}},
		"header upper":     {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{RequestHeader("X-User", "user")}}}},
		"header with nl":   {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{RequestHeader("x\nname: y", "user")}}}},
		"header no key":    {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{RequestHeader("x-user", "")}}}},
		"match no value":   {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{HeaderValueMatch("k", "", "x-a", "b")}}}},
		"domain with nl":   {Domain: "a\nb", Cluster: ShippedRLSCluster},
		"domain not utf-8": {Domain: "\xff", Cluster: ShippedRLSCluster},
		"value with nul":   {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{GenericKey("k", "a\x00")}}}},
		"match bad header": {Domain: "d", Cluster: ShippedRLSCluster, RateLimits: []RateLimit{{Actions: []Action{HeaderValueMatch("k", "v", ":path", "b")}}}},
	} {
		if out, err := WithRateLimitFilter(rls, f); err == nil {
			t.Errorf("%s: accepted:\n%s", name, out)
		}
	}
	if _, err := WithRateLimitFilter([]byte("static_resources: {}\n  clusters:\n  - name: ratelimit\n"), good); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("a bootstrap without a filter to replace: %v, want ErrPlaceholder", err)
	}
	route := RateLimitRoute{Name: "r", Prefix: "/r", RateLimits: allActions}
	for name, r := range map[string]RateLimitRoute{
		"bad name":      {Name: "R-1", Prefix: "/r", RateLimits: allActions},
		"root prefix":   {Name: "r", Prefix: "/", RateLimits: allActions},
		"no slash":      {Name: "r", Prefix: "r", RateLimits: allActions},
		"query":         {Name: "r", Prefix: "/r?x", RateLimits: allActions},
		"no rate limit": {Name: "r", Prefix: "/r"},
		"bad action":    {Name: "r", Prefix: "/r", RateLimits: []RateLimit{{Actions: []Action{{}}}}},
		"shipped name":  {Name: "example3", Prefix: "/r", RateLimits: allActions},
	} {
		if out, err := WithRateLimitRoutes(rls, r); err == nil {
			t.Errorf("%s: accepted:\n%s", name, out)
		}
	}
	if _, err := WithRateLimitRoutes(rls); err == nil {
		t.Error("no route accepted")
	}
	if _, err := WithRateLimitRoutes([]byte("routes: []\n"), route); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("a bootstrap without the catch-all: %v, want ErrPlaceholder", err)
	}
}

// FuzzRateLimitValues: whatever a domain, a descriptor value or a matched
// header value holds (quotes, newlines, YAML syntax), the rendering is
// YAML with the same structure, and reads back the values as given.
func FuzzRateLimitValues(f *testing.F) {
	f.Add("edge", "users", "marketing")
	f.Add("\"\n  - name: evil\n", "}]}: {", "&a *a !!binary")
	f.Add("on", "no", "0x1f")
	f.Add("\x00\xff", "\u2028", "# comment")
	base := shippedRLS(f)
	f.Fuzz(func(t *testing.T, domain, value, exact string) {
		if domain == "" || value == "" {
			t.Skip()
		}
		// Text Envoy's YAML cannot carry is refused, with an error.
		bad := false
		for _, s := range []string{domain, value, exact} {
			bad = bad || !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl)
		}
		out, err := WithRateLimitFilter(base, RateLimitFilter{Domain: domain, Cluster: ShippedRLSCluster})
		if err == nil {
			out, err = WithRateLimitRoutes(out, RateLimitRoute{Name: "fuzz", Prefix: "/fuzz", Domain: domain,
				RateLimits: []RateLimit{{Actions: []Action{GenericKey("k", value), HeaderValueMatch("m", value, "x-m", exact)}}}})
		}
		if bad {
			if err == nil {
				t.Fatalf("%q, %q, %q accepted", domain, value, exact)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var bs rlsBootstrap
		if err := yaml.Unmarshal(out, &bs); err != nil {
			t.Fatalf("not YAML: %v", err)
		}
		if len(bs.StaticResources.Listeners) != 1 {
			t.Fatalf("%d listeners", len(bs.StaticResources.Listeners))
		}
		h := bs.hcm()
		if len(h.HTTPFilters) != 2 || h.HTTPFilters[0].TypedConfig.Domain != domain {
			t.Fatalf("filters %+v, want the domain %q", h.HTTPFilters, domain)
		}
		routes := h.RouteConfig.VirtualHosts[0].Routes
		r := routes[len(routes)-2]
		if r.Name != "fuzz" || r.TypedPerFilterConfig["envoy.filters.http.ratelimit"].Domain != domain ||
			r.Route.RateLimits[0].Actions[0]["generic_key"]["descriptor_value"] != value {
			t.Fatalf("route %+v", r)
		}
	})
}
