package checkh2_test

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// Answers already written are sent before the server waits for the
// CONTINUATION of a header block it has only begun to receive.
func TestAnswersFlushedBeforeAwaitingContinuation(t *testing.T) {
	// ReadTimeout far beyond the client's deadline: an answer held until
	// the CONTINUATION would never arrive within it.
	_, addr := serve(t, checkh2.Config{ReadTimeout: time.Hour})
	c := dial(t, addr)
	// Request 1 whole, then the first half of request 3's header block,
	// in one write (blocks encoded in the order the server decodes them).
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	block := func() []byte {
		c.hbuf.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: checkPath},
			{Name: ":authority", Value: "authz"}, {Name: "content-type", Value: "application/grpc"},
		} {
			c.enc.WriteField(f)
		}
		return append([]byte(nil), c.hbuf.Bytes()...)
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(), EndHeaders: true})
	fr.WriteData(1, true, grpcMessage(t, upload("a")))
	b3 := block()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: b3[:len(b3)/2], EndHeaders: false})
	if _, err := c.conn.Write(b.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, st := c.response(1); st != "0" {
		t.Fatalf("stream 1: grpc-status %q", st)
	}
	if err := c.fr.WriteContinuation(3, true, b3[len(b3)/2:]); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteData(3, true, grpcMessage(t, upload("c"))); err != nil {
		t.Fatal(err)
	}
	if _, st := c.response(3); st != "0" {
		t.Fatalf("stream 3: grpc-status %q", st)
	}
}
