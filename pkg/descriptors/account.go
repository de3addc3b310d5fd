package descriptors

import (
	"net/url"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// maxBodyBytes bounds the body searched for the account field. A longer
	// body is not parsed at all (the account is missing): a truncated JSON
	// document is malformed, and a truncated form could hide a later copy
	// of the field.
	maxBodyBytes = 64 << 10

	// maxJSONDepth bounds the nesting of a JSON body; deeper is malformed.
	maxJSONDepth = 64

	headerContentType   = "content-type"
	headerContentLength = "content-length"
	headerPartialBody   = "x-envoy-auth-partial-body"

	mediaForm = "application/x-www-form-urlencoded"
	mediaJSON = "application/json"
)

// MaxAccounts bounds the accounts one request counts against: one from
// the header and one from the body (a repeated header or field is
// unreadable, not several accounts). A request would present more only
// through a change of those rules; it is then also counted under
// UnreadableAccount, never cut short.
const MaxAccounts = 2

// UnreadableAccount is the key of the account-keyed buckets for a login
// whose account cannot be read: every such login shares it. It cannot be
// a normalised account, which never starts with a space.
const UnreadableAccount = " unreadable"

// accountSet is every account a request presents, normalised, each once,
// and whether some part of the request that may name one could not be read.
type accountSet struct {
	v          [MaxAccounts]string
	n          int
	unreadable bool
}

func (a *accountSet) add(v string) {
	for _, x := range a.v[:a.n] {
		if x == v {
			return
		}
	}
	if a.n == len(a.v) {
		a.unreadable = true // too many: the rest count under the shared key
		return
	}
	a.v[a.n] = v
	a.n++
}

// accounts finds every account a login request presents: the account
// header and the account field of the body, as the application may read
// either. Anything that may name an account but cannot be read marks the
// set unreadable, and so does a request that names none: an attacker must
// not escape the per-account limit by making the account unreadable to the
// server while the application still reads one.
func (e *Engine) accounts(headers map[string]string, body string, set *accountSet) {
	if e.accountHeader != "" {
		if raw, ok := headers[e.accountHeader]; ok {
			// Envoy joins a repeated header with ",": which copy the
			// application reads is unknown. An account never holds one.
			if v := normAccount(raw); v == "" || strings.IndexByte(raw, ',') >= 0 {
				set.unreadable = true
			} else {
				set.add(v)
			}
		}
	}
	if e.accountField != "" && body != "" {
		if v, ok := e.bodyAccount(headers, body); !ok {
			set.unreadable = true
		} else if v != "" {
			set.add(v)
		}
	}
	if set.n == 0 {
		set.unreadable = true
	}
}

// bodyAccount returns the account field of a non-empty body: "" and true
// when a well-formed body lacks the field, false when the body cannot be
// read (see the package doc).
func (e *Engine) bodyAccount(headers map[string]string, body string) (string, bool) {
	if len(body) > maxBodyBytes {
		return "", false
	}
	// Envoy sets the header on every buffered body; anything but "false"
	// (absent, "true", or a client's copy joined to Envoy's) may be a cut.
	if v := strings.TrimSpace(headers[headerPartialBody]); !strings.EqualFold(v, "false") {
		return "", false
	}
	// A body shorter than its declared length was cut too.
	if cl, ok := headers[headerContentLength]; ok {
		if n, err := strconv.Atoi(cl); err != nil || n != len(body) {
			return "", false
		}
	}
	if !utf8.ValidString(body) {
		return "", false
	}
	ct := headers[headerContentType]
	switch {
	case hasMediaType(ct, mediaForm):
		return formAccount(body, e.accountField)
	case hasMediaType(ct, mediaJSON):
		return jsonAccount(body, e.accountField)
	}
	return "", false // a body the application may parse some other way
}

// normAccount trims and lower-cases an account; "" when it is empty or not
// valid UTF-8. It allocates only when there is something to lower-case.
func normAccount(s string) string {
	s = strings.TrimSpace(s)
	if !utf8.ValidString(s) {
		return ""
	}
	return strings.ToLower(s)
}

// hasMediaType reports whether the content type ct is the media type mt,
// ignoring case and parameters.
func hasMediaType(ct, mt string) bool {
	ct = strings.TrimLeft(ct, " \t")
	if len(ct) < len(mt) || !strings.EqualFold(ct[:len(mt)], mt) {
		return false
	}
	if len(ct) == len(mt) {
		return true
	}
	switch ct[len(mt)] {
	case ';', ' ', '\t':
		return true
	}
	return false
}

// accountPick collects every value given for the account field. Parsers
// disagree on which copy of a repeated field wins (first for Go's
// FormValue, last for JSON.parse and encoding/json), so copies that
// normalise differently make the account ambiguous, hence missing: an
// attacker cannot have one account counted while the application checks
// another.
type accountPick struct {
	v         string
	ambiguous bool
}

func (a *accountPick) add(raw string) {
	v := normAccount(raw)
	switch {
	case v == "":
		a.ambiguous = true
	case a.v == "":
		a.v = v
	case a.v != v:
		a.ambiguous = true
	}
}

// result is the account ("" when the field was absent) and whether it
// could be read.
func (a *accountPick) result() (string, bool) {
	if a.ambiguous {
		return "", false
	}
	return a.v, true
}

// formAccount returns the account field of a form-urlencoded body ("" when
// absent) and false when it cannot be read. A malformed percent-escape
// anywhere makes the whole body malformed.
func formAccount(body, field string) (string, bool) {
	for i := 0; i < len(body); i++ {
		if body[i] == '%' {
			if _, ok := unescapeAt(body, i); !ok {
				return "", false
			}
		}
	}
	var pick accountPick
	for rest := body; rest != ""; {
		var pair string
		pair, rest, _ = strings.Cut(rest, "&")
		k, v, _ := strings.Cut(pair, "=")
		if !formKeyIs(k, field) {
			continue
		}
		dv, err := url.QueryUnescape(v)
		if err != nil || !utf8.ValidString(dv) {
			return "", false
		}
		pick.add(dv)
	}
	return pick.result()
}

// formKeyIs reports whether the encoded form key k decodes to field.
func formKeyIs(k, field string) bool {
	if !strings.ContainsAny(k, "%+") {
		return k == field
	}
	dk, err := url.QueryUnescape(k)
	return err == nil && dk == field
}

// jsonAccount returns the top-level string member field of a JSON object
// body ("" when absent) and false when it cannot be read. Keys compare as encoding/json compares them to a struct field:
// exactly or, failing that, case-insensitively; every copy counts. A
// malformed document, a non-string value for the field, or copies that
// disagree make the account missing.
func jsonAccount(body, field string) (string, bool) {
	p := jsonParser{s: body}
	p.ws()
	if !p.eat('{') {
		return "", false
	}
	var pick accountPick
	p.ws()
	if !p.eat('}') {
		for {
			p.ws()
			ks, ke, kesc := p.str()
			if ks < 0 {
				return "", false
			}
			p.ws()
			if !p.eat(':') {
				return "", false
			}
			p.ws()
			if jsonKeyIs(body[ks:ke], kesc, field) {
				if p.peek() != '"' {
					pick.ambiguous = true
					if !p.value(1) {
						return "", false
					}
				} else {
					vs, ve, vesc := p.str()
					if vs < 0 {
						return "", false
					}
					v := body[vs:ve]
					if vesc {
						v = unescapeJSON(v)
					}
					pick.add(v)
				}
			} else if !p.value(1) {
				return "", false
			}
			p.ws()
			if p.eat(',') {
				continue
			}
			if p.eat('}') {
				break
			}
			return "", false
		}
	}
	p.ws()
	if p.i != len(p.s) {
		return "", false
	}
	return pick.result()
}

func jsonKeyIs(raw string, escaped bool, field string) bool {
	if escaped {
		raw = unescapeJSON(raw)
	}
	return strings.EqualFold(raw, field)
}

// jsonParser validates JSON (RFC 8259) without building values. Its input is
// valid UTF-8 (checked by the caller).
type jsonParser struct {
	s string
	i int
}

func (p *jsonParser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *jsonParser) eat(c byte) bool {
	if p.peek() == c {
		p.i++
		return true
	}
	return false
}

// value skips one value; false when it is malformed.
func (p *jsonParser) value(depth int) bool {
	if depth > maxJSONDepth {
		return false
	}
	switch c := p.peek(); {
	case c == '"':
		s, _, _ := p.str()
		return s >= 0
	case c == '{':
		p.i++
		p.ws()
		if p.eat('}') {
			return true
		}
		for {
			p.ws()
			if s, _, _ := p.str(); s < 0 {
				return false
			}
			p.ws()
			if !p.eat(':') {
				return false
			}
			p.ws()
			if !p.value(depth + 1) {
				return false
			}
			p.ws()
			if p.eat('}') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == '[':
		p.i++
		p.ws()
		if p.eat(']') {
			return true
		}
		for {
			p.ws()
			if !p.value(depth + 1) {
				return false
			}
			p.ws()
			if p.eat(']') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	}
	return false
}

func (p *jsonParser) lit(w string) bool {
	if strings.HasPrefix(p.s[p.i:], w) {
		p.i += len(w)
		return true
	}
	return false
}

func (p *jsonParser) digits() int {
	n := 0
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}

func (p *jsonParser) number() bool {
	p.eat('-')
	switch {
	case p.eat('0'):
	case p.digits() == 0:
		return false
	}
	if p.eat('.') && p.digits() == 0 {
		return false
	}
	if p.eat('e') || p.eat('E') {
		if !p.eat('+') {
			p.eat('-')
		}
		if p.digits() == 0 {
			return false
		}
	}
	return true
}

// str scans a string at p.i and returns the bounds of its contents and
// whether it holds escapes; start is -1 when it is malformed.
func (p *jsonParser) str() (start, end int, escaped bool) {
	if !p.eat('"') {
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

// hex4 decodes the four hex digits at s[i:].
func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var r rune
	for _, c := range []byte(s[i : i+4]) {
		d, ok := unhex(c)
		if !ok {
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}

// unescapeJSON decodes the contents of a well-formed JSON string as
// encoding/json does: a lone surrogate becomes U+FFFD.
func unescapeJSON(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			i++
			continue
		}
		switch s[i+1] {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, _ := hex4(s, i+2)
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if r2, ok := hex4(s, i+2); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							b.WriteRune(d)
							i += 6
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			b.WriteRune(r)
			continue
		default: // '"', '\\', '/'
			b.WriteByte(s[i+1])
		}
		i += 2
	}
	return b.String()
}

// NormalizeAccount returns an account as Describe reports it: trimmed and
// lower-cased, "" when empty or not valid UTF-8. Failure reports made
// outside a check use it so that they count against the same key.
func NormalizeAccount(s string) string { return normAccount(s) }
