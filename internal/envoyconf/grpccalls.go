package envoyconf

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// GRPCCall is one gRPC service a bootstrap calls through one of its
// clusters (an envoy_grpc grpc_service): enough for check-config to say
// whether a call reaches a listener that does not serve it.
type GRPCCall struct {
	// Config is the type of the innermost typed_config holding the call,
	// without the type URL prefix: the ext_authz filter, a gRPC access
	// logger, the rate limit filter, … Empty: outside any typed_config.
	Config string
	// Cluster is the cluster the call goes to.
	Cluster string
}

// Check reports whether the call is the ext_authz filter's Check (or a
// route's override of it), which the lean Check listener serves.
func (c GRPCCall) Check() bool {
	return c.Config == extAuthzType || c.Config == extAuthzPerRouteType
}

// RateLimit reports whether the call is a rate limit filter's
// ShouldRateLimit (RLS v3: the HTTP, network or Thrift ratelimit filter),
// which the lean Check listener serves on a node serving RLS.
func (c GRPCCall) RateLimit() bool {
	return slices.Contains(rateLimitTypes, c.Config)
}

// Quota reports whether the call is the rate_limit_quota filter's RLQS
// stream.
func (c GRPCCall) Quota() bool { return c.Config == quotaFilterType }

// Lean reports whether the lean Check listener serves the call: Check
// always, ShouldRateLimit when the node serves RLS (rls); nothing else
// (the access log, RLQS) but health.
func (c GRPCCall) Lean(rls bool) bool { return c.Check() || (rls && c.RateLimit()) }

const (
	extAuthzPerRouteType = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
	quotaFilterType      = "envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
)

var rateLimitTypes = []string{
	"envoy.extensions.filters.http.ratelimit.v3.RateLimit",
	"envoy.extensions.filters.network.ratelimit.v3.RateLimit",
	"envoy.extensions.filters.network.thrift_proxy.filters.ratelimit.v3.RateLimit",
}

// GRPCCalls reads an Envoy bootstrap (YAML or JSON) and returns every
// envoy_grpc call it makes, wherever it is (listeners, filters, access
// logs, routes), and the ports of the endpoints of each static cluster
// (load_assignment; only what a TCP port can be), by cluster name. It
// reads only what it needs and does not validate the rest (envoy --mode
// validate does).
func GRPCCalls(bootstrap []byte) ([]GRPCCall, map[string][]int, error) {
	var doc any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, nil, fmt.Errorf("envoyconf: parse bootstrap: %w", err)
	}
	var calls []GRPCCall
	walkCalls(doc, "", &calls)
	ports := map[string][]int{}
	for _, c := range list(get(doc, "static_resources", "clusters")) {
		name, _ := get(c, "name").(string)
		for _, e := range list(get(c, "load_assignment", "endpoints")) {
			for _, lb := range list(get(e, "lb_endpoints")) {
				if p := integer(get(lb, "endpoint", "address", "socket_address", "port_value")); p > 0 && p <= 65535 && !slices.Contains(ports[name], p) {
					ports[name] = append(ports[name], p)
				}
			}
		}
	}
	return calls, ports, nil
}

// walkCalls appends the envoy_grpc calls in v to out; typ is the type of
// the innermost typed_config around v. Keys are visited in order, so the
// calls come in the same order for the same bootstrap.
func walkCalls(v any, typ string, out *[]GRPCCall) {
	switch x := v.(type) {
	case map[string]any:
		if t, ok := x["@type"].(string); ok {
			typ = t[strings.LastIndexByte(t, '/')+1:]
		}
		if name, ok := get(x, "envoy_grpc", "cluster_name").(string); ok {
			*out = append(*out, GRPCCall{Config: typ, Cluster: name})
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			walkCalls(x[k], typ, out)
		}
	case []any:
		for _, e := range x {
			walkCalls(e, typ, out)
		}
	}
}
