package inflight

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
)

// The body of a cast (replicate.Replicator.Cast seals, numbers and
// authenticates it; this is only what it carries). Integers are uvarints.
//
//	body     = kind (1 byte) · buckets · entries
//	buckets  = n · n × name (string)
//	kind 1, gauges:   entries = n · n × (bucket index · key (string) · requests in flight)
//	kind 2, releases: entries = n · n × (bucket index · key (string) · request id (string))
//	string   = length · bytes
//
// A body must end exactly after its last entry.

const (
	kindGauges   byte = 1
	kindReleases byte = 2
)

// Bounds the decoder enforces.
const (
	maxNameLen      = 255
	maxBuckets      = 1 << 12
	maxWireKeyLen   = 4096 // counter.max_key_bytes is at most 4096
	maxWireIDLen    = 1024 // above any MaxRequestIDBytes worth configuring
	minWireEntryLen = 3    // bucket index, empty key, one-byte count
)

// errMalformed is wrapped by decodeBody for any body it cannot read.
var errMalformed = errors.New("inflight: malformed cast")

// wireEntry is one gauge (N) or one release (ID) of a body.
type wireEntry struct {
	Bucket int // index into body.Buckets
	Key    string
	N      int64
	ID     string
}

// body is a decoded cast body; decodeBody reuses its slices.
type body struct {
	Kind    byte
	Buckets []string
	Entries []wireEntry
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encode appends m's encoding to b.
func (m *body) encode(b []byte) []byte {
	b = append(b, m.Kind)
	b = binary.AppendUvarint(b, uint64(len(m.Buckets)))
	for _, n := range m.Buckets {
		b = appendString(b, n)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for _, e := range m.Entries {
		b = e.append(b, m.Kind)
	}
	return b
}

func (e *wireEntry) append(b []byte, kind byte) []byte {
	b = binary.AppendUvarint(b, uint64(e.Bucket))
	b = appendString(b, e.Key)
	if kind == kindGauges {
		return binary.AppendUvarint(b, uint64(e.N))
	}
	return appendString(b, e.ID)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{errMalformed}, args...)...)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s: bad varint", what)
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) string(what string, minLen, maxLen int) string {
	n := d.uvarint(what)
	if d.err != nil {
		return ""
	}
	if n < uint64(minLen) || n > uint64(maxLen) || n > uint64(len(d.b)) {
		d.fail("%s: length %d outside [%d, %d] or past the end", what, n, minLen, min(maxLen, len(d.b)))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// count reads a table length, bounded by maxN and by what the rest of the
// body can hold at minLen bytes an item, so that a forged count cannot
// make decodeBody allocate more than the body's size warrants.
func (d *decoder) count(what string, maxN, minLen int) int {
	n := d.uvarint(what)
	if d.err == nil && (n > uint64(maxN) || n > uint64(len(d.b)/minLen)) {
		d.fail("%s: %d is too many", what, n)
	}
	if d.err != nil {
		return 0
	}
	return int(n)
}

// decodeBody reads data into m, reusing m's slices; its strings are
// copies. An error wraps errMalformed; m is then in an unspecified state.
func decodeBody(data []byte, m *body) error {
	m.Buckets, m.Entries = m.Buckets[:0], m.Entries[:0]
	if len(data) < 1 {
		return fmt.Errorf("%w: empty", errMalformed)
	}
	m.Kind = data[0]
	if m.Kind != kindGauges && m.Kind != kindReleases {
		return fmt.Errorf("%w: unknown kind %d", errMalformed, m.Kind)
	}
	d := decoder{b: data[1:]}
	nb := d.count("buckets", maxBuckets, 2)
	for range nb {
		m.Buckets = append(m.Buckets, d.string("bucket name", 1, maxNameLen))
	}
	ne := d.count("entries", 1<<31, minWireEntryLen)
	for range ne {
		if d.err != nil {
			break
		}
		var e wireEntry
		bi := d.uvarint("entry bucket")
		e.Key = d.string("entry key", 0, maxWireKeyLen)
		if m.Kind == kindGauges {
			n := d.uvarint("entry count")
			if d.err == nil && n > counter.MaxLimit {
				d.fail("entry count %d", n)
			}
			e.N = int64(n)
		} else {
			e.ID = d.string("entry request id", 1, maxWireIDLen)
		}
		if d.err == nil && bi >= uint64(len(m.Buckets)) {
			d.fail("entry bucket %d of %d", bi, len(m.Buckets))
		}
		e.Bucket = int(bi)
		m.Entries = append(m.Entries, e)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	return d.err
}

// packer packs entries into bodies of at most max bytes, each with the
// bucket names its entries need, and hands each full one to emit (which
// must not keep the slice).
type packer struct {
	max  int
	msg  body
	idx  map[string]int
	size int
	buf  []byte
	emit func([]byte)
}

func (p *packer) start(kind byte) {
	p.msg.Kind = kind
	p.msg.Buckets, p.msg.Entries = p.msg.Buckets[:0], p.msg.Entries[:0]
	if p.idx == nil {
		p.idx = map[string]int{}
	}
	clear(p.idx)
	p.size = 1
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// add appends one entry of bucket name, emitting the current body first
// when the entry would not fit in it. It reports false for an entry
// larger than a body on its own (dropped).
func (p *packer) add(name string, e wireEntry) bool {
	for {
		extra := 0
		bi, have := p.idx[name]
		if !have {
			bi = len(p.msg.Buckets)
			extra += uvarintLen(uint64(len(name))) + len(name)
		}
		e.Bucket = bi
		extra += len(e.append(p.buf[:0], p.msg.Kind))
		nb := len(p.msg.Buckets)
		if !have {
			nb++
		}
		if p.size+extra+uvarintLen(uint64(nb))+uvarintLen(uint64(len(p.msg.Entries)+1)) <= p.max {
			if !have {
				p.idx[name] = bi
				p.msg.Buckets = append(p.msg.Buckets, name)
			}
			p.msg.Entries = append(p.msg.Entries, e)
			p.size += extra
			return true
		}
		if len(p.msg.Entries) == 0 {
			return false
		}
		p.flush()
	}
}

// flush emits the current body if it has entries.
func (p *packer) flush() {
	if len(p.msg.Entries) == 0 {
		return
	}
	p.buf = p.msg.encode(p.buf[:0])
	p.emit(p.buf)
	p.start(p.msg.Kind)
}
