package checkh2_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkh2"
	"github.com/ratelimit-authz/ratelimit-authz/internal/poll"
)

// seedFrames is a client's frames after the preface: SETTINGS, a Check,
// a health check and a ShouldRateLimit, a ping, a reset and a window
// update.
func seedFrames(t testing.TB) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	hdr := func(id uint32, path string, end bool) {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
			{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"}, {Name: "grpc-timeout", Value: "5S"},
		} {
			enc.WriteField(f)
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end})
	}
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10})
	hdr(1, checkPath, false)
	fr.WriteData(1, true, grpcMessage(t, upload("f")))
	hdr(3, "/grpc.health.v1.Health/Check", false)
	fr.WriteData(3, true, []byte{0, 0, 0, 0, 0})
	hdr(5, rlsPath, false)
	fr.WriteData(5, true, grpcMessage(t, checkh2.RLSRequest("tenant", "f")))
	fr.WritePing(false, [8]byte{1})
	hdr(7, checkPath, false)
	fr.WriteRSTStream(7, http2.ErrCodeCancel)
	fr.WriteWindowUpdate(1, 100)
	fr.WriteWindowUpdate(0, 100)
	fr.WriteGoAway(0, http2.ErrCodeNo, nil)
	return b.Bytes()
}

// stateFrames breaks the stream states (RFC 9113 §5.1, §5.3.1, §8.2.2):
// a request with a connection-specific header, PRIORITY and HEADERS
// depending on themselves, DATA on a closed stream, a client's trailers
// and a reused stream.
func stateFrames(t testing.TB) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	hdr := func(id uint32, end bool, prio http2.PriorityParam, extra ...hpack.HeaderField) {
		hb.Reset()
		for _, f := range append([]hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: checkPath},
			{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		}, extra...) {
			enc.WriteField(f)
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: end, Priority: prio})
	}
	fr.WriteSettings()
	hdr(1, false, http2.PriorityParam{}, hpack.HeaderField{Name: "connection", Value: "close"})
	fr.WritePriority(3, http2.PriorityParam{StreamDep: 3})
	hdr(5, false, http2.PriorityParam{StreamDep: 5, Weight: 1})
	hdr(7, false, http2.PriorityParam{})
	fr.WriteData(7, true, grpcMessage(t, upload("s")))
	fr.WriteData(7, true, []byte{0})
	hdr(9, false, http2.PriorityParam{})
	fr.WriteData(9, false, grpcMessage(t, upload("s")))
	hdr(9, true, http2.PriorityParam{})
	hdr(7, true, http2.PriorityParam{})
	return b.Bytes()
}

// FuzzServe feeds a connection the preface and then any bytes, and ends
// its input there: the server must neither panic nor hang. The
// connection is in memory and never waits (its reads return the input,
// then EOF; its writes are discarded), so an input ends as soon as the
// server has answered it and closed, with no timeout involved.
func FuzzServe(f *testing.F) {
	f.Add(seedFrames(f))
	f.Add(stateFrames(f))
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})
	f.Add(heldFrames(f))
	h := &holding{Server: newAuthz(f)}
	s, err := checkh2.New(checkh2.Config{
		Check: h, RateLimit: checkh2.NewTestRLS(f, nil), MaxRecvMsgBytes: 4 << 10, MaxHeaderListBytes: 4 << 10, MaxConcurrentStreams: 8,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &memConn{r: bytes.NewReader(append([]byte(http2.ClientPreface), in...)), closed: make(chan struct{})}
		s.ServeConn(c)
		select {
		case <-c.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection was still served 10 s after its input ended")
		}
		// Every hold ends once, as taken or given back, by the time the
		// connection is gone.
		poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
			if c, k, a := h.cancels.Load(), h.keeps.Load(), h.all.Load(); c+k != a {
				return errorf("%d holds given back and %d kept of %d", c, k, a)
			}
			return nil
		})
		if n := h.doubleEnds.Load(); n != 0 {
			t.Fatalf("%d holds ended twice", n)
		}
	})
}

// heldFrames: checks answered and then reset, a PING ack the server did
// not ask for, an ack of the server's own PING, and a repeated stream id.
func heldFrames(t testing.TB) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, id := range []uint32{1, 3, 5} {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: checkPath},
			{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"},
		} {
			enc.WriteField(f)
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, grpcMessage(t, upload("f")))
	}
	fr.WritePing(true, [8]byte{1})
	fr.WriteRSTStream(1, http2.ErrCodeCancel)
	fr.WritePing(true, [8]byte{'c', 'h', 'e', 'c', 'k', 'h', '2', 'h'})
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	fr.WriteRSTStream(3, http2.ErrCodeCancel)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: hb.Bytes(), EndHeaders: true})
	return b.Bytes()
}

// memConn is a connection whose reads return r and then EOF and whose
// writes are discarded. Safe for the one goroutine serving it, and Close
// from any.
type memConn struct {
	r      *bytes.Reader
	once   sync.Once
	closed chan struct{}
}

func (c *memConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *memConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *memConn) Close() error                     { c.once.Do(func() { close(c.closed) }); return nil }
func (c *memConn) LocalAddr() net.Addr              { return memAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return memAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "mem" }
