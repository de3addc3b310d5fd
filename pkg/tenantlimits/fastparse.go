package tenantlimits

// A full reload of a million tenants decodes a million values, and
// encoding/json allocates dozens of times per row. Nearly every value
// has the one shape the database allows, printed the way jsonb prints it:
//
//	{"activity_create": {"limit": 200, "scale_ms": 1000}, "upload": {…}}
//
// fastEntries reads exactly that (any whitespace, either field order) with
// no allocation, and gives up on anything else, which then takes the
// general path (parseLimits) that explains what is wrong. A fuzz test holds
// the two to the same answers.

// maxFastEntries bounds the entries the fast path handles (more: slow path).
const maxFastEntries = 16

// fastEntry is one entry read by fastEntries; bucket aliases the input.
type fastEntry struct {
	bucket         []byte
	limit, scaleMS int64
}

// fastEntries decodes raw into dst and returns the entries and true, or
// false when raw is not plainly of the expected shape. It checks the shape
// only: bucket names, limits and windows are checked by the caller.
func fastEntries(raw []byte, dst *[maxFastEntries]fastEntry) ([]fastEntry, bool) {
	p := fastParser{b: raw}
	out := dst[:0]
	if !p.byte('{') {
		return nil, false
	}
	if p.byte('}') {
		return out, p.end()
	}
	for {
		name, ok := p.str()
		if !ok || !p.byte(':') || !p.byte('{') || len(out) == maxFastEntries {
			return nil, false
		}
		e := fastEntry{bucket: name, limit: -1, scaleMS: -1}
		for i := 0; i < 2; i++ {
			if i == 1 && !p.byte(',') {
				return nil, false
			}
			field, ok := p.str()
			if !ok || !p.byte(':') {
				return nil, false
			}
			n, ok := p.num()
			switch {
			case !ok:
				return nil, false
			case string(field) == "limit" && e.limit < 0:
				e.limit = n
			case string(field) == "scale_ms" && e.scaleMS < 0:
				e.scaleMS = n
			default:
				return nil, false
			}
		}
		if !p.byte('}') {
			return nil, false
		}
		for _, prev := range out {
			if string(prev.bucket) == string(e.bucket) {
				return nil, false // a repeated key: encoding/json's rules decide
			}
		}
		out = append(out, e)
		if p.byte('}') {
			return out, p.end()
		}
		if !p.byte(',') {
			return nil, false
		}
	}
}

type fastParser struct {
	b []byte
	i int
}

func (p *fastParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// byte consumes c (after whitespace) if it is next.
func (p *fastParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (p *fastParser) end() bool {
	p.space()
	return p.i == len(p.b)
}

// str reads a string of [a-z0-9_] only (anything else, escapes included,
// is for the slow path).
func (p *fastParser) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, len(s) > 0
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_':
			p.i++
		default:
			return nil, false
		}
	}
	return nil, false
}

// num reads a plain non-negative integer of at most 18 digits (no sign,
// fraction, exponent or leading zero).
func (p *fastParser) num() (int64, bool) {
	p.space()
	start := p.i
	var n int64
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' && p.i-start < 18 {
		n = n*10 + int64(p.b[p.i]-'0')
		p.i++
	}
	switch {
	case p.i == start:
		return 0, false
	case p.b[start] == '0' && p.i-start > 1:
		return 0, false
	case p.i < len(p.b) && (p.b[p.i] >= '0' && p.b[p.i] <= '9' || p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E'):
		return 0, false
	}
	return n, true
}
