package match

import (
	"net/netip"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

const (
	headerExternalAddress = "x-envoy-external-address"
	headerForwardedFor    = "x-forwarded-for"
)

// clientIP returns the trusted client address of r (see Result.ClientIP).
func (e *Engine) clientIP(r *checkreq.Request) string {
	if e.useExternal {
		if v := r.Headers.Value(headerExternalAddress); v != "" {
			if ip, ok := canonicalIP(v); ok {
				return ip
			}
			return peerIP(r.PeerAddress)
		}
	}
	if e.trustedHops > 0 {
		if v, ok := xffEntry(r.Headers.Value(headerForwardedFor), e.trustedHops); ok {
			if ip, ok := canonicalIP(v); ok {
				return ip
			}
		}
	}
	return peerIP(r.PeerAddress)
}

// peerIP is the TCP peer as a key, or "" when it is not an IP address (a
// Unix socket, say): every client behind such a peer would share one key.
func peerIP(s string) string {
	ip, _ := canonicalIP(s)
	return ip
}

// xffEntry returns entry n counted from the right (0 = last) of the
// comma-separated list xff, trimmed; ok is false when the list is shorter.
// Envoy appends the TCP peer before the filter chain runs, so with N trusted
// hops the client is entry N from the right: the same address Envoy picks
// as the trusted client (ENVOY.md §3).
func xffEntry(xff string, n int) (string, bool) {
	if xff == "" {
		return "", false
	}
	end := len(xff)
	for ; n > 0; n-- {
		i := strings.LastIndexByte(xff[:end], ',')
		if i < 0 {
			return "", false
		}
		end = i
	}
	start := strings.LastIndexByte(xff[:end], ',') + 1
	return strings.TrimSpace(xff[start:end]), true
}

// canonicalIP parses s (surrounding whitespace ignored) as an IP address and
// returns its canonical text: IPv4-mapped IPv6 addresses are unmapped, IPv6
// is lower-case and compressed, so one client has one key whatever way a
// proxy wrote its address. When s already is canonical — the usual case —
// s itself (a substring) is returned and nothing is allocated.
func canonicalIP(s string) (string, bool) {
	s = strings.TrimSpace(s)
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return "", false
	}
	ip = ip.Unmap()
	var buf [64]byte
	out := ip.AppendTo(buf[:0])
	if string(out) == s {
		return s, true
	}
	return string(out), true
}

// CanonicalIP returns an IP address as Describe reports it (IPv4-mapped
// addresses unmapped), and false when s is not an IP address.
func CanonicalIP(s string) (string, bool) { return canonicalIP(s) }

// ipKey is the key of an ip-keyed bucket for the canonical client address
// ip: ip itself for IPv4, its network "2001:db8:1:2::/64" for IPv6 with a
// prefix shorter than 128. One host usually owns a whole /64 (SLAAC,
// privacy addresses), so keying by address would give it 2^64 budgets.
func ipKey(ip string, prefix int) string {
	if ip == "" || prefix >= 128 || strings.IndexByte(ip, ':') < 0 {
		return ip
	}
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is6() {
		return ip
	}
	p, err := a.Prefix(prefix)
	if err != nil {
		return ip
	}
	var buf [64]byte
	return string(p.AppendTo(buf[:0]))
}

// IPKey returns the key ip-keyed buckets count an address under, as
// Describe computes it with an IPv6 prefix length of prefix (0 means 64),
// and false when ip is not an IP address. Failure reports made outside a
// check use it so that they count against the same key.
func IPKey(ip string, prefix int) (string, bool) {
	c, ok := canonicalIP(ip)
	if !ok {
		return "", false
	}
	if prefix == 0 {
		prefix = 64
	}
	return ipKey(c, prefix), true
}
