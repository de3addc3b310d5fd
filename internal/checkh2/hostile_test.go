package checkh2_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
)

// h2 is a client that speaks the frames itself, ignoring what the server
// advertises, to show the server enforces its bounds.
type h2 struct {
	t        *testing.T
	conn     net.Conn
	fr       *http2.Framer
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	settings map[http2.SettingID]uint32
}

// dial connects, sends the preface and SETTINGS s, and reads the server's
// SETTINGS and its connection WINDOW_UPDATE.
func dial(t *testing.T, addr string, s ...http2.Setting) *h2 {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &h2{t: t, conn: conn, fr: http2.NewFramer(conn, conn), settings: map[http2.SettingID]uint32{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(s...); err != nil {
		t.Fatal(err)
	}
	f := c.read()
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		t.Fatalf("first frame %v, want SETTINGS", f)
	}
	sf.ForeachSetting(func(s http2.Setting) error { c.settings[s.ID] = s.Val; return nil })
	if err := c.fr.WriteSettingsAck(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *h2) read() http2.Frame {
	c.t.Helper()
	f, err := c.fr.ReadFrame()
	if err != nil {
		c.t.Fatalf("read a frame: %v", err)
	}
	return f
}

// until reads frames until one satisfies ok, and returns it.
func (c *h2) until(what string, ok func(http2.Frame) bool) http2.Frame {
	c.t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok(f) {
			return f
		}
	}
}

// goAway is a GOAWAY received.
type goAway struct {
	LastStreamID uint32
	ErrCode      http2.ErrCode
	Debug        string
}

// closed reads until the connection ends and returns the last GOAWAY
// seen, if any.
func (c *h2) closed() *goAway {
	c.t.Helper()
	var ga *goAway
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatal("the server kept the connection open")
			}
			return ga
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			ga = &goAway{LastStreamID: g.LastStreamID, ErrCode: g.ErrCode, Debug: string(g.DebugData())}
		}
	}
}

func (c *h2) headers(id uint32, path string, end bool, extra ...hpack.HeaderField) {
	c.t.Helper()
	if err := c.tryHeaders(id, path, end, extra...); err != nil {
		c.t.Fatal(err)
	}
}

func (c *h2) tryHeaders(id uint32, path string, end bool, extra ...hpack.HeaderField) error {
	c.hbuf.Reset()
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "authz"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		c.enc.WriteField(f)
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: end})
}

func grpcMessage(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

func (c *h2) check(id uint32) {
	c.t.Helper()
	c.headers(id, "/envoy.service.auth.v3.Authorization/Check", false)
	if err := c.fr.WriteData(id, true, grpcMessage(c.t, upload("h"))); err != nil {
		c.t.Fatal(err)
	}
}

// response reads stream id's response to its end and returns its DATA
// and grpc-status.
func (c *h2) response(id uint32) (data []byte, grpcStatus string) {
	c.t.Helper()
	for {
		f := c.read()
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			data = append(data, f.Data()...)
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				c.t.Fatalf("stream %d: HTTP status %s", id, v)
			}
			if f.StreamEnded() {
				return data, headerValue(f, "grpc-status")
			}
		case *http2.RSTStreamFrame:
			c.t.Fatalf("stream %d reset: %v", id, f.ErrCode)
		}
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.RegularFields() {
		if h.Name == name {
			return h.Value
		}
	}
	return ""
}

func TestPrefaceSettingsPing(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxConcurrentStreams: 7, MaxHeaderListBytes: 9000})
	c := dial(t, addr)
	if c.settings[http2.SettingMaxConcurrentStreams] != 7 || c.settings[http2.SettingMaxHeaderListSize] != 9000 {
		t.Fatalf("advertised %v", c.settings)
	}
	c.until("the SETTINGS ack", func(f http2.Frame) bool {
		sf, ok := f.(*http2.SettingsFrame)
		return ok && sf.IsAck()
	})
	c.fr.WritePing(false, [8]byte{1, 2, 3})
	p := c.until("the PING ack", func(f http2.Frame) bool { _, ok := f.(*http2.PingFrame); return ok }).(*http2.PingFrame)
	if !p.IsAck() || p.Data != [8]byte{1, 2, 3} {
		t.Fatalf("ping answer %v", p)
	}
	c.check(1)
	if _, st := c.response(1); st != "0" {
		t.Fatalf("grpc-status %q", st)
	}

	// Not HTTP/2: closed.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(raw, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := io.ReadAll(raw); err != nil {
		t.Fatalf("an HTTP/1.1 request: %v, want the connection closed", err)
	}
}

// A client's GOAWAY refuses only streams the server would open: the
// client's own streams after it are still served, and the server's own
// GOAWAY on shutdown still comes.
func TestClientGoAwayLeavesItsStreamsServed(t *testing.T) {
	s, addr := serve(t, checkh2.Config{})
	c := dial(t, addr)
	c.check(1)
	if err := c.fr.WriteGoAway(0, http2.ErrCodeNo, nil); err != nil {
		t.Fatal(err)
	}
	c.check(3)
	for _, id := range []uint32{1, 3} {
		if _, st := c.response(id); st != "0" {
			t.Fatalf("stream %d after the client's GOAWAY: grpc-status %q, want 0", id, st)
		}
	}
	go s.Shutdown(context.Background())
	c.until("the server's GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok })
}

// A peer's window of 0 holds the response back until it opens the window.
func TestFlowControlZeroWindow(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	c := dial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	c.check(1)
	c.fr.WritePing(false, [8]byte{9})
	c.until("the PING ack", func(f http2.Frame) bool {
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 && len(d.Data()) > 0 {
			t.Fatal("DATA sent into a window of 0")
		}
		p, ok := f.(*http2.PingFrame)
		return ok && p.IsAck()
	})
	// Open it a byte at a time: every frame stays within the window.
	var got []byte
	for len(got) < 5 {
		c.fr.WriteWindowUpdate(1, 1)
		d := c.until("one byte of DATA", func(f http2.Frame) bool { _, ok := f.(*http2.DataFrame); return ok }).(*http2.DataFrame)
		if len(d.Data()) != 1 {
			t.Fatalf("%d bytes of DATA in a window of 1", len(d.Data()))
		}
		got = append(got, d.Data()...)
	}
	c.fr.WriteWindowUpdate(1, 1<<20)
	rest, st := c.response(1)
	if st != "0" {
		t.Fatalf("grpc-status %q", st)
	}
	n := binary.BigEndian.Uint32(got[1:5])
	if int(n) != len(rest) {
		t.Fatalf("message of %d bytes announced, %d sent", n, len(rest))
	}
}

// Received DATA is given back with connection WINDOW_UPDATEs, so a peer
// can send more than the window over time.
func TestFlowControlWindowUpdates(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxRecvMsgBytes: 64 << 10})
	c := dial(t, addr)
	// The server's initial connection WINDOW_UPDATE.
	w := c.until("the connection window", func(f http2.Frame) bool { _, ok := f.(*http2.WindowUpdateFrame); return ok }).(*http2.WindowUpdateFrame)
	window := int64(65535) + int64(w.Increment)
	msg := grpcMessage(t, func() proto.Message {
		r := upload("w")
		r.Attributes.Request.Http.Headers["x-pad"] = strings.Repeat("p", 60<<10)
		return r
	}())
	sent, granted, target := int64(0), int64(0), 2*window
	for id := uint32(1); sent < target; id += 2 {
		c.headers(id, "/envoy.service.auth.v3.Authorization/Check", false)
		for off := 0; off < len(msg); off += 16384 {
			end := min(off+16384, len(msg))
			for window-sent < int64(end-off) {
				if u, ok := c.read().(*http2.WindowUpdateFrame); ok && u.StreamID == 0 {
					window += int64(u.Increment)
					granted += int64(u.Increment)
				}
			}
			if err := c.fr.WriteData(id, end == len(msg), msg[off:end]); err != nil {
				t.Fatal(err)
			}
			sent += int64(end - off)
		}
	}
	if granted == 0 {
		t.Fatal("no WINDOW_UPDATE for received DATA")
	}
}

const checkPath = "/envoy.service.auth.v3.Authorization/Check"

// Streams past the advertised bound are refused, and the connection
// goes on.
func TestMaxConcurrentStreams(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxConcurrentStreams: 2})
	c := dial(t, addr)
	c.headers(1, checkPath, false)
	c.headers(3, checkPath, false)
	c.headers(5, checkPath, false)
	rst := c.until("RST_STREAM", func(f http2.Frame) bool { _, ok := f.(*http2.RSTStreamFrame); return ok }).(*http2.RSTStreamFrame)
	if rst.StreamID != 5 || rst.ErrCode != http2.ErrCodeRefusedStream {
		t.Fatalf("got RST_STREAM %d %v, want stream 5 REFUSED_STREAM", rst.StreamID, rst.ErrCode)
	}
	c.fr.WriteData(1, true, grpcMessage(t, upload("m")))
	if _, st := c.response(1); st != "0" {
		t.Fatalf("stream 1: grpc-status %q", st)
	}
	c.check(7) // a slot is free again
	if _, st := c.response(7); st != "0" {
		t.Fatalf("stream 7: grpc-status %q", st)
	}
}

// trailersOnly reads stream id's trailers-only answer and returns its
// grpc-status and whether the stream was then reset with NO_ERROR.
func (c *h2) trailersOnly(id uint32) (st string, resetNoError bool) {
	c.t.Helper()
	for {
		f := c.read()
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				c.t.Fatalf("stream %d: a response, not trailers only", id)
			}
			st = headerValue(f, "grpc-status")
			c.fr.WritePing(false, [8]byte{7})
			for {
				switch g := c.read().(type) {
				case *http2.RSTStreamFrame:
					if g.StreamID == id {
						resetNoError = g.ErrCode == http2.ErrCodeNo
					}
				case *http2.PingFrame:
					return st, resetNoError
				}
			}
		case *http2.RSTStreamFrame:
			c.t.Fatalf("stream %d reset %v before an answer", id, f.ErrCode)
		}
	}
}

// Requests the server refuses are answered with a gRPC status (and the
// stream reset when the client is still sending), the connection kept.
func TestRefusedRequests(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxRecvMsgBytes: 1 << 10, MaxHeaderListBytes: 1 << 10})
	refuses(t, addr, (*h2).check, []refusal{
		{"message over the max", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, false, []byte{0, 0, 0, 8, 0}) // announces 2 KiB
		}, "8", true},
		{"body over the max without a prefix of it", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, false, make([]byte, 2<<10))
		}, "8", true},
		{"header list over the max", func(c *h2) {
			// Over the bound, but within twice of it (past that, the
			// connection is closed: TestConnectionErrors).
			c.headers(1, checkPath, true, hpack.HeaderField{Name: "x-big", Value: strings.Repeat("b", 1000)})
		}, "8", false},
		{"compressed flag", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, true, []byte{1, 0, 0, 0, 0})
		}, "13", false},
		{"truncated message", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, true, []byte{0, 0, 0, 0, 9, 1})
		}, "13", false},
		{"no message", func(c *h2) { c.headers(1, checkPath, true) }, "13", false},
		{"two messages", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
		}, "13", false},
		{"undecodable message", func(c *h2) {
			c.headers(1, checkPath, false)
			c.fr.WriteData(1, true, []byte{0, 0, 0, 0, 2, 0xff, 0xff})
		}, "13", false},
		{"expired grpc-timeout", func(c *h2) {
			c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "1n"})
			time.Sleep(time.Millisecond)
			c.fr.WriteData(1, true, grpcMessage(c.t, upload("x")))
		}, "4", false},
		{"malformed grpc-timeout", func(c *h2) {
			c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-timeout", Value: "soon"})
		}, "13", true},
		{"grpc-encoding gzip", func(c *h2) {
			c.headers(1, checkPath, false, hpack.HeaderField{Name: "grpc-encoding", Value: "gzip"})
		}, "12", true},
		{"another method", func(c *h2) {
			c.headers(1, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", false)
		}, "12", true},
	})
}

// refusal is a request the server refuses with a gRPC status, the stream
// then reset with NO_ERROR when the client was still sending.
type refusal struct {
	name      string
	send      func(c *h2)
	status    string
	wantReset bool
}

// refuses sends each refusal on a connection of its own to addr, then
// next on stream 3 of it, which must be answered grpc-status 0: the
// connection is kept.
func refuses(t *testing.T, addr string, next func(c *h2, id uint32), cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			tc.send(c)
			st, reset := c.trailersOnly(1)
			if st != tc.status || reset != tc.wantReset {
				t.Fatalf("grpc-status %q reset %v, want %q reset %v", st, reset, tc.status, tc.wantReset)
			}
			next(c, 3)
			if _, st := c.response(3); st != "0" {
				t.Fatalf("the next call: grpc-status %q", st)
			}
		})
	}
}

// Protocol violations and floods end the connection with GOAWAY and the
// code the peer earned.
func TestConnectionErrors(t *testing.T) {
	_, addr := serve(t, checkh2.Config{MaxResetsPerSecond: 50, PingMinInterval: time.Minute, MaxHeaderListBytes: 4 << 10})
	for _, tc := range []struct {
		name string
		send func(c *h2)
		code http2.ErrCode
	}{
		{"rapid reset", func(c *h2) {
			for id := uint32(1); id < 400; id += 2 {
				c.headers(id, checkPath, false)
				c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
		}, http2.ErrCodeEnhanceYourCalm},
		{"ping flood", func(c *h2) {
			for i := range 10 {
				c.fr.WritePing(false, [8]byte{byte(i)})
			}
		}, http2.ErrCodeEnhanceYourCalm},
		{"CONTINUATION flood", func(c *h2) {
			c.hbuf.Reset()
			c.enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
			c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hbuf.Bytes()})
			c.hbuf.Reset()
			c.enc.WriteField(hpack.HeaderField{Name: "x-flood", Value: strings.Repeat("f", 4000)})
			for range 1000 {
				if c.fr.WriteContinuation(1, false, c.hbuf.Bytes()) != nil {
					return // the server has closed
				}
			}
		}, http2.ErrCodeProtocol},
		{"header list far over the max", func(c *h2) {
			c.headers(1, checkPath, true, hpack.HeaderField{Name: "x-big", Value: strings.Repeat("b", 15000)})
		}, http2.ErrCodeCompression}, // the decoder refuses a string longer than the list
		{"frame over the max size", func(c *h2) {
			c.fr.WriteData(1, false, make([]byte, 20000))
		}, http2.ErrCodeFrameSize},
		{"DATA on an idle stream", func(c *h2) { c.fr.WriteData(9, true, []byte{0}) }, http2.ErrCodeProtocol},
		{"even stream", func(c *h2) { c.headers(2, checkPath, true) }, http2.ErrCodeProtocol},
		{"DATA past the connection window", func(c *h2) {
			big := make([]byte, 16384)
			for id := uint32(1); id < 400; id += 2 {
				if c.tryHeaders(id, checkPath, false) != nil {
					return
				}
				for range 4 {
					if c.fr.WriteData(id, false, big) != nil {
						return
					}
				}
			}
		}, http2.ErrCodeFlowControl},
		{"connection window overflow", func(c *h2) { c.fr.WriteWindowUpdate(0, 1<<31-1) }, http2.ErrCodeFlowControl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, addr)
			tc.send(c)
			ga := c.closed()
			if ga == nil {
				t.Fatalf("closed without GOAWAY, want %v", tc.code)
			}
			if ga.ErrCode != tc.code {
				t.Fatalf("GOAWAY %v, want %v", ga.ErrCode, tc.code)
			}
		})
	}
}

// A response waiting for the window is dropped when its stream is reset,
// and the others still go out when the window opens.
func TestFlowControlResetWhileBlocked(t *testing.T) {
	_, addr := serve(t, checkh2.Config{})
	c := dial(t, addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	c.check(1)
	c.check(3)
	c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	c.check(5)
	c.fr.WritePing(false, [8]byte{2})
	c.until("the PING ack", func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && p.IsAck() })
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	done := map[uint32]bool{}
	for len(done) < 2 {
		f := c.read()
		id := f.Header().StreamID
		if id == 1 && f.Header().Type != http2.FrameSettings {
			t.Fatalf("a frame on the reset stream: %v", f)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamEnded() {
			if st := headerValue(h, "grpc-status"); st != "0" {
				t.Fatalf("stream %d: grpc-status %q", id, st)
			}
			done[id] = true
		}
	}
	if !done[3] || !done[5] {
		t.Fatalf("answered %v, want 3 and 5", done)
	}
}
