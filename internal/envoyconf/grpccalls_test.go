package envoyconf

import (
	"slices"
	"testing"
)

// TestGRPCCallsShipped: the shipped bootstrap sends Check to the lean
// Check listener's cluster and the failure access log to the gRPC port's,
// and the clusters' ports are the shipped ones.
func TestGRPCCallsShipped(t *testing.T) {
	calls, ports, err := GRPCCalls(shipped(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []GRPCCall{
		{Config: "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig", Cluster: ShippedAuthzCluster},
		{Config: extAuthzType, Cluster: ShippedCheckCluster},
	}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %+v, want %+v", calls, want)
	}
	for i, w := range []bool{false, true} {
		if i < len(calls) && calls[i].Check() != w {
			t.Errorf("%+v: Check() %v, want %v", calls[i], !w, w)
		}
	}
	if !slices.Equal(ports[ShippedCheckCluster], []int{9002}) || !slices.Equal(ports[ShippedAuthzCluster], []int{9001}) || !slices.Equal(ports["app"], []int{8080}) {
		t.Errorf("ports %v", ports)
	}
}

// TestGRPCCalls: calls are found wherever they are, typed by the
// innermost typed_config; a route's ext_authz override counts as Check;
// JSON (with ports as strings) reads as YAML does.
func TestGRPCCalls(t *testing.T) {
	calls, ports, err := GRPCCalls([]byte(`{
  "static_resources": {
    "listeners": [{"access_log": [{"typed_config": {"@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig",
        "common_config": {"grpc_service": {"envoy_grpc": {"cluster_name": "tcp_log"}}}}}],
      "filter_chains": [{"filters": [{"typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "route_config": {"virtual_hosts": [{"typed_per_filter_config": {"envoy.filters.http.ext_authz": {
          "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute",
          "check_settings": {}, "grpc_service": {"envoy_grpc": {"cluster_name": "route_authz"}}}}}]},
        "http_filters": [{"typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
          "rate_limit_service": {"grpc_service": {"envoy_grpc": {"cluster_name": "rls"}}}}}]}}]}]}],
    "clusters": [{"name": "rls", "load_assignment": {"endpoints": [{"lb_endpoints": [
      {"endpoint": {"address": {"socket_address": {"address": "a", "port_value": "9002"}}}},
      {"endpoint": {"address": {"socket_address": {"address": "b", "port_value": 9002}}}},
      {"endpoint": {"address": {"socket_address": {"address": "c", "port_value": 9003}}}}]}]}}]
  }
}`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]GRPCCall{}
	for _, c := range calls {
		got[c.Cluster] = c
	}
	for cluster, w := range map[string]struct {
		typ              string
		check, rateLimit bool
	}{
		"tcp_log":     {"envoy.extensions.access_loggers.grpc.v3.TcpGrpcAccessLogConfig", false, false},
		"route_authz": {extAuthzPerRouteType, true, false},
		"rls":         {"envoy.extensions.filters.http.ratelimit.v3.RateLimit", false, true},
	} {
		c, ok := got[cluster]
		if !ok || c.Config != w.typ || c.Check() != w.check || c.RateLimit() != w.rateLimit {
			t.Errorf("call to %s: %+v (found %v), want type %s, Check %v, RateLimit %v", cluster, c, ok, w.typ, w.check, w.rateLimit)
		}
		if c.Lean(false) != w.check || c.Lean(true) != (w.check || w.rateLimit) {
			t.Errorf("call to %s: served by the lean listener without RLS %v, with %v", cluster, c.Lean(false), c.Lean(true))
		}
	}
	if len(calls) != 3 {
		t.Errorf("%d calls, want 3: %+v", len(calls), calls)
	}
	if !slices.Equal(ports["rls"], []int{9002, 9003}) {
		t.Errorf("rls ports %v, want [9002 9003]", ports["rls"])
	}
	if _, _, err := GRPCCalls([]byte("{")); err == nil {
		t.Error("a broken bootstrap parsed")
	}
}

// FuzzGRPCCalls: any document is read without a panic, the same document
// gives the same calls, and every port reported is a TCP port.
func FuzzGRPCCalls(f *testing.F) {
	f.Add(string(shippedQuota(f)))
	f.Add(`{"a": {"@type": "x/y", "envoy_grpc": {"cluster_name": "c"}}, "static_resources": {"clusters": [{"name": "c", "load_assignment": {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"port_value": 70000}}}}]}]}}]}}`)
	f.Add(`[{"envoy_grpc": {"cluster_name": 7}}, "@type"]`)
	f.Fuzz(func(t *testing.T, doc string) {
		calls, ports, err := GRPCCalls([]byte(doc))
		if err != nil {
			return
		}
		again, _, _ := GRPCCalls([]byte(doc))
		if !slices.Equal(calls, again) {
			t.Fatalf("calls differ between two reads: %v, %v", calls, again)
		}
		for name, ps := range ports {
			for _, p := range ps {
				if p < 1 || p > 65535 {
					t.Fatalf("cluster %q: port %d", name, p)
				}
			}
		}
	})
}
