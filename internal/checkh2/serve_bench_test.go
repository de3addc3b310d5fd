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
	"google.golang.org/protobuf/proto"

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
	return serveCall(tb, nil, pathCheck, nil, extra)
}

// serveCall is serveCheck for a call of path with message msg, the
// rate limit service rl answering ShouldRateLimit; every call must be
// answered grpc-status 0.
func serveCall(tb testing.TB, rl checkwire.RateLimitServer, path string, msg []byte, extra []hpack.HeaderField) func(i int) {
	pre, err := checkwire.Prebuild(&authv3.CheckResponse{})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Config{Check: okCheck{dec: checkwire.NewDecoder(nil, false), ok: pre.Response()}, RateLimit: rl})
	if err != nil {
		tb.Fatal(err)
	}
	c := newConn(s, nil)
	var out bytes.Buffer
	var first bytes.Buffer
	sink := &switchWriter{w: &first}
	c.bw = bufio.NewWriter(sink)
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
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "a"}, {Name: "content-type", Value: "application/grpc"},
	}, extra...) {
		f.Sensitive = true
		enc.WriteField(f)
	}
	fr := http2.NewFramer(&out, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	hdrLen := out.Len()
	fr.WriteData(1, true, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...))
	req := out.Bytes()
	serve := func(i int) {
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
	// The first call's answer is read back: a response and grpc-status 0.
	serve(0)
	c.bw.Flush()
	sink.w = io.Discard
	rd := http2.NewFramer(nil, &first)
	rd.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var data, status bool
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			data = data || len(f.Data()) > 0
		case *http2.MetaHeadersFrame:
			for _, h := range f.RegularFields() {
				status = status || (h.Name == "grpc-status" && h.Value == "0")
			}
		}
	}
	if !data || !status {
		tb.Fatalf("%s: the first call was not answered with a message and grpc-status 0", path)
	}
	return func(i int) { serve(i + 1) }
}

// switchWriter writes to w, which may be swapped between calls.
type switchWriter struct{ w io.Writer }

func (s *switchWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

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
		b.Run(tc.name, func(b *testing.B) { benchServe(b, serveCheck(b, tc.extra)) })
	}
}

// TestServeCheckAllocations holds a check's allocations on the lean
// listener to their budget.
func TestServeCheckAllocations(t *testing.T) {
	for _, tc := range serveCheckCases {
		t.Run(tc.name, func(t *testing.T) { allocBudget(t, serveCheck(t, tc.extra), tc.allocs) })
	}
}

func benchServe(b *testing.B, serve func(int)) {
	b.ReportAllocs()
	for i := range b.N {
		serve(i)
	}
}

// allocBudget fails t when a call of serve allocates more than budget
// times.
func allocBudget(t *testing.T, serve func(int), budget float64) {
	if raceBuild {
		t.Skip("the race detector allocates on its own; make test runs this without it")
	}
	i := 0
	if got := testing.AllocsPerRun(200, func() { serve(i); i++ }); got > budget {
		t.Errorf("%.1f allocations per call, budget %.0f", got, budget)
	}
}

// serveRateLimitCases are ShouldRateLimit calls on the product's rate
// limit service, allowed (counted) and denied, with the server's own
// allocation budget of a check: the decision and its answer add none.
var serveRateLimitCases = []struct {
	name   string
	key    string
	allocs float64
}{{"allowed", "allowed", 15}, {"denied", "denied", 15}}

func serveRateLimit(tb testing.TB, key string) func(i int) {
	msg, err := proto.Marshal(RLSRequest(key, "tenant-1"))
	if err != nil {
		tb.Fatal(err)
	}
	return serveCall(tb, NewTestRLS(tb, nil), pathRateLimit, msg, nil)
}

// BenchmarkServeRateLimit is BenchmarkServeCheck for ShouldRateLimit.
func BenchmarkServeRateLimit(b *testing.B) {
	for _, tc := range serveRateLimitCases {
		b.Run(tc.name, func(b *testing.B) { benchServe(b, serveRateLimit(b, tc.key)) })
	}
}

// TestServeRateLimitAllocations holds a ShouldRateLimit call's allocations
// on the lean listener to their budget.
func TestServeRateLimitAllocations(t *testing.T) {
	for _, tc := range serveRateLimitCases {
		t.Run(tc.name, func(t *testing.T) { allocBudget(t, serveRateLimit(t, tc.key), tc.allocs) })
	}
}
