// Package jsonscan reads JSON (RFC 8259) in place, without building values
// and without allocating: a Scanner walks a document held in a string or a
// byte slice, validating what it passes and handing back the bounds of the
// strings and the integers its caller wants. It serves hot paths that look
// at one or two members of a small document (a login body's account, a
// stored override), where encoding/json would allocate per value.
//
// A Scanner never reads past its input and never recurses deeper than
// MaxDepth; anything malformed is a false or a negative start, never a
// panic. Its input is expected to be valid UTF-8 where strings matter
// (callers check it); bytes of strings are passed through unchecked.
// A Scanner is a value owned by one goroutine.
package jsonscan

import (
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth bounds the nesting Value accepts: deeper is malformed.
const MaxDepth = 64

// Scanner reads one JSON document. The zero Scanner reads an empty one.
type Scanner[T ~string | ~[]byte] struct {
	s T
	i int
}

// New returns a Scanner at the start of s.
func New[T ~string | ~[]byte](s T) Scanner[T] { return Scanner[T]{s: s} }

// Space skips whitespace.
func (p *Scanner[T]) Space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// Peek returns the next byte, 0 at the end.
func (p *Scanner[T]) Peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

// Eat consumes c if it is the next byte.
func (p *Scanner[T]) Eat(c byte) bool {
	if p.Peek() == c {
		p.i++
		return true
	}
	return false
}

// Token skips whitespace, then consumes c if it is next.
func (p *Scanner[T]) Token(c byte) bool {
	p.Space()
	return p.Eat(c)
}

// End skips whitespace and reports whether the input is exhausted.
func (p *Scanner[T]) End() bool {
	p.Space()
	return p.i == len(p.s)
}

// Slice returns the input between two offsets String returned.
func (p *Scanner[T]) Slice(start, end int) T { return p.s[start:end] }

// String scans a string at the current position and returns the bounds of
// its contents (still escaped) and whether it holds escapes; start is -1
// when there is no well-formed string there.
func (p *Scanner[T]) String() (start, end int, escaped bool) {
	if !p.Eat('"') {
		return -1, 0, false
	}
	start = p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			end = p.i
			p.i++
			return start, end, escaped
		case c < 0x20:
			return -1, 0, false
		case c == '\\':
			escaped = true
			if p.i+1 >= len(p.s) {
				return -1, 0, false
			}
			switch p.s[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if _, ok := hex4(p.s, p.i+2); !ok {
					return -1, 0, false
				}
				p.i += 6
			default:
				return -1, 0, false
			}
		default:
			p.i++
		}
	}
	return -1, 0, false
}

// Value skips one value at the current position, of nesting depth depth
// (1 for a member of the top-level object); false when it is malformed or
// nested deeper than MaxDepth.
func (p *Scanner[T]) Value(depth int) bool {
	if depth > MaxDepth {
		return false
	}
	switch c := p.Peek(); {
	case c == '"':
		s, _, _ := p.String()
		return s >= 0
	case c == '{':
		p.i++
		if p.Token('}') {
			return true
		}
		for {
			p.Space()
			if s, _, _ := p.String(); s < 0 {
				return false
			}
			if !p.Token(':') {
				return false
			}
			p.Space()
			if !p.Value(depth + 1) {
				return false
			}
			if p.Token('}') {
				return true
			}
			if !p.Eat(',') {
				return false
			}
		}
	case c == '[':
		p.i++
		if p.Token(']') {
			return true
		}
		for {
			p.Space()
			if !p.Value(depth + 1) {
				return false
			}
			if p.Token(']') {
				return true
			}
			if !p.Eat(',') {
				return false
			}
		}
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	}
	return false
}

func (p *Scanner[T]) literal(w string) bool {
	if len(p.s)-p.i < len(w) {
		return false
	}
	for j := 0; j < len(w); j++ {
		if p.s[p.i+j] != w[j] {
			return false
		}
	}
	p.i += len(w)
	return true
}

func (p *Scanner[T]) digits() int {
	n := 0
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

func (p *Scanner[T]) number() bool {
	p.Eat('-')
	switch {
	case p.Eat('0'):
	case p.digits() == 0:
		return false
	}
	if p.Eat('.') && p.digits() == 0 {
		return false
	}
	if p.Eat('e') || p.Eat('E') {
		if !p.Eat('+') {
			p.Eat('-')
		}
		if p.digits() == 0 {
			return false
		}
	}
	return true
}

// Uint skips whitespace and reads a plain non-negative integer of at most
// 18 digits (so it fits an int64): no sign, fraction, exponent or leading
// zero. ok is false for any other number, or none.
func (p *Scanner[T]) Uint() (n int64, ok bool) {
	p.Space()
	start := p.i
	for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' && p.i-start < 18 {
		n = n*10 + int64(p.s[p.i]-'0')
		p.i++
	}
	switch {
	case p.i == start:
		return 0, false
	case p.s[start] == '0' && p.i-start > 1:
		return 0, false
	case p.i < len(p.s) && (p.s[p.i] >= '0' && p.s[p.i] <= '9' || p.s[p.i] == '.' || p.s[p.i] == 'e' || p.s[p.i] == 'E'):
		return 0, false
	}
	return n, true
}

// hex4 decodes the four hex digits at s[i:].
func hex4[T ~string | ~[]byte](s T, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for j := i; j < i+4; j++ {
		c := s[j]
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// Unescape decodes the contents of a well-formed JSON string (as String
// bounds them) as encoding/json does: a lone surrogate becomes U+FFFD.
func Unescape(s string) string { return string(AppendUnescape(make([]byte, 0, len(s)), s)) }

// AppendUnescape is Unescape appending to dst: with a dst of enough
// capacity on the caller's stack, it does not allocate.
func AppendUnescape(dst []byte, s string) []byte {
	b := dst
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b = append(b, c)
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, _ := hex4(s, i+2)
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if r2, ok := hex4(s, i+2); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							b = utf8.AppendRune(b, d)
							i += 6
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			b = utf8.AppendRune(b, r)
			continue
		default: // '"', '\\', '/'
			b = append(b, s[i+1])
		}
		i += 2
	}
	return b
}
