package match

import (
	"bytes"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ratelimit-authz/ratelimit-authz/internal/checkreq"
	"github.com/ratelimit-authz/ratelimit-authz/internal/jsonscan"
)

const (
	// maxBodyBytes bounds the body searched for the account field. A longer
	// body is not parsed at all (the account is missing): a truncated JSON
	// document is malformed, and a truncated form could hide a later copy
	// of the field.
	maxBodyBytes = 64 << 10

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
func (e *Engine) accounts(headers checkreq.Fields, body string, set *accountSet) {
	if e.accountHeader != "" {
		if raw, ok := headers.Get(e.accountHeader); ok {
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
// read (see docs/design/routes-and-keys.md, "Failure mode").
func (e *Engine) bodyAccount(headers checkreq.Fields, body string) (string, bool) {
	if len(body) > maxBodyBytes {
		return "", false
	}
	// Envoy sets the header on every buffered body; anything but "false"
	// (absent, "true", or a client's copy joined to Envoy's) may be a cut.
	if v := strings.TrimSpace(headers.Value(headerPartialBody)); !strings.EqualFold(v, "false") {
		return "", false
	}
	// A body shorter than its declared length was cut too.
	if cl, ok := headers.Get(headerContentLength); ok {
		if n, err := strconv.Atoi(cl); err != nil || n != len(body) {
			return "", false
		}
	}
	if !utf8.ValidString(body) {
		return "", false
	}
	ct := headers.Value(headerContentType)
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
	p := jsonscan.New(body)
	if !p.Token('{') {
		return "", false
	}
	var pick accountPick
	if !p.Token('}') {
		for {
			p.Space()
			ks, ke, kesc := p.String()
			if ks < 0 {
				return "", false
			}
			if !p.Token(':') {
				return "", false
			}
			p.Space()
			if jsonKeyIs(body[ks:ke], kesc, field) {
				if p.Peek() != '"' {
					pick.ambiguous = true
					if !p.Value(1) {
						return "", false
					}
				} else {
					vs, ve, vesc := p.String()
					if vs < 0 {
						return "", false
					}
					v := body[vs:ve]
					if vesc {
						v = jsonscan.Unescape(v)
					}
					pick.add(v)
				}
			} else if !p.Value(1) {
				return "", false
			}
			if p.Token(',') {
				continue
			}
			if p.Eat('}') {
				break
			}
			return "", false
		}
	}
	if !p.End() {
		return "", false
	}
	return pick.result()
}

// jsonKeyIs reports whether the key raw (escaped: it holds escapes) is
// field, ignoring case, without allocating for a decoy key: each rune of a
// match stands for one rune of field and takes at most twelve bytes of raw
// (a surrogate pair), so a longer key cannot match, and a shorter one is
// unescaped into a buffer on the stack.
func jsonKeyIs(raw string, escaped bool, field string) bool {
	if !escaped {
		return strings.EqualFold(raw, field)
	}
	if len(raw) > 12*len(field) {
		return false
	}
	var buf [256]byte
	return bytes.EqualFold(jsonscan.AppendUnescape(buf[:0], raw), []byte(field))
}

// NormalizeAccount returns an account as Describe reports it: trimmed and
// lower-cased, "" when empty or not valid UTF-8. Failure reports made
// outside a check use it so that they count against the same key.
func NormalizeAccount(s string) string { return normAccount(s) }
