package checkwire

import (
	"context"
	"fmt"
	"math"
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
	// AppendGRPC), with what the decision reserved (nil: nothing), which
	// the caller ends. An error is the call's gRPC status.
	AppendShouldRateLimit(ctx context.Context, req *RateLimitRequest, b []byte) ([]byte, Hold, error)
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
// descriptor's entries, limit (requests_per_unit, unit), hits_addend and
// is_negative_hits, the strings as views into the input. Everything else is checked as
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
		d.Limit, d.HitsAddend, d.IsNegativeHits = nil, nil, false
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
	err := fields(s, b, recursionLimit-1, func(num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return consumeString(s, num, b, &r.msg.Domain)
		case num == 2 && typ == protowire.BytesType:
			return d.descriptor(r, b, depth)
		case num == 3 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			r.msg.HitsAddend = uint32(v)
			return n, nil // n < 0: fields reports it
		}
		return skipField, nil
	})
	r.msg.Descriptors = r.ptrs[:r.nd]
	return err
}

// descriptor reads one element of descriptors at the start of b.
func (d *RateLimitDecoder) descriptor(r *RateLimitRequest, b []byte, depth int) (int, error) {
	s := d.s.descriptor
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	if depth-1 < 0 {
		return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
	}
	if r.nd > d.maxDescriptors {
		return n, (&walker{}).message(s, v, depth-1) // beyond the bound: checked only
	}
	desc := take(&r.descs, &r.nd)
	r.ptrs = append(r.ptrs[:r.nd-1], desc)
	return n, fields(s, v, depth-1, func(num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error) {
		if num == 4 && typ == protowire.VarintType { // is_negative_hits
			v, m := protowire.ConsumeVarint(b)
			desc.IsNegativeHits = v != 0
			return m, nil // m < 0: fields reports it
		}
		if typ != protowire.BytesType || num < 1 || num > 3 {
			return skipField, nil
		}
		sub, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return m, nil
		}
		if depth-1 < 0 {
			return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
		}
		switch num {
		case 1:
			return m, d.entry(r, desc, sub, depth-1)
		case 2:
			if desc.Limit == nil {
				desc.Limit = take(&r.overrides, &r.no)
			}
			o := desc.Limit
			return m, varints(d.s.override, sub, depth-1, func(num protowire.Number, v uint64) bool {
				switch num {
				case 1:
					o.RequestsPerUnit = uint32(v)
				case 2:
					o.Unit = typev3.RateLimitUnit(int32(v)) // an open enum: any int32
				default:
					return false
				}
				return true
			})
		default:
			if desc.HitsAddend == nil {
				desc.HitsAddend = take(&r.hits, &r.nh)
			}
			h := desc.HitsAddend
			return m, varints(d.s.uint64Value, sub, depth-1, func(num protowire.Number, v uint64) bool {
				if num != 1 {
					return false
				}
				h.Value = v
				return true
			})
		}
	})
}

// entry reads one entry (a new one: repeated fields append) into desc.
func (d *RateLimitDecoder) entry(r *RateLimitRequest, desc *ratelimitv3.RateLimitDescriptor, b []byte, depth int) error {
	s := d.s.entry
	if len(desc.Entries) > d.maxEntries {
		return (&walker{}).message(s, b, depth) // beyond the bound: checked only
	}
	e := take(&r.entries, &r.ne)
	desc.Entries = append(desc.Entries, e)
	return fields(s, b, depth, func(num protowire.Number, typ protowire.Type, b []byte, _ int) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return consumeString(s, num, b, &e.Key)
		case num == 2 && typ == protowire.BytesType:
			return consumeString(s, num, b, &e.Value)
		}
		return skipField, nil
	})
}

// skipField is what a fields callback returns for a field it does not
// keep: fields checks and skips it as proto.Unmarshal would (an unknown
// field, or one of a wire type its field does not have).
const skipField = math.MinInt

// fields walks the fields of a message of schema s, b, depth being what
// is left of the recursion bound; read reads the value of one at the
// start of its b and returns its length (< 0: a protowire error) or
// skipField.
func fields(s *schema, b []byte, depth int, read func(num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber || typ == protowire.EndGroupType {
			return fmt.Errorf("%w: bad tag in %s", ErrMalformed, s.md.FullName())
		}
		b = b[n:]
		m, err := read(num, typ, b, depth)
		if m == skipField {
			m, err = (&walker{}).field(s, s.field(num), num, typ, b, depth)
		}
		if err != nil {
			return err
		}
		if m < 0 {
			return fmt.Errorf("%w: field %d of %s: %v", ErrMalformed, num, s.md.FullName(), protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}

// varints walks a message whose kept fields are varints: set stores one
// and reports whether it kept it; every other field is checked and
// skipped.
func varints(s *schema, b []byte, depth int, set func(num protowire.Number, v uint64) bool) error {
	return fields(s, b, depth, func(num protowire.Number, typ protowire.Type, b []byte, _ int) (int, error) {
		if typ != protowire.VarintType {
			return skipField, nil
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return n, nil
		}
		if !set(num, v) {
			return skipField, nil
		}
		return n, nil
	})
}

// consumeString reads a proto3 string field's value into *out, a view.
func consumeString(s *schema, num protowire.Number, b []byte, out *string) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil // fields reports it
	}
	if !utf8.Valid(v) {
		return 0, fmt.Errorf("%w: field %d of %s", ErrInvalidUTF8, num, s.md.FullName())
	}
	*out = view(v)
	return n, nil
}
