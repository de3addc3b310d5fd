package checkh2_test

import (
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// trailers sends a header block ending stream id, as a client's trailers.
func (c *h2) trailers(id uint32) {
	c.t.Helper()
	c.hbuf.Reset()
	c.enc.WriteField(hpack.HeaderField{Name: "x-trailer", Value: "1"})
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		c.t.Fatal(err)
	}
}

// What a client still had in flight on streams the server answered early
// or refused (RFC 9113 §5.1: frames after a RST_STREAM it sent) is
// ignored: the other streams go on.
func TestFramesOnResetStreamsIgnored(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxConcurrentStreams: 1})
	c := dial(t, addr)
	c.headers(1, "/no.such/Method", false) // answered at once, reset NO_ERROR
	if st, reset := c.trailersOnly(1); st == "0" || !reset {
		t.Fatalf("stream 1: grpc-status %q, reset %v: want an early answer and a reset", st, reset)
	}
	c.headers(3, checkPath, false)
	c.headers(5, checkPath, false) // refused: one stream at a time
	c.until("RST_STREAM 5", func(f http2.Frame) bool {
		r, ok := f.(*http2.RSTStreamFrame)
		return ok && r.StreamID == 5 && r.ErrCode == http2.ErrCodeRefusedStream
	})
	for _, id := range []uint32{1, 5} {
		if err := c.fr.WriteData(id, false, grpcMessage(t, upload("late"))); err != nil {
			t.Fatal(err)
		}
		c.trailers(id)
	}
	if err := c.fr.WriteData(3, true, grpcMessage(t, upload("on"))); err != nil {
		t.Fatal(err)
	}
	if _, st := c.response(3); st != "0" {
		t.Fatalf("stream 3: grpc-status %q", st)
	}
	c.check(7)
	if _, st := c.response(7); st != "0" {
		t.Fatalf("stream 7: grpc-status %q", st)
	}
}

// HEADERS on a stream the client never opened (an identifier it skipped)
// is still a connection error.
func TestHeadersOnSkippedStreamIsConnectionError(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.check(3) // skips 1
	if _, st := c.response(3); st != "0" {
		t.Fatalf("stream 3: grpc-status %q", st)
	}
	c.trailers(1)
	ga := c.closed()
	if ga == nil || ga.ErrCode != http2.ErrCodeProtocol {
		t.Fatalf("GOAWAY %+v, want PROTOCOL_ERROR", ga)
	}
}
