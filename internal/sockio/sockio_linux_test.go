package sockio

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ratelimit-authz/ratelimit-authz/internal/testcert"
)

// pair returns a wrapped server side and a plain client side of one
// loopback TCP connection, both closed at the test's end.
func pair(t testing.TB) (srv net.Conn, cli net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wl := Listen(l)
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := wl.Accept()
		ch <- accepted{c, err}
	}()
	cli, err = net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a := <-ch
	if a.err != nil {
		t.Fatal(a.err)
	}
	if _, ok := a.c.(*Conn); !ok {
		t.Fatalf("Listen accepted a %T, want a *sockio.Conn", a.c)
	}
	t.Cleanup(func() { a.c.Close(); cli.Close() })
	return a.c, cli
}

func TestWrapLeavesOtherConnsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe) = %T, want the pipe itself", got)
	}
}

func TestRoundTripBothWays(t *testing.T) {
	srv, cli := pair(t)
	// Larger than any socket buffer: the writer meets a full socket and
	// must wait in the poller, the reader meets an empty one.
	want := make([]byte, 16<<20)
	rand.Read(want)
	for _, dir := range []struct {
		name string
		w, r net.Conn
	}{{"wrapped writes", srv, cli}, {"wrapped reads", cli, srv}} {
		t.Run(dir.name, func(t *testing.T) {
			dir.w.SetDeadline(time.Now().Add(30 * time.Second))
			dir.r.SetDeadline(time.Now().Add(30 * time.Second))
			errc := make(chan error, 1)
			go func() {
				n, err := dir.w.Write(want)
				if err == nil && n != len(want) {
					err = errors.New("short write without an error")
				}
				errc <- err
			}()
			got := make([]byte, len(want))
			if _, err := io.ReadFull(dir.r, got); err != nil {
				t.Fatalf("read: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("bytes read differ from bytes written")
			}
		})
	}
}

func TestZeroLengthReadAndWrite(t *testing.T) {
	srv, _ := pair(t)
	if n, err := srv.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
	if n, err := srv.Write(nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v; want 0, nil", n, err)
	}
}

func TestReadDeadline(t *testing.T) {
	srv, _ := pair(t)
	srv.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	start := time.Now()
	_, err := srv.Read(make([]byte, 10))
	assertTimeout(t, err, "read")
	if time.Since(start) > 5*time.Second {
		t.Fatalf("read returned after %v: the deadline did not end it", time.Since(start))
	}
	// A deadline in the past fails at once, as for any net.Conn.
	srv.SetReadDeadline(time.Unix(1, 0))
	_, err = srv.Read(make([]byte, 10))
	assertTimeout(t, err, "read")
}

func TestWriteDeadlineReportsWhatWasWritten(t *testing.T) {
	srv, _ := pair(t) // the client never reads
	srv.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	p := make([]byte, 64<<20)
	n, err := srv.Write(p)
	assertTimeout(t, err, "write")
	if n <= 0 || n >= len(p) {
		t.Fatalf("Write wrote %d of %d bytes before its deadline, want some but not all", n, len(p))
	}
}

func assertTimeout(t *testing.T, err error, op string) {
	t.Helper()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("%s error %v (%T) is not a net.Error with Timeout", op, err, err)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s error %v is not os.ErrDeadlineExceeded", op, err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op {
		t.Fatalf("%s error %v has op %v, want %q", op, err, oe, op)
	}
}

func TestEOFWhenThePeerCloses(t *testing.T) {
	srv, cli := pair(t)
	cli.Write([]byte("last"))
	cli.Close()
	srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(srv)
	if err != nil || string(got) != "last" {
		t.Fatalf("ReadAll = %q, %v; want \"last\", nil (io.EOF ends it)", got, err)
	}
	if _, err := srv.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("Read after the peer closed = %v, want io.EOF", err)
	}
}

func TestWriteToAResetPeerFails(t *testing.T) {
	srv, cli := pair(t)
	cli.(*net.TCPConn).SetLinger(0) // close with RST
	cli.Close()
	srv.SetWriteDeadline(time.Now().Add(5 * time.Second))
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = srv.Write(make([]byte, 1<<10))
		time.Sleep(time.Millisecond)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) {
		t.Fatalf("writes to a reset peer gave %v, want a system call error (EPIPE or ECONNRESET)", err)
	}
}

func TestCloseEndsABlockedRead(t *testing.T) {
	srv, _ := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := srv.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	srv.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Read ended with %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a blocked Read")
	}
	if _, err := srv.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close = %v, want net.ErrClosed", err)
	}
}

func TestConcurrentReadersAndWriters(t *testing.T) {
	srv, cli := pair(t)
	srv.SetDeadline(time.Now().Add(30 * time.Second))
	cli.SetDeadline(time.Now().Add(30 * time.Second))
	const writers, each, size = 4, 200, 512
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			msg := bytes.Repeat([]byte{byte('a' + w)}, size)
			for range each {
				if _, err := srv.Write(msg); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	// Each Write is whole and not interleaved with another: every
	// size-long block read is one letter.
	got := make([]byte, writers*each*size)
	if _, err := io.ReadFull(cli, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := 0; i < len(got); i += size {
		blk := got[i : i+size]
		if bytes.Count(blk, blk[:1]) != size {
			t.Fatalf("block at %d mixes writes: %q…", i, blk[:16])
		}
	}
	// Concurrent readers share the stream without losing a byte.
	go cli.Write(got)
	var mu sync.Mutex
	total := 0
	for range 4 {
		wg.Go(func() {
			buf := make([]byte, 1000)
			for {
				mu.Lock()
				done := total == len(got)
				mu.Unlock()
				if done {
					return
				}
				srv.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				n, err := srv.Read(buf)
				mu.Lock()
				total += n
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if total != len(got) {
		t.Fatalf("concurrent readers read %d of %d bytes", total, len(got))
	}
}

func TestTLSOverAWrappedConn(t *testing.T) {
	ca := testcert.New(t)
	srv, cli := pair(t)
	st := tls.Server(srv, &tls.Config{Certificates: []tls.Certificate{ca.KeyPair(t, testcert.Leaf{Name: "server", Usage: x509.ExtKeyUsageServerAuth})}})
	ct := tls.Client(cli, &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"})
	st.SetDeadline(time.Now().Add(10 * time.Second))
	ct.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(st, buf); err == nil {
			st.Write(append(buf, "!"...))
		}
	}()
	if _, err := ct.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 6)
	if _, err := io.ReadFull(ct, got); err != nil || string(got) != "hello!" {
		t.Fatalf("TLS echo = %q, %v", got, err)
	}
}

func TestReadAndWriteDoNotAllocate(t *testing.T) {
	if raceBuild {
		t.Skip("the race build reads and writes through the syscall package; make test runs this package without -race as well")
	}
	srv, cli := pair(t)
	msg, buf := make([]byte, 200), make([]byte, 200)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := srv.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(cli, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(srv, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a wrapped Write and Read (and the plain peer's) allocate %.1f times, want 0", allocs)
	}
}

// BenchmarkPingPong sends 200 bytes each way per operation over loopback,
// the server side wrapped or plain.
func BenchmarkPingPong(b *testing.B) {
	for _, wrapped := range []bool{false, true} {
		name := map[bool]string{false: "net", true: "sockio"}[wrapped]
		b.Run(name, func(b *testing.B) {
			srv, cli := pair(b)
			if !wrapped {
				srv = srv.(*Conn).TCPConn
			}
			go func() {
				buf := make([]byte, 200)
				for {
					if _, err := io.ReadFull(srv, buf); err != nil {
						return
					}
					if _, err := srv.Write(buf); err != nil {
						return
					}
				}
			}()
			msg, buf := make([]byte, 200), make([]byte, 200)
			b.ReportAllocs()
			for b.Loop() {
				cli.Write(msg)
				if _, err := io.ReadFull(cli, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
