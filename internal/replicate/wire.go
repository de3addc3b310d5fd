package replicate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/ratelimit-authz/ratelimit-authz/internal/counter"
	"github.com/ratelimit-authz/ratelimit-authz/internal/wirecode"
)

// The wire format, version 1. All integers are varints (encoding/binary:
// unsigned LEB128, signed zigzag) except the 8-byte little-endian
// incarnation.
//
//	message  = magic "RL" · version (1 byte, 1) · kind (1 byte) · header · body
//	header   = node (string) · incarnation (8 bytes LE) · sent_at_ms (varint)
//	           · seq (uvarint) · [kind 3: flags (1 byte; bit 0 = last chunk)]
//	kind 1, batch:      limits · entries
//	kind 2, sync request: nothing
//	kind 3, sync reply:   limits · origins · entries (each with its origin)
//	kind 4, query:        body (string)
//	kind 5, answer:       body (string)
//	kind 6, cast:         body (string)
//	limits   = n (uvarint) · n × (bucket name (string) · scale_ms (uvarint) · algorithm (1 byte))
//	origins  = n (uvarint) · n × (node (string) · incarnation (8 bytes LE))
//	entries  = n (uvarint) · n × (limit index (uvarint) · window offset (varint)
//	           · key (string) · count (uvarint) · [kind 3: origin index (uvarint)])
//	string   = length (uvarint) · bytes
//
// A window is sent as its offset from the window that contains sent_at_ms
// at the entry's scale (floor(sent_at_ms / scale_ms)): −1, 0 or +1 in
// practice, one byte. A message must end exactly after its last entry.

// msgKind is the type of a message.
type msgKind uint8

const (
	// kindBatch carries the sender's own running counts that changed since
	// its previous batch.
	kindBatch msgKind = 1
	// kindSyncRequest asks every peer for its counts of the live windows
	// (warm start, and catching up after NATS comes back).
	kindSyncRequest msgKind = 2
	// kindSyncReply is one chunk of a peer's answer: every count it holds,
	// its own and those it merged, each with the node that made it.
	kindSyncReply msgKind = 3
	// kindQuery asks every peer one question (see query.go); kindAnswer
	// is a peer's answer, on the asker's inbox.
	kindQuery  msgKind = 4
	kindAnswer msgKind = 5
	// kindCast carries a body another component broadcasts to every peer
	// (see cast.go); its seq numbers the sender's casts.
	kindCast msgKind = 6
)

// wireVersion is the wire format version this package writes and reads.
const wireVersion = 1

// Bounds the decoder enforces.
const (
	maxNameLen = 255  // bucket names
	maxNodeLen = 128  // node ids: printable ASCII, see validNode
	maxKeyLen  = 4096 // counter.max_key_bytes is at most 4096
	maxLimits  = 1 << 12
	maxOrigins = 1 << 12
	// minEntryLen is the smallest encoded entry: limit, offset, empty key,
	// count, each one byte.
	minEntryLen = 4
)

var magic = [2]byte{'R', 'L'}

// Errors of decode. Both mean the message is dropped.
var (
	// errMalformed is wrapped by decode for any message it cannot read.
	errMalformed = errors.New("replicate: malformed message")
	// errVersion is wrapped by decode for a well-framed message of
	// another wire version (a node of a newer release during a rollout).
	errVersion = errors.New("replicate: unsupported wire version")
)

// header is the part of every message that says who sent it and when.
type header struct {
	Kind        msgKind
	Node        string // the sender's node id
	Incarnation uint64 // random per process start: a restarted node is a new peer
	SentAtMS    int64  // the sender's clock, unix ms
	Seq         uint64 // batch: per-incarnation message number; reply: chunk number
	Last        bool   // reply: this is the responder's last chunk
}

// wireLimit is an entry's bucket, by name, and the window it was counted in.
type wireLimit struct {
	Name      string
	ScaleMS   int64
	Algorithm counter.Algorithm
}

// origin is one process of the cluster: its node id, a name that
// processes may share (two started with one --node-id, or on one host),
// and its incarnation, random per process start. The pair is a node's
// identity everywhere: peers, shares, sync replies (the node that made a
// count), logs.
type origin struct {
	Node        string
	Incarnation uint64
}

// String is the identity as logs show it: node id/incarnation in hex.
func (o origin) String() string { return fmt.Sprintf("%s/%016x", o.Node, o.Incarnation) }

// origin is the sender of the message.
func (h *header) origin() origin { return origin{h.Node, h.Incarnation} }

// entry is one count: Limit and Origin index message.Limits and
// message.Origins.
type entry struct {
	Limit  int
	Origin int
	Window int64
	Key    string
	Count  int64
}

// message is a decoded message. decode reuses its slices.
type message struct {
	header
	Limits  []wireLimit
	Origins []origin
	Entries []entry
	// Body is a query's, an answer's or a cast's content.
	Body string
}

func appendHeader(b []byte, h *header) []byte {
	b = append(b, magic[0], magic[1], wireVersion, byte(h.Kind))
	b = wirecode.AppendString(b, h.Node)
	b = binary.LittleEndian.AppendUint64(b, h.Incarnation)
	b = binary.AppendVarint(b, h.SentAtMS)
	b = binary.AppendUvarint(b, h.Seq)
	if h.Kind == kindSyncReply {
		var f byte
		if h.Last {
			f = 1
		}
		b = append(b, f)
	}
	return b
}

// encode appends the encoding of m to b. Entries must index m.Limits (and
// m.Origins for a sync reply); encode does not check.
func (m *message) encode(b []byte) []byte {
	b = appendHeader(b, &m.header)
	switch m.Kind {
	case kindSyncRequest:
		return b
	case kindQuery, kindAnswer, kindCast:
		return wirecode.AppendString(b, m.Body)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Limits)))
	for _, l := range m.Limits {
		b = wirecode.AppendString(b, l.Name)
		b = binary.AppendUvarint(b, uint64(l.ScaleMS))
		b = append(b, byte(l.Algorithm))
	}
	if m.Kind == kindSyncReply {
		b = binary.AppendUvarint(b, uint64(len(m.Origins)))
		for _, o := range m.Origins {
			b = wirecode.AppendString(b, o.Node)
			b = binary.LittleEndian.AppendUint64(b, o.Incarnation)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for i := range m.Entries {
		b = m.appendEntry(b, &m.Entries[i])
	}
	return b
}

func (m *message) appendEntry(b []byte, e *entry) []byte {
	scale := m.Limits[e.Limit].ScaleMS
	b = binary.AppendUvarint(b, uint64(e.Limit))
	b = binary.AppendVarint(b, e.Window-counter.WindowOf(m.SentAtMS, scale))
	b = wirecode.AppendString(b, e.Key)
	b = binary.AppendUvarint(b, uint64(e.Count))
	if m.Kind == kindSyncReply {
		b = binary.AppendUvarint(b, uint64(e.Origin))
	}
	return b
}

// entryLen is the encoded length of e in m, whose limit has scale ms.
func (m *message) entryLen(e *entry, scale int64) int {
	n := wirecode.UvarintLen(uint64(e.Limit)) + wirecode.VarintLen(e.Window-counter.WindowOf(m.SentAtMS, scale)) +
		wirecode.UvarintLen(uint64(len(e.Key))) + len(e.Key) + wirecode.UvarintLen(uint64(e.Count))
	if m.Kind == kindSyncReply {
		n += wirecode.UvarintLen(uint64(e.Origin))
	}
	return n
}

// decoder reads a message (see package wirecode), recording the first
// error, which wraps errMalformed.
type decoder struct{ wirecode.Decoder }

// node reads a node id and checks it with validNode.
func (d *decoder) node(what string) string {
	s := d.String(what, 1, maxNodeLen)
	if d.Err == nil && !validNode(s) {
		d.Fail("%s %q: not printable ASCII", what, s)
		return ""
	}
	return s
}

// validNode reports whether s may be a node id: 1 to maxNodeLen bytes of
// printable ASCII without spaces. Node ids appear in logs; nothing else
// may reach a log line or a terminal from the wire.
func validNode(s string) bool {
	if len(s) == 0 || len(s) > maxNodeLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// decode reads data into m, reusing m's slices. The strings in m are
// copies: m does not keep data. Every error wraps errMalformed or
// errVersion; m is then in an unspecified state.
func decode(data []byte, m *message) error {
	m.header = header{}
	m.Limits, m.Origins, m.Entries, m.Body = m.Limits[:0], m.Origins[:0], m.Entries[:0], ""
	if len(data) < 4 || data[0] != magic[0] || data[1] != magic[1] {
		return fmt.Errorf("%w: no magic", errMalformed)
	}
	if data[2] != wireVersion {
		return fmt.Errorf("%w: version %d", errVersion, data[2])
	}
	m.Kind = msgKind(data[3])
	if m.Kind < kindBatch || m.Kind > kindCast {
		return fmt.Errorf("%w: unknown kind %d", errMalformed, data[3])
	}
	d := decoder{wirecode.Decoder{B: data[4:], Malformed: errMalformed}}
	m.Node = d.node("node")
	m.Incarnation = d.Uint64("incarnation")
	m.SentAtMS = d.Varint("sent_at")
	m.Seq = d.Uvarint("seq")
	if d.Err == nil && (m.SentAtMS < -1<<53 || m.SentAtMS > 1<<53) {
		d.Fail("sent_at %d out of range", m.SentAtMS)
	}
	if m.Kind == kindSyncReply {
		f := d.Byte("flags")
		if f&^1 != 0 {
			d.Fail("unknown flags %#x", f)
		}
		m.Last = f&1 != 0
	}
	switch m.Kind {
	case kindSyncRequest:
	case kindQuery, kindAnswer, kindCast:
		m.Body = d.String("body", 0, len(d.B))
	default:
		nl := d.Count("limits", maxLimits, 3)
		for range nl {
			l := wireLimit{Name: d.String("bucket name", 1, maxNameLen)}
			scale := d.Uvarint("scale")
			alg := d.Byte("algorithm")
			if d.Err != nil {
				break
			}
			if scale < 1 || scale > counter.MaxScaleMS || alg > byte(counter.Sliding) {
				d.Fail("limit %q: scale %d ms or algorithm %d out of range", l.Name, scale, alg)
				break
			}
			l.ScaleMS, l.Algorithm = int64(scale), counter.Algorithm(alg)
			m.Limits = append(m.Limits, l)
		}
		if m.Kind == kindSyncReply {
			no := d.Count("origins", maxOrigins, 10)
			for range no {
				o := origin{Node: d.node("origin node")}
				o.Incarnation = d.Uint64("origin incarnation")
				if d.Err != nil {
					break
				}
				m.Origins = append(m.Origins, o)
			}
		}
		ne := d.Count("entries", math.MaxInt32, minEntryLen)
		for range ne {
			e := d.entry(m)
			if d.Err != nil {
				break
			}
			m.Entries = append(m.Entries, e)
		}
	}
	d.End()
	return d.Err
}

func (d *decoder) entry(m *message) entry {
	var e entry
	li := d.Uvarint("entry limit")
	off := d.Varint("entry window")
	e.Key = d.String("entry key", 0, maxKeyLen)
	count := d.Uvarint("entry count")
	if m.Kind == kindSyncReply {
		oi := d.Uvarint("entry origin")
		if d.Err == nil && oi >= uint64(len(m.Origins)) {
			d.Fail("entry origin %d of %d", oi, len(m.Origins))
		}
		e.Origin = int(oi)
	}
	if d.Err != nil {
		return e
	}
	if li >= uint64(len(m.Limits)) {
		d.Fail("entry limit %d of %d", li, len(m.Limits))
		return e
	}
	// A sender only has counts of the window of its clock, the one before
	// (sliding) and, merged from a peer whose clock is ahead, the next.
	if off < -1 || off > 1 {
		d.Fail("entry window offset %d", off)
		return e
	}
	if count > counter.MaxCount {
		d.Fail("entry count %d", count)
		return e
	}
	e.Limit = int(li)
	e.Window = counter.WindowOf(m.SentAtMS, m.Limits[li].ScaleMS) + off
	e.Count = int64(count)
	return e
}

// errEntryTooLarge: one entry does not fit in a message of the size limit.
var errEntryTooLarge = errors.New("replicate: entry larger than the message size limit")

// splitter packs entries into messages of at most max bytes, each with the
// limit (and origin) tables its entries need, and hands each full message
// to emit. Its buffer is reused: emit must not keep the slice. Seq is
// numbered by the splitter, one per message.
type splitter struct {
	max       int
	msg       message
	limitIdx  map[wireLimit]int
	originIdx map[origin]int
	size      int // encoded size without the varint counts of the tables and entries
	buf       []byte
	emit      func([]byte) error
}

func newSplitter(max int, emit func([]byte) error) *splitter {
	return &splitter{max: max, emit: emit, limitIdx: map[wireLimit]int{}, originIdx: map[origin]int{}}
}

// start begins a new series of messages with header h (its Seq is the
// first message's).
func (s *splitter) start(h header) {
	s.msg.header = h
	s.clearBody()
}

func (s *splitter) clearBody() {
	s.msg.Limits, s.msg.Origins, s.msg.Entries = s.msg.Limits[:0], s.msg.Origins[:0], s.msg.Entries[:0]
	clear(s.limitIdx)
	clear(s.originIdx)
	s.size = len(appendHeader(s.buf[:0], &s.msg.header))
}

func (s *splitter) total(extra, limits, origins, entries int) int {
	n := s.size + extra + wirecode.UvarintLen(uint64(limits)) + wirecode.UvarintLen(uint64(entries))
	if s.msg.Kind == kindSyncReply {
		n += wirecode.UvarintLen(uint64(origins))
	}
	return n
}

// add appends one entry, emitting the current message first when the
// entry would not fit in it.
func (s *splitter) add(l wireLimit, o origin, window int64, key string, count int64) error {
	for {
		extra := 0
		li, haveL := s.limitIdx[l]
		if !haveL {
			li = len(s.msg.Limits)
			extra += wirecode.UvarintLen(uint64(len(l.Name))) + len(l.Name) + wirecode.UvarintLen(uint64(l.ScaleMS)) + 1
		}
		oi, haveO := 0, true
		if s.msg.Kind == kindSyncReply {
			if oi, haveO = s.originIdx[o]; !haveO {
				oi = len(s.msg.Origins)
				extra += wirecode.UvarintLen(uint64(len(o.Node))) + len(o.Node) + 8
			}
		}
		e := entry{Limit: li, Origin: oi, Window: window, Key: key, Count: count}
		extra += s.msg.entryLen(&e, l.ScaleMS)
		nl, no := len(s.msg.Limits), len(s.msg.Origins)
		if !haveL {
			nl++
		}
		if !haveO {
			no++
		}
		if s.total(extra, nl, no, len(s.msg.Entries)+1) <= s.max {
			if !haveL {
				s.limitIdx[l] = li
				s.msg.Limits = append(s.msg.Limits, l)
			}
			if !haveO {
				s.originIdx[o] = oi
				s.msg.Origins = append(s.msg.Origins, o)
			}
			s.msg.Entries = append(s.msg.Entries, e)
			s.size += extra
			return nil
		}
		if len(s.msg.Entries) == 0 {
			return errEntryTooLarge
		}
		if err := s.flush(false); err != nil {
			return err
		}
	}
}

// flush emits the current message if it has entries (or, when last is
// set, even without: a sync reply always ends with a last chunk).
func (s *splitter) flush(last bool) error {
	if len(s.msg.Entries) == 0 && !last {
		return nil
	}
	s.msg.Last = last
	s.buf = s.msg.encode(s.buf[:0])
	err := s.emit(s.buf)
	s.msg.Seq++
	s.msg.Last = false
	s.clearBody()
	return err
}
