package checkwire

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// AppendGRPC appends r as one uncompressed gRPC message (the 5-byte
// prefix: flag 0 and the big-endian length, then the encoded
// CheckResponse), for a transport outside grpc-go. A Prebuilt is copied
// as is; a message is encoded as the Codec encodes it.
func (r Response) AppendGRPC(b []byte) ([]byte, error) {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0)
	switch {
	case r.pre != nil:
		b = append(b, r.pre.data...)
	case r.msg == nil:
		return b[:at], fmt.Errorf("checkwire: encode a response: no message")
	case Encodable(r.msg):
		b = AppendResponse(b, r.msg)
	default:
		var err error
		if b, err = (proto.MarshalOptions{}).MarshalAppend(b, r.msg); err != nil {
			return b[:at], fmt.Errorf("checkwire: encode a response: %w", err)
		}
	}
	binary.BigEndian.PutUint32(b[at+1:], uint32(len(b)-at-5))
	return b, nil
}

// Reset drops the received bytes and every view into them, keeping the
// room of the lookups for the next Decode: a transport that reuses one
// Request calls it after each call.
func (r *Request) Reset() { r.release() }
