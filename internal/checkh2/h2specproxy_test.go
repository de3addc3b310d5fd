package checkh2_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// grpcShaper stands between h2spec and a server and makes h2spec's
// requests gRPC requests of the Check, without changing what each case
// tests: h2spec sends GET requests of its --path, which a gRPC server
// answers 405 at once, before the stream states, flow control and
// concurrency a case is about come into play.
//
// It passes every frame through as it is, but a request's header block:
// that it decodes (as the server would), makes POST with content-type
// application/grpc and te: trailers (what Envoy sends), re-encodes as
// literals never indexed (so the server's HPACK table stays empty, and a
// block h2spec meant to be invalid stays invalid there), and sends as
// HEADERS and CONTINUATION frames with the same stream, priority and
// flags. A request ended by its HEADERS gets its END_STREAM on a DATA
// frame with msg added after it, so it is a whole Check. A block the
// proxy cannot take apart (bad padding, a frame above the default maximum
// size, a stream a client does not open, a CONTINUATION missing or
// interrupted, HPACK h2spec made invalid on purpose) is passed through as it is, and so is everything after it:
// the case was about that error.
type grpcShaper struct {
	target string
	msg    []byte // a gRPC-framed request message
}

// serve accepts h2spec's connections on l until l is closed.
func (p *grpcShaper) serve(t *testing.T, l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go p.conn(t, c)
	}
}

func (p *grpcShaper) conn(t *testing.T, c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		t.Errorf("h2spec proxy: %v", err)
		return
	}
	defer s.Close()
	go func() {
		io.Copy(c, s)
		c.Close()
	}()
	r := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	n, _ := io.ReadFull(r, preface)
	if _, err := s.Write(preface[:n]); err != nil || string(preface[:n]) != http2.ClientPreface {
		io.Copy(s, r)
		return
	}
	var (
		dec     = hpack.NewDecoder(4096, nil)
		enc     bytes.Buffer
		henc    = hpack.NewEncoder(&enc)
		opened  = map[uint32]bool{}
		pending []byte // a header block's raw frames until END_HEADERS
		block   []byte // its fragments
		first   frameHead
		prio    []byte
	)
	raw := func(b ...[]byte) {
		for _, x := range b {
			s.Write(x)
		}
		io.Copy(s, r)
	}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			s.Write(pending)
			return
		}
		h := frameHead{length: int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2]), typ: http2.FrameType(hdr[3]), flags: http2.Flags(hdr[4]), stream: binary.BigEndian.Uint32(hdr[5:]) & (1<<31 - 1)}
		payload := make([]byte, h.length)
		if _, err := io.ReadFull(r, payload); err != nil {
			s.Write(pending)
			s.Write(hdr[:])
			s.Write(payload)
			return
		}
		frame := append(hdr[:], payload...)
		switch {
		case pending != nil && (h.typ != http2.FrameContinuation || h.stream != first.stream):
			raw(pending, frame)
			return
		case h.length > 16384, h.typ == http2.FrameHeaders && h.stream%2 == 0:
			// Above the default frame size, or on a stream a client does
			// not open: the case is about that error.
			raw(pending, frame)
			return
		case h.typ == http2.FrameHeaders && !opened[h.stream]:
			frag, pr, ok := headersFragment(h, payload)
			if !ok {
				raw(frame)
				return
			}
			first, prio, pending, block = h, pr, frame, append([]byte(nil), frag...)
		case h.typ == http2.FrameContinuation && pending != nil:
			pending, block = append(pending, frame...), append(block, payload...)
		default:
			s.Write(frame)
			continue
		}
		if !h.flags.Has(http2.FlagHeadersEndHeaders) {
			continue
		}
		fields, err := dec.DecodeFull(block)
		if err != nil {
			raw(pending)
			return
		}
		opened[first.stream] = true
		enc.Reset()
		var ctype, te bool
		for _, f := range fields {
			switch f.Name {
			case ":method":
				f.Value = "POST"
			case "content-type":
				ctype = true
			case "te":
				te = true
			}
			f.Sensitive = true
			henc.WriteField(f)
		}
		if !ctype {
			henc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc", Sensitive: true})
		}
		if !te {
			henc.WriteField(hpack.HeaderField{Name: "te", Value: "trailers", Sensitive: true})
		}
		end := first.flags.Has(http2.FlagHeadersEndStream)
		var out bytes.Buffer
		fr := http2.NewFramer(&out, nil)
		b := enc.Bytes()
		n := min(len(b), 16384-len(prio))
		param := http2.HeadersFrameParam{StreamID: first.stream, BlockFragment: b[:n], EndHeaders: n == len(b)}
		if prio != nil {
			param.Priority = http2.PriorityParam{StreamDep: binary.BigEndian.Uint32(prio) & (1<<31 - 1), Exclusive: prio[0]&0x80 != 0, Weight: prio[4]}
		}
		fr.WriteHeaders(param)
		for b = b[n:]; len(b) > 0; b = b[n:] {
			n = min(len(b), 16384)
			fr.WriteContinuation(first.stream, n == len(b), b[:n])
		}
		if end {
			fr.WriteData(first.stream, true, p.msg)
		}
		s.Write(out.Bytes())
		pending, block = nil, nil
	}
}

type frameHead struct {
	length int
	typ    http2.FrameType
	flags  http2.Flags
	stream uint32
}

// headersFragment returns a HEADERS payload's block fragment and its
// priority fields (nil without), or false when its padding is invalid.
func headersFragment(h frameHead, p []byte) (frag, prio []byte, ok bool) {
	pad := 0
	if h.flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return nil, nil, false
		}
		pad, p = int(p[0]), p[1:]
	}
	if h.flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return nil, nil, false
		}
		prio, p = p[:5], p[5:]
	}
	if pad > len(p) {
		return nil, nil, false
	}
	return p[:len(p)-pad], prio, true
}
