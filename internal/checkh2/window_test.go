package checkh2

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
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

// frame returns the one frame write puts on the wire, as the server's
// framer reads it.
func frame(t *testing.T, write func(*http2.Framer) error) http2.Frame {
	t.Helper()
	var b bytes.Buffer
	if err := write(http2.NewFramer(&b, nil)); err != nil {
		t.Fatal(err)
	}
	f, err := http2.NewFramer(nil, &b).ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// blockResponses opens n streams and answers each with msg while the
// peer's stream windows are zero, so every answer waits.
func blockResponses(t *testing.T, c *conn, n int, msg []byte) {
	t.Helper()
	c.peerInitialWindow = 0
	for i := range n {
		st := c.newStream(uint32(2*i + 1))
		c.streams[st.id] = st
		c.maxStreamID = st.id
		if err := c.respond(st, msg); err != nil {
			t.Fatal(err)
		}
	}
}

// Frames that open no window a waiting response can use cost no work per
// waiting response: the queue the connection window serves holds only
// responses whose stream window is open, and no frame allocates.
func TestWindowFramesDoNoWorkPerWaitingResponse(t *testing.T) {
	c := unitConn(t, Config{})
	const n = 1000
	blockResponses(t, c, n, make([]byte, 100))
	c.connSend = 0
	if len(c.blocked) != 0 {
		t.Errorf("%d responses queued for the connection window with their stream windows shut", len(c.blocked))
	}
	settings := frame(t, func(fr *http2.Framer) error { return fr.WriteSettings() })
	sameWindow := frame(t, func(fr *http2.Framer) error {
		return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	})
	connUpdate := frame(t, func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 1) })
	for _, tc := range []struct {
		name string
		f    http2.Frame
	}{{"empty SETTINGS", settings}, {"SETTINGS of the same window", sameWindow}, {"connection WINDOW_UPDATE", connUpdate}} {
		allocs := testing.AllocsPerRun(100, func() {
			if err := c.handle(tc.f); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per frame with %d responses waiting", tc.name, allocs, n)
		}
		if len(c.blocked) != 0 {
			t.Errorf("%s: %d responses queued with their stream windows shut", tc.name, len(c.blocked))
		}
	}
	// The connection window now holds 101 bytes (an update per run, one
	// to warm up): one stream's update sends its answer and no other.
	if err := c.handle(frame(t, func(fr *http2.Framer) error { return fr.WriteWindowUpdate(1, 1000) })); err != nil {
		t.Fatal(err)
	}
	if c.streams[1] != nil || len(c.streams) != n-1 || c.connSend != 1 {
		t.Fatalf("after stream 1's update: stream 1 open %v, %d open, connection window %d; want 1 closed, %d open, 1", c.streams[1] != nil, len(c.streams), c.connSend, n-1)
	}
	// Stream updates with the connection window shut queue their stream
	// once, and allocate nothing once the queue has grown.
	c.connSend = 0
	update3 := frame(t, func(fr *http2.Framer) error { return fr.WriteWindowUpdate(3, 1) })
	allocs := testing.AllocsPerRun(100, func() {
		if err := c.handle(update3); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("stream WINDOW_UPDATE: %v allocations per frame", allocs)
	}
	if len(c.blocked) != 1 || c.blocked[0].id != 3 {
		t.Fatalf("queued %d responses, want stream 3 alone", len(c.blocked))
	}
	// A larger initial window opens every stream: the connection window
	// then serves them in order.
	if err := c.handle(frame(t, func(fr *http2.Framer) error {
		return fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
	})); err != nil {
		t.Fatal(err)
	}
	if len(c.blocked) != n-1 {
		t.Fatalf("%d responses queued after the initial window grew, want %d", len(c.blocked), n-1)
	}
	if err := c.handle(frame(t, func(fr *http2.Framer) error { return fr.WriteWindowUpdate(0, 100*n) })); err != nil {
		t.Fatal(err)
	}
	if len(c.streams) != 0 || len(c.blocked) != 0 {
		t.Fatalf("%d streams open, %d queued after the windows opened for all", len(c.streams), len(c.blocked))
	}
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

// initialWindow is a SETTINGS frame setting SETTINGS_INITIAL_WINDOW_SIZE
// to each of vals in turn.
func initialWindow(t *testing.T, vals ...uint32) http2.Frame {
	t.Helper()
	var s []http2.Setting
	for _, v := range vals {
		s = append(s, http2.Setting{ID: http2.SettingInitialWindowSize, Val: v})
	}
	return frame(t, func(fr *http2.Framer) error { return fr.WriteSettings(s...) })
}

func isCalm(err error) bool {
	ce, ok := err.(connError)
	return ok && ce.code == http2.ErrCodeEnhanceYourCalm
}

// A SETTINGS_INITIAL_WINDOW_SIZE change walks every open stream, bounded
// by MaxConcurrentStreams and allocating nothing; so a peer changing it
// with streams open more than maxWindowStrikes times within a second gets
// ENHANCE_YOUR_CALM, whether the changes come in many frames or in one,
// or with responses (health checks) between them, and a flood of them is
// no amplification.
func TestInitialWindowFloodBounded(t *testing.T) {
	const n = 1000
	up, down := initialWindow(t, 1000), initialWindow(t, 0)

	c := unitConn(t, Config{})
	blockResponses(t, c, n, make([]byte, 100))
	c.connSend = 0
	allocs := testing.AllocsPerRun(100, func() {
		c.windowStrikes = 0
		for _, f := range []http2.Frame{up, down} {
			if err := c.handle(f); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per change of the initial window with %d streams open", allocs, n)
	}

	for _, tc := range []struct {
		name   string
		frames []http2.Frame
	}{
		{"many frames", func() []http2.Frame {
			var fs []http2.Frame
			for range 500 {
				fs = append(fs, up, down)
			}
			return fs
		}()},
		{"one frame", []http2.Frame{initialWindow(t, slices.Repeat([]uint32{1000, 0}, 500)...)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := unitConn(t, Config{})
			blockResponses(t, c, n, make([]byte, 100))
			c.connSend = 0
			var err error
			handled := 0
			for _, f := range tc.frames {
				if err = c.handle(f); err != nil {
					break
				}
				handled++
			}
			if !isCalm(err) {
				t.Fatalf("after %d frames: %v, want ENHANCE_YOUR_CALM", handled, err)
			}
			if handled > maxWindowStrikes {
				t.Fatalf("%d frames changing the initial window let through, want at most %d", handled, maxWindowStrikes)
			}
		})
	}

	// A response between changes (a health check is a cheap one) does
	// not clear the strikes.
	c = unitConn(t, Config{})
	blockResponses(t, c, n, make([]byte, 100))
	c.connSend = 0
	var err error
	handled := 0
	for i := 0; i < 100 && err == nil; i++ {
		answered := c.newStream(uint32(1<<20 + 2*i + 1))
		c.streams[answered.id] = answered
		answered.send = 1000
		if err = c.respond(answered, []byte{0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		for _, f := range []http2.Frame{up, down} {
			if err = c.handle(f); err != nil {
				break
			}
			handled++
		}
	}
	if !isCalm(err) || handled > maxWindowStrikes {
		t.Fatalf("changes with a response between each pair: %d let through, then %v; want at most %d, then ENHANCE_YOUR_CALM", handled, err, maxWindowStrikes)
	}

	// Without streams open a change walks nothing and costs no strike;
	// changes a second apart are let through.
	c = unitConn(t, Config{})
	for range 100 {
		for _, f := range []http2.Frame{up, down} {
			if err := c.handle(f); err != nil {
				t.Fatalf("a change with no stream open: %v", err)
			}
		}
	}
	for i := range 100 {
		open := c.newStream(uint32(2*i + 1))
		c.streams[open.id] = open
		c.maxStreamID = open.id
		f := up
		if i%2 == 1 {
			f = down
		}
		if err := c.handle(f); err != nil {
			t.Fatalf("change %d, a second after the last: %v", i, err)
		}
		c.windowSince = c.windowSince.Add(-time.Second) // as if a second passed
		c.closeStream(open)
	}
}
