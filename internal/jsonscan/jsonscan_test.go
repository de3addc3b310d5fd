package jsonscan_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ratelimit-authz/ratelimit-authz/internal/jsonscan"
)

// valid reports whether s is one JSON document by the Scanner.
func valid[T ~string | ~[]byte](s T) bool {
	p := jsonscan.New(s)
	p.Space()
	return p.Value(1) && p.End()
}

func TestValue(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{}`, true}, {` {"a": [1, -2.5e+3, true, false, null, "x\u00e9\n"]} `, true}, {`"\ud83d\ude00"`, true},
		{`0`, true}, {`-0.0E-1`, true},
		{``, false}, {`{`, false}, {`{"a" 1}`, false}, {`{"a":1,}`, false}, {`[1,]`, false}, {`01`, false},
		{`1.`, false}, {`1e`, false}, {`-`, false}, {`"\x"`, false}, {`"\u12"`, false}, {"\"a\nb\"", false},
		{`tru`, false}, {`nul`, false}, {`{} {}`, false}, {`"abc`, false}, {`"\`, false},
		{strings.Repeat("[", jsonscan.MaxDepth) + strings.Repeat("]", jsonscan.MaxDepth), true},
		{strings.Repeat("[", jsonscan.MaxDepth+1) + strings.Repeat("]", jsonscan.MaxDepth+1), false},
	} {
		if got := valid(tc.in); got != tc.ok {
			t.Errorf("%.40q: valid %v, want %v", tc.in, got, tc.ok)
		}
		if got := valid([]byte(tc.in)); got != tc.ok {
			t.Errorf("%.40q as bytes: valid %v, want %v", tc.in, got, tc.ok)
		}
	}
}

func TestUint(t *testing.T) {
	for _, tc := range []struct {
		in string
		n  int64
		ok bool
	}{
		{" 200", 200, true}, {"0", 0, true}, {"999999999999999999", 999999999999999999, true},
		{"9999999999999999999", 0, false}, {"0200", 0, false}, {"2e2", 0, false}, {"2.0", 0, false},
		{"-1", 0, false}, {"", 0, false}, {"x", 0, false},
	} {
		p := jsonscan.New(tc.in)
		if n, ok := p.Uint(); ok != tc.ok || ok && n != tc.n {
			t.Errorf("Uint(%q) = %d, %v; want %d, %v", tc.in, n, ok, tc.n, tc.ok)
		}
	}
}

func TestNoAllocations(t *testing.T) {
	doc := []byte(`{"activity_create": {"limit": 200, "scale_ms": 1000}, "list": [1, "two", {"three": null}]}`)
	if n := testing.AllocsPerRun(100, func() { valid(doc); valid(string(doc[:10])) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// FuzzScan holds the Scanner to encoding/json: the same documents are
// valid (within MaxDepth), strings decode alike, and plain integers read
// alike. Neither form of input ever makes it panic.
func FuzzScan(f *testing.F) {
	for _, s := range []string{
		`{"email": "A@b.example", "password": "x"}`,
		`{"activity_create": {"limit": 200, "scale_ms": 1000}}`,
		`"\ud800"`, `"\ud83d\ude00\u0041\/\\\""`, `[[[[[]]]]]`, `-12.5e-7`, `{"a":}`, `123456789012345678901`,
		"\"\xff\"", `{"a":"b"}}`, `   `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		s := string(raw)
		got := valid(s)
		if valid(raw) != got {
			t.Fatalf("%q: string and bytes disagree", raw)
		}
		if got && !json.Valid(raw) {
			t.Fatalf("%q: valid for the scanner, not for encoding/json", raw)
		}
		if !got && json.Valid(raw) && strings.Count(s, "[")+strings.Count(s, "{") < jsonscan.MaxDepth {
			t.Fatalf("%q: valid for encoding/json, not for the scanner", raw)
		}
		p := jsonscan.New(s)
		p.Space()
		if start, end, esc := p.String(); start >= 0 && p.End() && utf8.ValidString(s) {
			var want string
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatalf("%q: scanned as a string, encoding/json: %v", raw, err)
			}
			v := s[start:end]
			if esc {
				v = jsonscan.Unescape(v)
			}
			if v != want {
				t.Fatalf("%q: unescaped %q, encoding/json %q", raw, v, want)
			}
		}
		q := jsonscan.New(raw)
		if n, ok := q.Uint(); ok && q.End() {
			if want, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err != nil || want != n {
				t.Fatalf("%q: Uint %d, strconv %d %v", raw, n, want, err)
			}
		}
	})
}
