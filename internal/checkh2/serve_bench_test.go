package checkh2

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// okCheck allows every request with one prebuilt answer.
type okCheck struct {
	dec *checkwire.Decoder
	ok  checkwire.Response
}

func (o okCheck) Decoder() *checkwire.Decoder { return o.dec }
func (o okCheck) CheckWire(context.Context, *checkwire.Request) (checkwire.Response, error) {
	return o.ok, nil
}

// serveCheck returns one connection's work for a check, its frames
// handed to it (no network, no client), the request carrying extra
// header fields: the i-th call serves stream 2i+1.
func serveCheck(tb testing.TB, extra []hpack.HeaderField) func(i int) {
	pre, err := checkwire.Prebuild(&authv3.CheckResponse{})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Config{Check: okCheck{dec: checkwire.NewDecoder(nil, false), ok: pre.Response()}})
	if err != nil {
		tb.Fatal(err)
	}
	c := newConn(s, nil)
	var out bytes.Buffer
	c.bw = bufio.NewWriter(io.Discard)
	in := new(bytes.Buffer)
	c.fr = http2.NewFramer(c.bw, in)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.sawSettings = true
	// The request's frames, its header fields never indexed so the same
	// bytes decode alike each time; the stream id is patched in per check.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: pathCheck},
		{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"},
	}, extra...) {
		f.Sensitive = true
		enc.WriteField(f)
	}
	fr := http2.NewFramer(&out, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	hdrLen := out.Len()
	fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	req := out.Bytes()
	return func(i int) {
		id := uint32(2*i + 1)
		binary.BigEndian.PutUint32(req[5:9], id)
		binary.BigEndian.PutUint32(req[hdrLen+5:hdrLen+9], id)
		in.Write(req)
		c.connSend = defaultWindow // as the peer's WINDOW_UPDATEs would
		for range 2 {
			f, err := c.fr.ReadFrame()
			if err != nil {
				tb.Fatal(err)
			}
			if err := c.handle(f); err != nil {
				tb.Fatal(err)
			}
		}
		if len(c.streams) != 0 {
			tb.Fatalf("stream %d not answered", id)
		}
	}
}

var serveCheckCases = []struct {
	name  string
	extra []hpack.HeaderField
	// allocs is the budget of TestServeCheckAllocations: what the
	// server alone allocates per check (the frame reader's header strings
	// and stream state; with a timeout, its header's name and value).
	allocs float64
}{{"no-timeout", nil, 15}, {"grpc-timeout", []hpack.HeaderField{{Name: "grpc-timeout", Value: "200m"}}, 17}}

// BenchmarkServeCheck is one connection's work for a check, its frames
// handed to it (no network, no client), with and without a grpc-timeout:
// what the server alone allocates per check.
func BenchmarkServeCheck(b *testing.B) {
	for _, tc := range serveCheckCases {
		b.Run(tc.name, func(b *testing.B) {
			serve := serveCheck(b, tc.extra)
			b.ReportAllocs()
			for i := range b.N {
				serve(i)
			}
		})
	}
}

// TestServeCheckAllocations holds a check's allocations on the lean
// listener to their budget.
func TestServeCheckAllocations(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	for _, tc := range serveCheckCases {
		t.Run(tc.name, func(t *testing.T) {
			serve := serveCheck(t, tc.extra)
			i := 0
			got := testing.AllocsPerRun(200, func() { serve(i); i++ })
			if got > tc.allocs {
				t.Errorf("%.1f allocations per check, budget %.0f", got, tc.allocs)
			}
		})
	}
}
