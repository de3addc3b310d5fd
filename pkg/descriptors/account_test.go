package descriptors

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAccount(t *testing.T) {
	const (
		form = "application/x-www-form-urlencoded"
		js   = "application/json"
	)
	huge := `{"email":"alice@example.com","pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`
	tests := []struct {
		name    string
		header  string // x-login-account
		ct      string
		body    string
		partial string
		want    string
	}{
		{name: "header", header: "Alice@Example.com", want: "alice@example.com"},
		{name: "header trimmed", header: "  bob  ", want: "bob"},
		{name: "header wins over the body", header: "bob", ct: js, body: `{"email":"alice"}`, want: "bob"},
		{name: "blank header falls back to the body", header: "  ", ct: js, body: `{"email":"alice"}`, want: "alice"},
		{name: "header not UTF-8", header: "al\xffice", want: ""},

		{name: "form", ct: form, body: "email=Alice%40Example.com&password=secret", want: "alice@example.com"},
		{name: "form plus is a space, trimmed", ct: form, body: "password=x&email=+alice+", want: "alice"},
		{name: "form with charset", ct: "Application/X-WWW-Form-Urlencoded; charset=UTF-8", body: "email=alice", want: "alice"},
		{name: "form escaped key", ct: form, body: "e%6Dail=alice", want: "alice"},
		{name: "form other fields only", ct: form, body: "emails=x&user=alice&email2=y", want: ""},
		{name: "form key without value", ct: form, body: "email&x=1", want: ""},
		{name: "form empty value", ct: form, body: "email=&x=1", want: ""},
		{name: "form repeated, same account", ct: form, body: "email=alice&email=ALICE", want: "alice"},
		{name: "form repeated, different accounts", ct: form, body: "email=alice&email=victim", want: ""},
		{name: "form bad escape", ct: form, body: "email=alice&x=%zz", want: ""},
		{name: "form escaped bytes not UTF-8", ct: form, body: "email=al%FFice", want: ""},

		{name: "JSON", ct: js, body: `{"email": "Alice@Example.com", "password": "x"}`, want: "alice@example.com"},
		{name: "JSON with charset", ct: "application/json; charset=utf-8", body: `{"email":"alice"}`, want: "alice"},
		{name: "JSON whitespace", ct: js, body: " \n{ \"password\" : [1, {\"email\": \"nested\"}], \"email\" :\t\"alice\" } \r\n", want: "alice"},
		{name: "JSON escapes", ct: js, body: `{"email":"al\u0069ce\u0040example.com"}`, want: "alice@example.com"},
		{name: "JSON escaped key", ct: js, body: `{"em\u0061il":"alice"}`, want: "alice"},
		{name: "JSON surrogate pair", ct: js, body: `{"email":"\ud83d\ude00@x"}`, want: "\U0001F600@x"},
		{name: "JSON key case-insensitive like encoding/json", ct: js, body: `{"Email":"alice"}`, want: "alice"},
		{name: "JSON keys differing in case disagree", ct: js, body: `{"email":"alice","EMAIL":"victim"}`, want: ""},
		{name: "JSON duplicate disagrees", ct: js, body: `{"email":"alice","email":"victim"}`, want: ""},
		{name: "JSON duplicate agrees", ct: js, body: `{"email":"alice","email":" Alice "}`, want: "alice"},
		{name: "JSON nested only", ct: js, body: `{"user":{"email":"alice"}}`, want: ""},
		{name: "JSON not a string", ct: js, body: `{"email":42}`, want: ""},
		{name: "JSON null", ct: js, body: `{"email":"alice","email":null}`, want: ""},
		{name: "JSON array top level", ct: js, body: `[{"email":"alice"}]`, want: ""},
		{name: "JSON empty string", ct: js, body: `{"email":""}`, want: ""},
		{name: "JSON malformed: truncated", ct: js, body: `{"email":"alice"`, want: ""},
		{name: "JSON malformed: trailing garbage", ct: js, body: `{"email":"alice"} x`, want: ""},
		{name: "JSON malformed: trailing comma", ct: js, body: `{"email":"alice",}`, want: ""},
		{name: "JSON malformed: bad escape", ct: js, body: `{"email":"al\ice"}`, want: ""},
		{name: "JSON malformed: control char", ct: js, body: "{\"email\":\"al\nice\"}", want: ""},
		{name: "JSON malformed: bad number", ct: js, body: `{"n":01,"email":"alice"}`, want: ""},
		{name: "JSON malformed: single quotes", ct: js, body: `{'email':'alice'}`, want: ""},
		{name: "JSON too deep", ct: js, body: `{"email":"alice","x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, want: ""},
		{name: "JSON not UTF-8", ct: js, body: "{\"email\":\"al\xffice\"}", want: ""},
		{name: "JSON not UTF-8 elsewhere", ct: js, body: "{\"email\":\"alice\",\"x\":\"\xc3\"}", want: ""},
		{name: "huge body", ct: js, body: huge, want: ""},
		{name: "partial body", ct: js, body: `{"email":"alice"}`, partial: "true", want: ""},
		{name: "complete body flag", ct: js, body: `{"email":"alice"}`, partial: "false", want: "alice"},

		{name: "no content type", body: `{"email":"alice"}`, want: ""},
		{name: "other content type", ct: "text/plain", body: "email=alice", want: ""},
		{name: "content type prefix only", ct: "application/jsonx", body: `{"email":"alice"}`, want: ""},
		{name: "no body", ct: js, want: ""},
		{name: "nothing", want: ""},
	}
	e := mustNew(t, exampleConfig())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.header != "" {
				h["x-login-account"] = tt.header
			}
			if tt.ct != "" {
				h["content-type"] = tt.ct
			}
			if tt.partial != "" {
				h["x-envoy-auth-partial-body"] = tt.partial
			}
			got := e.Describe(&Request{Method: "POST", Path: "/admin/login", Headers: h, Body: tt.body, PeerAddress: "192.0.2.1"}, nil)
			if got.Account != tt.want {
				t.Errorf("Account = %q, want %q", got.Account, tt.want)
			}
			if len(got.Descriptors) != 2 || got.Descriptors[1] != (Descriptor{Bucket: bLoginAccount, Key: tt.want}) {
				t.Errorf("Descriptors = %+v, want the account descriptor keyed %q", got.Descriptors, tt.want)
			}
		})
	}
}

func TestAccountSources(t *testing.T) {
	body := `{"email":"alice"}`
	h := map[string]string{"content-type": "application/json", "x-login-account": "bob"}
	for _, tt := range []struct {
		header, field string
		want          string
	}{
		{"x-login-account", "email", "bob"},
		{"", "email", "alice"},
		{"x-login-account", "", "bob"},
		{"x-other", "", ""},
		{"", "login", ""},
	} {
		e := mustNew(t, Config{
			Buckets:          []Bucket{{Name: "acct", Key: KeySpec{Kind: KeyAccount}}},
			Routes:           []Route{{Template: "/login", Buckets: []int{0}}},
			AccountHeader:    tt.header,
			AccountBodyField: tt.field,
		})
		got := e.Describe(&Request{Method: "POST", Path: "/login", Headers: h, Body: body}, nil)
		if got.Account != tt.want {
			t.Errorf("header %q field %q: Account = %q, want %q", tt.header, tt.field, got.Account, tt.want)
		}
	}
}

// FuzzJSONAccount cross-checks the JSON scanner with encoding/json: an
// account is only found in a document encoding/json accepts, and every
// top-level member encoding/json would decode into the field holds it.
func FuzzJSONAccount(f *testing.F) {
	for _, s := range []string{
		`{"email":"a"}`, `{"Email":"a","x":[1,2,{"y":null}]}`, `{"email":"\u00e9"}`, `{"email":"a","email":"b"}`,
		`{"email":1e5}`, `{"em\u0061il":"a\"b"}`, `{}`, `[]`, `{"email":"\ud800"}`, `{"n":-0.5e+3,"email":"a"}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		got := jsonAccount(body, "email")
		if got == "" {
			return
		}
		if !json.Valid([]byte(body)) {
			t.Fatalf("jsonAccount(%q) = %q, but encoding/json rejects the document", body, got)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("jsonAccount(%q) = %q, but it is no object: %v", body, got, err)
		}
		found := false
		for k, raw := range m {
			if !strings.EqualFold(k, "email") {
				continue
			}
			var v string
			if err := json.Unmarshal(raw, &v); err != nil {
				t.Fatalf("jsonAccount(%q) = %q, but member %q is %s", body, got, k, raw)
			}
			if normAccount(v) != got {
				t.Fatalf("jsonAccount(%q) = %q, but member %q is %q", body, got, k, v)
			}
			found = true
		}
		if !found {
			t.Fatalf("jsonAccount(%q) = %q, but encoding/json finds no such member", body, got)
		}
		// And the Go struct decoding an application would do agrees.
		var s struct {
			Email string `json:"email"`
		}
		if err := json.Unmarshal([]byte(body), &s); err != nil || normAccount(s.Email) != got {
			t.Fatalf("jsonAccount(%q) = %q, struct decoding gives %q, %v", body, got, s.Email, err)
		}
	})
}
