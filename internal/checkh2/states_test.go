package checkh2_test

import (
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// Frames a stream's state does not allow (RFC 9113 §5.1, §5.3.1, §8.2.2)
// get a stream error, and the connection goes on serving.
func TestStreamStateErrors(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	for _, tc := range []struct {
		name     string
		settings []http2.Setting
		send     func(c *h2)
		id       uint32
		code     http2.ErrCode
	}{
		{"DATA on a closed stream", nil, func(c *h2) {
			c.check(1)
			c.response(1)
			c.fr.WriteData(1, true, []byte{0})
		}, 1, http2.ErrCodeStreamClosed},
		{"DATA after the client's RST_STREAM", nil, func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
			c.fr.WriteData(1, true, []byte{0})
		}, 1, http2.ErrCodeStreamClosed},
		{"DATA on a half-closed (remote) stream", []http2.Setting{{ID: http2.SettingInitialWindowSize, Val: 0}}, func(c *h2) {
			c.check(1) // its answer waits for a window
			c.fr.WriteData(1, true, []byte{0})
		}, 1, http2.ErrCodeStreamClosed},
		{"HEADERS depending on itself", nil, func(c *h2) {
			c.hbuf.Reset()
			for _, f := range []hpack.HeaderField{
				{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: checkPath},
				{Name: ":authority", Value: "authz"}, {Name: "content-type", Value: "application/grpc"},
			} {
				c.enc.WriteField(f)
			}
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes(), EndHeaders: true,
				Priority: http2.PriorityParam{StreamDep: 1, Weight: 10}})
		}, 1, http2.ErrCodeProtocol},
		{"PRIORITY depending on itself", nil, func(c *h2) {
			c.fr.WritePriority(1, http2.PriorityParam{StreamDep: 1, Weight: 10})
		}, 1, http2.ErrCodeProtocol},
		{"connection", nil, func(c *h2) {
			c.headers(1, checkPath, false, hpack.HeaderField{Name: "connection", Value: "keep-alive"})
		}, 1, http2.ErrCodeProtocol},
		{"keep-alive", nil, func(c *h2) { c.headers(1, checkPath, false, hpack.HeaderField{Name: "keep-alive", Value: "timeout=5"}) }, 1, http2.ErrCodeProtocol},
		{"proxy-connection", nil, func(c *h2) {
			c.headers(1, checkPath, true, hpack.HeaderField{Name: "proxy-connection", Value: "close"})
		}, 1, http2.ErrCodeProtocol},
		{"transfer-encoding", nil, func(c *h2) {
			c.headers(1, checkPath, false, hpack.HeaderField{Name: "transfer-encoding", Value: "chunked"})
		}, 1, http2.ErrCodeProtocol},
		{"upgrade", nil, func(c *h2) { c.headers(1, checkPath, false, hpack.HeaderField{Name: "upgrade", Value: "h2c"}) }, 1, http2.ErrCodeProtocol},
		{"te other than trailers", nil, func(c *h2) { c.headers(1, checkPath, false, hpack.HeaderField{Name: "te", Value: "trailers, deflate"}) }, 1, http2.ErrCodeProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr, tc.settings...)
			tc.send(c)
			c.until("RST_STREAM", func(f http2.Frame) bool {
				switch f := f.(type) {
				case *http2.GoAwayFrame:
					t.Fatalf("GOAWAY %v, want RST_STREAM %v on stream %d", f.ErrCode, tc.code, tc.id)
				case *http2.RSTStreamFrame:
					if f.StreamID != tc.id || f.ErrCode != tc.code {
						t.Fatalf("RST_STREAM %v on stream %d, want %v on %d", f.ErrCode, f.StreamID, tc.code, tc.id)
					}
					return true
				}
				return false
			})
			c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 16})
			c.check(3)
			if _, st := c.response(3); st != "0" {
				t.Fatalf("the next check: grpc-status %q", st)
			}
		})
	}
}

// A stream identifier lower than or equal to one already opened, and a
// client's trailers, end the connection with PROTOCOL_ERROR (RFC 9113
// §5.1.1), as grpc-go ends it.
func TestStreamIdentifierErrors(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	for _, tc := range []struct {
		name string
		send func(c *h2)
	}{
		{"a reused identifier", func(c *h2) {
			c.check(1)
			c.response(1)
			c.headers(1, checkPath, true)
		}},
		{"a lower identifier", func(c *h2) {
			c.check(5)
			c.response(5)
			c.headers(3, checkPath, true)
		}},
		{"a client's trailers", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, false, grpcMessage(t, upload("t")))
			c.trailers(1)
		}},
		{"HEADERS after the request ended", func(c *h2) {
			c.headers(1, checkPath, true)
			c.headers(1, checkPath, true)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			tc.send(c)
			if ga := c.closed(); ga == nil || ga.ErrCode != http2.ErrCodeProtocol {
				t.Fatalf("GOAWAY %+v, want PROTOCOL_ERROR", ga)
			}
		})
	}
}
