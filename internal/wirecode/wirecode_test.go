package wirecode_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ratelimit-authz/ratelimit-authz/internal/wirecode"
)

var errBad = errors.New("bad")

func TestDecoderReadsWhatIsWritten(t *testing.T) {
	b := wirecode.AppendString(nil, "héllo")
	b = binary.AppendUvarint(b, 300)
	b = binary.AppendVarint(b, -5)
	b = append(b, 7)
	b = binary.LittleEndian.AppendUint64(b, 1<<60)
	d := wirecode.Decoder{B: b, Malformed: errBad}
	if s, u, v, c, x := d.String("s", 0, 10), d.Uvarint("u"), d.Varint("v"), d.Byte("c"), d.Uint64("x"); s != "héllo" || u != 300 || v != -5 || c != 7 || x != 1<<60 {
		t.Fatalf("read %q %d %d %d %d", s, u, v, c, x)
	}
	d.End()
	if d.Err != nil {
		t.Fatal(d.Err)
	}
	if wirecode.UvarintLen(300) != 2 || wirecode.VarintLen(-5) != 1 || wirecode.VarintLen(-65) != 2 {
		t.Fatal("lengths")
	}
}

func TestDecoderBounds(t *testing.T) {
	for name, c := range map[string]struct {
		b    []byte
		read func(d *wirecode.Decoder)
	}{
		"string too long":      {wirecode.AppendString(nil, "abcdef"), func(d *wirecode.Decoder) { d.String("s", 0, 5) }},
		"string too short":     {wirecode.AppendString(nil, ""), func(d *wirecode.Decoder) { d.String("s", 1, 5) }},
		"string past the end":  {[]byte{9, 'a'}, func(d *wirecode.Decoder) { d.String("s", 0, 100) }},
		"count above the rest": {[]byte{3, 0, 0}, func(d *wirecode.Decoder) { d.Count("n", 100, 1) }},
		"count above max":      {[]byte{3, 0, 0, 0}, func(d *wirecode.Decoder) { d.Count("n", 2, 1) }},
		"bad varint":           {[]byte{0x80}, func(d *wirecode.Decoder) { d.Uvarint("u") }},
		"truncated uint64":     {[]byte{1, 2, 3}, func(d *wirecode.Decoder) { d.Uint64("x") }},
		"no byte":              {nil, func(d *wirecode.Decoder) { d.Byte("c") }},
		"trailing bytes":       {[]byte{1}, func(d *wirecode.Decoder) { d.End() }},
	} {
		d := wirecode.Decoder{B: c.b, Malformed: errBad}
		c.read(&d)
		if !errors.Is(d.Err, errBad) {
			t.Errorf("%s: error %v", name, d.Err)
		}
		// The first error stays; later reads read nothing.
		first := d.Err
		if d.Uvarint("after") != 0 || d.Err != first {
			t.Errorf("%s: a read after the error", name)
		}
	}
}
