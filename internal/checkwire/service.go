package checkwire

import (
	"context"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// Server is the Authorization service on the lean path.
type Server interface {
	// Decoder returns the decoder of the next check: what the current
	// configuration reads.
	Decoder() *Decoder
	// CheckWire decides on req, valid until it returns. It may decode req
	// again with another Decoder (DecodeWith) when the configuration
	// changed since Decoder was called. The caller ends the Response's
	// Hold, if any.
	CheckWire(ctx context.Context, req *Request) (Response, error)
}

// Request is one Check call's request: the received bytes, referenced for
// the duration of the call, and what a Decoder read from them (views into
// those bytes). Not safe for concurrent use; the handler owns it.
type Request struct {
	d   *Decoder
	buf Buffer // the received message, referenced; nil after Decode
	raw []byte // the bytes given to Decode
	req checkreq.Request
}

// Buffer is a received message that a Request references until it is
// reset: its bytes, and Free, which hands them back to their pool
// (grpc-go's mem.Buffer is one).
type Buffer interface {
	ReadOnlyData() []byte
	Free()
}

// SetDecoder makes d the decoder of the request's next DecodeBuffer.
func (r *Request) SetDecoder(d *Decoder) { r.d = d }

// DecodeBuffer decodes buf, the received message, with the request's
// decoder (SetDecoder), and keeps buf until Reset: the request's strings
// are views into it.
func (r *Request) DecodeBuffer(buf Buffer) error {
	r.buf = buf
	return r.d.Decode(buf.ReadOnlyData(), &r.req)
}

// Decode decodes b with d into r, outside gRPC (in-process benchmarks and
// tests): b must not change while r is in use.
func (r *Request) Decode(d *Decoder, b []byte) error {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	r.raw = b
	return r.DecodeWith(d)
}

// Decoder is the decoder req was decoded with.
func (r *Request) Decoder() *Decoder { return r.d }

// Request is the decoded request; its strings are valid until the call
// returns (copy what must outlive it).
func (r *Request) Request() *checkreq.Request { return &r.req }

// DecodeWith decodes the received bytes again with d.
func (r *Request) DecodeWith(d *Decoder) error {
	r.d = d
	b := r.raw
	if r.buf != nil {
		b = r.buf.ReadOnlyData()
	}
	return d.Decode(b, &r.req)
}

// release drops the buffer and every view into it.
func (r *Request) release() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	r.raw = nil
	h, e := r.req.Headers, r.req.ContextExtensions
	clear(h[:cap(h)])
	clear(e[:cap(e)])
	r.req = checkreq.Request{Headers: h[:0], ContextExtensions: e[:0]}
	r.d = nil
}
