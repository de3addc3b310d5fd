package freeport

import (
	"net"
	"strconv"
	"testing"
)

// listenable fails the test unless addr is a 127.0.0.1 address with a
// real port that can be listened on now.
func listenable(t *testing.T, addr string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("address %q (%v), want 127.0.0.1:<port>", addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	l.Close()
}

func TestAddrListenable(t *testing.T) {
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	listenable(t, addr)
	listenable(t, TestAddr(t))
}

func TestAddrsDistinct(t *testing.T) {
	addrs, err := Addrs(20)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 20 {
		t.Fatalf("%d addresses, want 20", len(addrs))
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s picked twice in %v", a, addrs)
		}
		seen[a] = true
		listenable(t, a)
	}
	if got, err := Addrs(0); err != nil || len(got) != 0 {
		t.Errorf("Addrs(0) = %v, %v", got, err)
	}
	if _, err := Addrs(-1); err == nil {
		t.Error("Addrs(-1) gave no error")
	}
}

func TestPortListenable(t *testing.T) {
	for _, p := range []int{must(t)(Port()), TestPort(t)} {
		if p <= 0 || p > 65535 {
			t.Fatalf("port %d", p)
		}
		listenable(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	}
}

func must(t *testing.T) func(int, error) int {
	return func(p int, err error) int {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// Picked ports lie below the kernel's ephemeral range, where no outgoing
// connection takes one.
func TestAddrsBelowTheEphemeralRange(t *testing.T) {
	lo, hi := pickRange()
	addrs, err := Addrs(50)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		listenable(t, a)
		_, p, _ := net.SplitHostPort(a)
		// With no room below the range (lo == hi), the kernel picks.
		if port, err := strconv.Atoi(p); err != nil || (lo < hi && (port < lo || port >= hi)) {
			t.Errorf("port %s outside [%d, %d)", p, lo, hi)
		}
	}
}
