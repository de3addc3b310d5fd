// Package freeport picks loopback TCP addresses for tests, tools and the
// demo to hand to servers they start.
//
// An address was free when it was picked; its listener is closed before it
// is returned, so another process may take the port in between. Ports are
// picked at random below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), where the kernel never puts
// the local end of an outgoing connection: a test that makes thousands of
// connections cannot take a port picked for a server. Only another
// listener that picked the same port can; callers that start a server on
// it and can retry (testpg) do. The package imports no testing code, so
// production tools (the bench, the demo) may use it.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// pickRange is the ports picked from, [lo, hi): the 16384 ports below the
// ephemeral range, or none (lo == hi) when that range starts too low to
// leave room, and the kernel then picks.
func pickRange() (lo, hi int) {
	hi = 32768 // Linux's default start of the ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				hi = min(n, 1<<16)
			}
		}
	}
	if hi < 16384+1024 {
		return 0, 0
	}
	return hi - 16384, hi
}

// listen listens on a loopback port in [lo, hi), tried from a random one
// on; with lo == hi, on one the kernel picks.
func listen(lo, hi int) (net.Listener, error) {
	if lo == hi {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	start := rand.IntN(hi - lo)
	var err error
	for i := range min(hi-lo, 256) {
		var l net.Listener
		if l, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(lo+(start+i)%(hi-lo))); err == nil {
			return l, nil
		}
	}
	return nil, err
}

// Addr returns one 127.0.0.1:port address whose port was free a moment
// ago.
func Addr() (string, error) {
	addrs, err := Addrs(1)
	if err != nil {
		return "", err
	}
	return addrs[0], nil
}

// Addrs returns n distinct 127.0.0.1:port addresses. Every listener is
// held until all n are picked, so no port repeats within one call.
func Addrs(n int) ([]string, error) {
	if n < 0 {
		return nil, fmt.Errorf("freeport: %d addresses asked for", n)
	}
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]string, 0, n)
	lo, hi := pickRange()
	for range n {
		l, err := listen(lo, hi)
		if err != nil {
			return nil, fmt.Errorf("freeport: pick a free port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// Port returns a loopback TCP port that was free a moment ago.
func Port() (int, error) {
	addr, err := Addr()
	if err != nil {
		return 0, err
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return 0, fmt.Errorf("freeport: read the port of %s: %w", addr, err)
	}
	return int(ap.Port()), nil
}

// TB is the part of testing.TB the test forms use; declared here so that
// this package does not import testing.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// TestAddr is Addr for a test: it stops the test when no port is free.
func TestAddr(t TB) string {
	t.Helper()
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestAddrs is Addrs for a test: n distinct addresses, or the test stops.
func TestAddrs(t TB, n int) []string {
	t.Helper()
	addrs, err := Addrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// TestPort is Port for a test: it stops the test when no port is free.
func TestPort(t TB) int {
	t.Helper()
	return int(netip.MustParseAddrPort(TestAddr(t)).Port())
}
