// Package freeport picks loopback TCP addresses for tests, tools and the
// demo to hand to servers they start.
//
// An address was free when it was picked; its listener is closed before it
// is returned, so another process may take the port in between. Callers
// that start a server on it and can retry (testpg) do; for a test machine
// that race is rare. The package imports no testing code, so production
// tools (the bench, the demo) may use it.
package freeport

import (
	"fmt"
	"net"
	"net/netip"
)

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
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
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
