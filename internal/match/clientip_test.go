package match

import (
	"net/netip"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

func TestClientIP(t *testing.T) {
	const peer = "203.0.113.128"
	tests := []struct {
		name     string
		hops     int
		external bool
		xff      string
		ext      string
		peer     string
		want     string
	}{
		{name: "hops 0: the peer, XFF ignored", xff: "198.51.100.1, 203.0.113.128", want: peer},
		{name: "hops 0: external header ignored when not trusted", ext: "198.51.100.9", want: peer},
		{name: "hops 1: Envoy's example", hops: 1, xff: "198.51.100.1,203.0.113.128", want: "198.51.100.1"},
		{name: "hops 1: spaces", hops: 1, xff: " 198.51.100.1 ,  203.0.113.128 ", want: "198.51.100.1"},
		{name: "hops 1: spoofed entries left of the trusted one ignored", hops: 1, xff: "1.1.1.1, 2.2.2.2, 198.51.100.1, 203.0.113.128", want: "198.51.100.1"},
		{name: "hops 2", hops: 2, xff: "1.1.1.1, 198.51.100.2, 10.0.0.5, 203.0.113.128", want: "198.51.100.2"},
		{name: "hops 2: exactly hops+1 entries", hops: 2, xff: "198.51.100.2,10.0.0.5,203.0.113.128", want: "198.51.100.2"},
		{name: "hops 2: short XFF falls back to the peer", hops: 2, xff: "10.0.0.5, 203.0.113.128", want: peer},
		{name: "hops 1: no XFF", hops: 1, want: peer},
		{name: "hops 1: only the peer appended", hops: 1, xff: "203.0.113.128", want: peer},
		{name: "hops 1: empty entry", hops: 1, xff: ",203.0.113.128", want: peer},
		{name: "hops 1: invalid entry falls back to the peer", hops: 1, xff: "unknown, 203.0.113.128", want: peer},
		{name: "hops 1: entry with a port is invalid", hops: 1, xff: "198.51.100.1:4711, 203.0.113.128", want: peer},
		{name: "hops 1: IPv6", hops: 1, xff: "2001:db8::7, 203.0.113.128", want: "2001:db8::7"},
		{name: "hops 1: IPv6 canonicalised", hops: 1, xff: "2001:DB8:0:0::7, 203.0.113.128", want: "2001:db8::7"},
		{name: "hops 1: IPv4-mapped IPv6 unmapped", hops: 1, xff: "::ffff:198.51.100.1, 203.0.113.128", want: "198.51.100.1"},
		{name: "external header trusted", external: true, hops: 1, ext: "198.51.100.9", xff: "198.51.100.1, 203.0.113.128", want: "198.51.100.9"},
		{name: "external header empty: XFF", external: true, hops: 1, ext: "", xff: "198.51.100.1, 203.0.113.128", want: "198.51.100.1"},
		{name: "external header invalid: the peer", external: true, hops: 1, ext: "nonsense", xff: "198.51.100.1, 203.0.113.128", want: peer},
		{name: "external header IPv6", external: true, ext: "2001:db8::1", want: "2001:db8::1"},
		{name: "external header off", hops: 0, ext: "198.51.100.9", want: peer},
		{name: "IPv6 peer", peer: "2001:db8::42", want: "2001:db8::42"},
		{name: "IPv4-mapped peer", peer: "::ffff:203.0.113.5", want: "203.0.113.5"},
		{name: "peer with zone", peer: "fe80::1%eth0", want: "fe80::1%eth0"},
		{name: "peer not an IP: missing", peer: "/var/run/envoy.sock", want: ""},
		{name: "no peer: missing", peer: "-", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mustNew(t, Config{TrustedHops: tt.hops, UseExternalAddressHeader: tt.external})
			h := map[string]string{}
			if tt.xff != "" {
				h["x-forwarded-for"] = tt.xff
			}
			if tt.ext != "" {
				h["x-envoy-external-address"] = tt.ext
			}
			p := tt.peer
			if p == "" {
				p = peer
			}
			if p == "-" {
				p = ""
			}
			got := e.Describe(&checkreq.Request{Method: "GET", Path: "/", Headers: checkreq.AppendMap(nil, h, nil), PeerAddress: p}, nil)
			if got.ClientIP != tt.want {
				t.Errorf("ClientIP = %q, want %q", got.ClientIP, tt.want)
			}
		})
	}
}

func TestCanonicalIPNoAlloc(t *testing.T) {
	for _, s := range []string{"203.0.113.128", "2001:db8::7", " 198.51.100.1"} {
		if n := testing.AllocsPerRun(100, func() { canonicalIP(s) }); n != 0 {
			t.Errorf("canonicalIP(%q) allocates %v times", s, n)
		}
	}
}

// TestIPKey: ip-keyed buckets count IPv6 clients per network (default
// /64), IPv4 and IPv4-mapped clients per address, and the key is the same
// through Describe and IPKey (which failure reports use).
func TestIPKey(t *testing.T) {
	for _, tt := range []struct {
		peer   string
		prefix int
		want   string
	}{
		{"203.0.113.7", 0, "203.0.113.7"},
		{"::ffff:203.0.113.7", 0, "203.0.113.7"},
		{"2001:db8:1:2::1", 0, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", 0, "2001:db8:1:2::/64"},
		{"2001:DB8:1:2::dead:beef", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", 64, "2001:db8:1:3::/64"},
		{"2001:db8:1:2::1", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2::1", 56, "2001:db8:1::/56"},
		{"2001:db8:1:2::1", 128, "2001:db8:1:2::1"},
		{"fe80::1%eth0", 64, "fe80::/64"},
		{"::1", 64, "::/64"},
	} {
		e := mustNew(t, Config{
			Buckets:    []Bucket{{Name: "per_ip", Key: KeySpec{Kind: KeyIP}}},
			Routes:     []Route{{Template: "/x", Buckets: []int{0}}},
			IPv6Prefix: tt.prefix,
		})
		got := e.Describe(&checkreq.Request{Method: "GET", Path: "/x", PeerAddress: tt.peer}, nil)
		if len(got.Descriptors) != 1 || got.Descriptors[0].Key != tt.want {
			t.Errorf("peer %s /%d: descriptors %+v, want key %q", tt.peer, tt.prefix, got.Descriptors, tt.want)
		}
		if k, ok := IPKey(tt.peer, tt.prefix); !ok || k != tt.want {
			t.Errorf("IPKey(%q, %d) = %q, %v; want %q", tt.peer, tt.prefix, k, ok, tt.want)
		}
	}
	if _, ok := IPKey("not an ip", 64); ok {
		t.Error("IPKey accepted a non-address")
	}
	if _, err := New(Config{IPv6Prefix: 129}); err == nil {
		t.Error("IPv6Prefix 129 accepted")
	}
}

// FuzzIPKey: any string is either refused or keyed; an IPv6 key is a
// network that holds the address, an IPv4 key the address itself.
func FuzzIPKey(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "::ffff:1.2.3.4", "2001:db8::1", "fe80::1%eth0", "::", "1.2.3", "[::1]", ""} {
		f.Add(s, 64)
	}
	f.Add("2001:db8::1", 0)
	f.Add("2001:db8::1", 128)
	f.Fuzz(func(t *testing.T, s string, prefix int) {
		if prefix < 0 || prefix > 128 {
			prefix &= 127
		}
		k, ok := IPKey(s, prefix)
		if !ok {
			return
		}
		c, _ := canonicalIP(s)
		a, err := netip.ParseAddr(c)
		if err != nil {
			t.Fatalf("IPKey(%q) = %q but %q does not parse", s, k, c)
		}
		if a.Is4() {
			if k != c {
				t.Fatalf("IPv4 %q keyed %q, want the address", s, k)
			}
			return
		}
		if prefix == 128 {
			if k != c {
				t.Fatalf("IPv6 %q /128 keyed %q", s, k)
			}
			return
		}
		p, err := netip.ParsePrefix(k)
		if err != nil || !p.Contains(a.WithZone("")) || p != p.Masked() {
			t.Fatalf("IPv6 %q /%d keyed %q: not a masked network holding it (%v)", s, prefix, k, err)
		}
	})
}
