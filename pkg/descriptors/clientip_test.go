package descriptors

import "testing"

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
			got := e.Describe(&Request{Method: "GET", Path: "/", Headers: h, PeerAddress: p}, nil)
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
