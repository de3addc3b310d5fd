package envoyconf

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratelimit-authz/ratelimit-authz/internal/binaries"
)

// shipped is envoy/ratelimit-authz.yaml from the repository.
func shipped(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", Path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// bootstrap is the part of an Envoy bootstrap the tests look at.
type bootstrap struct {
	Admin           struct{ Address address }
	StaticResources struct {
		Listeners []struct {
			Name    string
			Address address
		}
		Clusters []struct {
			Name           string
			LoadAssignment struct {
				Endpoints []struct {
					LbEndpoints []struct {
						Endpoint struct{ Address address }
					} `yaml:"lb_endpoints"`
				}
			} `yaml:"load_assignment"`
		}
	} `yaml:"static_resources"`
}

type address struct {
	SocketAddress struct {
		Address   string
		PortValue int `yaml:"port_value"`
	} `yaml:"socket_address"`
}

func (a address) String() string {
	return net.JoinHostPort(a.SocketAddress.Address, strconv.Itoa(a.SocketAddress.PortValue))
}

func parse(t *testing.T, b []byte) *bootstrap {
	t.Helper()
	var bs bootstrap
	if err := yaml.Unmarshal(b, &bs); err != nil {
		t.Fatalf("rendered bootstrap is not YAML: %v\n%s", err, b)
	}
	return &bs
}

// endpoints returns the addresses of a cluster's endpoints.
func (bs *bootstrap) endpoints(cluster string) []string {
	var out []string
	for _, c := range bs.StaticResources.Clusters {
		if c.Name != cluster {
			continue
		}
		for _, e := range c.LoadAssignment.Endpoints {
			for _, lb := range e.LbEndpoints {
				out = append(out, lb.Endpoint.Address.String())
			}
		}
	}
	return out
}

func TestShippedAddresses(t *testing.T) {
	bs := parse(t, shipped(t))
	if got := bs.Admin.Address.String(); got != ShippedAdmin {
		t.Errorf("admin %s, want %s", got, ShippedAdmin)
	}
	if len(bs.StaticResources.Listeners) != 1 || bs.StaticResources.Listeners[0].Address.String() != ShippedListener {
		t.Errorf("listeners %+v, want one on %s", bs.StaticResources.Listeners, ShippedListener)
	}
	if got := bs.endpoints("ratelimit_authz"); len(got) != 1 || got[0] != ShippedAuthz {
		t.Errorf("ratelimit_authz endpoints %v, want [%s]", got, ShippedAuthz)
	}
	if got := bs.endpoints("ratelimit_authz_check"); len(got) != 1 || got[0] != ShippedCheck {
		t.Errorf("ratelimit_authz_check endpoints %v, want [%s]", got, ShippedCheck)
	}
	if got := bs.endpoints("app"); len(got) != 1 || got[0] != ShippedApp {
		t.Errorf("app endpoints %v, want [%s]", got, ShippedApp)
	}
}

func TestRender(t *testing.T) {
	for _, tc := range []struct{ authz, check []string }{
		{[]string{"127.0.0.1:40001"}, nil},
		{[]string{"127.0.0.1:40001", "127.0.0.2:40002", "127.0.0.3:40003"}, nil},
		{[]string{"127.0.0.1:40001"}, []string{"127.0.0.1:40101"}},
		{[]string{"127.0.0.1:40001", "127.0.0.2:40002"}, []string{"127.0.0.1:40101", "127.0.0.2:40102"}},
		// Addresses that are shipped ones elsewhere: each is replaced once.
		{[]string{ShippedCheck}, []string{ShippedAuthz}},
	} {
		authz := tc.authz
		a := Addrs{Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", Authz: authz, Check: tc.check, App: "127.0.0.1:43000"}
		out, err := Render(shipped(t), a)
		if err != nil {
			t.Fatalf("%v %v: %v", authz, tc.check, err)
		}
		// Without Check addresses, the checks go to the gRPC ports.
		check := tc.check
		if len(check) == 0 {
			check = authz
		}
		bs := parse(t, out)
		if got := bs.Admin.Address.String(); got != a.Admin {
			t.Errorf("admin %s, want %s", got, a.Admin)
		}
		if got := bs.StaticResources.Listeners[0].Address.String(); got != a.Listener {
			t.Errorf("listener %s, want %s", got, a.Listener)
		}
		if got := bs.endpoints("ratelimit_authz"); strings.Join(got, " ") != strings.Join(authz, " ") {
			t.Errorf("ratelimit_authz endpoints %v, want %v", got, authz)
		}
		if got := bs.endpoints("ratelimit_authz_check"); strings.Join(got, " ") != strings.Join(check, " ") {
			t.Errorf("ratelimit_authz_check endpoints %v, want %v", got, check)
		}
		if got := bs.endpoints("app"); len(got) != 1 || got[0] != a.App {
			t.Errorf("app endpoints %v, want [%s]", got, a.App)
		}
		if authz[0] != ShippedCheck {
			for _, port := range []string{"9901", "10000", "9001", "9002", "8080"} {
				if strings.Contains(string(out), "port_value: "+port+" ") {
					t.Errorf("shipped port %s left in the rendering", port)
				}
			}
		}
		// Only the addresses changed: same lines otherwise.
		if d := strings.Count(string(out), "\n") - strings.Count(string(shipped(t)), "\n"); d != len(authz)-1+len(check)-1 {
			t.Errorf("rendering has %d more lines, want %d", d, len(authz)-1+len(check)-1)
		}
	}
}

func TestRenderIPv6(t *testing.T) {
	a := Addrs{Admin: "[::1]:41000", Listener: "[::1]:42000", Authz: []string{"[::1]:40001", "127.0.0.1:40002"}, App: "[::1]:43000"}
	out, err := Render(shipped(t), a)
	if err != nil {
		t.Fatal(err)
	}
	bs := parse(t, out)
	if got := bs.endpoints("ratelimit_authz"); strings.Join(got, " ") != "[::1]:40001 127.0.0.1:40002" {
		t.Errorf("ratelimit_authz endpoints %v", got)
	}
}

func TestRenderErrors(t *testing.T) {
	good := Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"}
	src := string(shipped(t))
	const authzLine = "- endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 9001 } } }"
	const checkLine = "- endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 9002 } } }"
	for _, l := range []string{authzLine, checkLine} {
		if !strings.Contains(src, l) {
			t.Fatalf("shipped bootstrap lacks %q", l)
		}
	}
	withCheck := good
	withCheck.Check = []string{"127.0.0.1:5"}
	for name, tc := range map[string]struct {
		src         string
		addrs       Addrs
		placeholder bool // want ErrPlaceholder
	}{
		"listener address changed": {strings.Replace(src, "port_value: 10000", "port_value: 10001", 1), good, true},
		"admin address twice":      {src + "# address: 127.0.0.1, port_value: 9901 }\n", good, true},
		"app address missing":      {strings.Replace(src, "port_value: 8080 }", "port_value: 8081 }", 1), good, true},
		"authz address missing":    {strings.Replace(src, "port_value: 9001 }", "port_value: 9002 }", 1), good, true},
		"authz address twice":      {src + "#" + authzLine + "\n", good, true},
		"authz endpoint reformatted, several endpoints": {
			strings.Replace(src, authzLine, "- endpoint:\n            address: { socket_address: { address: 127.0.0.1, port_value: 9001 } }", 1),
			Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3", "127.0.0.1:5"}, App: "127.0.0.1:4"},
			true,
		},
		"check address missing": {strings.Replace(src, "port_value: 9002 }", "port_value: 9003 }", 1), withCheck, true},
		"check address twice":   {src + "#" + checkLine + "\n", good, true},
		"check endpoint reformatted, several endpoints": {
			strings.Replace(src, checkLine, "- endpoint:\n            address: { socket_address: { address: 127.0.0.1, port_value: 9002 } }", 1),
			Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, Check: []string{"127.0.0.1:5", "127.0.0.1:6"}, App: "127.0.0.1:4"},
			true,
		},
		"check port zero": {src, Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, Check: []string{"127.0.0.1:0"}, App: "127.0.0.1:4"}, false},
		"no authz":        {src, Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", App: "127.0.0.1:4"}, false},
		"host name":       {src, Addrs{Admin: "localhost:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"}, false},
		"no port":         {src, Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"}, false},
		"port zero":       {src, Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:0"}, App: "127.0.0.1:4"}, false},
		"port too large":  {src, Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:65536"}, false},
	} {
		out, err := Render([]byte(tc.src), tc.addrs)
		if err == nil {
			t.Errorf("%s: rendered without error:\n%s", name, out)
			continue
		}
		if errors.Is(err, ErrPlaceholder) != tc.placeholder {
			t.Errorf("%s: %v; ErrPlaceholder %v, want %v", name, err, !tc.placeholder, tc.placeholder)
		}
	}

	// A reformatted authz endpoint is still fine for one node.
	src1 := strings.Replace(src, authzLine, "- endpoint:\n            address: { socket_address: { address: 127.0.0.1, port_value: 9001 } }", 1)
	if _, err := Render([]byte(src1), good); err != nil {
		t.Errorf("one endpoint, reformatted: %v", err)
	}
}

func TestRenderFile(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	a := Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"}
	if err := RenderFile(filepath.Join("..", "..", Path), dst, a); err != nil {
		t.Fatal(err)
	}
	if err := RenderFile(filepath.Join(t.TempDir(), "missing.yaml"), dst, a); err == nil {
		t.Error("RenderFile of a missing file succeeded")
	}
}

// TestRenderedValidates runs `envoy --mode validate` on a rendering with
// three nodes. It needs the Envoy that `make tools` installs (or
// $E2E_ENVOY_BIN): skipped without it, failed under CI=true.
func TestRenderedValidates(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	a := Addrs{
		Admin: "127.0.0.1:41000", Listener: "127.0.0.1:42000", App: "127.0.0.1:43000",
		Authz: []string{"127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"},
	}
	if err := RenderFile(filepath.Join("..", "..", Path), dst, a); err != nil {
		t.Fatal(err)
	}
	validate(t, envoy, dst)
}

// TestShippedConfigsValidate: every bootstrap in envoy/, as shipped, loads
// in the pinned Envoy.
func TestShippedConfigsValidate(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	files, err := filepath.Glob(filepath.Join("..", "..", "envoy", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs in envoy/: %v", err)
	}
	for _, f := range files {
		validate(t, envoy, f)
	}
}

func validate(t *testing.T, envoy, config string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Validate(ctx, envoy, config); err != nil {
		t.Fatal(err)
	}
}

// Validate reports what Envoy says of a bootstrap it refuses.
func TestValidateRefuses(t *testing.T) {
	envoy := binaries.InstalledEnvoy(t)
	bad := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(bad, []byte("static_resources: {listeners: [{name: on}]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Validate(ctx, envoy, bad); err == nil || !strings.Contains(err.Error(), "listeners") {
		t.Errorf("Validate of a bad bootstrap: %v, want Envoy's complaint", err)
	}
}

func TestWithTrustedHops(t *testing.T) {
	out, err := WithTrustedHops(shipped(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), ShippedTrustedHops) || !strings.Contains(string(out), "xff_num_trusted_hops: 1") {
		t.Errorf("xff_num_trusted_hops not replaced")
	}
	if _, err := WithTrustedHops(out, 2); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("second replacement: %v, want ErrPlaceholder", err)
	}
	if _, err := WithTrustedHops(shipped(t), -1); err == nil {
		t.Error("negative hops accepted")
	}
}

func TestInspectShipped(t *testing.T) {
	cms, err := Inspect(shipped(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(cms) != 1 {
		t.Fatalf("%d connection managers, want 1", len(cms))
	}
	c := cms[0]
	if c.Listener != "ingress" || !c.UseRemoteAddress || c.XFFNumTrustedHops != 0 || len(c.InternalCIDRs) != 0 || !c.ExtAuthz {
		t.Errorf("shipped: %+v", c)
	}
	if c.Clears("x-tenant-id") {
		t.Error("the shipped bootstrap does not strip x-tenant-id")
	}
	for _, k := range []string{"failures", "charges", "leases"} {
		if !c.GRPCAccessLog || !c.Logs(k) {
			t.Errorf("the shipped bootstrap's access log does not send the entries carrying %q", k)
		}
	}
}

// Logs: only a filter that passes every entry carrying a key of the
// ext_authz metadata sends it; failures may also be narrowed by status.
func TestInspectLogsMeta(t *testing.T) {
	meta := func(ns, key string) string {
		return `{metadata_filter: {matcher: {filter: ` + ns + `, path: [{key: ` + key + `}], value: {present_match: true}}}}`
	}
	leases, failures := meta("envoy.filters.http.ext_authz", "leases"), meta("envoy.filters.http.ext_authz", "failures")
	for _, tc := range []struct {
		filter string
		want   []string
	}{
		{"", []string{"failures", "charges", "leases"}},
		{"filter: " + leases, []string{"leases"}},
		{"filter: {or_filter: {filters: [{status_code_filter: {}}, " + leases + "]}}", []string{"leases"}},
		{"filter: {and_filter: {filters: [{status_code_filter: {}}, " + leases + "]}}", nil},
		{"filter: {and_filter: {filters: [{status_code_filter: {}}, " + failures + "]}}", []string{"failures"}},
		{"filter: {and_filter: {filters: [{duration_filter: {}}, " + failures + "]}}", nil},
		{"filter: {status_code_filter: {}}", nil},
		{"filter: " + meta("envoy.filters.http.ext_authz", "charges"), []string{"charges"}},
		{"filter: " + meta("ext_authz", "charges"), nil}, // the namespace is fixed, whatever the filter's name
		{"filter: " + meta("other", "leases"), nil},
	} {
		doc := `static_resources: {listeners: [{name: l, filter_chains: [{filters: [{name: envoy.filters.network.http_connection_manager, typed_config: {access_log: [{name: als, ` +
			tc.filter + map[bool]string{true: ", ", false: ""}[tc.filter != ""] +
			`typed_config: {"@type": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig}}]}}]}]}]}`
		cms, err := Inspect([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", tc.filter, err)
		}
		if !cms[0].GRPCAccessLog || !slices.Equal(cms[0].LogsMeta, tc.want) {
			t.Errorf("%q: logs %v, want %v", tc.filter, cms[0].LogsMeta, tc.want)
		}
	}
}

func TestInspect(t *testing.T) {
	const hcm = `
static_resources:
  listeners:
  - name: edge
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          use_remote_address: true
          xff_num_trusted_hops: 2
          internal_address_config:
            cidr_ranges: [{address_prefix: 10.0.0.0, prefix_len: 8}]
          http_filters:
          - name: strip
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations:
                - remove: X-Tenant-Id
                - append: {header: {key: x-org, value: "%REQ(x-org-claim)%"}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}
                - append: {header: {key: x-added, value: v}, append_action: APPEND_IF_EXISTS_OR_ADD}
          - name: envoy.filters.http.ext_authz
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz
          - name: too-late
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
              mutations:
                request_mutations: [{remove: x-late}]
`
	cms, err := Inspect([]byte(hcm))
	if err != nil {
		t.Fatal(err)
	}
	c := cms[0]
	if c.Listener != "edge" || c.XFFNumTrustedHops != 2 || strings.Join(c.InternalCIDRs, ",") != "10.0.0.0/8" || !c.ExtAuthz {
		t.Errorf("inspected: %+v", c)
	}
	for h, want := range map[string]bool{"x-tenant-id": true, "x-org": true, "x-added": false, "x-late": false} {
		if c.Clears(h) != want {
			t.Errorf("Clears(%q) = %v, want %v", h, !want, want)
		}
	}
	for _, bad := range []string{"[", "static_resources: {}", "admin: {}"} {
		if _, err := Inspect([]byte(bad)); err == nil {
			t.Errorf("Inspect(%q) succeeded", bad)
		}
	}
}

// FuzzInspect: any document is read or refused, never a panic.
func FuzzInspect(f *testing.F) {
	f.Add(`static_resources: {listeners: [{filter_chains: [{filters: [{name: envoy.filters.network.http_connection_manager, typed_config: {xff_num_trusted_hops: "3", http_filters: [1, {typed_config: {mutations: {request_mutations: [{append: 7}]}}}]}}]}]}]}`)
	f.Add(`{"static_resources":{"listeners":"x"}}`)
	f.Add("- a\n- b")
	f.Add(`static_resources: {listeners: [{filter_chains: [{filters: [{name: envoy.filters.network.http_connection_manager, typed_config: {route_config: {virtual_hosts: [{domains: ["*"], routes: [{match: {safe_regex: {regex: "(a"}}}, {match: {path_match_policy: {typed_config: {path_template: "/{x=**}/{"}}}}, {match: {prefix: 7, case_sensitive: "no"}, typed_per_filter_config: {a: 1}}]}]}, http_filters: [{name: a, typed_config: {}}]}}]}]}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		cms, _ := Inspect([]byte(doc))
		for _, c := range cms {
			c.RoutesFor("/a/b")
			c.RoutesFor("")
		}
	})
}

// The strip check-config looks for loads in the pinned Envoy, and
// Inspect sees it.
func TestWithHeaderStripValidates(t *testing.T) {
	out, err := WithHeaderStrip(shipped(t), "x-tenant-id", "x-api-key")
	if err != nil {
		t.Fatal(err)
	}
	cms, err := Inspect(out)
	if err != nil {
		t.Fatal(err)
	}
	if !cms[0].Clears("x-tenant-id") || !cms[0].Clears("x-api-key") || !cms[0].ExtAuthz {
		t.Errorf("inspected: %+v", cms[0])
	}
	if _, err := WithHeaderStrip(shipped(t), "bad name"); err == nil {
		t.Error("a bad header name accepted")
	}
	dst := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		t.Fatal(err)
	}
	validate(t, binaries.InstalledEnvoy(t), dst)
}

// TestRenderCheckNeedsTheCluster: the RLS bootstrap calls the lean
// listener only, so its rate limit cluster takes the Check addresses, or
// the gRPC ports for nodes without a lean listener; a bootstrap calling
// the gRPC port only refuses Check addresses rather than dropping them,
// and one calling neither is refused.
func TestRenderCheckNeedsTheCluster(t *testing.T) {
	a := Addrs{Admin: "127.0.0.1:1", Listener: "127.0.0.1:2", Authz: []string{"127.0.0.1:3"}, App: "127.0.0.1:4"}
	endpoint := func(port string) string {
		return "- endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: " + port + " } } }"
	}
	out, err := Render(shippedRLS(t), a)
	if err != nil || !strings.Contains(string(out), endpoint("3")) {
		t.Fatalf("RLS bootstrap with gRPC ports only: %v\n%s", err, out)
	}
	a.Check = []string{"127.0.0.1:5", "127.0.0.1:6"}
	out, err = Render(shippedRLS(t), a)
	if err != nil || !strings.Contains(string(out), endpoint("5")) || !strings.Contains(string(out), endpoint("6")) || strings.Contains(string(out), endpoint("3")) {
		t.Fatalf("RLS bootstrap with Check addresses: %v\n%s", err, out)
	}
	grpcOnly := strings.Replace(string(shippedRLS(t)), "port_value: 9002 }", "port_value: 9001 }", 1)
	if out, err := Render([]byte(grpcOnly), a); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("a bootstrap calling the gRPC port only, with Check addresses: %v, want ErrPlaceholder\n%s", err, out)
	}
	neither := strings.Replace(string(shippedRLS(t)), "port_value: 9002 }", "port_value: 9003 }", 1)
	if out, err := Render([]byte(neither), a); !errors.Is(err, ErrPlaceholder) {
		t.Errorf("a bootstrap calling neither: %v, want ErrPlaceholder\n%s", err, out)
	}
}
