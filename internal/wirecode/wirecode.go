// Package wirecode reads and writes the parts of the compact binary
// messages the nodes exchange over NATS (package replicate's, and the
// in-flight gauges of package inflight inside them): varints (encoding/
// binary), fixed-width little-endian integers and length-prefixed strings.
//
// A Decoder reads each part bounded (a string's length, a table's count
// by what the rest can hold) and records the first error, so a decoder
// reads a whole message and checks once; it never allocates more than the
// message's size warrants. Safe for use by one goroutine at a time.
package wirecode

import (
	"encoding/binary"
	"fmt"
)

// Decoder reads a message from B, recording the first error in Err.
type Decoder struct {
	B   []byte // what is left to read
	Err error  // the first error; every error wraps Malformed
	// Malformed is the sentinel the errors wrap.
	Malformed error
}

// Fail records an error, unless one is recorded.
func (d *Decoder) Fail(format string, args ...any) {
	if d.Err == nil {
		d.Err = fmt.Errorf("%w: "+format, append([]any{d.Malformed}, args...)...)
	}
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint(what string) uint64 {
	if d.Err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Fail("%s: bad varint", what)
		return 0
	}
	d.B = d.B[n:]
	return x
}

// Varint reads a signed (zigzag) varint.
func (d *Decoder) Varint(what string) int64 {
	if d.Err != nil {
		return 0
	}
	x, n := binary.Varint(d.B)
	if n <= 0 {
		d.Fail("%s: bad varint", what)
		return 0
	}
	d.B = d.B[n:]
	return x
}

// Byte reads one byte.
func (d *Decoder) Byte(what string) byte {
	if d.Err != nil {
		return 0
	}
	if len(d.B) < 1 {
		d.Fail("%s: truncated", what)
		return 0
	}
	c := d.B[0]
	d.B = d.B[1:]
	return c
}

// Uint64 reads 8 bytes, little-endian.
func (d *Decoder) Uint64(what string) uint64 {
	if d.Err != nil {
		return 0
	}
	if len(d.B) < 8 {
		d.Fail("%s: truncated", what)
		return 0
	}
	x := binary.LittleEndian.Uint64(d.B)
	d.B = d.B[8:]
	return x
}

// String reads a length-prefixed string of minLen to maxLen bytes, a
// copy: the result does not keep the message.
func (d *Decoder) String(what string, minLen, maxLen int) string {
	n := d.Uvarint(what)
	if d.Err != nil {
		return ""
	}
	if n < uint64(minLen) || n > uint64(maxLen) || n > uint64(len(d.B)) {
		d.Fail("%s: length %d outside [%d, %d] or past the end", what, n, minLen, min(maxLen, len(d.B)))
		return ""
	}
	s := string(d.B[:n])
	d.B = d.B[n:]
	return s
}

// Count reads a table length, bounded by maxN and by what the rest of the
// message can hold at minLen bytes an item, so that a forged count cannot
// make the caller allocate more than the message's size warrants.
func (d *Decoder) Count(what string, maxN, minLen int) int {
	n := d.Uvarint(what)
	if d.Err != nil {
		return 0
	}
	if n > uint64(maxN) || n > uint64(len(d.B)/minLen) {
		d.Fail("%s: %d is too many", what, n)
		return 0
	}
	return int(n)
}

// End records an error when bytes are left: a message must end exactly
// after its last part.
func (d *Decoder) End() {
	if d.Err == nil && len(d.B) != 0 {
		d.Fail("%d trailing bytes", len(d.B))
	}
}

// AppendString appends s, length-prefixed.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// UvarintLen is the encoded length of x as an unsigned varint.
func UvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// VarintLen is the encoded length of x as a signed varint.
func VarintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return UvarintLen(ux)
}
