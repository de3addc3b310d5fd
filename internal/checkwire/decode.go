package checkwire

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
)

// recursionLimit is the protobuf runtime's default nesting bound
// (protowire.DefaultRecursionLimit), counted the way proto.Unmarshal
// counts it: one per message and one per map entry.
const recursionLimit = protowire.DefaultRecursionLimit

// Errors Decode returns, wrapped with where they were found.
var (
	// ErrMalformed is a message that is not valid protobuf wire format:
	// a truncated varint or tag, a length past the end, a bad field number,
	// a reserved wire type, an unbalanced group, a bad packed field.
	ErrMalformed = errors.New("checkwire: malformed protobuf")
	// ErrInvalidUTF8 is a proto3 string field holding invalid UTF-8.
	ErrInvalidUTF8 = errors.New("checkwire: string field holds invalid UTF-8")
	// ErrTooDeep is a message nested deeper than the protobuf runtime
	// accepts.
	ErrTooDeep = errors.New("checkwire: message nested too deeply")
)

// checkRequest is the compiled schema, immutable once built.
var checkRequest = sync.OnceValue(compile)

// Decoder reads a CheckRequest's wire form into a checkreq.Request. It
// keeps only the headers named at construction and the body only when
// wanted; everything else is checked as proto.Unmarshal would check it
// (so it accepts and rejects exactly what proto.Unmarshal does) and
// skipped without allocating. A Decoder is immutable and safe for
// concurrent use.
type Decoder struct {
	root     *schema
	names    []string // headers kept
	wantBody bool
}

// NewDecoder returns a Decoder keeping the headers named by headerNames
// (lowercase, as Envoy sends them) and the body when wantBody.
func NewDecoder(headerNames []string, wantBody bool) *Decoder {
	return &Decoder{root: checkRequest(), names: append([]string(nil), headerNames...), wantBody: wantBody}
}

// Reader is what a consumer of decoded requests reads of them (the
// matcher's Engine): the headers it looks up and whether it reads the body.
type Reader interface {
	HeaderNames() []string
	WantsBody() bool
}

// ForEngine returns a Decoder keeping what e reads.
func ForEngine(e Reader) *Decoder {
	return NewDecoder(e.HeaderNames(), e.WantsBody())
}

// Decode reads b, a serialised CheckRequest, into out, whose strings are
// then views into b: b must not change while out is in use. Headers and
// context extensions not named are skipped; a repeated name takes its
// last value, as a protobuf map does. The lookups reuse the arrays behind
// out's Headers and ContextExtensions (so a reused Request decodes without
// allocating). On an error out holds no meaning.
func (d *Decoder) Decode(b []byte, out *checkreq.Request) error {
	hdrs, exts := out.Headers[:0], out.ContextExtensions[:0]
	*out = checkreq.Request{}
	w := walker{d: d, out: out, hdrs: hdrs, exts: exts}
	if err := w.message(d.root, b, recursionLimit-1); err != nil {
		return err
	}
	if !d.wantBody {
		w.body, w.rawBody = "", ""
	}
	out.Body = w.body
	if out.Body == "" {
		out.Body = w.rawBody // pack_as_bytes
	}
	out.Headers, out.ContextExtensions = w.hdrs, w.exts
	return nil
}

// walker holds one Decode's state. The source address is a oneof: peerCase
// says which case the merged message holds, so a later pipe address
// clears the socket address and a later socket address after it starts
// afresh, as the protobuf runtime's merging does.
type walker struct {
	d             *Decoder
	out           *checkreq.Request
	hdrs, exts    checkreq.Fields
	body, rawBody string
	socketCase    bool
}

// message walks the fields of one message of schema s; depth is what is
// left of the recursion bound.
func (w *walker) message(s *schema, b []byte, depth int) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: bad tag in %s", ErrMalformed, s.md.FullName())
		}
		b = b[n:]
		if typ == protowire.EndGroupType {
			return fmt.Errorf("%w: end of group outside a group in %s", ErrMalformed, s.md.FullName())
		}
		m, err := w.field(s, s.field(num), num, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

// field reads one field's value at the start of b and returns its length.
// A value whose wire type does not fit its field is an unknown field, as
// it is to the protobuf runtime: checked and skipped.
func (w *walker) field(s *schema, f field, num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error) {
	if f.kind == kMap {
		// The runtime counts a map entry as a level even before it looks
		// at the wire type.
		if depth-1 < 0 {
			return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
		}
	}
	if typ != protowire.BytesType || (f.kind == kScalar && f.role == roleNone) {
		n := protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("%w: field %d of %s: %v", ErrMalformed, num, s.md.FullName(), protowire.ParseError(n))
		}
		return n, nil
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, fmt.Errorf("%w: field %d of %s: %v", ErrMalformed, num, s.md.FullName(), protowire.ParseError(n))
	}
	switch f.kind {
	case kString:
		if !utf8.Valid(v) {
			return 0, fmt.Errorf("%w: field %d of %s", ErrInvalidUTF8, num, s.md.FullName())
		}
		w.set(f.role, view(v))
	case kMessage:
		if depth-1 < 0 {
			return 0, fmt.Errorf("%w: in %s", ErrTooDeep, s.md.FullName())
		}
		switch f.role {
		case roleSocket:
			if !w.socketCase {
				w.out.PeerAddress = "" // a new case: the old socket address is gone
			}
		case roleOtherAddr:
			// A pipe or internal address replaces the socket address;
			// a decode error below fails the whole message anyway.
			w.out.PeerAddress = ""
		}
		if err := w.message(f.msg, v, depth-1); err != nil {
			return 0, err
		}
		switch f.role {
		case roleSocket:
			w.socketCase = true
		case roleOtherAddr:
			w.socketCase = false
		}
	case kMap:
		if err := w.entry(f, v, depth-1); err != nil {
			return 0, err
		}
	case kPackedVarint:
		for len(v) > 0 {
			_, m := protowire.ConsumeVarint(v)
			if m < 0 {
				return 0, fmt.Errorf("%w: packed field %d of %s", ErrMalformed, num, s.md.FullName())
			}
			v = v[m:]
		}
	case kPackedFixed32, kPackedFixed64:
		size := 4
		if f.kind == kPackedFixed64 {
			size = 8
		}
		if len(v)%size != 0 {
			return 0, fmt.Errorf("%w: packed field %d of %s", ErrMalformed, num, s.md.FullName())
		}
	default:
		// bytes: any content. raw_body is the only one read.
		if f.role == roleRawBody {
			w.rawBody = view(v)
		}
	}
	return n, nil
}

// set stores a string field the decision reads.
func (w *walker) set(r role, v string) {
	switch r {
	case roleMethod:
		w.out.Method = v
	case rolePath:
		w.out.Path = v
	case roleBody:
		w.body = v
	case rolePeer:
		w.out.PeerAddress = v
	}
}

// entry walks one map entry (fields 1, key, and 2, value), as the
// runtime's map decoding does, and keeps it when the map is one the
// decision reads and the key one it names.
func (w *walker) entry(f field, b []byte, depth int) error {
	s := f.msg
	var key, val string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num > protowire.MaxValidNumber {
			return fmt.Errorf("%w: bad tag in %s", ErrMalformed, s.md.FullName())
		}
		b = b[n:]
		ef := s.field(num)
		if num > 2 {
			ef = field{}
		}
		if f.role != roleNone && ef.kind == kString && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return fmt.Errorf("%w: map entry of %s", ErrMalformed, s.md.FullName())
			}
			if !utf8.Valid(v) {
				return fmt.Errorf("%w: map entry of %s", ErrInvalidUTF8, s.md.FullName())
			}
			if num == 1 {
				key = view(v)
			} else {
				val = view(v)
			}
			b = b[m:]
			continue
		}
		m, err := w.field(s, ef, num, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[m:]
	}
	switch f.role {
	case roleHeaders:
		if name, ok := w.d.wanted(key); ok {
			w.hdrs = w.hdrs.Set(name, val)
		}
	case roleExtensions:
		if key == checkreq.ExtBuckets || key == checkreq.ExtRoute {
			w.exts = w.exts.Set(key, val)
		}
	}
	return nil
}

// wanted returns the kept header named key (the Decoder's own string, not
// a view), if any.
func (d *Decoder) wanted(key string) (string, bool) {
	for _, n := range d.names {
		if n == key {
			return n, true
		}
	}
	return "", false
}

// view is the bytes b as a string without a copy: valid while b is.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}
