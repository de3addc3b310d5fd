package match

import "strings"

// maxPathBytes bounds the path (without its query string) that is matched
// against templates. A longer path matches no route.
const maxPathBytes = 8 << 10

// routePath cuts the raw :path at its query string or fragment and
// normalises what is left. ok is false when the result cannot match any
// route: it does not start with "/" (e.g. "*" or an absolute URI) or it is
// longer than maxPathBytes (tooLong).
func routePath(raw string) (p string, tooLong, ok bool) {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i]
	}
	if len(raw) > maxPathBytes {
		return "", true, false
	}
	if raw == "" || raw[0] != '/' {
		return "", false, false
	}
	if !needsNormalize(raw) {
		return raw, false, true
	}
	return normalizePath(raw), false, true
}

// needsNormalize reports whether normalizePath would change p. It does not
// allocate: most paths Envoy sends are already normalised, by Envoy itself.
func needsNormalize(p string) bool {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '\\':
			return true
		case '%':
			if c, ok := unescapeAt(p, i); ok && decodedByNormalize(c) {
				return true
			}
		case '/':
			rest := p[i+1:]
			if rest == "" {
				continue
			}
			if rest[0] == '/' {
				return true
			}
			if rest[0] == '.' {
				if len(rest) == 1 || rest[1] == '/' {
					return true
				}
				if rest[1] == '.' && (len(rest) == 2 || rest[2] == '/') {
					return true
				}
			}
		}
	}
	return false
}

// normalizePath applies what Envoy's HCM normalize_path (Chromium's URL path
// canonicaliser, RFC 3986 §6.2.2) and then merge_slashes do to the path p
// (starting with "/"):
//   - "\" becomes "/";
//   - a percent-escape of a letter, digit, "-", ".", "_" or "~" is decoded
//     (hex case is kept for every other escape, as Envoy keeps it), and a
//     "%" that only becomes an escape through that decoding is escaped as
//     "%25", so the result is stable;
//   - "." and ".." segments are resolved as RFC 3986 remove_dot_segments
//     does, never above the root, with empty segments counting as segments
//     (Envoy resolves dots before it merges slashes);
//   - runs of "/" are merged into one.
//
// Envoy additionally escapes characters its codecs rarely let through (space,
// non-ASCII) and rejects a few paths outright; those are left as they are.
func normalizePath(p string) string {
	var stack [256]byte
	b := stack[:0]
	if len(p) > len(stack) {
		b = make([]byte, 0, len(p))
	}
	// Decode the escapes normalize_path decodes and turn "\" into "/".
	bad := -1 // index in b of the last "%" that began no valid escape
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch c {
		case '\\':
			c = '/'
		case '%':
			if d, ok := unescapeAt(p, i); !ok {
				bad = len(b)
			} else if decodedByNormalize(d) {
				c = d
				i += 2
			}
		}
		b = append(b, c)
		if bad >= 0 && len(b) == bad+3 {
			// Decoding must not create an escape ("%%341" → "%41") that a
			// second pass would decode: like Envoy, escape that "%".
			x, y := b[bad+1], b[bad+2]
			_, okx := unhex(x)
			_, oky := unhex(y)
			if okx && oky {
				b = append(b[:bad+1], '2', '5', x, y)
			}
			bad = -1
		}
	}
	b = removeDotSegments(b)
	b = mergeSlashes(b)
	return string(b)
}

// removeDotSegments resolves "." and ".." segments of b (which starts with
// "/") in place. A trailing "." or ".." leaves a trailing "/".
func removeDotSegments(b []byte) []byte {
	w := 0 // b[:w] is the output: "/seg" repeated
	for r := 0; r < len(b); {
		s := r + 1 // b[r] == '/'
		e := s
		for e < len(b) && b[e] != '/' {
			e++
		}
		seg := b[s:e]
		last := e == len(b)
		switch {
		case len(seg) == 1 && seg[0] == '.':
			if last {
				b[w] = '/'
				w++
			}
		case len(seg) == 2 && seg[0] == '.' && seg[1] == '.':
			for w > 0 {
				w--
				if b[w] == '/' {
					break
				}
			}
			if last {
				b[w] = '/'
				w++
			}
		default:
			b[w] = '/'
			w += 1 + copy(b[w+1:], seg)
		}
		r = e
	}
	if w == 0 {
		b[0] = '/'
		w = 1
	}
	return b[:w]
}

// mergeSlashes collapses each run of "/" in b into one, in place.
func mergeSlashes(b []byte) []byte {
	w := 0
	for r := 0; r < len(b); r++ {
		if b[r] == '/' && w > 0 && b[w-1] == '/' {
			continue
		}
		b[w] = b[r]
		w++
	}
	return b[:w]
}

// unescapeAt decodes the percent-escape at s[i] ('%').
func unescapeAt(s string, i int) (byte, bool) {
	if i+2 >= len(s) {
		return 0, false
	}
	h, ok1 := unhex(s[i+1])
	l, ok2 := unhex(s[i+2])
	return h<<4 | l, ok1 && ok2
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// decodedByNormalize reports whether normalize_path decodes a percent-escape
// of c: the RFC 3986 unreserved characters.
func decodedByNormalize(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	case c == '-', c == '.', c == '_', c == '~':
		return true
	}
	return false
}
