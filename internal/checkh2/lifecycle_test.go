package checkh2_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
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

// goAwayFrame reads until GOAWAY and returns it.
func (c *h2) goAwayFrame() goAway {
	c.t.Helper()
	f := c.until("GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	return goAway{LastStreamID: f.LastStreamID, ErrCode: f.ErrCode, Debug: string(f.DebugData())}
}

// shutdown runs Shutdown (bounded by 10 s) on a goroutine and returns
// what it returns.
func shutdown(s *checkh2.Server) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	return done
}

// awaitShutdown fails t unless Shutdown returns nil within 10 s.
func awaitShutdown(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
}

// Shutdown closes in two steps: GOAWAY naming every stream and a PING,
// the streams that arrive before the PING's ack served; on the ack,
// GOAWAY naming the last stream received, the later ones not answered;
// the streams in progress finish, then the connection closes and
// Shutdown returns.
func TestShutdownGraceful(t *testing.T) {
	s, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.headers(1, checkPath, false)
	c.fr.WritePing(false, [8]byte{1})
	c.until("the PING ack", func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok })
	done := shutdown(s)
	ga := c.goAwayFrame()
	if ga.LastStreamID != 1<<31-1 || ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("first GOAWAY last %d %v, want 2^31-1 NO_ERROR", ga.LastStreamID, ga.ErrCode)
	}
	ping := c.until("the server's PING", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() }).(*http2.PingFrame).Data
	c.check(3) // sent before the client read the GOAWAY: served
	if _, st := c.response(3); st != "0" {
		t.Fatalf("a stream sent before the PING's ack: grpc-status %q", st)
	}
	if err := c.fr.WritePing(true, ping); err != nil {
		t.Fatal(err)
	}
	ga = c.goAwayFrame()
	if ga.LastStreamID != 3 || ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("final GOAWAY last %d %v, want 3 NO_ERROR", ga.LastStreamID, ga.ErrCode)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a stream in progress", err)
	case <-time.After(100 * time.Millisecond):
	}
	c.headers(5, checkPath, true) // past the GOAWAY: not answered
	c.fr.WriteData(1, true, grpcMessage(t, upload("s")))
	if _, st := c.response(1); st != "0" {
		t.Fatalf("the stream in progress: grpc-status %q", st)
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			break
		}
		if f.Header().StreamID == 5 {
			t.Fatalf("a stream past GOAWAY was answered: %v", f)
		}
	}
	awaitShutdown(t, done)
}

// A peer that never acks the graceful close's PING still gets the final
// GOAWAY, and Shutdown returns.
func TestShutdownWithoutPingAck(t *testing.T) {
	s, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.check(1)
	if _, st := c.response(1); st != "0" {
		t.Fatalf("grpc-status %q", st)
	}
	done := shutdown(s)
	first := c.goAwayFrame()
	if first.LastStreamID != 1<<31-1 {
		t.Fatalf("first GOAWAY last %d, want 2^31-1", first.LastStreamID)
	}
	c.until("the server's PING", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() })
	ga := c.closed() // the PING never acked
	if ga == nil || ga.LastStreamID != 1 || ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("final GOAWAY %+v, want NO_ERROR after stream 1", ga)
	}
	awaitShutdown(t, done)
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

// A GOAWAY after the final one of a graceful close (here the read
// timeout's) names no later stream, though the peer opened one since.
func TestGoAwayNeverNamesALaterStream(t *testing.T) {
	s, addr := serve(t, checkh2.Config{ReadTimeout: 300 * time.Millisecond})
	c := dial(t, addr)
	c.headers(1, checkPath, false) // and never its message
	done := shutdown(s)
	c.goAwayFrame()
	ping := c.until("the server's PING", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() }).(*http2.PingFrame).Data
	if err := c.fr.WritePing(true, ping); err != nil {
		t.Fatal(err)
	}
	if ga := c.goAwayFrame(); ga.LastStreamID != 1 {
		t.Fatalf("final GOAWAY last %d, want 1", ga.LastStreamID)
	}
	c.headers(3, checkPath, false) // past the GOAWAY: ignored
	ga := c.closed()
	if ga == nil || ga.Debug != "read timeout" || ga.LastStreamID != 1 {
		t.Fatalf("GOAWAY %+v, want read timeout naming stream 1", ga)
	}
	awaitShutdown(t, done)
}
