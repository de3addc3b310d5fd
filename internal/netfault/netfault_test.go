package netfault

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip sends a line and reads it back, returning how long it took,
// or an error when nothing comes back within d.
func roundTrip(t *testing.T, c net.Conn, rd *bufio.Reader, line string, d time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	c.SetDeadline(start.Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return 0, err
	}
	got, err := rd.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if got != line+"\n" {
		t.Fatalf("echoed %q, want %q", got, line)
	}
	return time.Since(start), nil
}

func TestDelayCutAndReset(t *testing.T) {
	r := Start(t, echoServer(t))
	c, rd := dial(t, r.Addr())
	if _, err := roundTrip(t, c, rd, "plain", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// A delay each way: a round trip takes at least twice it.
	r.Set(Faults{Delay: 100 * time.Millisecond})
	if rt, err := roundTrip(t, c, rd, "delayed", 5*time.Second); err != nil || rt < 200*time.Millisecond {
		t.Fatalf("round trip %v (%v), want at least 200ms", rt, err)
	}
	// Every chunk lost once: a retransmission's delay each way.
	r.Set(Faults{Loss: 1, RTO: 150 * time.Millisecond})
	if rt, err := roundTrip(t, c, rd, "lost", 5*time.Second); err != nil || rt < 300*time.Millisecond {
		t.Fatalf("round trip %v (%v), want at least 300ms", rt, err)
	}
	// A silent cut: nothing comes back, the connection stays open, and
	// the held bytes arrive once it heals.
	r.Set(Faults{Cut: true})
	if _, err := roundTrip(t, c, rd, "cut", 300*time.Millisecond); err == nil {
		t.Fatal("a line crossed a cut link")
	}
	r.Set(Faults{})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := rd.ReadString('\n'); err != nil || got != "cut\n" {
		t.Fatalf("after the heal: %q, %v; want the held line", got, err)
	}
	// In order under jitter.
	r.Set(Faults{Jitter: 20 * time.Millisecond})
	for i := range 50 {
		if _, err := io.WriteString(c, string(rune('a'+i%26))+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		got, err := rd.ReadString('\n')
		if err != nil || got != string(rune('a'+i%26))+"\n" {
			t.Fatalf("line %d: %q, %v", i, got, err)
		}
	}
	// A reset closes it.
	r.Reset()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rd.ReadString('\n'); err == nil {
		t.Fatal("read after a reset")
	}
	c2, rd2 := dial(t, r.Addr())
	if _, err := roundTrip(t, c2, rd2, "again", 5*time.Second); err != nil {
		t.Fatalf("a new connection after the reset: %v", err)
	}
}
