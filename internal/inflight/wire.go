package inflight

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wirecode"
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

// encode appends m's encoding to b.
func (m *body) encode(b []byte) []byte {
	b = append(b, m.Kind)
	b = binary.AppendUvarint(b, uint64(len(m.Buckets)))
	for _, n := range m.Buckets {
		b = wirecode.AppendString(b, n)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for _, e := range m.Entries {
		b = e.append(b, m.Kind)
	}
	return b
}

func (e *wireEntry) append(b []byte, kind byte) []byte {
	b = binary.AppendUvarint(b, uint64(e.Bucket))
	b = wirecode.AppendString(b, e.Key)
	if kind == kindGauges {
		return binary.AppendUvarint(b, uint64(e.N))
	}
	return wirecode.AppendString(b, e.ID)
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
	d := wirecode.Decoder{B: data[1:], Malformed: errMalformed}
	nb := d.Count("buckets", maxBuckets, 2)
	for range nb {
		m.Buckets = append(m.Buckets, d.String("bucket name", 1, maxNameLen))
	}
	ne := d.Count("entries", 1<<31, minWireEntryLen)
	for range ne {
		if d.Err != nil {
			break
		}
		var e wireEntry
		bi := d.Uvarint("entry bucket")
		e.Key = d.String("entry key", 0, maxWireKeyLen)
		if m.Kind == kindGauges {
			n := d.Uvarint("entry count")
			if d.Err == nil && n > counter.MaxLimit {
				d.Fail("entry count %d", n)
			}
			e.N = int64(n)
		} else {
			e.ID = d.String("entry request id", 1, maxWireIDLen)
		}
		if d.Err == nil && bi >= uint64(len(m.Buckets)) {
			d.Fail("entry bucket %d of %d", bi, len(m.Buckets))
		}
		e.Bucket = int(bi)
		m.Entries = append(m.Entries, e)
	}
	d.End()
	return d.Err
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

// add appends one entry of bucket name, emitting the current body first
// when the entry would not fit in it. It reports false for an entry
// larger than a body on its own (dropped).
func (p *packer) add(name string, e wireEntry) bool {
	for {
		extra := 0
		bi, have := p.idx[name]
		if !have {
			bi = len(p.msg.Buckets)
			extra += wirecode.UvarintLen(uint64(len(name))) + len(name)
		}
		e.Bucket = bi
		extra += len(e.append(p.buf[:0], p.msg.Kind))
		nb := len(p.msg.Buckets)
		if !have {
			nb++
		}
		if p.size+extra+wirecode.UvarintLen(uint64(nb))+wirecode.UvarintLen(uint64(len(p.msg.Entries)+1)) <= p.max {
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
