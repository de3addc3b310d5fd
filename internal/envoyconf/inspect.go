package envoyconf

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// ConnectionManager is what one HTTP connection manager of a bootstrap
// does to the request headers and addresses ratelimit-authz may trust:
// enough for check-config to say whether a client can set them.
type ConnectionManager struct {
	Listener          string
	UseRemoteAddress  bool
	XFFNumTrustedHops int
	// InternalCIDRs are internal_address_config.cidr_ranges: requests from
	// them are internal, and Envoy neither sets nor strips
	// x-envoy-external-address on them.
	InternalCIDRs []string
	// ExtAuthz: an ext_authz filter is in the chain.
	ExtAuthz bool
	// Cleared are the lowercase headers a header_mutation filter ahead of
	// ext_authz removes, or overwrites with OVERWRITE_IF_EXISTS_OR_ADD: a
	// client's copy never reaches the check.
	Cleared []string
	// LoggedResponseHeaders and LoggedResponseTrailers are the lowercase
	// additional_response_headers_to_log and
	// additional_response_trailers_to_log of its gRPC access logs: what a
	// cost charged after the response can be read from.
	LoggedResponseHeaders, LoggedResponseTrailers []string
	// GRPCAccessLog: the connection manager has a gRPC access log.
	GRPCAccessLog bool
	// LogsMeta are the ext_authz dynamic metadata keys ("failures",
	// "charges", "leases") whose entries one of its gRPC access logs
	// sends, so that the server charges or releases what they name: the
	// log has no filter, or its filter is, or is an or_filter with, a
	// metadata_filter matching that key present; for "failures" also an
	// and_filter of such a metadata_filter with status_code_filters (a
	// failure is a response status).
	LogsMeta []string
	// Routes are the routes of its static route_config, in order (none
	// with RDS).
	Routes []Route
}

// Logs reports whether a gRPC access log of the connection manager sends
// the entries that carry the ext_authz metadata key.
func (c ConnectionManager) Logs(key string) bool { return slices.Contains(c.LogsMeta, key) }

// metaKeys are the ext_authz metadata keys the server reads from the
// access log.
var metaKeys = [...]string{"failures", "charges", "leases"}

// Clears reports whether the connection manager removes or overwrites
// header before ext_authz.
func (c ConnectionManager) Clears(header string) bool {
	return slices.Contains(c.Cleared, strings.ToLower(header))
}

const (
	hcmName           = "envoy.filters.network.http_connection_manager"
	hcmType           = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	grpcLogType       = "envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"
	extAuthzType      = "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
	headerMutationTyp = "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
	// extAuthzName is the dynamic metadata namespace of ext_authz, whatever
	// the filter is called.
	extAuthzName = "envoy.filters.http.ext_authz"
)

// Inspect reads the static listeners of an Envoy bootstrap (YAML or JSON)
// and returns each HTTP connection manager. It reads only what it needs
// and does not validate the rest (envoy --mode validate does).
func Inspect(bootstrap []byte) ([]ConnectionManager, error) {
	var doc any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, fmt.Errorf("envoyconf: parse bootstrap: %w", err)
	}
	var out []ConnectionManager
	for _, l := range list(get(doc, "static_resources", "listeners")) {
		name, _ := get(l, "name").(string)
		for _, fc := range list(get(l, "filter_chains")) {
			for _, f := range list(get(fc, "filters")) {
				tc := get(f, "typed_config")
				if n, _ := get(f, "name").(string); n != hcmName && !isType(tc, hcmType) {
					continue
				}
				out = append(out, connectionManager(name, tc))
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("envoyconf: the bootstrap has no static listener with an HTTP connection manager")
	}
	return out, nil
}

func connectionManager(listener string, tc any) ConnectionManager {
	c := ConnectionManager{Listener: listener}
	c.UseRemoteAddress, _ = get(tc, "use_remote_address").(bool)
	c.XFFNumTrustedHops = integer(get(tc, "xff_num_trusted_hops"))
	for _, r := range list(get(tc, "internal_address_config", "cidr_ranges")) {
		prefix, _ := get(r, "address_prefix").(string)
		c.InternalCIDRs = append(c.InternalCIDRs, fmt.Sprintf("%s/%d", prefix, integer(get(r, "prefix_len"))))
	}
	for _, al := range list(get(tc, "access_log")) {
		atc := get(al, "typed_config")
		if !isType(atc, grpcLogType) {
			continue
		}
		c.GRPCAccessLog = true
		for _, k := range metaKeys {
			if !c.Logs(k) && passes(get(al, "filter"), k) {
				c.LogsMeta = append(c.LogsMeta, k)
			}
		}
		for _, h := range list(get(atc, "additional_response_headers_to_log")) {
			if s, ok := h.(string); ok {
				c.LoggedResponseHeaders = append(c.LoggedResponseHeaders, strings.ToLower(s))
			}
		}
		for _, h := range list(get(atc, "additional_response_trailers_to_log")) {
			if s, ok := h.(string); ok {
				c.LoggedResponseTrailers = append(c.LoggedResponseTrailers, strings.ToLower(s))
			}
		}
	}
	filter, off := "", false
	for _, f := range list(get(tc, "http_filters")) {
		ftc := get(f, "typed_config")
		name, _ := get(f, "name").(string)
		if isType(ftc, extAuthzType) || name == "envoy.filters.http.ext_authz" {
			c.ExtAuthz = true
			filter, off = name, get(f, "disabled") == true
			break // only filters ahead of ext_authz protect the check
		}
		if !isType(ftc, headerMutationTyp) {
			continue
		}
		for _, m := range list(get(ftc, "mutations", "request_mutations")) {
			if h, ok := get(m, "remove").(string); ok {
				c.Cleared = append(c.Cleared, strings.ToLower(h))
			}
			if a := get(m, "append"); a != nil {
				h, _ := get(a, "header", "key").(string)
				if act, _ := get(a, "append_action").(string); h != "" && act == "OVERWRITE_IF_EXISTS_OR_ADD" {
					c.Cleared = append(c.Cleared, strings.ToLower(h))
				}
			}
		}
	}
	c.Routes = routes(tc, filter, off)
	return c
}

// passes reports whether an access-log filter passes every entry that
// carries the ext_authz metadata key: no filter, a metadata_filter
// requiring it present, or an or_filter with one; for "failures", also an
// and_filter of one with status_code_filters. Any other filter may drop
// such entries.
func passes(f any, key string) bool {
	if f == nil {
		return true
	}
	if mf := get(f, "metadata_filter"); mf != nil {
		m := get(mf, "matcher")
		path := list(get(m, "path"))
		ns, _ := get(m, "filter").(string)
		present, _ := get(m, "value", "present_match").(bool)
		k := ""
		if len(path) == 1 {
			k, _ = get(path[0], "key").(string)
		}
		return ns == extAuthzName && k == key && present
	}
	for _, sub := range list(get(f, "or_filter", "filters")) {
		if passes(sub, key) {
			return true
		}
	}
	if subs := list(get(f, "and_filter", "filters")); key == "failures" && len(subs) > 0 {
		meta := false
		for _, sub := range subs {
			switch {
			case get(sub, "status_code_filter") != nil:
			case passes(sub, key):
				meta = true
			default:
				return false
			}
		}
		return meta
	}
	return false
}

// get walks maps by key; nil when a step is missing.
func get(v any, path ...string) any {
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

func integer(v any) int {
	switch x := v.(type) {
	case int:
		return x
	case string: // protobuf JSON writes some integers as strings
		n, _ := strconv.Atoi(x)
		return n
	}
	return 0
}

func isType(tc any, typ string) bool {
	t, _ := get(tc, "@type").(string)
	return strings.HasSuffix(t, "/"+typ)
}
