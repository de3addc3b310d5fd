// Package checkgrpc puts the Check's wire layer (package checkwire) on
// grpc-go: a codec that hands a Check's received bytes to checkwire's
// decoder and sends its responses hand-encoded or prebuilt, the
// Authorization service's registration on it, and Settle, which ends what
// a decision reserved by whether its call is still live.
//
// Invariants: the codec changes nothing for the other services (health,
// RLS, the access log, reflection): their messages go to the standard
// proto codec. A Check's request strings are views into gRPC's receive
// buffer, kept until the handler returns. The Codec is safe for
// concurrent use.
package checkgrpc

import (
	"sync"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkwire"
)

// Codec is a gRPC server codec (grpc.ForceServerCodecV2) that decodes a
// *checkwire.Request with its Decoder, encodes a *checkwire.Prebuilt as
// its bytes and a CheckResponse of the shapes this product answers by
// hand (checkwire.Encodable); every other message goes to the standard
// proto codec.
type Codec struct {
	fallback encoding.CodecV2
	// prebuilt holds each Prebuilt answered as the buffer list gRPC
	// sends, made once: Prebuilt responses are a few constants a Service
	// makes when it is built, never per request or per reload.
	prebuilt sync.Map // *checkwire.Prebuilt → mem.BufferSlice
}

// NewCodec returns the codec; register the Authorization service with
// Register for its requests to take the lean path.
func NewCodec() *Codec {
	return &Codec{fallback: encoding.GetCodecV2(protocodec.Name)}
}

// Name is the standard codec's: the content-subtype stays "proto".
func (c *Codec) Name() string { return protocodec.Name }

// Unmarshal decodes data into v. A *checkwire.Request keeps a reference
// to data's buffer until it is reset, its strings being views into it.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*checkwire.Request)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	return r.DecodeBuffer(data.MaterializeToBuffer(mem.DefaultBufferPool()))
}

// Marshal encodes v.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *checkwire.Prebuilt:
		if s, ok := c.prebuilt.Load(m); ok {
			return s.(mem.BufferSlice), nil // read-only: the transport only reads it, Free is a no-op
		}
		s := mem.BufferSlice{mem.SliceBuffer(m.Bytes())}
		c.prebuilt.Store(m, s)
		return s, nil
	case *authv3.CheckResponse:
		if checkwire.Encodable(m) {
			return encodeResponse(m), nil
		}
	}
	return c.fallback.Marshal(v)
}

// encodeResponse encodes m (checkwire.Encodable) in one allocation.
func encodeResponse(m *authv3.CheckResponse) mem.BufferSlice {
	n := checkwire.ResponseSize(m)
	o := &encoded{}
	var b []byte
	if n <= len(o.small) {
		b = o.small[:0]
	} else {
		b = make([]byte, 0, n)
	}
	o.buf = mem.SliceBuffer(checkwire.AppendResponse(b, m))
	o.slice[0] = &o.buf // a pointer: no allocation to box it
	return o.slice[:]
}

// encoded is one encoded response with the gRPC buffer list pointing at it.
type encoded struct {
	slice [1]mem.Buffer
	buf   mem.SliceBuffer
	small [512]byte
}
