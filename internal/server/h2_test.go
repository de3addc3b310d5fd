package server_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Client is a hostile HTTP/2 client: it speaks the frames itself and
// ignores what the server advertises, to show that the server enforces its
// bounds rather than relying on a polite client.
type h2Client struct {
	t        *testing.T
	conn     net.Conn
	fr       *http2.Framer
	settings map[http2.SettingID]uint32 // the server's first SETTINGS
}

// dialH2 connects, sends the client preface and reads the server's
// SETTINGS. It fails the test when the server does not answer.
func dialH2(t *testing.T, addr string) *h2Client {
	t.Helper()
	c, err := tryH2(t, addr)
	if err != nil {
		t.Fatalf("HTTP/2 handshake with %s: %v", addr, err)
	}
	return c
}

// tryH2 is dialH2 returning the error: io.EOF when the server closes the
// connection instead of answering.
func tryH2(t *testing.T, addr string) (*h2Client, error) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	c := &h2Client{t: t, conn: conn, fr: http2.NewFramer(conn, conn), settings: map[http2.SettingID]uint32{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		return nil, err
	}
	if err := c.fr.WriteSettings(); err != nil {
		return nil, err
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
			sf.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
			if err := c.fr.WriteSettingsAck(); err != nil {
				return nil, err
			}
			conn.SetDeadline(time.Time{})
			return c, nil
		}
	}
}

// openCheck opens a stream calling Check with the request headers only (no
// message yet), plus extra headers. A header block larger than a frame is
// split into CONTINUATION frames.
func (c *h2Client) openCheck(id uint32, extra ...hpack.HeaderField) {
	c.t.Helper()
	if err := c.tryOpenCheck(id, extra...); err != nil {
		c.t.Fatal(err)
	}
}

// tryOpenCheck is openCheck returning a write error: a server may close the
// connection while a hostile header block is still being written.
func (c *h2Client) tryOpenCheck(id uint32, extra ...hpack.HeaderField) error {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, h := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/envoy.service.auth.v3.Authorization/Check"}, {Name: ":authority", Value: "limiter"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		if err := enc.WriteField(h); err != nil {
			c.t.Fatal(err)
		}
	}
	b := block.Bytes()
	const frame = 16 << 10 // the initial SETTINGS_MAX_FRAME_SIZE
	first := b[:min(len(b), frame)]
	b = b[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(b) == 0}); err != nil {
		return err
	}
	for len(b) > 0 {
		n := min(len(b), frame)
		if err := c.fr.WriteContinuation(id, n == len(b), b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// sendMessage sends one gRPC length-prefixed message on a stream and ends
// it.
func (c *h2Client) sendMessage(id uint32, msg []byte) {
	c.t.Helper()
	buf := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(msg)))
	copy(buf[5:], msg)
	if err := c.fr.WriteData(id, true, buf); err != nil {
		c.t.Fatal(err)
	}
}

// waitFrame reads frames until match returns true, and returns that frame.
// It acknowledges the server's pings as it goes, as a live client does.
// It fails on a read error (or the connection closing) or after timeout.
func (c *h2Client) waitFrame(timeout time.Duration, what string, match func(http2.Frame) bool) http2.Frame {
	c.t.Helper()
	f, err := c.readUntil(timeout, match)
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", what, err)
	}
	return f
}

func (c *h2Client) readUntil(timeout time.Duration, match func(http2.Frame) bool) (http2.Frame, error) {
	c.conn.SetReadDeadline(time.Now().Add(timeout))
	defer c.conn.SetReadDeadline(time.Time{})
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil, err
		}
		if match(f) {
			return f, nil
		}
		if p, ok := f.(*http2.PingFrame); ok && !p.IsAck() {
			c.fr.WritePing(true, p.Data)
		}
	}
}

// waitClosed reads (acknowledging pings) until the server closes the
// connection, and fails if it is still open after timeout.
func (c *h2Client) waitClosed(timeout time.Duration) {
	c.t.Helper()
	_, err := c.readUntil(timeout, func(http2.Frame) bool { return false })
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection still open after %v", timeout)
	}
}
