package checkwire

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// RateLimitServer is the rate limit service (RLS v3 ShouldRateLimit) on
// the lean path.
type RateLimitServer interface {
	// RateLimitDecoder returns the decoder of the next call: the bounds
	// the service refuses requests beyond.
	RateLimitDecoder() *RateLimitDecoder
	// AppendShouldRateLimit decides on req, valid until it returns, and
	// appends the answer to b as one uncompressed gRPC message (see
	// AppendGRPC). An error is the call's gRPC status.
	AppendShouldRateLimit(ctx context.Context, req *RateLimitRequest, b []byte) ([]byte, error)
}

// rateLimitSchemas are the compiled schemas of a RateLimitRequest and of
// the messages the decoder reads in it, immutable once built.
type rateLimitSchemas struct {
	request, descriptor, entry, override, uint64Value *schema
}

var rateLimitSchema = sync.OnceValue(func() *rateLimitSchemas {
	memo := map[protoreflect.FullName]*schema{}
	s := &rateLimitSchemas{request: compileMessage((&rlsv3.RateLimitRequest{}).ProtoReflect().Descriptor(), memo)}
	s.descriptor = s.request.fields[2].msg
	s.entry = s.descriptor.fields[1].msg
	s.override = s.descriptor.fields[2].msg
	s.uint64Value = s.descriptor.fields[3].msg
	return s
})

// RateLimitDecoder reads a RateLimitRequest's wire form into a
// RateLimitRequest: the domain, the request's hits_addend and each
// descriptor's entries, limit (requests_per_unit, unit) and hits_addend,
// the strings as views into the input. Everything else is checked as
// proto.Unmarshal checks it and skipped, so it accepts and rejects exactly
// what proto.Unmarshal does. It keeps at most maxDescriptors+1
// descriptors and maxEntries+1 entries a descriptor (the rest is checked,
// not kept): enough for a service bounding them at maxDescriptors and
// maxEntries to refuse the request as it would the whole message.
// Immutable and safe for concurrent use.
type RateLimitDecoder struct {
	s                          *rateLimitSchemas
	maxDescriptors, maxEntries int
}

// NewRateLimitDecoder returns a decoder for a service refusing more than
// maxDescriptors descriptors or maxEntries entries in one descriptor.
func NewRateLimitDecoder(maxDescriptors, maxEntries int) *RateLimitDecoder {
	return &RateLimitDecoder{s: rateLimitSchema(), maxDescriptors: max(0, maxDescriptors), maxEntries: max(0, maxEntries)}
}

// RateLimitRequest is one ShouldRateLimit call's request: the message a
// RateLimitDecoder read, its strings views into the received bytes, its
// parts taken from pools it keeps for the next call. Not safe for
// concurrent use; the transport owns it and resets it after each call.
type RateLimitRequest struct {
	msg rlsv3.RateLimitRequest
	// The pools, and how many of each the current message uses.
	descs     []*ratelimitv3.RateLimitDescriptor
	entries   []*ratelimitv3.RateLimitDescriptor_Entry
	overrides []*ratelimitv3.RateLimitDescriptor_RateLimitOverride
	hits      []*wrapperspb.UInt64Value
	nd, ne    int
	no, nh    int
	ptrs      []*ratelimitv3.RateLimitDescriptor // behind msg.Descriptors
}

// maxPooled bounds what a RateLimitRequest keeps of each pool for the next
// call: parts beyond it (a request near the bounds) are left to the
// garbage collector.
const maxPooled = 256

// Message is the decoded request: read it, never keep or change it; its
// strings are valid until the call returns.
func (r *RateLimitRequest) Message() *rlsv3.RateLimitRequest { return &r.msg }

// Reset drops every view into the received bytes and returns the parts
// to the pools.
func (r *RateLimitRequest) Reset() {
	for _, d := range r.descs[:r.nd] {
		d.Entries = d.Entries[:0]
		d.Limit, d.HitsAddend = nil, nil
	}
	for _, e := range r.entries[:r.ne] {
		e.Key, e.Value = "", ""
	}
	for _, o := range r.overrides[:r.no] {
		o.RequestsPerUnit, o.Unit = 0, 0
	}
	for _, h := range r.hits[:r.nh] {
		h.Value = 0
	}
	clear(r.ptrs[:r.nd])
	r.descs, r.entries = trim(r.descs), trim(r.entries)
	r.overrides, r.hits = trim(r.overrides), trim(r.hits)
	if cap(r.ptrs) > maxPooled {
		r.ptrs = nil
	}
	r.msg.Domain, r.msg.Descriptors, r.msg.HitsAddend = "", nil, 0
	r.nd, r.ne, r.no, r.nh = 0, 0, 0, 0
}

func trim[T any](p []*T) []*T {
	if len(p) > maxPooled {
		clear(p[maxPooled:])
		return p[:maxPooled:maxPooled]
	}
	return p
}

// take returns the pool's next part, allocating one when all are in use.
func take[T any](pool *[]*T, used *int) *T {
	if *used == len(*pool) {
		*pool = append(*pool, new(T))
	}
	p := (*pool)[*used]
	*used++
	return p
}

// Decode reads b, a serialised RateLimitRequest, into r (reset first),
// whose strings are then views into b: b must not change while r is in
// use. On an error r holds no meaning (Reset it).
func (d *RateLimitDecoder) Decode(b []byte, r *RateLimitRequest) error {
	r.Reset()
	s := d.s.request
	depth := recursionLimit - 1
	for len(b) > 0 {
		num, typ, n := consumeTag(s, b)
		if n < 0 {
			return errMalformedTag(s)
		}
		b = b[n:]
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType:
			n, err = consumeString(s, num, b, &r.msg.Domain)
		case num == 2 && typ == protowire.BytesType:
			n, err = d.descriptor(r, b, depth)
		case num == 3 && typ == protowire.VarintType:
			var v uint64
			if v, n = protowire.ConsumeVarint(b); n < 0 {
				err = errMalformedField(s, num, n)
			}
			r.msg.HitsAddend = uint32(v)
		default:
			n, err = skip(s, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	r.msg.Descriptors = r.ptrs[:r.nd]
	return nil
}

// descriptor reads one element of descriptors at the start of b.
func (d *RateLimitDecoder) descriptor(r *RateLimitRequest, b []byte, depth int) (int, error) {
	s := d.s.descriptor
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, errMalformedField(d.s.request, 2, n)
	}
	if depth-1 < 0 {
		return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
	}
	depth--
	if r.nd > d.maxDescriptors {
		return n, (&walker{}).message(s, v, depth) // beyond the bound: checked only
	}
	desc := take(&r.descs, &r.nd)
	r.ptrs = append(r.ptrs[:r.nd-1], desc)
	for len(v) > 0 {
		num, typ, m := consumeTag(s, v)
		if m < 0 {
			return 0, errMalformedTag(s)
		}
		v = v[m:]
		var err error
		if typ != protowire.BytesType || num < 1 || num > 3 {
			m, err = skip(s, num, typ, v, depth)
		} else {
			var sub []byte
			if sub, m = protowire.ConsumeBytes(v); m < 0 {
				return 0, errMalformedField(s, num, m)
			}
			if depth-1 < 0 {
				return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
			}
			switch num {
			case 1:
				err = d.entry(r, desc, sub, depth-1)
			case 2:
				if desc.Limit == nil {
					desc.Limit = take(&r.overrides, &r.no)
				}
				err = d.override(desc.Limit, sub, depth-1)
			case 3:
				if desc.HitsAddend == nil {
					desc.HitsAddend = take(&r.hits, &r.nh)
				}
				err = d.uint64Value(desc.HitsAddend, sub, depth-1)
			}
		}
		if err != nil {
			return 0, err
		}
		v = v[m:]
	}
	return n, nil
}

// entry reads one entry (a new one: repeated fields append) into desc.
func (d *RateLimitDecoder) entry(r *RateLimitRequest, desc *ratelimitv3.RateLimitDescriptor, b []byte, depth int) error {
	s := d.s.entry
	if len(desc.Entries) > d.maxEntries {
		return (&walker{}).message(s, b, depth) // beyond the bound: checked only
	}
	e := take(&r.entries, &r.ne)
	desc.Entries = append(desc.Entries, e)
	for len(b) > 0 {
		num, typ, n := consumeTag(s, b)
		if n < 0 {
			return errMalformedTag(s)
		}
		b = b[n:]
		var err error
		switch {
		case num == 1 && typ == protowire.BytesType:
			n, err = consumeString(s, num, b, &e.Key)
		case num == 2 && typ == protowire.BytesType:
			n, err = consumeString(s, num, b, &e.Value)
		default:
			n, err = skip(s, num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// override merges b into o, as a repeated singular message merges.
func (d *RateLimitDecoder) override(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride, b []byte, depth int) error {
	s := d.s.override
	for len(b) > 0 {
		num, typ, n := consumeTag(s, b)
		if n < 0 {
			return errMalformedTag(s)
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return errMalformedField(s, num, m)
			}
			if num == 1 {
				o.RequestsPerUnit = uint32(v)
			} else {
				o.Unit = typev3.RateLimitUnit(int32(v)) // an open enum: any int32
			}
			b = b[m:]
			continue
		}
		m, err := skip(s, num, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

// uint64Value merges b, a google.protobuf.UInt64Value, into h.
func (d *RateLimitDecoder) uint64Value(h *wrapperspb.UInt64Value, b []byte, depth int) error {
	s := d.s.uint64Value
	for len(b) > 0 {
		num, typ, n := consumeTag(s, b)
		if n < 0 {
			return errMalformedTag(s)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return errMalformedField(s, num, m)
			}
			h.Value = v
			b = b[m:]
			continue
		}
		m, err := skip(s, num, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

// consumeTag reads a field's tag as proto.Unmarshal does: n < 0 for a bad
// tag, a field number out of range, or an end of group outside a group.
func consumeTag(s *schema, b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber || typ == protowire.EndGroupType {
		return 0, 0, -1
	}
	return num, typ, n
}

func errMalformedTag(s *schema) error {
	return fmt.Errorf("%w: bad tag in %s", ErrMalformed, s.md.FullName())
}

func errMalformedField(s *schema, num protowire.Number, n int) error {
	return fmt.Errorf("%w: field %d of %s: %v", ErrMalformed, num, s.md.FullName(), protowire.ParseError(n))
}

// consumeString reads a proto3 string field's value into *out, a view.
func consumeString(s *schema, num protowire.Number, b []byte, out *string) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, errMalformedField(s, num, n)
	}
	if !utf8.Valid(v) {
		return 0, fmt.Errorf("%w: field %d of %s", ErrInvalidUTF8, num, s.md.FullName())
	}
	*out = view(v)
	return n, nil
}

// skip checks and skips a field the decoder does not keep (unknown, or of
// a wire type its field does not have), as the Check decoder does.
func skip(s *schema, num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error) {
	return (&walker{}).field(s, s.field(num), num, typ, b, depth)
}
