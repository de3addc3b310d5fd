package configfile

import (
	"fmt"
	"strings"

	"github.com/ratelimit-authz/ratelimit-authz/internal/match"
)

// TrustedHeader is a request header the rules key by as sent, and the
// buckets that do: a client that sets it chooses its own key.
type TrustedHeader struct {
	Name    string
	Buckets []string
}

// Risk says what trusting h lets a client do.
func (h TrustedHeader) Risk() string {
	return fmt.Sprintf("header %s is trusted as sent (buckets %s): a client that sets it chooses its own key, and with it the tenant's override", h.Name, strings.Join(h.Buckets, ", "))
}

// Fix says what in the proxy in front makes h safe to trust.
func (h TrustedHeader) Fix() string {
	return fmt.Sprintf("deploy a filter ahead of ext_authz that sets it from a verified identity (jwt_authn claim_to_headers) and a header_mutation filter ahead of that one removing the client's copy (request_mutations: [{remove: %s}])", h.Name)
}

// TrustedHeaders lists the headers r keys by as sent (the tenant header,
// header: keys), in the order the buckets first name them.
func (r *Rules) TrustedHeaders() []TrustedHeader {
	var out []TrustedHeader
	at := map[string]int{}
	for _, b := range r.Buckets {
		var h string
		switch b.Key.Kind {
		case match.KeyTenant:
			h = r.Keys.TenantHeader
		case match.KeyHeader:
			h = b.Key.Name
		default:
			continue
		}
		i, seen := at[h]
		if !seen {
			i = len(out)
			at[h] = i
			out = append(out, TrustedHeader{Name: h})
		}
		out[i].Buckets = append(out[i].Buckets, b.Name)
	}
	return out
}

// SettingWarnings lists the settings of r that a client can exploit
// whatever the proxy in front: a client IP read from x-forwarded-for, a
// failure bucket whose lockout lapses when the key table is full.
func (r *Rules) SettingWarnings() []string {
	var out []string
	if n := r.Keys.TrustedHops; n > 0 {
		out = append(out, fmt.Sprintf("keys.trusted_hops is %d: the client IP is taken from x-forwarded-for, which clients write; safe only when every request reaches Envoy through exactly %d proxies that append to it (never on an edge listener), with Envoy's xff_num_trusted_hops also %d", n, n, n))
	}
	for _, b := range r.Buckets {
		if b.Count == CountFailures && b.OnOverflow == Allow {
			out = append(out, fmt.Sprintf("bucket %s counts failures with on_overflow: allow: when the key table is full its lockout is off, which a guesser can cause by flooding keys; remove on_overflow (deny is the default for failure buckets)", b.Name))
		}
	}
	return out
}

// TrustWarnings lists what r trusts that a client can set, as far as the
// rules alone tell: each trusted header (check-config --envoy also reads
// whether the proxy in front removes the client's copy), then the
// settings (SettingWarnings).
func (r *Rules) TrustWarnings() []string {
	var out []string
	for _, h := range r.TrustedHeaders() {
		out = append(out, h.Risk()+"; "+h.Fix()+", and check with --envoy")
	}
	return append(out, r.SettingWarnings()...)
}
