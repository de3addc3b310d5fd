package server

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"strings"
	"testing"
)

// FuzzAllowList: any name either is refused with an error or, once
// accepted, admits a certificate carrying exactly it (as a DNS SAN, or as
// a URI SAN for a URI) and nothing else: not the name as a common name,
// not a longer name, not the other kind of SAN.
func FuzzAllowList(f *testing.F) {
	for _, s := range []string{
		"edge-envoy.mesh.internal", "Edge.Example", "spiffe://cluster.local/ns/edge/sa/envoy",
		"*.example", "", "a b", "a,b", "x:", ":/x", "urn:envoy:edge", "http://h/p?q#f",
		"a..b", "-a.b", strings.Repeat("a", 64), "\x00", "é.example", "spiffe://h/%zz",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		a, err := parseAllowList([]string{name})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "server: allowed client name ") {
				t.Fatalf("error %q", err)
			}
			return
		}
		if a.empty() {
			t.Fatalf("%q accepted but the list is empty", name)
		}
		if a.allows(&x509.Certificate{Subject: pkix.Name{CommonName: name}}) {
			t.Fatalf("%q admitted as a common name", name)
		}
		if a.allows(&x509.Certificate{DNSNames: []string{name + "x"}}) {
			t.Fatalf("%q admits %q", name, name+"x")
		}
		if strings.Contains(name, ":") {
			u, err := url.Parse(name)
			if err != nil {
				t.Fatalf("%q accepted as a URI: %v", name, err)
			}
			if !a.allows(&x509.Certificate{URIs: []*url.URL{u}}) {
				t.Fatalf("URI %q not admitted", name)
			}
			if a.allows(&x509.Certificate{DNSNames: []string{name}}) {
				t.Fatalf("URI %q admitted as a DNS name", name)
			}
			return
		}
		if !a.allows(&x509.Certificate{DNSNames: []string{strings.ToUpper(name)}}) {
			t.Fatalf("DNS name %q not admitted", name)
		}
		if u, err := url.Parse("dns://" + name); err == nil && a.allows(&x509.Certificate{URIs: []*url.URL{u}}) {
			t.Fatalf("DNS name %q admitted as a URI", name)
		}
	})
}
