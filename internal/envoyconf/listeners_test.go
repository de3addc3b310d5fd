package envoyconf

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
)

// listeners is the part of a bootstrap's listeners the tests of
// WithListeners look at.
type listeners struct {
	StaticResources struct {
		Listeners []struct {
			Name         string
			Address      address
			FilterChains []struct {
				Filters []struct {
					TypedConfig struct {
						StatPrefix string `yaml:"stat_prefix"`
						AccessLog  []struct {
							TypedConfig struct {
								CommonConfig struct {
									GRPCService grpcService `yaml:"grpc_service"`
								} `yaml:"common_config"`
							} `yaml:"typed_config"`
						} `yaml:"access_log"`
						RouteConfig struct {
							VirtualHosts []struct {
								Routes []struct{ Name string }
							} `yaml:"virtual_hosts"`
						} `yaml:"route_config"`
						HTTPFilters []struct {
							Name        string
							TypedConfig struct {
								GRPCService grpcService `yaml:"grpc_service"`
							} `yaml:"typed_config"`
						} `yaml:"http_filters"`
					} `yaml:"typed_config"`
				}
			} `yaml:"filter_chains"`
		}
	} `yaml:"static_resources"`
}

type grpcService struct {
	EnvoyGRPC struct {
		ClusterName string `yaml:"cluster_name"`
	} `yaml:"envoy_grpc"`
}

// benchLike renders what a comparison of the filter's cost needs: the
// shipped bootstrap with a second check cluster and three listeners, the
// filter on with each cluster and off.
func benchLike(t *testing.T, names [3]string) []byte {
	t.Helper()
	out, err := Render(shipped(t), Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", Authz: []string{"127.0.0.1:40001", "127.0.0.1:40002"}, App: "127.0.0.1:43000"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err = WithAuthzCluster(out, "noop_authz", "127.0.0.1:40009", "[::1]:40010"); err != nil {
		t.Fatal(err)
	}
	out, err = WithListeners(out,
		Listener{Name: names[0], Addr: "127.0.0.1:42001", Authz: ShippedAuthzCluster},
		Listener{Name: names[1], Addr: "127.0.0.1:42002", Authz: "noop_authz"},
		Listener{Name: names[2], Addr: "[::1]:42003"})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWithListeners(t *testing.T) {
	names := [3]string{"authz_on", "authz_noop", "authz_off"}
	out := benchLike(t, names)
	var doc listeners
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ls := doc.StaticResources.Listeners
	if len(ls) != 3 {
		t.Fatalf("%d listeners, want 3", len(ls))
	}
	want := []struct{ addr, cluster string }{{"127.0.0.1:42001", ShippedAuthzCluster}, {"127.0.0.1:42002", "noop_authz"}, {"[::1]:42003", ""}}
	routes := func(i int) []string {
		var out []string
		for _, r := range ls[i].FilterChains[0].Filters[0].TypedConfig.RouteConfig.VirtualHosts[0].Routes {
			out = append(out, r.Name)
		}
		return out
	}
	for i, l := range ls {
		hcm := l.FilterChains[0].Filters[0].TypedConfig
		if l.Name != names[i] || hcm.StatPrefix != names[i] || l.Address.String() != want[i].addr {
			t.Errorf("listener %d: %s, stat_prefix %s, on %s; want %s on %s", i, l.Name, hcm.StatPrefix, l.Address, names[i], want[i].addr)
		}
		var filters []string
		authz := ""
		for _, f := range hcm.HTTPFilters {
			filters = append(filters, f.Name)
			if f.Name == "envoy.filters.http.ext_authz" {
				authz = f.TypedConfig.GRPCService.EnvoyGRPC.ClusterName
			}
		}
		wantFilters := "envoy.filters.http.ext_authz envoy.filters.http.router"
		if want[i].cluster == "" {
			wantFilters = "envoy.filters.http.router"
		}
		if strings.Join(filters, " ") != wantFilters || authz != want[i].cluster {
			t.Errorf("%s: filters %v checking with %q; want %s checking with %q", l.Name, filters, authz, wantFilters, want[i].cluster)
		}
		// The failure access log stays on the gRPC port, which serves the
		// access-log service, whatever cluster the checks go to.
		logTo := hcm.AccessLog[0].TypedConfig.CommonConfig.GRPCService.EnvoyGRPC.ClusterName
		if logTo != ShippedAuthzCluster {
			t.Errorf("%s: access log to %q, want %q", l.Name, logTo, ShippedAuthzCluster)
		}
		// Everything else is the shipped listener: the same routes.
		if strings.Join(routes(i), " ") != strings.Join(routes(0), " ") || len(routes(i)) < 5 {
			t.Errorf("%s: routes %v, want the shipped ones %v", l.Name, routes(i), routes(0))
		}
	}
	bs := parse(t, out)
	if got := bs.endpoints("noop_authz"); strings.Join(got, " ") != "127.0.0.1:40009 [::1]:40010" {
		t.Errorf("noop_authz endpoints %v", got)
	}
	if got := bs.endpoints(ShippedAuthzCluster); strings.Join(got, " ") != "127.0.0.1:40001 127.0.0.1:40002" {
		t.Errorf("ratelimit_authz endpoints %v, want the rendered ones", got)
	}
	var clusters []string
	for _, c := range bs.StaticResources.Clusters {
		clusters = append(clusters, c.Name)
	}
	if strings.Join(clusters, " ") != "ratelimit_authz_check ratelimit_authz noop_authz app" {
		t.Errorf("clusters %v", clusters)
	}
	// The copy keeps the shipped cluster's settings: HTTP/2 and health checks.
	c, _, err := cut(string(out), "  - name: \"noop_authz\"\n", "  # The application.")
	if err != nil || !strings.Contains(c, "http2_protocol_options") || !strings.Contains(c, "grpc_health_check") {
		t.Errorf("noop_authz is not a copy of ratelimit_authz (%v):\n%s", err, c)
	}
}

// cut returns the text of s from the line from up to the line to.
func cut(s, from, to string) (string, bool, error) {
	i := strings.Index(s, from)
	if i < 0 {
		return "", false, errors.New("start not found")
	}
	j := strings.Index(s[i:], to)
	if j < 0 {
		return s[i:], false, nil
	}
	return s[i : i+j], true, nil
}

// TestListenersValidate: the rendering loads in the pinned Envoy, with
// listener names that a plain YAML scalar would read as booleans.
func TestListenersValidate(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(dst, benchLike(t, [3]string{"on", "noop", "off"}), 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, envoy, dst)
}

func TestWithListenersErrors(t *testing.T) {
	rendered, err := Render(shipped(t), Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"})
	if err != nil {
		t.Fatal(err)
	}
	on := Listener{Name: "a", Addr: "127.0.0.1:5", Authz: ShippedAuthzCluster}
	once, err := WithListeners(rendered, on)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg         []byte
		ls          []Listener
		placeholder bool
	}{
		"no listener":            {rendered, nil, false},
		"empty name":             {rendered, []Listener{{Addr: "127.0.0.1:5"}}, false},
		"name with a quote":      {rendered, []Listener{{Name: `a"b`, Addr: "127.0.0.1:5"}}, false},
		"name with a newline":    {rendered, []Listener{{Name: "a\n  - name: b", Addr: "127.0.0.1:5"}}, false},
		"upper case name":        {rendered, []Listener{{Name: "Edge", Addr: "127.0.0.1:5"}}, false},
		"name too long":          {rendered, []Listener{{Name: strings.Repeat("a", 61), Addr: "127.0.0.1:5"}}, false},
		"same name twice":        {rendered, []Listener{on, on}, false},
		"host name":              {rendered, []Listener{{Name: "a", Addr: "localhost:5"}}, false},
		"unknown cluster":        {rendered, []Listener{{Name: "a", Addr: "127.0.0.1:5", Authz: "noop_authz"}}, false},
		"a listener as cluster":  {rendered, []Listener{{Name: "a", Addr: "127.0.0.1:5", Authz: ShippedListenerName}}, false},
		"cluster name injection": {rendered, []Listener{{Name: "a", Addr: "127.0.0.1:5", Authz: "x }\n"}}, false},
		"applied twice":          {once, []Listener{on}, true},
		"listener renamed":       {[]byte(strings.Replace(string(rendered), "- name: ingress\n", "- name: edge\n", 1)), []Listener{on}, true},
		"stat_prefix changed":    {[]byte(strings.Replace(string(rendered), "stat_prefix: ingress\n", "stat_prefix: edge\n", 1)), []Listener{on}, true},
		"no ext_authz filter":    {[]byte(strings.Replace(string(rendered), extAuthzFilter+"\n", "          - name: ext_authz\n", 1)), []Listener{{Name: "a", Addr: "127.0.0.1:5"}}, true},
	} {
		out, err := WithListeners(tc.cfg, tc.ls...)
		if err == nil {
			t.Errorf("%s: rendered without error:\n%s", name, out)
			continue
		}
		if errors.Is(err, ErrPlaceholder) != tc.placeholder {
			t.Errorf("%s: %v; ErrPlaceholder %v, want %v", name, err, !tc.placeholder, tc.placeholder)
		}
	}
}

func TestWithAuthzClusterErrors(t *testing.T) {
	rendered, err := Render(shipped(t), Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, Check: []string{"127.0.0.1:7"}, App: "127.0.0.1:4"})
	if err != nil {
		t.Fatal(err)
	}
	reformatted := strings.Replace(string(rendered), "- endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 3 } } }",
		"- endpoint:\n            address: { socket_address: { address: 127.0.0.1, port_value: 3 } }", 1)
	for name, tc := range map[string]struct {
		cfg         string
		cluster     string
		addrs       []string
		placeholder bool
	}{
		"bad name":             {string(rendered), "noop-authz", []string{"127.0.0.1:5"}, false},
		"shipped name":         {string(rendered), ShippedAuthzCluster, []string{"127.0.0.1:5"}, false},
		"the app's name":       {string(rendered), "app", []string{"127.0.0.1:5"}, false},
		"no address":           {string(rendered), "noop_authz", nil, false},
		"port zero":            {string(rendered), "noop_authz", []string{"127.0.0.1:0"}, false},
		"no cluster to copy":   {strings.Replace(string(rendered), "  - name: ratelimit_authz\n", "  - name: limiter\n", 1), "noop_authz", []string{"127.0.0.1:5"}, true},
		"endpoint reformatted": {reformatted, "noop_authz", []string{"127.0.0.1:5"}, true},
	} {
		out, err := WithAuthzCluster([]byte(tc.cfg), tc.cluster, tc.addrs...)
		if err == nil {
			t.Errorf("%s: rendered without error:\n%s", name, out)
			continue
		}
		if errors.Is(err, ErrPlaceholder) != tc.placeholder {
			t.Errorf("%s: %v; ErrPlaceholder %v, want %v", name, err, !tc.placeholder, tc.placeholder)
		}
	}
	twice, err := WithAuthzCluster(rendered, "noop_authz", "127.0.0.1:5")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WithAuthzCluster(twice, "noop_authz", "127.0.0.1:6"); err == nil {
		t.Error("the same cluster added twice")
	}
}

func TestBlock(t *testing.T) {
	s := "a:\n  - name: x\n    k: v\n\n    # note\n  # next\n  - name: y\n    k: w\n"
	start, end, err := block(s, "  - name: x")
	if err != nil || s[start:end] != "  - name: x\n    k: v\n\n    # note\n" {
		t.Errorf("block x = %q, %v", s[start:end], err)
	}
	start, end, err = block(s, "  - name: y")
	if err != nil || s[start:end] != "  - name: y\n    k: w\n" {
		t.Errorf("block y (to the end) = %q, %v", s[start:end], err)
	}
	if _, _, err := block(s, "  - name: z"); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("missing block: %v", err)
	}
	if _, _, err := block("\n  - name: x\n\n  - name: x\n", "  - name: x"); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("block twice: %v", err)
	}
}

// FuzzWithListeners: any bootstrap text is rendered or refused, never a
// panic, and a listener that renders is in the output under its name.
func FuzzWithListeners(f *testing.F) {
	f.Add("\n  - name: ingress\n    address: { socket_address: { address: 1.2.3.4, port_value: 1 } }\n          stat_prefix: ingress\n cluster_name: ratelimit_authz }\n"+extAuthzFilter+"\n", "ratelimit_authz")
	f.Add("\n  - name: ingress\n", "")
	f.Add("\n  clusters:\n  - name: ratelimit_authz\n      cluster_name: ratelimit_authz\n        - endpoint: { address: { socket_address: { x } } }", "x")
	f.Add(extAuthzFilter, "")
	f.Fuzz(func(t *testing.T, cfg, authz string) {
		if out, err := WithAuthzCluster([]byte(cfg), "extra", "127.0.0.1:7"); err == nil && !strings.Contains(string(out), `- name: "extra"`) {
			t.Fatalf("cluster added without its name:\n%s", out)
		}
		out, err := WithListeners([]byte(cfg), Listener{Name: "a", Addr: "127.0.0.1:5", Authz: authz})
		if err == nil && !strings.Contains(string(out), `- name: "a"`) {
			t.Fatalf("listener rendered without its name:\n%s", out)
		}
	})
}
