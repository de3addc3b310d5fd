package match

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrInvalidTemplate is wrapped by every error ValidateTemplate returns, and
// by the template errors New reports.
var ErrInvalidTemplate = errors.New("invalid route template")

// tseg is one segment of a compiled template: a literal compared byte for
// byte, or a capture of one non-empty path segment.
type tseg struct {
	lit     string
	capture bool
}

// capture is a {name} of a template and the index of the segment it takes.
type capture struct {
	name string
	seg  int
}

// template is a compiled route template. The root template "/" is one empty
// literal segment, which only the path "/" matches.
type template struct {
	segs     []tseg
	captures []capture
}

// ValidateTemplate reports whether t is a route template New accepts: it
// starts with "/"; it holds no "?", "#", "\", whitespace or control
// character; it has no empty segment (only the root template "/" ends with
// a slash) and no "." or ".." segment; it holds no percent-escape of a
// character Envoy's normalize_path decodes (letters, digits, "-", ".", "_",
// "~"); and a "{" or "}" only appears as a whole-segment capture {name},
// name matching [A-Za-z_][A-Za-z0-9_]*, each name at most once. Every such
// template could never match a path Envoy normalised. The error wraps
// ErrInvalidTemplate.
func ValidateTemplate(t string) error {
	if _, problem := parseTemplate(t); problem != "" {
		return fmt.Errorf("%w %q: %s", ErrInvalidTemplate, t, problem)
	}
	return nil
}

// parseTemplate compiles t, or says what is wrong with it.
func parseTemplate(t string) (template, string) {
	if t == "" {
		return template{}, "empty"
	}
	if t[0] != '/' {
		return template{}, `does not start with "/"`
	}
	if !utf8.ValidString(t) {
		return template{}, "not valid UTF-8"
	}
	for i, r := range t {
		switch {
		case r == '?' || r == '#':
			return template{}, fmt.Sprintf("%q at byte %d: templates match the path without its query string or fragment", r, i)
		case r == '\\':
			return template{}, fmt.Sprintf(`"\" at byte %d: normalize_path turns it into "/"`, i)
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return template{}, fmt.Sprintf("whitespace or control character %q at byte %d", r, i)
		case r == '%':
			if c, ok := unescapeAt(t, i); ok && decodedByNormalize(c) {
				return template{}, fmt.Sprintf("%q at byte %d: normalize_path decodes it to %q, so it can never match", t[i:i+3], i, c)
			}
		}
	}
	if t == "/" {
		return template{segs: []tseg{{}}}, ""
	}
	parts := strings.Split(t[1:], "/")
	tp := template{segs: make([]tseg, len(parts))}
	for i, s := range parts {
		switch {
		case s == "" && i == len(parts)-1:
			return template{}, `ends with "/" (only the root template "/" may; Envoy does not strip a trailing slash, so "/a/" and "/a" are different paths)`
		case s == "":
			return template{}, fmt.Sprintf(`empty segment %d ("//"): merge_slashes removes it, so it can never match`, i+1)
		case s == "." || s == "..":
			return template{}, fmt.Sprintf("segment %d is %q: normalize_path removes it, so it can never match", i+1, s)
		case s[0] == '{' && s[len(s)-1] == '}':
			name := s[1 : len(s)-1]
			if !ValidParamName(name) {
				return template{}, fmt.Sprintf("segment %d %q: a capture name must match [A-Za-z_][A-Za-z0-9_]*", i+1, s)
			}
			for _, c := range tp.captures {
				if c.name == name {
					return template{}, fmt.Sprintf("capture {%s} appears twice", name)
				}
			}
			tp.segs[i] = tseg{capture: true}
			tp.captures = append(tp.captures, capture{name: name, seg: i})
		case strings.ContainsAny(s, "{}"):
			return template{}, fmt.Sprintf(`segment %d %q: "{" and "}" are only allowed around a whole-segment capture {name}`, i+1, s)
		default:
			tp.segs[i] = tseg{lit: s}
		}
	}
	return tp, ""
}

// ValidParamName reports whether s matches [A-Za-z_][A-Za-z0-9_]*.
func ValidParamName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// RouteKey is what makes two routes the same, so that the second could
// never match: the same method ("" = any) and the same template shape
// (every capture written "{}"). ok is false for an invalid template.
func RouteKey(method, tpl string) (key string, ok bool) {
	t, problem := parseTemplate(tpl)
	if problem != "" {
		return "", false
	}
	return method + " " + t.shape(), true
}

// TemplateParams returns the capture names of a valid template, in order;
// none for an invalid one.
func TemplateParams(tpl string) []string {
	t, _ := parseTemplate(tpl)
	names := make([]string, len(t.captures))
	for i, c := range t.captures {
		names[i] = c.name
	}
	return names
}

// shape is the template with every capture written as "{}": two templates
// with the same shape match the same paths.
func (t *template) shape() string {
	var b strings.Builder
	for _, s := range t.segs {
		b.WriteByte('/')
		if s.capture {
			b.WriteString("{}")
		} else {
			b.WriteString(s.lit)
		}
	}
	return b.String()
}

// captureSeg returns the segment index of capture name, or -1.
func (t *template) captureSeg(name string) int {
	for _, c := range t.captures {
		if c.name == name {
			return c.seg
		}
	}
	return -1
}

// match reports whether the normalised path p (starting with "/") matches t.
func (t *template) match(p string) bool {
	pos := 1
	for i := range t.segs {
		last := i == len(t.segs)-1
		n := strings.IndexByte(p[pos:], '/')
		var seg string
		switch {
		case n < 0 && !last, n >= 0 && last:
			return false
		case n < 0:
			seg = p[pos:]
		default:
			seg = p[pos : pos+n]
		}
		if s := &t.segs[i]; s.capture {
			if seg == "" {
				return false
			}
		} else if seg != s.lit {
			return false
		}
		pos += n + 1
	}
	return true
}

// segment returns segment k (0-based) of the normalised path p, or "".
func segment(p string, k int) string {
	if len(p) == 0 || k < 0 {
		return ""
	}
	p = p[1:]
	for ; k > 0; k-- {
		n := strings.IndexByte(p, '/')
		if n < 0 {
			return ""
		}
		p = p[n+1:]
	}
	if n := strings.IndexByte(p, '/'); n >= 0 {
		return p[:n]
	}
	return p
}

// firstSegment returns the first segment of the normalised path p.
func firstSegment(p string) string {
	return segment(p, 0)
}
