package checkh2_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/checkh2"
)

func TestTimeouts(t *testing.T) {
	_, addr := serve(t, checkh2.Config{HandshakeTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond})

	t.Run("handshake", func(t *testing.T) {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(raw, http2.ClientPreface[:10]) // and nothing more
		if _, err := io.ReadAll(raw); err != nil {
			t.Fatalf("a stalled preface: %v, want the connection closed", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		c := dial(t, addr)
		c.check(1)
		c.response(1)
		ga := c.closed()
		if ga == nil || ga.ErrCode != http2.ErrCodeNo || ga.LastStreamID != 1 {
			t.Fatalf("idle connection: GOAWAY %+v, want NO_ERROR after stream 1", ga)
		}
	})
	t.Run("stalled request", func(t *testing.T) {
		c := dial(t, addr)
		c.headers(1, checkPath, false) // and never its message
		ga := c.closed()
		if ga == nil || ga.ErrCode != http2.ErrCodeNo || ga.Debug != "read timeout" || ga.LastStreamID != 1 {
			t.Fatalf("a stalled request: GOAWAY %+v, want NO_ERROR after stream 1 saying read timeout", ga)
		}
	})
}

func TestMaxConnections(t *testing.T) {
	s, addr := serve(t, checkh2.Config{MaxConnections: 1})
	c := dial(t, addr)
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(raw); err != nil {
		t.Fatalf("a connection over the bound: %v, want closed", err)
	}
	if s.Refused() != 1 || s.Open() != 1 {
		t.Fatalf("refused %d open %d, want 1 and 1", s.Refused(), s.Open())
	}
	c.check(1)
	if _, st := c.response(1); st != "0" {
		t.Fatalf("the connection within the bound: grpc-status %q", st)
	}
}

// Shutdown: GOAWAY naming the last stream, the stream in progress
// answered, then the connection closed and Shutdown returns.
func TestShutdownGraceful(t *testing.T) {
	s, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.headers(1, checkPath, false)
	c.fr.WritePing(false, [8]byte{1})
	c.until("the PING ack", func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	ga := c.until("GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if ga.LastStreamID != 1 || ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("GOAWAY last %d %v, want 1 NO_ERROR", ga.LastStreamID, ga.ErrCode)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a stream in progress", err)
	case <-time.After(100 * time.Millisecond):
	}
	c.headers(3, checkPath, true) // past the GOAWAY: not answered
	c.fr.WriteData(1, true, grpcMessage(t, upload("s")))
	if _, st := c.response(1); st != "0" {
		t.Fatalf("the stream in progress: grpc-status %q", st)
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			break
		}
		if f.Header().StreamID == 3 {
			t.Fatalf("a stream past GOAWAY was answered: %v", f)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// Shutdown's context bounds the wait for a stream that never completes.
func TestShutdownDeadline(t *testing.T) {
	s, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.headers(1, checkPath, false)
	c.fr.WritePing(false, [8]byte{1})
	c.until("the PING ack", func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown: %v, want DeadlineExceeded", err)
	}
	c.closed()
	if s.Open() != 0 {
		t.Fatalf("%d connections open after Shutdown", s.Open())
	}
}
