// Package envoyconf renders the shipped Envoy bootstrap,
// envoy/ratelimit-authz.yaml (and envoy/ratelimit-rls.yaml, RLSPath), with
// the addresses of one run: the end-to-end tests, the demo and the
// benchmarks run exactly the file users copy, with only its five addresses
// changed (and the two ratelimit-authz clusters given one endpoint per
// node). It is the only place that writes a bootstrap. The With options
// edit a rendering for what one run needs and nothing else.
//
// Invariant and failure mode: the rendering is textual, and each shipped
// address and each line an option edits must occur exactly once, so a
// bootstrap whose addresses are edited, added or reformatted makes Render or
// the option fail loudly (ErrPlaceholder) instead of leaving a fixed port or
// an unedited listener behind. Names it writes are quoted: Envoy's YAML
// reads a plain on or off as a boolean.
//
// The clusters, the options and the reasoning are in
// docs/design/envoy-bootstrap.md.
package envoyconf

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// Path is the shipped bootstrap, relative to the repository root.
const Path = "envoy/ratelimit-authz.yaml"

// The addresses in the shipped bootstrap that Render replaces.
const (
	ShippedAdmin    = "127.0.0.1:9901"  // admin interface
	ShippedListener = "127.0.0.1:10000" // listener "ingress"
	ShippedAuthz    = "127.0.0.1:9001"  // the endpoint of cluster ratelimit_authz (the gRPC port)
	ShippedCheck    = "127.0.0.1:9002"  // the endpoint of cluster ratelimit_authz_check (the lean Check listener)
	ShippedApp      = "127.0.0.1:8080"  // the endpoint of cluster app
)

// ErrPlaceholder means a shipped address does not occur exactly once, in
// the form Render looks for, in the bootstrap.
var ErrPlaceholder = errors.New("envoyconf: shipped address not found exactly once")

// Addrs are the addresses of one run, each host:port with an IP literal
// host (the bootstrap's clusters are STATIC).
type Addrs struct {
	Admin    string   // Envoy's admin interface
	Listener string   // where clients connect
	Authz    []string // the ratelimit-authz nodes' gRPC ports, at least one: the endpoints of cluster ratelimit_authz
	// Check are the nodes' lean Check listeners (serve --check-addr): the
	// endpoints of cluster ratelimit_authz_check, which the ext_authz
	// filter calls. Empty: the Authz addresses, for nodes that serve Check
	// on their gRPC port only. Only a bootstrap with that cluster takes
	// them.
	Check []string
	App   string // the application behind Envoy
}

// Render returns the bootstrap src with the shipped addresses replaced by
// a's. With several Authz (or Check) addresses, the cluster's single
// lb_endpoints entry is repeated once per address, so Envoy balances over
// the nodes. The bootstrap holds the gRPC port's endpoint (ShippedAuthz),
// the lean listener's (ShippedCheck), or both: RLSPath calls only the
// lean listener. Every shipped address is found in src before any is
// replaced, so an address of a that equals a shipped one is no confusion.
func Render(src []byte, a Addrs) ([]byte, error) {
	if len(a.Authz) == 0 {
		return nil, errors.New("envoyconf: no ratelimit-authz address")
	}
	cfg := string(src)
	var edits []edit
	for _, r := range []struct{ shipped, addr string }{
		{ShippedAdmin, a.Admin}, {ShippedListener, a.Listener}, {ShippedApp, a.App},
	} {
		old, err := socketAddress(r.shipped)
		if err != nil {
			return nil, err
		}
		repl, err := socketAddress(r.addr)
		if err != nil {
			return nil, err
		}
		if n := strings.Count(cfg, old); n != 1 {
			return nil, fmt.Errorf("%w: %q occurs %d times", ErrPlaceholder, old, n)
		}
		i := strings.Index(cfg, old)
		edits = append(edits, edit{i, i + len(old), repl})
	}
	authz, err := socketAddress(ShippedAuthz)
	if err != nil {
		return nil, err
	}
	check, err := socketAddress(ShippedCheck)
	if err != nil {
		return nil, err
	}
	hasAuthz, hasCheck := strings.Contains(cfg, authz), strings.Contains(cfg, check)
	if !hasAuthz && !hasCheck {
		return nil, fmt.Errorf("%w: neither %s endpoint %q nor %s endpoint %q", ErrPlaceholder, ShippedAuthzCluster, authz, ShippedCheckCluster, check)
	}
	if hasAuthz {
		e, err := endpointEdit(cfg, ShippedAuthzCluster, ShippedAuthz, a.Authz)
		if err != nil {
			return nil, err
		}
		edits = append(edits, e)
	}
	switch {
	case hasCheck:
		addrs := a.Check
		if len(addrs) == 0 {
			addrs = a.Authz
		}
		e, err := endpointEdit(cfg, ShippedCheckCluster, ShippedCheck, addrs)
		if err != nil {
			return nil, err
		}
		edits = append(edits, e)
	case len(a.Check) > 0:
		return nil, fmt.Errorf("%w: Check addresses given, but the bootstrap has no %s endpoint %q", ErrPlaceholder, ShippedCheckCluster, check)
	}
	return []byte(apply(cfg, edits)), nil
}

// edit replaces cfg[start:end] by repl.
type edit struct {
	start, end int
	repl       string
}

// apply makes the edits, which do not overlap, to cfg.
func apply(cfg string, edits []edit) string {
	slices.SortFunc(edits, func(a, b edit) int { return a.start - b.start })
	var b strings.Builder
	at := 0
	for _, e := range edits {
		b.WriteString(cfg[at:e.start])
		b.WriteString(e.repl)
		at = e.end
	}
	b.WriteString(cfg[at:])
	return b.String()
}

// endpointEdit replaces the line holding the endpoint shipped of cluster
// with one such line per address.
func endpointEdit(cfg, cluster, shipped string, addrs []string) (edit, error) {
	old, err := socketAddress(shipped)
	if err != nil {
		return edit{}, err
	}
	if n := strings.Count(cfg, old); n != 1 {
		return edit{}, fmt.Errorf("%w: %q occurs %d times", ErrPlaceholder, old, n)
	}
	i := strings.Index(cfg, old)
	start := strings.LastIndexByte(cfg[:i], '\n') + 1
	end := len(cfg)
	if j := strings.IndexByte(cfg[i:], '\n'); j >= 0 {
		end = i + j + 1
	}
	line := cfg[start:end]
	if len(addrs) > 1 && !strings.HasPrefix(strings.TrimSpace(line), "- endpoint:") {
		// Repeating the line is only right for one lb_endpoints entry
		// written on one line.
		return edit{}, fmt.Errorf("%w: the %s endpoint is no longer a one-line \"- endpoint:\" entry, cannot add endpoints: %q",
			ErrPlaceholder, cluster, strings.TrimSpace(line))
	}
	var b strings.Builder
	for _, addr := range addrs {
		repl, err := socketAddress(addr)
		if err != nil {
			return edit{}, err
		}
		b.WriteString(strings.Replace(line, old, repl, 1))
	}
	return edit{start, end, b.String()}, nil
}

// socketAddress is addr as the bootstrap writes it, up to the brace that
// closes socket_address: "address: 127.0.0.1, port_value: 9001 }".
func socketAddress(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("envoyconf: address %q: %w", addr, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return "", fmt.Errorf("envoyconf: address %q: want an IP literal host (the clusters are STATIC)", addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", fmt.Errorf("envoyconf: address %q: want a port in 1…65535", addr)
	}
	h := ip.String()
	if ip.Is6() {
		h = `"` + h + `"` // a plain scalar may not hold ':' in a flow mapping
	}
	return "address: " + h + ", port_value: " + strconv.FormatUint(p, 10) + " }", nil
}

// RenderFile renders the bootstrap at src into dst (mode 0644).
func RenderFile(src, dst string, a Addrs) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("envoyconf: %w", err)
	}
	out, err := Render(b, a)
	if err != nil {
		return fmt.Errorf("%w (in %s)", err, src)
	}
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		return fmt.Errorf("envoyconf: %w", err)
	}
	return nil
}

// Validate runs the Envoy binary envoy in validate mode on the bootstrap
// at path: what Envoy itself makes of a rendering, beyond what rendering
// checks. Its error carries Envoy's output.
func Validate(ctx context.Context, envoy, path string) error {
	out, err := exec.CommandContext(ctx, envoy, "--mode", "validate", "-c", path, "--log-level", "error").CombinedOutput()
	if err != nil {
		return fmt.Errorf("envoyconf: envoy --mode validate -c %s: %w\n%s", path, err, out)
	}
	return nil
}

// ShippedTrustedHops is the HTTP connection manager's setting in the
// shipped bootstrap that WithTrustedHops replaces.
const ShippedTrustedHops = "xff_num_trusted_hops: 0"

// WithTrustedHops returns the bootstrap cfg with the HTTP connection
// manager trusting n proxies in front of Envoy (xff_num_trusted_hops),
// for tests that present many clients as x-forwarded-for entries of one
// trusted proxy, IPv6 ones included. The server's keys.trusted_hops must
// be n too. Never for an edge listener: with n > 0 there, clients choose
// their address.
func WithTrustedHops(cfg []byte, n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("envoyconf: trusted hops %d is negative", n)
	}
	s := string(cfg)
	if c := strings.Count(s, ShippedTrustedHops); c != 1 {
		return nil, fmt.Errorf("%w: %q occurs %d times", ErrPlaceholder, ShippedTrustedHops, c)
	}
	return []byte(strings.Replace(s, ShippedTrustedHops, "xff_num_trusted_hops: "+strconv.Itoa(n), 1)), nil
}

// shippedFilters opens the HTTP filter chain of the shipped bootstrap.
const shippedFilters = "\n          http_filters:\n"

// WithHeaderStrip returns the bootstrap cfg with a header_mutation filter
// ahead of ext_authz that removes each of headers from every request: what
// makes a header the server keys by trustworthy (a layer after it, such as
// jwt_authn, then sets the real value).
func WithHeaderStrip(cfg []byte, headers ...string) ([]byte, error) {
	s := string(cfg)
	if c := strings.Count(s, shippedFilters); c != 1 {
		return nil, fmt.Errorf("%w: %q occurs %d times", ErrPlaceholder, strings.TrimSpace(shippedFilters), c)
	}
	var b strings.Builder
	b.WriteString(shippedFilters)
	b.WriteString("          - name: envoy.filters.http.header_mutation\n")
	b.WriteString("            typed_config:\n")
	b.WriteString("              \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation\n")
	b.WriteString("              mutations:\n")
	b.WriteString("                request_mutations:\n")
	for _, h := range headers {
		if p := strings.TrimSpace(h); p == "" || strings.ContainsAny(p, " \t\r\n:{}[],#\"'") {
			return nil, fmt.Errorf("envoyconf: %q is not a header name", h)
		}
		b.WriteString("                - remove: " + h + "\n")
	}
	return []byte(strings.Replace(s, shippedFilters, b.String(), 1)), nil
}
