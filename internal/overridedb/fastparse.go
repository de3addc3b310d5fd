package overridedb

import "github.com/ratelimit-authz/ratelimit-authz/internal/jsonscan"

// A full reload of a million tenants decodes a million values, and
// encoding/json allocates dozens of times per row. Nearly every value
// has the one shape the database allows, printed the way jsonb prints it:
//
//	{"activity_create": {"limit": 200, "scale_ms": 1000}, "upload": {…}}
//
// FastEntries reads exactly that (any whitespace, either field order) with
// no allocation, and gives up on anything else, which then takes the
// general path (ParseLimits) that explains what is wrong. A fuzz test holds
// the two to the same answers.

// MaxFastEntries bounds the entries the fast path handles (more: slow path).
const MaxFastEntries = 16

// FastEntry is one entry read by FastEntries; Bucket aliases the input.
type FastEntry struct {
	Bucket         []byte
	Limit, ScaleMS int64
}

// FastEntries decodes raw into dst and returns the entries and true, or
// false when raw is not plainly of the expected shape. It checks the shape
// only: bucket names, limits and windows are checked by the caller.
func FastEntries(raw []byte, dst *[MaxFastEntries]FastEntry) ([]FastEntry, bool) {
	p := jsonscan.New(raw)
	out := dst[:0]
	if !p.Token('{') {
		return nil, false
	}
	if p.Token('}') {
		return out, p.End()
	}
	for {
		name, ok := plainName(&p)
		if !ok || !p.Token(':') || !p.Token('{') || len(out) == MaxFastEntries {
			return nil, false
		}
		e := FastEntry{Bucket: name, Limit: -1, ScaleMS: -1}
		for i := 0; i < 2; i++ {
			if i == 1 && !p.Token(',') {
				return nil, false
			}
			field, ok := plainName(&p)
			if !ok || !p.Token(':') {
				return nil, false
			}
			n, ok := p.Uint()
			switch {
			case !ok:
				return nil, false
			case string(field) == "limit" && e.Limit < 0:
				e.Limit = n
			case string(field) == "scale_ms" && e.ScaleMS < 0:
				e.ScaleMS = n
			default:
				return nil, false
			}
		}
		if !p.Token('}') {
			return nil, false
		}
		for _, prev := range out {
			if string(prev.Bucket) == string(e.Bucket) {
				return nil, false // a repeated key: encoding/json's rules decide
			}
		}
		out = append(out, e)
		if p.Token('}') {
			return out, p.End()
		}
		if !p.Token(',') {
			return nil, false
		}
	}
}

// plainName reads a non-empty string of [a-z0-9_] only, after whitespace
// (anything else, escapes included, is for the slow path).
func plainName(p *jsonscan.Scanner[[]byte]) ([]byte, bool) {
	p.Space()
	start, end, escaped := p.String()
	if start < 0 || escaped || start == end {
		return nil, false
	}
	s := p.Slice(start, end)
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return nil, false
		}
	}
	return s, true
}
