package checkh2

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/pkg/checkwire"
)

// unusedCheck fails the test if a request reaches it: these tests drive
// the connection's flow control and stream bookkeeping only.
type unusedCheck struct{ t *testing.T }

func (u unusedCheck) Decoder() *checkwire.Decoder { u.t.Error("Check decoder asked for"); return nil }
func (u unusedCheck) CheckWire(context.Context, *checkwire.Request) (checkwire.Response, error) {
	u.t.Error("Check called")
	return checkwire.Response{}, nil
}

// unitConn is a connection past its handshake whose writes are discarded;
// its frames are handed to it by the test.
func unitConn(t *testing.T, cfg Config) *conn {
	t.Helper()
	cfg.Check = unusedCheck{t}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	c := newConn(s, server)
	c.bw = bufio.NewWriter(io.Discard)
	c.fr = http2.NewFramer(c.bw, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.sawSettings = true
	return c
}

// retained is the buffer capacity a connection keeps for streams to come.
func retained(c *conn) int {
	n := 0
	for _, st := range c.free {
		n += cap(st.body) + cap(st.out)
	}
	return n
}

// A connection whose streams have closed keeps at most maxFreeBytes of
// request and response buffers, however large the requests were.
func TestClosedStreamsRetainBoundedBuffers(t *testing.T) {
	c := unitConn(t, Config{MaxResetsPerSecond: 1 << 20})
	var in bytes.Buffer
	cl := http2.NewFramer(&in, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	// Two rounds of 128 streams, each stream sent 48 KiB before all of
	// the round are reset: within the connection's receive window.
	const streams, round = 256, 128
	chunk := make([]byte, 16384) // a message prefix declaring 0 bytes, then zeros
	for r := 0; r < streams; r += round {
		for i := r; i < r+round; i++ {
			id := uint32(2*i + 1)
			hb.Reset()
			for _, f := range []hpack.HeaderField{
				{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/envoy.service.auth.v3.Authorization/Check"},
				{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"},
			} {
				enc.WriteField(f)
			}
			cl.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			for range 3 {
				cl.WriteData(id, false, chunk)
			}
		}
		for i := r; i < r+round; i++ {
			cl.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel)
		}
	}
	c.fr = http2.NewFramer(c.bw, &in)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.SetReuseFrames()
	for in.Len() > 0 {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.handle(f); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.streams) != 0 || len(c.free) != round {
		t.Fatalf("%d streams open, %d free, want 0 and %d", len(c.streams), len(c.free), round)
	}
	if got := retained(c); got > maxFreeBytes {
		t.Fatalf("%d closed streams retain %d bytes of buffers, want at most %d", streams, got, maxFreeBytes)
	}
}
